package node

import (
	"errors"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// filesUnder lists every file below dir (none when it does not exist).
func filesUnder(fsys vfs.FS, dir string) []string {
	names, err := fsys.List(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, name := range names {
		child := path.Join(dir, name)
		if _, err := fsys.List(child); err == nil {
			out = append(out, filesUnder(fsys, child)...)
		} else {
			out = append(out, child)
		}
	}
	return out
}

// deleteTopic deletes name on n and waits for the answer.
func deleteTopic(t *testing.T, n *Node, name string, incarnation uint64) (uint64, error) {
	t.Helper()
	type res struct {
		inc uint64
		err error
	}
	ch := make(chan res, 1)
	n.DeleteTopic(name, incarnation, func(inc uint64, err error) { ch <- res{inc, err} })
	select {
	case r := <-ch:
		return r.inc, r.err
	case <-time.After(waitMax):
		t.Fatal("delete: no reply")
		return 0, nil
	}
}

func wantWireCode(t *testing.T, what string, err error, code wire.Code, text string) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code || !strings.Contains(we.Message, text) {
		t.Fatalf("%s: %v, want %s containing %q", what, err, code, text)
	}
}

// A single node deletes a topic durably: runners stop, publishes get
// NOT_FOUND "was deleted", the partitions' and the groups' directories go,
// and the name declared again is incarnation 2 with an empty log from seq
// 1 — neither the producer's dedup state nor the group's acks of
// incarnation 1 leak into it, and a restart does not bring 1 back.
func TestSingleNodeTopicDeleteAndRecreate(t *testing.T) {
	h := newHarness(t)
	h.declare("orders", 1)
	first := h.mustPublish(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: 1, Value: []byte("a")})
	h.mustPublish(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: 2, Value: []byte("b")})
	s := newSink()
	sub, err := h.node.Subscribe("orders", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(10)
	for _, m := range s.waitFor(t, 2) {
		h.ack("orders", "g", false, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	}
	h.sync("orders", "g")
	if len(filesUnder(h.fs, "/data/topics/orders")) == 0 || len(filesUnder(h.fs, "/data/groups/g/orders")) == 0 {
		t.Fatal("no partition or group files before the delete: the test proves nothing")
	}
	if _, err := deleteTopic(t, h.node, "__sched", 0); err == nil {
		t.Fatal("an internal topic was deleted")
	}
	inc, err := deleteTopic(t, h.node, "orders", 0)
	if err != nil || inc != 1 {
		t.Fatalf("delete: incarnation %d, %v", inc, err)
	}
	if files := append(filesUnder(h.fs, "/data/topics/orders"), filesUnder(h.fs, "/data/groups/g/orders")...); len(files) > 0 {
		t.Fatalf("files left after the delete: %v", files)
	}
	_, err = h.publish(&wire.Pub{Topic: "orders", Partition: 0, Value: []byte("x")})
	wantWireCode(t, "publish after delete", err, wire.CodeNotFound, "was deleted")
	_, err = deleteTopic(t, h.node, "orders", 0)
	wantWireCode(t, "second delete", err, wire.CodeNotFound, "was deleted")

	h.declare("orders", 1)
	if md := h.node.Metadata([]string{"orders"}); len(md) != 1 || md[0].Incarnation != 2 || md[0].Partitions[0].CommitSeq != 0 {
		t.Fatalf("re-declared topic: %+v", md)
	}
	again := h.mustPublish(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: 1, Value: []byte("new")})
	if again.Duplicate || again.Seq != first.Seq {
		t.Fatalf("producer 7 seq 1 into incarnation 2: %+v, want a new record at seq %d", again, first.Seq)
	}
	s2 := newSink()
	sub2, err := h.node.Subscribe("orders", "g", GroupOptions{}, s2)
	if err != nil {
		t.Fatal(err)
	}
	sub2.AddCredit(10)
	if m := s2.waitFor(t, 1)[0]; m.Seq != again.Seq || string(m.Value) != "new" {
		t.Fatalf("group g on incarnation 2 got seq %d %q", m.Seq, m.Value)
	}

	h.restart()
	if md := h.node.Metadata([]string{"orders"}); len(md) != 1 || md[0].Incarnation != 2 || md[0].Partitions[0].CommitSeq != again.Seq {
		t.Fatalf("after restart: %+v", md)
	}
	if cur, del := h.node.TopicIncarnation("orders"); cur != 2 || del != 1 {
		t.Fatalf("TopicIncarnation after restart: %d, %d", cur, del)
	}
}

// A single node stopped between the delete's commit point (groups.json)
// and the rewrite of topics.json — its files still there — does not bring
// the topic back: Open drops it from topics.json and removes its files.
func TestSingleNodeDeleteFinishesAtOpen(t *testing.T) {
	h := newHarness(t)
	h.declare("orders", 1)
	h.mustPublish(&wire.Pub{Topic: "orders", Partition: 0, Value: []byte("a")})
	topicsJSON, err := storage.ReadFileAtomic(h.fs, "/data/topics.json")
	if err != nil {
		t.Fatal(err)
	}
	h.node.Close()
	leftover := map[string][]byte{}
	for _, f := range filesUnder(h.fs, "/data/topics/orders") {
		leftover[f] = readAll(t, h.fs, f)
	}
	h.open()
	if _, err := deleteTopic(t, h.node, "orders", 0); err != nil {
		t.Fatal(err)
	}
	h.node.Close()
	// Put back what a crash before the removal would have left.
	if err := storage.WriteFileAtomic(h.fs, "/data/topics.json", topicsJSON); err != nil {
		t.Fatal(err)
	}
	for name, b := range leftover {
		writeFile(t, h.fs, name, b)
	}
	h.open()
	if md := h.node.Metadata([]string{"orders"}); len(md) != 0 {
		t.Fatalf("the deleted topic came back: %+v", md)
	}
	if files := filesUnder(h.fs, "/data/topics/orders"); len(files) > 0 {
		t.Fatalf("leftovers not removed at open: %v", files)
	}
	if b, _ := storage.ReadFileAtomic(h.fs, "/data/topics.json"); strings.Contains(string(b), "orders") {
		t.Fatalf("topics.json still lists the deleted topic: %s", b)
	}
}

func readAll(t testing.TB, fsys vfs.FS, name string) []byte {
	t.Helper()
	size, err := fsys.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fsys.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && size > 0 {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, fsys vfs.FS, name string, b []byte) {
	t.Helper()
	if err := fsys.MkdirAll(path.Dir(name)); err != nil {
		t.Fatal(err)
	}
	f, err := fsys.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := fsys.SyncDir(path.Dir(name)); err != nil {
		t.Fatal(err)
	}
}

// coordinatorOf returns the node that leads the metadata log now.
func (tc *testCluster) coordinatorOf() (string, *Node) {
	tc.t.Helper()
	var id string
	eventually(tc.t, "a metadata leader", func() bool {
		for nid, n := range tc.nodes {
			if here, _ := n.cluster.Coordinator(); here {
				id = nid
				return true
			}
		}
		return false
	})
	return id, tc.nodes[id]
}

// Three nodes: a delete reaches every node — runners stopped, data gone,
// publishes NOT_FOUND — and is asked at the metadata leader only; the
// name declared again is incarnation 2, an empty log whose first record
// takes the seq incarnation 1's first did, with no dedup state of 1. A
// node that was down during the delete applies it when it comes back,
// and one restarted with the deleted incarnation's files still on disk
// (stopped before it removed them) removes them at start.
func TestClusterTopicDeleteAndRecreate(t *testing.T) {
	tc := newTestCluster(t, 3)
	cfg := wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 3}
	tc.declare("n1", cfg)
	_, first := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: 1, Value: []byte("a")})
	_, last := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: 2, Value: []byte("b")})
	for id := range tc.nodes {
		tc.readAll(id, "orders", 0, last.Seq)
	}
	coord, cn := tc.coordinatorOf()
	var down string
	for id := range tc.nodes {
		if id != coord {
			down = id // keeps incarnation 1's files while the others delete
			break
		}
	}
	leftovers := map[string][]byte{}
	for _, f := range filesUnder(tc.fs, "/"+down+"/topics/orders") {
		leftovers[f] = nil
	}
	if len(leftovers) == 0 {
		t.Fatal("no partition files before the delete: the test proves nothing")
	}
	for id, n := range tc.nodes {
		if id != coord {
			_, err := deleteTopic(t, n, "orders", 0)
			wantWireCode(t, "delete at a non-coordinator", err, wire.CodeNotLeader, "metadata leader")
			break
		}
	}
	tc.stop(down)
	inc, err := deleteTopic(t, cn, "orders", 0)
	if err != nil || inc != 1 {
		t.Fatalf("delete: incarnation %d, %v", inc, err)
	}
	for id, n := range tc.nodes {
		// (A node applies the delete when it learns it committed; the
		// leader answered once it applied it itself.)
		eventually(t, id+" stops the deleted topic and removes its files", func() bool {
			return len(n.Metadata([]string{"orders"})) == 0 && len(filesUnder(tc.fs, "/"+id+"/topics/orders")) == 0
		})
		_, perr := publishOn(t, n, &wire.Pub{Topic: "orders", Partition: 0, Value: []byte("x")})
		wantWireCode(t, "publish on "+id+" after delete", perr, wire.CodeNotFound, "was deleted (incarnation 1)")
	}
	_, err = deleteTopic(t, cn, "orders", 0)
	wantWireCode(t, "second delete", err, wire.CodeNotFound, "was deleted")

	// The node that missed the delete applies it from the log.
	tc.start(down)
	eventually(t, down+" applies the delete", func() bool {
		cur, del := tc.nodes[down].TopicIncarnation("orders")
		return cur == 0 && del == 1 && len(tc.nodes[down].Metadata([]string{"orders"})) == 0 &&
			len(filesUnder(tc.fs, "/"+down+"/topics/orders")) == 0
	})

	tc.declare("n2", cfg)
	for id, n := range tc.nodes {
		if md := n.Metadata([]string{"orders"}); len(md) != 1 || md[0].Incarnation != 2 {
			t.Fatalf("%s: re-declared topic %+v", id, md)
		}
	}
	// IncarnationsNeverMeet: incarnation 2's replica groups and files are
	// its own — a late REPLICATE of incarnation 1's group ("orders")
	// finds no group here, and nothing opens 1's directories.
	for id, n := range tc.nodes {
		if _, ok := n.cluster.Replica("orders", 0); ok {
			t.Fatalf("%s: incarnation 2 answers to incarnation 1's replica group", id)
		}
		if _, ok := n.cluster.Replica("orders@2", 0); !ok {
			t.Fatalf("%s: no replica group orders@2", id)
		}
	}
	_, again := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, ProducerID: 7, ProducerSeq: 1, Value: []byte("new")})
	if again.Duplicate || again.Seq != first.Seq {
		t.Fatalf("producer 7 seq 1 into incarnation 2: %+v, want a new record at seq %d", again, first.Seq)
	}

	// A node restarted with incarnation 1's files back on disk (as if it
	// stopped before removing them) removes them at start and serves 2.
	tc.stop(down)
	for f := range leftovers {
		writeFile(t, tc.fs, f, []byte("stale"))
	}
	tc.start(down)
	if files := filesUnder(tc.fs, "/"+down+"/topics/orders"); len(files) > 0 {
		t.Fatalf("%s did not remove incarnation 1's leftovers at start: %v", down, files)
	}
	for id := range tc.nodes {
		if got := tc.readAll(id, "orders", 0, again.Seq); len(got) != 1 || !strings.HasSuffix(got[0], ":new") {
			t.Fatalf("%s: incarnation 2 holds %v", id, got)
		}
		if len(filesUnder(tc.fs, "/"+id+"/topics/orders@2")) == 0 {
			t.Fatalf("%s: incarnation 2 has no files of its own", id)
		}
	}
}

// DeleteAfterDurable: a node that applied a delete but could not make it
// durable in meta.json stops the topic and keeps its files — a restart
// from the older meta.json then starts the incarnation again from
// intact files, not half-removed ones — and, restarted with a working
// disk, applies the delete again from the log and removes them.
func TestClusterDeleteKeepsDataUntilMetaIsDurable(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 3})
	_, ok := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, Value: []byte("a")})
	coord, cn := tc.coordinatorOf()
	var broken string
	for id := range tc.nodes {
		if id != coord {
			broken = id
			break
		}
	}
	tc.readAll(broken, "orders", 0, ok.Seq)
	tc.fs.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpRename && strings.HasPrefix(name, "/"+broken+"/meta.json") {
			return errors.New("injected: meta.json cannot be replaced")
		}
		return nil
	})
	if _, err := deleteTopic(t, cn, "orders", 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, broken+" stops the deleted topic", func() bool {
		cur, _ := tc.nodes[broken].TopicIncarnation("orders")
		return cur == 0 && len(tc.nodes[broken].Metadata([]string{"orders"})) == 0
	})
	if files := filesUnder(tc.fs, "/"+broken+"/topics/orders"); len(files) == 0 {
		t.Fatalf("%s removed the topic's files before meta.json said it was deleted", broken)
	}
	tc.stop(broken)
	tc.fs.SetInjector(nil)
	tc.start(broken)
	eventually(t, broken+" applies the delete again and removes the files", func() bool {
		cur, del := tc.nodes[broken].TopicIncarnation("orders")
		return cur == 0 && del == 1 && len(filesUnder(tc.fs, "/"+broken+"/topics/orders")) == 0
	})
}

// Repair rebuilds a damaged topics.json from the directories with each
// name's latest incarnation: a re-created topic comes back as itself, not
// as the deleted incarnation whose emptied directory is still listed (a
// crash between removing its files and its directory leaves it).
func TestRepairRebuildsTheLatestIncarnation(t *testing.T) {
	h := newHarness(t)
	h.declare("orders", 1)
	h.mustPublish(&wire.Pub{Topic: "orders", Partition: 0, Value: []byte("old")})
	if _, err := deleteTopic(t, h.node, "orders", 0); err != nil {
		t.Fatal(err)
	}
	h.declare("orders", 1)
	h.mustPublish(&wire.Pub{Topic: "orders", Partition: 0, Value: []byte("new")})
	h.node.Close()
	if err := h.fs.MkdirAll("/data/topics/orders/0"); err != nil {
		t.Fatal(err)
	}
	if names, _ := h.fs.List("/data/topics"); !slices.Contains(names, "orders") {
		t.Fatalf("topics/ lists %v: the deleted incarnation's directory is not there to mislead the repair", names)
	}
	for _, f := range []string{"/data/topics.json", "/data/topics.json" + storage.CopySuffix} { // both: else the copy serves
		if err := h.fs.FlipBit(f, 12, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
		t.Fatal(err)
	}
	h.open()
	md := h.node.Metadata([]string{"orders"})
	if len(md) != 1 || md[0].Incarnation != 2 {
		t.Fatalf("after repair: %+v", md)
	}
	if es, err := h.node.Read("orders", 0, 1, 10); err != nil || len(es) != 1 || string(es[0].Record.Value) != "new" {
		t.Fatalf("after repair orders holds %v, %v", es, err)
	}
}

// A group member holding the partitions of a deleted topic holds none
// after the delete (GroupsOwnNoDeletedPartition on the node's applied
// state, which groups.json keeps across a restart); the topic declared
// again with another partition count is assigned to it afresh.
func TestDeleteTakesTheTopicFromItsGroup(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	box := &noticeBox{}
	h.join("a", 1, box)
	held := func() []uint32 {
		var out []uint32
		for _, g := range h.n.GroupStates() {
			for p, o := range g.Owners {
				if o.Member == "a" {
					out = append(out, p.Index)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	if got := held(); len(got) != 2 {
		t.Fatalf("a holds %v before the delete, want both partitions", got)
	}
	if _, err := deleteTopic(t, h.n, "t", 0); err != nil {
		t.Fatal(err)
	}
	if got := held(); len(got) != 0 {
		t.Fatalf("a holds %v of the deleted topic", got)
	}
	h.n.Close()
	h.open()
	if got := held(); len(got) != 0 {
		t.Fatalf("after a restart a holds %v of the deleted topic", got)
	}
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	if got := held(); len(got) != 3 {
		t.Fatalf("a holds %v of the re-declared topic, want its 3 partitions", got)
	}
}

// A publish bound to a topic's incarnation (a scheduled message) is
// refused NOT_FOUND by the partition's leader once that incarnation was
// deleted, even though the name lives again — also when it is forwarded
// from another node (PEER_PUBLISH carries the incarnation); bound to the
// current incarnation, or to none, it lands.
func TestClusterPublishBoundToADeletedIncarnation(t *testing.T) {
	tc := newTestCluster(t, 3)
	cfg := wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3}
	tc.declare("n1", cfg)
	_, cn := tc.coordinatorOf()
	if _, err := deleteTopic(t, cn, "t", 0); err != nil {
		t.Fatal(err)
	}
	tc.declare("n1", cfg)
	leader, _ := tc.publishAnywhere(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("first")})
	// publishVia retries while leadership moves (NOT_LEADER, UNAVAILABLE:
	// the new incarnation's partition may still be electing or handing
	// itself to its preferred leader), as the scheduler does.
	publishVia := func(id string, incarnation uint64) *wire.Error {
		var last *wire.Error
		deadline := time.Now().Add(waitMax)
		for attempt := 0; time.Now().Before(deadline); attempt++ {
			ch := make(chan *wire.Error, 1)
			tc.nodes[id].publishToLeader(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("x")}, incarnation, attempt,
				func(_ wire.PubOK, err *wire.Error) { ch <- err })
			select {
			case last = <-ch:
			case <-time.After(waitMax):
				t.Fatal("publish: no reply")
			}
			if last == nil || !last.Code.Retryable() {
				return last
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("publish via %s: still %v", id, last)
		return nil
	}
	for id := range tc.nodes {
		via := "at the leader"
		if id != leader {
			via = "forwarded"
		}
		eventually(t, "incarnation 2 known on "+id, func() bool {
			md := tc.nodes[id].Metadata([]string{"t"})
			return len(md) == 1 && md[0].Incarnation == 2
		})
		wantWireCode(t, "a publish bound to incarnation 1 "+via, publishVia(id, 1), wire.CodeNotFound, "incarnation 1 was deleted")
		for _, inc := range []uint64{2, 0} {
			if err := publishVia(id, inc); err != nil {
				t.Fatalf("a publish bound to incarnation %d %s: %v", inc, via, err)
			}
		}
	}
}
