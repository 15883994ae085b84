package node

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

const ledgerTestGroupDir = "/data/groups/g/t"

// setLedgerCompactBytes lowers the compaction threshold of a running group.
func (h *harness) setLedgerCompactBytes(topic, group string, n int64) {
	h.t.Helper()
	h.node.mu.RLock()
	g := h.node.groups[groupKey{group: group, topic: topic}]
	h.node.mu.RUnlock()
	if g == nil {
		h.t.Fatalf("no group %s on %s", group, topic)
	}
	g.ledgerCompactBytes.Store(n)
}

// tryAck acks entries and returns the per-entry codes or the request error,
// without failing the test on an error reply.
func (h *harness) tryAck(topic, group string, entries []wire.AckEntry) ([]wire.Code, *wire.Error) {
	h.t.Helper()
	type res struct {
		codes []wire.Code
		err   *wire.Error
	}
	ch := make(chan res, 1)
	h.node.Ack(topic, group, entries, func(c []wire.Code, err *wire.Error) { ch <- res{c, err} })
	select {
	case r := <-ch:
		return r.codes, r.err
	case <-time.After(waitMax):
		h.t.Fatal("ack: no reply")
		return nil, nil
	}
}

// ledgerFiles returns the size of every file in the group's ledger
// directories, by path relative to the group dir.
func ledgerFiles(t *testing.T, fsys *vfs.MemFS) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	dirs, err := fsys.List(ledgerTestGroupDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, ok := parseLedgerDirName(d); !ok {
			continue
		}
		names, err := fsys.List(path.Join(ledgerTestGroupDir, d))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			size, err := fsys.Stat(path.Join(ledgerTestGroupDir, d, n))
			if err != nil {
				t.Fatal(err)
			}
			out[d+"/"+n] = size
		}
	}
	return out
}

func snapshotGen(t *testing.T, fsys vfs.FS) uint64 {
	t.Helper()
	b, err := storage.ReadFileAtomic(fsys, path.Join(ledgerTestGroupDir, ledgerSnapshotFile))
	if err != nil {
		t.Fatalf("read snapshot: %v", err)
	}
	s, err := decodeLedgerSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	return s.gen
}

// kill models kill -9 and restart: from now on no disk operation of the
// node succeeds (the process is gone, though its goroutines still unwind),
// then the disk loses everything unsynced and a new node opens on it.
// (Crashing the MemFS under a node that keeps running would let it write
// on after the crash, which no real process does.)
func (h *harness) kill() {
	h.crash()
	h.open()
}

// crash is kill without the restart: the node is gone, h.node closed.
func (h *harness) crash() {
	h.fs.SetInjector(func(vfs.Op, string) error { return errInjected })
	h.node.Close()
	h.fs.SetInjector(nil)
	h.fs.CrashClean()
}

// position is a (partition, seq) pair.
type position struct {
	partition uint32
	seq       uint64
}

// publishSpread publishes perPartition records to each partition of t.
func (h *harness) publishSpread(topic string, partitions uint32, perPartition int) {
	h.t.Helper()
	for i := 0; i < perPartition; i++ {
		for p := uint32(0); p < partitions; p++ {
			h.mustPublish(&wire.Pub{Topic: topic, Partition: int32(p), Value: []byte(fmt.Sprint(p, "/", i))})
		}
	}
}

// deliveredAfterRestart subscribes a fresh member and returns every
// position delivered to it once the group has run two iterations, and the
// messages.
func (h *harness) deliveredAfterRestart(want int) (map[position]bool, []*wire.Msg) {
	h.t.Helper()
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{}, s)
	if err != nil {
		h.t.Fatal(err)
	}
	sub.AddCredit(10_000)
	s.waitFor(h.t, want)
	h.sync("t", "g")
	got := map[position]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.msgs {
		k := position{m.Partition, m.Seq}
		if got[k] {
			h.t.Fatalf("%v delivered twice after restart", k)
		}
		got[k] = true
	}
	return got, slices.Clone(s.msgs)
}

func TestLedgerCompactionStartsNewGenerationAndRestores(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 2)
	h.publishSpread("t", 2, 200)
	s := newSink()
	sub, _ := h.node.Subscribe("t", "g", GroupOptions{}, s)
	sub.AddCredit(1000)
	msgs := s.waitFor(t, 400)
	// Ack one at a time (one ledger append each), leaving seq 7 and every
	// seq above 190 unacked, with the default threshold: no compaction.
	unacked := map[position]bool{}
	for _, m := range msgs {
		if m.Seq == 7 || m.Seq > 190 {
			unacked[position{m.Partition, m.Seq}] = true
			continue
		}
		h.ack("t", "g", false, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	}
	before := ledgerFiles(t, h.fs)
	var beforeBytes int64
	for _, n := range before {
		beforeBytes += n
	}
	if len(before) == 0 || beforeBytes < 380*ledgerEntryBytes {
		t.Fatalf("ledger before compaction: %v", before)
	}
	// Lower the threshold: the next flush compacts.
	h.setLedgerCompactBytes("t", "g", 1024)
	m := msgs[len(msgs)-1]
	h.ack("t", "g", false, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	delete(unacked, position{m.Partition, m.Seq})
	h.sync("t", "g") // compaction runs after the ACK_OK
	if gen := snapshotGen(t, h.fs); gen != 1 {
		t.Fatalf("snapshot generation %d, want 1", gen)
	}
	after := ledgerFiles(t, h.fs)
	var afterBytes int64
	for name, n := range after {
		if !strings.HasPrefix(name, "ledger-1/") {
			t.Errorf("file %s (%d bytes) of an old generation left after compaction", name, n)
		}
		afterBytes += n
	}
	if afterBytes >= beforeBytes/10 {
		t.Fatalf("ledger %d bytes after compaction, %d before", afterBytes, beforeBytes)
	}
	t.Logf("ledger: %d bytes in %d files before compaction, %d bytes after", beforeBytes, len(before), afterBytes)
	// A restart restores the cursors from the snapshot: exactly the unacked
	// are delivered again.
	h.kill()
	got, _ := h.deliveredAfterRestart(len(unacked))
	if !maps.Equal(got, unacked) {
		t.Fatalf("after restart delivered %v, want %v", keys(got), keys(unacked))
	}
}

func keys(m map[position]bool) []position {
	out := make([]position, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b position) int {
		if a.partition != b.partition {
			return int(a.partition) - int(b.partition)
		}
		return int(a.seq) - int(b.seq)
	})
	return out
}

// faultMode is what happens at the chosen disk operation.
type faultMode uint8

const (
	// killBefore: that operation and every later one fail (the process
	// is dead: nothing more reaches the disk, like kill -9 just before it),
	// then the disk loses what was not synced and the node reopens.
	killBefore faultMode = iota
	// failThenCrash: only that operation fails; the node carries on, then
	// dies and loses what was not synced.
	failThenCrash
	// failThenRestart: only that operation fails; the node carries on and
	// is closed and reopened cleanly (nothing is lost: what was written but
	// not synced, such as an unsynced rename, is what recovery sees).
	failThenRestart
	// failRepeatThenRestart: that operation fails, and so does every later
	// one with the same op and file, until a clean restart (a persistent
	// fault, so that no later success papers over the first failure).
	failRepeatThenRestart
)

func (m faultMode) String() string {
	return [...]string{"kill", "fail+crash", "fail+restart", "fail-repeat+restart"}[m]
}

// crashSwitch records the disk operations under the groups directory and
// fires at the operation numbered at.
type crashSwitch struct {
	mu   sync.Mutex
	at   int // -1: never
	mode faultMode
	ops  []string
	dead bool
	// repeat is the op and file that keep failing (failRepeatThenRestart).
	repeat string
}

var errInjected = errors.New("injected")

func isMutating(op vfs.Op) bool {
	switch op {
	case vfs.OpCreate, vfs.OpWrite, vfs.OpSync, vfs.OpSyncDir, vfs.OpRename, vfs.OpRemove, vfs.OpMkdirAll, vfs.OpTruncate, vfs.OpAllocate:
		return true
	}
	return false
}

func (c *crashSwitch) inject(op vfs.Op, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errInjected
	}
	if !isMutating(op) || !strings.HasPrefix(name, "/data/groups/") {
		return nil
	}
	opName := op.String() + " " + strings.TrimPrefix(name, ledgerTestGroupDir+"/")
	c.ops = append(c.ops, opName)
	if c.repeat == opName {
		return errInjected
	}
	if len(c.ops)-1 != c.at {
		return nil
	}
	c.dead = c.mode == killBefore
	if c.mode == failRepeatThenRestart {
		c.repeat = opName
	}
	return errInjected
}

// runCompactionCrash: 2 partitions × 15 records; acks A (seqs 1-5 but 2)
// compact to generation 1; the switch is armed; acks B (6-10 but 8) flush
// and compact to generation 2, where the switch fires at operation at;
// acks C (11-13) follow; then the node stops as mode says and reopens.
// Every ack confirmed with OK must stay done; every seq never acked must be
// delivered again. It returns the operations recorded after arming.
func runCompactionCrash(t *testing.T, at int, mode faultMode) []string {
	h := newHarness(t)
	h.declare("t", 2)
	h.publishSpread("t", 2, 15)
	s := newSink()
	sub, _ := h.node.Subscribe("t", "g", GroupOptions{}, s)
	sub.AddCredit(1000)
	msgs := s.waitFor(t, 30)
	h.setLedgerCompactBytes("t", "g", 1)
	confirmed, neverAcked := map[position]bool{}, map[position]bool{}
	ackSeqs := func(lo, hi uint64, skip uint64) {
		var entries []wire.AckEntry
		for _, m := range msgs {
			if m.Seq >= lo && m.Seq <= hi && m.Seq != skip {
				entries = append(entries, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
			}
		}
		codes, err := h.tryAck("t", "g", entries)
		for i, e := range entries {
			if err == nil && codes[i] == wire.CodeOK {
				confirmed[position{e.Partition, e.Seq}] = true
			}
		}
	}
	ackSeqs(1, 5, 2)
	h.sync("t", "g") // compaction runs after the ACK_OK
	if gen := snapshotGen(t, h.fs); gen != 1 {
		t.Fatalf("generation %d after the first compaction", gen)
	}
	sw := &crashSwitch{at: at, mode: mode}
	h.fs.SetInjector(sw.inject)
	ackSeqs(6, 10, 8)
	ackSeqs(11, 13, 0)
	ackSeqs(1, 0, 0) // two empty acks: the group finished its iterations
	ackSeqs(1, 0, 0)
	sw.mu.Lock()
	ops := slices.Clone(sw.ops)
	crash := mode == killBefore || mode == failThenCrash
	if crash {
		sw.dead = true // nothing more reaches the disk
	}
	sw.mu.Unlock()
	h.node.Close()
	h.fs.SetInjector(nil)
	if crash {
		h.fs.CrashClean()
	}
	h.open()
	for _, m := range msgs {
		k := position{m.Partition, m.Seq}
		if m.Seq == 2 || m.Seq == 8 || m.Seq >= 14 {
			neverAcked[k] = true
		}
	}
	got, again := h.deliveredAfterRestart(len(neverAcked))
	for k := range confirmed {
		if got[k] {
			t.Errorf("crash at op %d (%s): %v redelivered after its ACK_OK", at, opName(ops, at), k)
		}
	}
	for k := range neverAcked {
		if !got[k] {
			t.Errorf("crash at op %d (%s): never-acked %v not redelivered", at, opName(ops, at), k)
		}
	}
	if len(confirmed) < 8 {
		t.Errorf("only %d acks confirmed before the switch fired", len(confirmed))
	}
	// The recovered group keeps working: it acks and compacts again, and
	// after one more crash nothing is left to deliver.
	h.setLedgerCompactBytes("t", "g", 1)
	for _, m := range again {
		h.ack("t", "g", false, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	}
	h.kill()
	if rest, _ := h.deliveredAfterRestart(0); len(rest) != 0 {
		t.Errorf("crash at op %d (%s): after acking everything, %v delivered again", at, opName(ops, at), keys(rest))
	}
	return ops
}

func opName(ops []string, at int) string {
	if at < len(ops) {
		return ops[at]
	}
	return "none"
}

// TestLedgerCompactionCrashAtEveryDiskOp kills the node before each disk
// operation of two flush-and-compact rounds in turn; separately, it fails
// just that operation, lets the node carry on, then crashes it or restarts
// it cleanly.
func TestLedgerCompactionCrashAtEveryDiskOp(t *testing.T) {
	var ops []string
	t.Run("no crash", func(t *testing.T) { ops = runCompactionCrash(t, -1, killBefore) })
	// The armed window holds acks B's flush and compaction to generation 2,
	// then acks C's flush and compaction to generation 3.
	joined := strings.Join(ops, "\n")
	for _, want := range []string{"Write ledger-1/", "Sync ledger-1/", "ledger-2/", "Rename ledger-snapshot.tmp", "Remove ledger-1/", "ledger-3/"} {
		if !strings.Contains(joined, want) {
			t.Fatalf("recorded operations lack %q:\n%s", want, joined)
		}
	}
	t.Logf("%d disk operations in the armed window:\n%s", len(ops), joined)
	for _, mode := range []faultMode{killBefore, failThenCrash, failThenRestart, failRepeatThenRestart} {
		for at := range ops {
			t.Run(fmt.Sprintf("%v at %d %s", mode, at, ops[at]), func(t *testing.T) {
				runCompactionCrash(t, at, mode)
			})
		}
	}
}

func TestLedgerSnapshotOfMillionAcksIsSmall(t *testing.T) {
	// One partition has 1M acks with a few gaps, one is untouched.
	gaps := []uint64{17, 250_000, 250_001, 999_000}
	s := delivery.DoneState{Floor: 17}
	prev := uint64(17)
	for _, g := range append(gaps[1:], 1_000_001) {
		if g > prev+1 {
			s.Ranges = append(s.Ranges, delivery.SeqRange{First: prev + 1, Last: g - 1})
		}
		prev = g
	}
	if err := s.Validate(); err != nil || s.DoneSeqs() != 999_980 {
		t.Fatalf("test state: %v, %d done", err, s.DoneSeqs())
	}
	b := encodeLedgerSnapshot(ledgerSnapshot{gen: 7, states: []delivery.DoneState{s, {Floor: 1}}})
	if len(b) > 64 {
		t.Fatalf("snapshot of 1M acks with %d gaps is %d bytes, want ≤ 64", len(gaps), len(b))
	}
	got, err := decodeLedgerSnapshot(b)
	if err != nil || got.gen != 7 || len(got.states) != 2 || !slices.Equal(got.states[0].Ranges, s.Ranges) {
		t.Fatalf("round trip %+v %v", got, err)
	}
	t.Logf("1M acks, %d gaps: %d bytes; their ledger records hold %d MB", len(gaps), len(b), 1_000_000*ledgerEntryBytes/1_000_000)
}

func TestParseLedgerDirName(t *testing.T) {
	for name, want := range map[string]int64{"ledger": 0, "ledger-1": 1, "ledger-42": 42,
		"ledger-": -1, "ledger-01": -1, "ledger-0": -1, "ledger-snapshot": -1, "ledger-1.tmp": -1, "settings.json": -1} {
		gen, ok := parseLedgerDirName(name)
		if (want < 0) == ok || (ok && gen != uint64(want)) {
			t.Errorf("%s: %d %v, want %d", name, gen, ok, want)
		}
		if ok && ledgerDirName(gen) != name {
			t.Errorf("%s does not round-trip", name)
		}
	}
}

func FuzzDecodeLedgerSnapshot(f *testing.F) {
	f.Add(encodeLedgerSnapshot(ledgerSnapshot{gen: 3, states: []delivery.DoneState{{Floor: 5, Ranges: []delivery.SeqRange{{First: 7, Last: 9}}}, {Floor: 1}}}))
	f.Add(encodeLedgerSnapshot(ledgerSnapshot{}))
	f.Add(encodeLedgerSnapshot(ledgerSnapshot{gen: 2, states: []delivery.DoneState{{Floor: 1}},
		counts: [][]delivery.SeqCount{{{Seq: 4, Count: 2}, {Seq: 9, Count: 5}}}}))
	f.Add(encodeLedgerSnapshot(ledgerSnapshot{states: []delivery.DoneState{{Floor: 3}}, fence: 12}))
	f.Add([]byte("NLS1\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x03\x01\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeLedgerSnapshot(b)
		if err != nil {
			return
		}
		if cap(s.states) > len(b)/4 {
			t.Fatalf("%d states allocated for %d bytes", cap(s.states), len(b))
		}
		again := encodeLedgerSnapshot(s)
		if string(b[:4]) == ledgerSnapshotMagicV1 {
			// An old snapshot re-encodes in the new layout, with no counts.
			s2, err := decodeLedgerSnapshot(again)
			if err != nil || s2.gen != s.gen || len(s2.states) != len(s.states) || len(slices.Concat(s2.counts...)) != 0 {
				t.Fatalf("NLS1 snapshot re-encoded as %+v, %v", s2, err)
			}
			return
		}
		if string(again) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}
