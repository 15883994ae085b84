package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// eventually waits until cond holds, failing the test with what after
// waitMax.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitMax)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// groupOf returns the running group of topic on n.
func groupOf(n *Node, group, topic string) *groupRunner {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.groups[groupKey{group: group, topic: topic}]
}

// deadLetters returns the dead letters in partition 0 of topic on n that
// copy seq of the group's partition 0, reading its whole visible log.
func deadLetters(t *testing.T, n *Node, topic string, seq uint64) []storage.Entry {
	t.Helper()
	var out []storage.Entry
	for from := uint64(1); ; {
		es, err := n.Read(topic, 0, from, 100)
		if err != nil {
			t.Fatalf("read %s: %v", topic, err)
		}
		if len(es) == 0 {
			return out
		}
		for _, e := range es {
			for _, h := range e.Record.Headers {
				if h.Key == "nereus-dlq-seq" && string(h.Value) == strconv.FormatUint(seq, 10) {
					out = append(out, e)
				}
			}
		}
		from = es[len(es)-1].Seq + 1
	}
}

// Issue 11, item 5. The dead letter's copy became durable (and visible)
// but the node stopped before the group heard the PUB_OK. The group had
// recorded the message as dead before publishing it, so after the restart
// the message is not delivered again (it was, with count 1): its dead
// letter is published again, deduplicated by the producer identity, and
// the message leaves the group. Manual mode makes the interleaving exact.
func TestDeadLetterRecordedBeforeItsCopyLeaves(t *testing.T) {
	fs := vfs.NewMem()
	var now atomic.Int64
	now.Store(1_000_000)
	open := func() *Node {
		n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: fs, Clock: testClock{nowMs: &now}}, Manual: true,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := open()
	defer func() { n.Close() }()
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	n.Publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("poison")}, func(_ wire.PubOK, err *wire.Error) {
		if err != nil {
			t.Errorf("publish: %v", err)
		}
	})
	s := newSink()
	sub, err := n.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000, MaxDeliver: 1}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(10)
	n.Step()
	if s.count() != 1 {
		t.Fatalf("%d deliveries, want 1", s.count())
	}
	// The ack wait passes. Only the group runs: it records the message as
	// dead and queues the dead letter's publish.
	now.Add(1001)
	dlq := dlqTopicName("g", "t")
	if !groupOf(n, "g", "t").step(now.Load()) {
		t.Fatal("the group did not run")
	}
	dt, err := n.topic(dlq)
	if err != nil {
		t.Fatalf("no dead-letter topic: %v", err)
	}
	// Only the dead-letter partition runs: the copy commits, and the node
	// stops before the group collects its PUB_OK.
	dt.partitions[0].step(now.Load())
	if got := len(deadLetters(t, n, dlq, 1)); got != 1 {
		t.Fatalf("%d dead letters before the restart, want 1", got)
	}
	fs.CrashClean()
	n.Close()

	n = open()
	s2 := newSink()
	sub2, err := n.Subscribe("t", "g", GroupOptions{}, s2)
	if err != nil {
		t.Fatal(err)
	}
	sub2.AddCredit(10)
	n.Step()
	if s2.count() != 0 {
		t.Fatalf("the dead-lettered message was delivered again after the restart: %+v", s2.msgs[0])
	}
	if got := len(deadLetters(t, n, dlq, 1)); got != 1 {
		t.Fatalf("%d dead letters after the restart, want exactly 1", got)
	}
	if floor := groupOf(n, "g", "t").floors[0].Load(); floor != 2 {
		t.Fatalf("ack floor %d after the dead letter, want 2", floor)
	}
}

// Delivery counts are durable: after a restart a message continues its
// count, so MaxDeliver holds, also when the ledger was compacted into a
// snapshot in between (the snapshot carries the counts).
func TestDeliveryCountsSurviveRestart(t *testing.T) {
	for _, compact := range []bool{false, true} {
		name := "ledger"
		if compact {
			name = "snapshot"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.declare("t", 1)
			h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("poison")})
			s := newSink()
			sub, err := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000, MaxDeliver: 3}, s)
			if err != nil {
				t.Fatal(err)
			}
			sub.AddCredit(100)
			s.waitFor(t, 1)
			if compact {
				groupOf(h.node, "g", "t").ledgerCompactBytes.Store(1)
			}
			for want := uint32(2); want <= 3; want++ {
				h.nowMs.Add(1001)
				h.sync("t", "g")
				if m := s.waitFor(t, int(want))[want-1]; m.DeliveryCount != want {
					t.Fatalf("delivery %d has count %d", want, m.DeliveryCount)
				}
			}
			if compact {
				b, err := storage.ReadFileAtomic(h.fs, "/data/groups/g/t/"+ledgerSnapshotFile)
				if err != nil {
					t.Fatalf("no ledger snapshot: %v", err)
				}
				snap, err := decodeLedgerSnapshot(b)
				if err != nil || len(snap.counts) != 1 || len(snap.counts[0]) != 1 || snap.counts[0][0].Count != 2 {
					t.Fatalf("snapshot %+v (%v), want the count 2 of seq 1", snap, err)
				}
			}
			// Delivery 3 is in flight when the node stops: it is not
			// counted, so it is delivery 3 again, and the last.
			h.restart()
			s2 := newSink()
			sub2, _ := h.node.Subscribe("t", "g", GroupOptions{}, s2)
			sub2.AddCredit(100)
			if m := s2.waitFor(t, 1)[0]; m.DeliveryCount != 3 {
				t.Fatalf("after the restart delivered with count %d, want 3", m.DeliveryCount)
			}
			h.nowMs.Add(1001)
			h.sync("t", "g")
			dlq := dlqTopicName("g", "t")
			eventually(t, "the dead letter", func() bool {
				h.sync("t", "g")
				return len(h.node.Metadata([]string{dlq})) == 1 && len(deadLetters(t, h.node, dlq, 1)) == 1
			})
			if n := s2.count(); n != 1 {
				t.Fatalf("%d deliveries after the restart, want 1 (MaxDeliver 3)", n)
			}
		})
	}
}

// clusterLeaderOf returns the node that leads partition 0 of topic, once
// one does.
func (tc *testCluster) clusterLeaderOf(topic string) string {
	tc.t.Helper()
	var leader string
	eventually(tc.t, "a leader of "+topic, func() bool {
		for id, n := range tc.nodes {
			if t, err := n.topic(topic); err == nil && t.partitions[0].replica() != nil &&
				t.partitions[0].replica().repl.Status().Role == replica.Leader {
				leader = id
				return true
			}
		}
		return false
	})
	return leader
}

// nackOn NACKs m for redelivery now and waits for the answer (which
// follows the record of its delivery count).
func nackOn(t *testing.T, n *Node, topic, group string, m *wire.Msg) {
	t.Helper()
	done := make(chan *wire.Error, 1)
	n.Nack(topic, group, []wire.AckEntry{{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID}}, 0,
		func(res []wire.Code, err *wire.Error) {
			if err == nil && res[0] != wire.CodeOK {
				err = wire.Errorf(res[0], "nack result")
			}
			done <- err
		})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("nack: %v", err)
		}
	case <-time.After(waitMax):
		t.Fatal("nack: no reply")
	}
}

// subscribeWith subscribes to group on n (retrying while n is not yet the
// coordinator) with opts and credit 10.
func subscribeWith(t *testing.T, n *Node, topic, group string, opts GroupOptions) *sink {
	t.Helper()
	s := newSink()
	eventually(t, "subscribed to "+group, func() bool {
		sub, err := n.Subscribe(topic, group, opts, s)
		if err == nil {
			sub.AddCredit(10)
		}
		return err == nil
	})
	return s
}

// Delivery counts are in the replicated ack log: a new coordinator
// continues a message's count after a failover (it started again at 1),
// so MaxDeliver holds, and the dead letter arrives once.
func TestClusterDeliveryCountsSurviveCoordinatorFailover(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "q", Partitions: 1, Replicas: 3})
	poison := &wire.Pub{Topic: "q", Partition: 0, ProducerID: 5, ProducerSeq: 1, Value: []byte("poison")}
	coordinator, _ := tc.publishAnywhere(poison)
	opts := GroupOptions{AckWaitMs: 60_000, MaxDeliver: 2}
	s := subscribeWith(t, tc.nodes[coordinator], "q", "g", opts)
	first := s.waitFor(t, 1)[0]
	nackOn(t, tc.nodes[coordinator], "q", "g", first)
	if m := s.waitFor(t, 2)[1]; m.DeliveryCount != 2 {
		t.Fatalf("redelivery has count %d", m.DeliveryCount)
	}
	// Delivery 2 is in flight when the coordinator stops: the new one
	// knows of delivery 1 from the log and sends delivery 2 again.
	tc.stop(coordinator)
	coordinator, _ = tc.publishAnywhere(poison) // a duplicate: finds the new leader
	s2 := subscribeWith(t, tc.nodes[coordinator], "q", "g", opts)
	m := s2.waitFor(t, 1)[0]
	if m.Seq != first.Seq || m.DeliveryCount != 2 {
		t.Fatalf("the new coordinator delivered %+v, want seq %d as delivery 2", m, first.Seq)
	}
	nackOn(t, tc.nodes[coordinator], "q", "g", m) // delivery 2 of 2: dead
	dlq := dlqTopicName("g", "q")
	dlqLeader := tc.clusterLeaderOf(dlq)
	g := groupOf(tc.nodes[coordinator], "g", "q")
	eventually(t, "the group records the dead letter", func() bool { return g.floors[0].Load() > first.Seq })
	if got := deadLetters(t, tc.nodes[dlqLeader], dlq, first.Seq); len(got) != 1 || string(got[0].Record.Value) != "poison" {
		t.Fatalf("dead letters %+v, want one copy of the poison message", got)
	}
	if n := s2.count(); n != 1 {
		t.Fatalf("%d deliveries by the new coordinator, want 1", n)
	}
}

// DeadLetterAsDurable: the dead-letter topic a group declares for a
// topic has that topic's replication and ack policy, so a letter that
// leaves the topic is kept as it was (it was declared with the defaults:
// three replicas acking at a quorum, whatever the topic's).
func TestClusterDeadLetterTopicIsAsDurableAsItsTopic(t *testing.T) {
	tc := newTestCluster(t, 3)
	for i, cfg := range []wire.TopicConfig{{Replicas: 3, Ack: wire.AckAll}, {Replicas: 1, Ack: wire.AckQuorum}} {
		cfg.Name, cfg.Partitions = fmt.Sprintf("q%d", i), 1
		tc.declare("n1", cfg)
		poison := &wire.Pub{Topic: cfg.Name, Partition: 0, ProducerID: 5, ProducerSeq: 1, Value: []byte("poison")}
		coordinator, _ := tc.publishAnywhere(poison)
		s := subscribeWith(t, tc.nodes[coordinator], cfg.Name, "g", GroupOptions{AckWaitMs: 60_000, MaxDeliver: 1})
		nackOn(t, tc.nodes[coordinator], cfg.Name, "g", s.waitFor(t, 1)[0])
		dlq := dlqTopicName("g", cfg.Name)
		tc.waitKnown(dlq)
		got := tc.nodes["n1"].Metadata([]string{dlq})[0].Config
		if got.Replicas != cfg.Replicas || got.Ack != cfg.Ack {
			t.Fatalf("%s of a topic of %d replicas acking %v: %d replicas acking %v", dlq, cfg.Replicas, cfg.Ack, got.Replicas, got.Ack)
		}
	}
}

// Issue 11, item 6. In a cluster the dead letter goes to the leader of the
// dead-letter topic's partition, also when that is not the group's
// coordinator — whether the coordinator holds a follower replica of it or
// none (both answered NOT_LEADER, retried forever) — and arrives once.
func TestClusterDeadLetterGoesToTheDeadLetterTopicsLeader(t *testing.T) {
	for _, replicas := range []uint8{3, 1} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			tc := newTestCluster(t, 3)
			tc.declare("n1", wire.TopicConfig{Name: "q", Partitions: 1, Replicas: 3})
			coordinator, ok := tc.publishAnywhere(&wire.Pub{Topic: "q", Partition: 0, Value: []byte("poison")})
			// Name groups until one's dead-letter topic is led by another
			// node; a one-replica filler topic shifts the next placement.
			var group, dlqLeader string
			for i := 0; group == ""; i++ {
				if i == 10 {
					t.Fatalf("every dead-letter topic is led by the coordinator %s", coordinator)
				}
				name := fmt.Sprint("g", i)
				tc.declare(coordinator, wire.TopicConfig{Name: dlqTopicName(name, "q"), Partitions: 1, Replicas: replicas})
				if leader := tc.clusterLeaderOf(dlqTopicName(name, "q")); leader != coordinator {
					group, dlqLeader = name, leader
					break
				}
				tc.declare(coordinator, wire.TopicConfig{Name: fmt.Sprint("filler", i), Partitions: 1, Replicas: 1})
			}
			dlq := dlqTopicName(group, "q")
			dt, _ := tc.nodes[coordinator].topic(dlq)
			if hosted := dt.partitions[0].replica() != nil; hosted != (replicas == 3) {
				t.Fatalf("the coordinator hosts %s: %v, with %d replicas", dlq, hosted, replicas)
			}
			s := subscribeWith(t, tc.nodes[coordinator], "q", group, GroupOptions{AckWaitMs: 60_000, MaxDeliver: 1})
			nackOn(t, tc.nodes[coordinator], "q", group, s.waitFor(t, 1)[0]) // delivery 1 of 1: dead
			g := groupOf(tc.nodes[coordinator], group, "q")
			eventually(t, "the group records the dead letter", func() bool { return g.floors[0].Load() > ok.Seq })
			if got := deadLetters(t, tc.nodes[dlqLeader], dlq, ok.Seq); len(got) != 1 || string(got[0].Record.Value) != "poison" {
				t.Fatalf("dead letters on %s: %+v, want one copy of the poison message", dlqLeader, got)
			}
			if n := s.count(); n != 1 {
				t.Fatalf("%d deliveries, want 1 (MaxDeliver 1)", n)
			}
		})
	}
}

// A dead letter that cannot be published is retried with exponential
// backoff, and warned about once, not every second forever. (A record at
// the size limit cannot carry the dead-letter headers: INVALID_ARGUMENT.)
func TestDeadLetterRetriesBackOffAndWarnOnce(t *testing.T) {
	h, logs := openDebugHarness(t, nil)
	h.declare("t", 1)
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: make([]byte, 1000)})
	s := newSink()
	sub, _ := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000, MaxDeliver: 1}, s)
	sub.AddCredit(10)
	s.waitFor(t, 1)
	h.nowMs.Add(1000)
	failures := func() (warned, retried int) {
		h.sync("t", "g") // the failed attempt is collected in the next iteration
		h.sync("t", "g")
		return logs.count("level=WARN msg=\"dead-letter publish failed"), logs.count("dead-letter publish failed again")
	}
	if w, r := failures(); w != 1 || r != 0 {
		t.Fatalf("after the first attempt: %d warnings, %d retries logged", w, r)
	}
	for i, waitMs := range []int64{100, 200, 400, 800} {
		h.nowMs.Add(waitMs - 1)
		if _, r := failures(); r != i {
			t.Fatalf("retry %d came before its backoff of %d ms", i+1, waitMs)
		}
		h.nowMs.Add(1)
		if w, r := failures(); w != 1 || r != i+1 {
			t.Fatalf("after retry %d: %d warnings, %d retries logged", i+1, w, r)
		}
	}
	if s.count() != 1 {
		t.Fatalf("%d deliveries of a message waiting for its dead letter", s.count())
	}
	if got := dlqBackoffMs(100); got != dlqRetryMaxMs {
		t.Fatalf("backoff after 100 failures %d ms, want the cap %d", got, dlqRetryMaxMs)
	}
}

// openDebugHarness opens a single node whose records are at most 1000
// bytes (one at the limit cannot carry the dead-letter headers: its dead
// letter fails INVALID_ARGUMENT at every attempt), logging at debug level
// into the buffer returned; tune, when set, adjusts the config.
func openDebugHarness(t *testing.T, tune func(*Config)) (*harness, *logBuffer) {
	logs := &logBuffer{}
	h := &harness{t: t, fs: vfs.NewMem()}
	h.nowMs.Store(1_000_000)
	cfg := Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.nowMs}}, RecordBytesMax: 1000,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if tune != nil {
		tune(&cfg)
	}
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.node = n
	t.Cleanup(func() { h.node.Close() })
	return h, logs
}

// dlqLog keeps the dead-letter log lines of a cluster (message and error).
type dlqLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *dlqLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *dlqLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *dlqLog) WithGroup(string) slog.Handler            { return l }
func (l *dlqLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "dead-letter") {
		return nil
	}
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			line += " err=" + a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	return nil
}

func (l *dlqLog) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

// In a cluster a dead letter is published only once its record committed
// in partition 0's log. While the coordinator has no quorum, the record
// fails and is written again after a backoff — the dead letter is not
// published, even to a dead-letter topic the coordinator could write alone
// (one replica, on the coordinator) — and once the quorum is back the
// record commits and the dead letter arrives, once.
func TestClusterDeadLetterWaitsForItsRecordToCommit(t *testing.T) {
	logs := &dlqLog{}
	tc := newTestClusterWith(t, 3, func(c *Config) { c.Logger = slog.New(logs) })
	tc.declare("n1", wire.TopicConfig{Name: "q", Partitions: 1, Replicas: 3})
	coordinator, ok := tc.publishAnywhere(&wire.Pub{Topic: "q", Partition: 0, Value: []byte("poison")})
	var group string
	for i := 0; group == ""; i++ {
		if i == 10 {
			t.Fatalf("no dead-letter topic placed on the coordinator %s", coordinator)
		}
		name := fmt.Sprint("g", i)
		tc.declare(coordinator, wire.TopicConfig{Name: dlqTopicName(name, "q"), Partitions: 1, Replicas: 1})
		if tc.clusterLeaderOf(dlqTopicName(name, "q")) == coordinator {
			group = name
			break
		}
	}
	dlq := dlqTopicName(group, "q")
	s := subscribeWith(t, tc.nodes[coordinator], "q", group, GroupOptions{AckWaitMs: 60_000, MaxDeliver: 1})
	m := s.waitFor(t, 1)[0]
	var others []string
	for id := range tc.nodes {
		if id != coordinator {
			others = append(others, id)
		}
	}
	for _, id := range others {
		tc.stop(id)
	}
	q, _ := tc.nodes[coordinator].topic("q")
	eventually(t, "the coordinator is READ_ONLY_DEGRADED", func() bool { return q.partitions[0].replica().repl.Status().ReadOnly })
	tc.nodes[coordinator].Nack("q", group, []wire.AckEntry{{Partition: 0, Seq: m.Seq, DeliveryID: m.DeliveryID}}, 0,
		func([]wire.Code, *wire.Error) {}) // answered QUORUM_LOST: the count cannot commit
	// Two attempts at the record fail (the second after its backoff);
	// the dead letter has not been published meanwhile.
	eventually(t, "the dead letter's record fails twice", func() bool {
		return logs.count("failed again err=record not committed") > 0
	})
	if got := deadLetters(t, tc.nodes[coordinator], dlq, ok.Seq); len(got) != 0 {
		t.Fatalf("dead letter published before its record committed: %+v", got)
	}
	// One follower back: the coordinator keeps its office and the record
	// commits at its next attempt.
	tc.start(others[0])
	g := groupOf(tc.nodes[coordinator], group, "q")
	eventually(t, "the group records the dead letter", func() bool { return g.floors[0].Load() > ok.Seq })
	if got := deadLetters(t, tc.nodes[coordinator], dlq, ok.Seq); len(got) != 1 || string(got[0].Record.Value) != "poison" {
		t.Fatalf("dead letters %+v, want one copy of the poison message", got)
	}
	if n := s.count(); n != 1 {
		t.Fatalf("%d deliveries, want 1 (MaxDeliver 1)", n)
	}
}

// TestGroupsSharingADeadLetterTopicKeepEachOthersDeadLetters: group "a.b"
// of topic "c" and group "a" of topic "b.c" both dead-letter into
// dlq.a.b.c; their dead letters at the same (partition, seq) are two
// records, not one deduplicated away.
func TestGroupsSharingADeadLetterTopicKeepEachOthersDeadLetters(t *testing.T) {
	h := newHarness(t)
	pairs := [][2]string{{"a.b", "c"}, {"a", "b.c"}}
	dlq := dlqTopicName(pairs[0][0], pairs[0][1])
	if other := dlqTopicName(pairs[1][0], pairs[1][1]); other != dlq {
		t.Fatalf("the pairs do not share a dead-letter topic: %s, %s", dlq, other)
	}
	for _, p := range pairs {
		group, topic := p[0], p[1]
		h.declare(topic, 1)
		h.mustPublish(&wire.Pub{Topic: topic, Partition: 0, Value: []byte("poison of " + group)})
		s := newSink()
		sub, err := h.node.Subscribe(topic, group, GroupOptions{AckWaitMs: 1000, MaxDeliver: 1}, s)
		if err != nil {
			t.Fatal(err)
		}
		sub.AddCredit(1)
		s.waitFor(t, 1)
		h.nowMs.Add(1001) // the only delivery expires: dead
		h.sync(topic, group)
	}
	deadline := time.Now().Add(waitMax)
	for {
		meta := h.node.Metadata([]string{dlq})
		if len(meta) == 1 && meta[0].Partitions[0].CommitSeq == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead-letter topic %s: %+v; want both dead letters", dlq, meta)
		}
		for _, p := range pairs {
			h.sync(p[1], p[0])
		}
	}
}
