package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// logBuffer collects log lines written by the node's goroutines, for the
// test to read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) count(substr string) int { return strings.Count(b.String(), substr) }

func (b *logBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// newCorruptionHarness opens a node with small segments (so a partition
// has sealed segments) and a log that records ERROR and WARN lines.
func newCorruptionHarness(t *testing.T, logs *logBuffer) *harness {
	h := &harness{t: t, fs: vfs.NewMem(), tune: func(c *Config) {
		c.SegmentBytesMax = 4 << 10
		c.ScrubBytesPerSecond = -1 // the tests step the scrubber themselves
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}}
	h.nowMs.Store(1_000_000)
	h.open()
	t.Cleanup(func() { h.node.Close() })
	return h
}

// publishTo publishes n records to one partition, one at a time (each
// acknowledged, so each batch is synced before the next is written), and
// returns their values by seq.
func publishTo(h *harness, topic string, partition uint32, n int) map[uint64]string {
	values := map[uint64]string{}
	for i := 0; i < n; i++ {
		v := fmt.Sprintf("%s-%d-value-%03d", topic, partition, i)
		ok := h.mustPublish(&wire.Pub{Topic: topic, Partition: int32(partition), Value: []byte(v)})
		values[ok.Seq] = v
	}
	return values
}

// segmentsOf lists the segment files of a partition, oldest first.
func segmentsOf(t *testing.T, fs *vfs.MemFS, topic string, partition int) []string {
	t.Helper()
	dir := path.Join("/data/topics", topic, fmt.Sprint(partition))
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, ".log") {
			out = append(out, path.Join(dir, n))
		}
	}
	return out
}

// partitionState returns the State METADATA reports for a partition.
func partitionState(h *harness, topic string, partition int) string {
	return h.node.Metadata([]string{topic})[0].Partitions[partition].State
}

// readVisible reads a partition through the node, stepping over refused
// (corrupt) and dropped (repaired) seqs; it checks every served record
// against values and returns how many were served and which seqs were
// refused as corrupt.
func readVisible(t *testing.T, h *harness, topic string, partition uint32, values map[uint64]string) (served int, refused []uint64) {
	t.Helper()
	for seq := uint64(1); seq <= h.node.Metadata([]string{topic})[0].Partitions[partition].CommitSeq; {
		es, err := h.node.Read(topic, partition, seq, 16)
		var damaged *storage.CorruptError
		var gap *storage.GapError
		switch {
		case errors.As(err, &damaged):
			refused = append(refused, seq)
			seq = damaged.Damage.LastSeq + 1
			continue
		case errors.As(err, &gap):
			seq = gap.Next
			continue
		case err != nil:
			t.Fatalf("Read(%d): %v", seq, err)
		}
		for _, e := range es {
			if want, ok := values[e.Seq]; !ok || string(e.Record.Value) != want {
				t.Fatalf("seq %d served %q, want %q", e.Seq, e.Record.Value, want)
			}
		}
		served += len(es)
		seq = es[len(es)-1].Seq + 1
	}
	return served, refused
}

// TestFlipInTheActiveSegmentMakesOnlyThatPartitionCorrupt is issue 11's
// first finding: one flipped byte in the middle of the active segment
// used to cut the log there (acked records gone, seqs reused). Now the
// partition goes corrupt: publishes get DATA_CORRUPT, every readable
// record is still served, no seq is reused, the damage is logged with its
// place, and the other partition keeps working. A salvage repair then
// drops only the damaged batch; consumers skip it and new records get
// seqs above the old end.
func TestFlipInTheActiveSegmentMakesOnlyThatPartitionCorrupt(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	h.declare("t", 2)
	values := publishTo(h, "t", 1, 40)
	other := publishTo(h, "t", 0, 5)
	commit := uint64(len(values))
	h.node.Close()

	segs := segmentsOf(t, h.fs, "t", 1)
	active := segs[len(segs)-1]
	data, _ := h.fs.ReadFile(active)
	if err := h.fs.FlipBit(active, int64(len(bytes.TrimRight(data, "\x00")))/2, 4); err != nil {
		t.Fatal(err)
	}
	h.open()

	if st := partitionState(h, "t", 1); st != wire.PartitionStateCorrupt {
		t.Fatalf("partition 1 state %q, want corrupt", st)
	}
	if st := partitionState(h, "t", 0); st != "" {
		t.Fatalf("partition 0 state %q, want healthy", st)
	}
	if got := h.node.Metadata([]string{"t"})[0].Partitions[1].CommitSeq; got != commit {
		t.Fatalf("commit seq %d after reopening, want %d: acked records were cut", got, commit)
	}
	if _, err := h.publish(&wire.Pub{Topic: "t", Partition: 1, Value: []byte("x")}); !errors.Is(err, wire.ErrDataCorrupt) {
		t.Fatalf("publish to the damaged partition: %v, want DATA_CORRUPT", err)
	}
	if ok := h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("y")}); ok.Seq != uint64(len(other))+1 {
		t.Fatalf("healthy partition appended at %d", ok.Seq)
	}
	served, refused := readVisible(t, h, "t", 1, values)
	if len(refused) != 1 || served == 0 || served >= len(values) {
		t.Fatalf("served %d of %d, refused %v", served, len(values), refused)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), active) {
		t.Fatalf("no ERROR line naming %s:\n%s", active, logs.String())
	}
	if damaged := h.node.Damaged(); len(damaged) != 1 || !strings.HasPrefix(damaged[0], "t/1:") {
		t.Fatalf("Damaged() = %v", damaged)
	}
	h.node.Close()

	logsRepaired, err := Repair(h.fs, "/data", RepairOptions{Topic: "t", Partition: -1, Mode: storage.RepairSalvage})
	if err != nil {
		t.Fatal(err)
	}
	var dropped uint64
	for _, l := range logsRepaired {
		if l.Damaged() != (l.Topic == "t" && l.Partition == 1) {
			t.Fatalf("repair: %+v", l)
		}
		dropped += l.Report.DroppedSeqs
	}
	if dropped != uint64(len(values)-served) {
		t.Fatalf("repair dropped %d seqs, reads refused %d", dropped, len(values)-served)
	}
	logs.Reset()
	h.open()
	if st := partitionState(h, "t", 1); st != "" {
		t.Fatalf("state %q after repair", st)
	}
	if ok := h.mustPublish(&wire.Pub{Topic: "t", Partition: 1, Value: []byte("after")}); ok.Seq != commit+1 {
		t.Fatalf("first publish after repair got seq %d, want %d (above the old end)", ok.Seq, commit+1)
	}
	// A consumer gets every record that survived, and the new one.
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(1000)
	want := served + 1 + len(other) + 1
	got := s.waitFor(t, want)
	h.sync("t", "g")
	if len(got) != want || s.count() != want {
		t.Fatalf("delivered %d, want %d", s.count(), want)
	}
	// The dropped seqs were stepped over, not left in flight to fail
	// again at every ack wait.
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("errors after the repair:\n%s", logs.String())
	}
}

// TestFlipInASealedSegmentDoesNotStopTheNode is issue 11's second finding:
// a flipped byte in a sealed segment (trusted through its index at open)
// used to fail the node's start. Now the node starts, only that partition
// is marked corrupt and the other topic keeps working. Without a dedup
// snapshot the replay at open finds the damage (it verifies the sealed
// segments); with one the open reads nothing before the snapshot's point,
// so a read of the damaged range (refused, never answered with wrong
// data, and which verifies the segment) or the scrubber's next pass finds
// it, whichever is first.
func TestFlipInASealedSegmentDoesNotStopTheNode(t *testing.T) {
	for _, snapshots := range []bool{false, true} {
		t.Run(fmt.Sprintf("snapshot=%v", snapshots), func(t *testing.T) {
			var logs logBuffer
			h := newCorruptionHarness(t, &logs)
			tune := h.tune
			h.tune = func(c *Config) {
				tune(c)
				if !snapshots {
					c.DedupSnapshotBytes = -1
				}
			}
			h.node.Close()
			h.open()
			h.declare("t", 1)
			h.declare("u", 1)
			values := publishTo(h, "t", 0, 200)
			publishTo(h, "u", 0, 3)
			h.node.Close()
			segs := segmentsOf(t, h.fs, "t", 0)
			if len(segs) < 3 {
				t.Fatalf("%d segments; want sealed ones", len(segs))
			}
			if err := h.fs.FlipBit(segs[1], 300, 1); err != nil {
				t.Fatal(err)
			}
			h.open()
			if snapshots {
				if st := partitionState(h, "t", 0); st != "" {
					t.Fatalf("state %q at open; the open was to read nothing before the snapshot", st)
				}
				refused := 0
				for seq := range uint64(len(values)) {
					es, err := h.node.Read("t", 0, seq+1, 1)
					switch {
					case errors.Is(err, storage.ErrCorrupt):
						refused++
					case err != nil:
						t.Fatalf("Read(%d): %v", seq+1, err)
					case string(es[0].Record.Value) != values[seq+1]:
						t.Fatalf("seq %d served %q, want %q", seq+1, es[0].Record.Value, values[seq+1])
					}
				}
				if refused == 0 {
					t.Fatal("every read served before the scrubber's pass; the flipped batch was to be refused")
				}
				s := &scrubber{n: h.node, from: map[*partitionRunner]uint64{}}
				s.step(1 << 30)
			}
			// The reads' own verify (on the partition's goroutine) may have
			// recorded the damage first: the scrubber then finds nothing new
			// and that verify marks the partition a moment later (a flake
			// of CI's race run when this was checked at once).
			eventually(t, "the partition is corrupt", func() bool { return partitionState(h, "t", 0) == wire.PartitionStateCorrupt })
			if _, refused := readVisible(t, h, "t", 0, values); len(refused) != 1 {
				t.Fatalf("refused %v", refused)
			}
			h.mustPublish(&wire.Pub{Topic: "u", Partition: 0, Value: []byte("still writable")})
		})
	}
}

// TestScrubberFindsDamageInASealedSegment: damage that appears while the
// node runs is found by the scrubber's next pass, which marks the
// partition corrupt and counts what it read.
func TestScrubberFindsDamageInASealedSegment(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	h.declare("t", 1)
	publishTo(h, "t", 0, 200)
	segs := segmentsOf(t, h.fs, "t", 0)
	s := &scrubber{n: h.node, from: map[*partitionRunner]uint64{}}
	s.step(1 << 30)
	if st := partitionState(h, "t", 0); st != "" {
		t.Fatalf("state %q before any damage", st)
	}
	if err := h.fs.FlipBit(segs[0], 100, 2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(segs) && partitionState(h, "t", 0) == ""; i++ {
		s.step(1) // one segment a step
	}
	if st := partitionState(h, "t", 0); st != wire.PartitionStateCorrupt {
		t.Fatalf("state %q after scrubbing, want corrupt", st)
	}
	if _, err := h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("x")}); !errors.Is(err, wire.ErrDataCorrupt) {
		t.Fatalf("publish: %v", err)
	}
}

// TestRepairRemovalsSurviveACrash: the files a repair removes — a
// partition's damaged epoch file and the dedup snapshot beside it (its
// torn tail cut too), a group's damaged ledger-snapshot, a damaged groups.json — stay removed
// after a power loss right after the repair. The removals used to be left
// unsynced: the simulator's operator saw a removed ledger-snapshot come
// back at the next crash and refuse the group again (N25); a dedup
// snapshot that came back would answer a lost record's retry as a
// duplicate.
func TestRepairRemovalsSurviveACrash(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	ackOneByOne(h, 40, 256) // compacts the ledger: a ledger-snapshot; the close writes a dedup snapshot
	files := []string{"/data/topics/t/0/epoch", path.Join(ledgerTestGroupDir, ledgerSnapshotFile), "/data/" + groupsFile}
	if err := storage.WriteFileAtomic(h.fs, files[2], []byte("{}")); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := h.fs.FlipBit(f, 3, 0); err != nil {
			t.Fatal(err)
		}
	}
	dedup := []string{path.Join("/data/topics/t/0", dedupSnapshotFile), path.Join("/data/topics/t/0", dedupSnapshotCopyFile)}
	for _, f := range dedup {
		if _, err := h.fs.Stat(f); err != nil {
			t.Fatalf("no dedup snapshot to remove: %v", err)
		}
	}
	// A torn tail cut with the epoch file removed removes the dedup
	// snapshots (TestRepairKeepsTrueDedupSnapshots).
	tearActiveSegment(t, h.fs, "/data/topics/t/0")
	out, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
	if err != nil {
		t.Fatal(err)
	}
	var epoch, snapshot, groups bool
	for _, r := range out {
		epoch, snapshot, groups = epoch || r.EpochFileRemoved, snapshot || r.LedgerSnapshotRemoved, groups || r.GroupsReset
	}
	if !epoch || !snapshot || !groups {
		t.Fatalf("repair: epoch file removed %v, ledger snapshot removed %v, groups reset %v: %+v", epoch, snapshot, groups, out)
	}
	h.fs.CrashClean()
	for _, f := range append(files, dedup...) {
		if _, err := h.fs.Stat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is back after a crash that followed the repair (%v)", f, err)
		}
	}
}

// TestCorruptEpochFileRefusesWritesUntilRepaired: a partition whose epoch
// file fails its checksum cannot know a safe next epoch, so it takes no
// write; the repair removes the file.
func TestCorruptEpochFileRefusesWritesUntilRepaired(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	h.declare("t", 1)
	publishTo(h, "t", 0, 3)
	h.node.Close()
	if err := h.fs.FlipBit("/data/topics/t/0/epoch", 9, 0); err != nil {
		t.Fatal(err)
	}
	h.open()
	if _, err := h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("x")}); !errors.Is(err, wire.ErrDataCorrupt) {
		t.Fatalf("publish: %v", err)
	}
	h.node.Close()
	logs2, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
	if err != nil || len(logs2) != 1 || !logs2[0].EpochFileRemoved {
		t.Fatalf("repair: %+v %v", logs2, err)
	}
	h.open()
	if ok := h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("x")}); ok.Seq != 4 {
		t.Fatalf("seq %d after repair", ok.Seq)
	}
}

// TestFullDiskLogsOneLinePerWindow: a disk that refuses every write made
// each publish (and each recovery) log an ERROR line: 1 307 identical
// lines in 20 s. A repeated line now gets through once per window and then
// says how many it suppressed. The errors name each file once.
func TestFullDiskLogsOneLinePerWindow(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	h.declare("t", 1)
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("a")})
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpWrite || op == vfs.OpCreate {
			return &fs.PathError{Op: "write", Path: name, Err: syscall.ENOSPC}
		}
		return nil
	})
	for i := 0; i < 50; i++ {
		if _, err := h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("b")}); !errors.Is(err, wire.ErrStorage) {
			t.Fatalf("publish %d on a full disk: %v", i, err)
		}
	}
	lines := strings.Count(logs.String(), "level=ERROR")
	if lines == 0 || lines > 2 {
		t.Fatalf("%d ERROR lines for 50 failed publishes:\n%s", lines, logs.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Count(line, "/data/topics/t/0/") > 1 && strings.Count(line, "epoch.tmp") > 1 {
			t.Fatalf("an error names its file twice: %s", line)
		}
	}
	// Reset first: the partition may log on its own (a recovery retry) as
	// soon as the window has passed, and that first line after the window
	// is the one that carries the count.
	// Which of the partition's two repeating lines (its write failed; its
	// recovery failed) comes first after the window depends on where its
	// commit loop was when the disk filled: about 1 run in 150 under
	// -race, the recovery line had not been logged in the flood (its
	// first comes after the window, without a count) and the write line
	// is not reached again. So a window passes, a few publishes fail; up
	// to three times, until a line carries the count of its suppressed
	// repeats.
	logs.Reset()
	for window := 0; !strings.Contains(logs.String(), "suppressed_repeats="); window++ {
		if window == 3 {
			t.Fatalf("after three windows, no count of the suppressed lines:\n%s", logs.String())
		}
		h.nowMs.Add(repeatWindowMs)
		for range 3 {
			h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("c")})
		}
		time.Sleep(50 * time.Millisecond) // a recovery may log after the answer
	}
}

// ackOneByOne publishes n records to topic t (one partition), has group
// g consume them and acks each on its own — one ledger flush each, synced
// in turn, and a compaction after each once the ledger passed
// compactBytes (0: the default) — then closes the node.
func ackOneByOne(h *harness, n int, compactBytes int64) {
	h.t.Helper()
	ackOneByOneOpen(h, n, compactBytes)
	h.node.Close()
}

// ackOneByOneOpen is ackOneByOne that leaves the node open.
func ackOneByOneOpen(h *harness, n int, compactBytes int64) {
	t := h.t
	t.Helper()
	h.declare("t", 1)
	publishTo(h, "t", 0, n)
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatal(err)
	}
	if compactBytes > 0 {
		h.setLedgerCompactBytes("t", "g", compactBytes)
	}
	sub.AddCredit(uint32(n))
	for _, m := range s.waitFor(t, n) {
		if res := h.ack("t", "g", false, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID}); res[0] != wire.CodeOK {
			t.Fatalf("ack %d: %v", m.Seq, res)
		}
	}
}

// groupRefusedAsCorrupt opens the node and checks that group g on topic
// t is refused with DATA_CORRUPT naming what (and an ERROR line with
// line), then closes it.
func groupRefusedAsCorrupt(h *harness, logs *logBuffer, what, line string) {
	t := h.t
	t.Helper()
	h.open()
	if _, err := h.node.Subscribe("t", "g", GroupOptions{}, newSink()); !errors.Is(err, wire.ErrDataCorrupt) || !strings.Contains(err.Error(), what) {
		t.Fatalf("subscribe to a group with a damaged %s: %v, want DATA_CORRUPT", what, err)
	}
	if !strings.Contains(logs.String(), line) {
		t.Fatalf("no ERROR line %q:\n%s", line, logs.String())
	}
	h.node.Close()
}

// deliveredAfterRepair opens the node and has group g consume topic t
// with credit: it returns what came once want messages did and nothing
// more was pending.
func deliveredAfterRepair(h *harness, credit, want int) []*wire.Msg {
	t := h.t
	t.Helper()
	h.open()
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatalf("subscribe after repair: %v", err)
	}
	sub.AddCredit(uint32(credit))
	s.waitFor(t, want)
	h.sync("t", "g")
	return s.all()
}

// ackOneMore publishes one more record to t/0 on the open node and has
// group g, whose earlier records are all acked, receive and ack it.
func ackOneMore(h *harness) {
	t := h.t
	t.Helper()
	publishTo(h, "t", 0, 1)
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(1)
	m := s.waitFor(t, 1)[0]
	if res := h.ack("t", "g", false, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID}); res[0] != wire.CodeOK {
		t.Fatalf("ack %d: %v", m.Seq, res)
	}
}

// testLedger is group g's ack ledger segment in the corruption harness.
const testLedger = "/data/groups/g/t/ledger/00000000000000000001.log"

// flipLastLedgerBatch flips a bit in the last batch of the ledger: the
// segment's preallocated tail is zeros, so the last byte that is not is
// in it.
func flipLastLedgerBatch(h *harness) {
	t := h.t
	t.Helper()
	data, err := h.fs.ReadFile(testLedger)
	if err != nil {
		t.Fatal(err)
	}
	last := len(bytes.TrimRight(data, "\x00")) - 1
	if err := h.fs.FlipBit(testLedger, int64(last), 0); err != nil {
		t.Fatal(err)
	}
}

// lastLedgerSeq is the seq of the last record in the ledger segment.
func lastLedgerSeq(h *harness) uint64 {
	t := h.t
	t.Helper()
	data, err := h.fs.ReadFile(testLedger)
	if err != nil {
		t.Fatal(err)
	}
	batches := storage.SegmentBatches(data)
	if len(batches) == 0 {
		t.Fatalf("no batch in %s", testLedger)
	}
	entries := batches[len(batches)-1].Entries
	return entries[len(entries)-1].Seq
}

// TestAckLedgerTornTailIsSaid: a bit flipped in the last batch of an ack
// ledger that no synced mark covers — written just before a crash —
// cannot be told from a crash's torn write, and is cut as one; the ack it
// held is forgotten and its message delivered again (at least once) —
// with a WARN line naming the file, not in silence (found by the
// single-node simulator's state-file flips; N25t).
func TestAckLedgerTornTailIsSaid(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	const n = 5
	ackOneByOne(h, n, 0) // a clean close: the ledger's synced mark covers the n acks
	h.open()             // a clean restart cuts nothing and says nothing
	if line := "ack ledger torn tail truncated"; strings.Contains(logs.String(), line) {
		t.Fatalf("a clean restart logged %q:\n%s", line, logs.String())
	}
	ackOneMore(h)
	h.crash() // no close: the last ack is past the mark
	flipLastLedgerBatch(h)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	got := deliveredAfterRepair(h, n+1, 1)
	if len(got) != 1 || got[0].Seq != n+1 {
		t.Fatalf("delivered %v after the cut, want seq %d alone (its ack was in the last batch)", got, n+1)
	}
	if line := "ack ledger torn tail truncated"; !strings.Contains(logs.String(), line) || !strings.Contains(logs.String(), testLedger) {
		t.Fatalf("no WARN line %q naming %s:\n%s", line, testLedger, logs.String())
	}
}

// DurableTailNotTorn for an ack ledger: its synced mark — written when
// the group closes, and once the ledger took no ack for a period — makes
// a flip into its last batch damage: the group is refused (DATA_CORRUPT)
// until a repair drops the ack on purpose, and only that message comes
// again. Before, it was cut as a torn write: the confirmed ack forgotten
// with a WARN line alone, after a clean stop too (SyncedMarkSkipped).
func TestAckLedgerMarkedTailIsDamage(t *testing.T) {
	for _, c := range []struct {
		name    string
		idle    bool // marked by an idle period before a crash, not by a clean close
		skipped bool
	}{{"clean close", false, false}, {"idle then crash", true, false}, {"mark skipped", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			var logs logBuffer
			h := newCorruptionHarness(t, &logs)
			tune := h.tune
			h.tune = func(cfg *Config) {
				tune(cfg)
				cfg.SyncedMarkMs = markPeriodMs
				cfg.Mutations.SyncedMarkSkipped = c.skipped
			}
			h.restart()
			const n = 5
			if !c.idle {
				ackOneByOne(h, n, 0)
				// What the simulator reads before each start and repair.
				if marks := LedgerMarks(h.fs, "/data"); !c.skipped && (len(marks) != 1 || marks[path.Dir(testLedger)] != lastLedgerSeq(h)) {
					t.Fatalf("ledger marks %v, want %s at seq %d", marks, path.Dir(testLedger), lastLedgerSeq(h))
				}
			} else {
				ackOneByOneOpen(h, n, 0)
				// The group's clock moves on: the ledger marks what it
				// synced once it took nothing through a period.
				last := lastLedgerSeq(h)
				eventually(t, fmt.Sprintf("the ledger's synced mark at seq %d", last), func() bool {
					h.nowMs.Add(markPeriodMs)
					h.node.pokeGroups()
					mark, err := readSyncedMark(h.fs, path.Dir(testLedger))
					return err == nil && mark == last
				})
				h.crash()
			}
			flipLastLedgerBatch(h)
			if c.skipped {
				if got := deliveredAfterRepair(h, n, 1); len(got) != 1 || got[0].Seq != n {
					t.Fatalf("mark skipped: delivered %v, want seq %d alone, its ack cut as a torn write", got, n)
				}
				return
			}
			groupRefusedAsCorrupt(h, &logs, "ledger", "group ack ledger corrupt")
			repaired, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range repaired {
				if l.Group == "g" && (l.Report.TornTail != nil || l.Report.DroppedSeqs != 1) {
					t.Fatalf("repair of the ledger: %+v; want its last seq dropped, no torn tail", l)
				}
			}
			if got := deliveredAfterRepair(h, n, 1); len(got) != 1 || got[0].Seq != n {
				t.Fatalf("delivered %v after the repair, want seq %d alone (its ack was dropped)", got, n)
			}
		})
	}
}

// TestDamagedAckLedgerRefusesTheGroupUntilRepaired is issue 11's third
// finding: a flipped byte in an ack ledger used to cut it there and
// silently deliver hundreds of acknowledged messages again. Now the group
// is refused with DATA_CORRUPT (naming the file) until a repair drops the
// damaged ack records on purpose; then only the messages whose acks were
// dropped come again.
func TestDamagedAckLedgerRefusesTheGroupUntilRepaired(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	const n = 40
	ackOneByOne(h, n, 0)
	ledger := "/data/groups/g/t/ledger/00000000000000000001.log"
	data, err := h.fs.ReadFile(ledger)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.fs.FlipBit(ledger, int64(len(bytes.TrimRight(data, "\x00")))/2, 3); err != nil {
		t.Fatal(err)
	}
	groupRefusedAsCorrupt(h, &logs, "ledger", "group ack ledger corrupt")
	repaired, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
	if err != nil {
		t.Fatal(err)
	}
	var dropped uint64
	for _, l := range repaired {
		if l.Group == "g" {
			dropped += l.Report.DroppedSeqs
		} else if l.Damaged() {
			t.Fatalf("repair found damage in %+v", l)
		}
	}
	if dropped == 0 {
		t.Fatalf("repair dropped nothing from the ledger: %+v", repaired)
	}
	if got := deliveredAfterRepair(h, n, int(dropped)); len(got) != int(dropped) {
		t.Fatalf("%d messages delivered again, want the %d whose acks the repair dropped: %v", len(got), dropped, got)
	}
}

// TestDamagedLedgerSnapshotRefusesTheGroupUntilRepaired (N25l): a group's
// ledger-snapshot — its done state as of the last compaction — went bad.
// Loading it used to fail with a bare error and no log line; the group is
// now refused with DATA_CORRUPT naming the file and an ERROR line, repair
// (its dry run first) removes the file, and the group then delivers every
// message again: its acks are forgotten, never guessed. Compactions leave
// one ledger directory, not one per compaction.
func TestDamagedLedgerSnapshotRefusesTheGroupUntilRepaired(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	const n = 30
	ackOneByOne(h, n, 1) // a compaction after every flush
	names, err := h.fs.List(ledgerTestGroupDir)
	if err != nil {
		t.Fatal(err)
	}
	dirs := 0
	for _, name := range names {
		if _, ok := parseLedgerDirName(name); ok {
			dirs++
		}
	}
	if dirs != 1 {
		t.Fatalf("%d ledger directories after %d compactions, want the live one: %v", dirs, n, names)
	}
	file := path.Join(ledgerTestGroupDir, ledgerSnapshotFile)
	if err := h.fs.FlipBit(file, 20, 3); err != nil {
		t.Fatal(err)
	}
	groupRefusedAsCorrupt(h, &logs, "ledger snapshot", "group ack ledger snapshot corrupt")
	for _, dry := range []bool{true, false} {
		repaired, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage, DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		removed := slices.ContainsFunc(repaired, func(l RepairedLog) bool { return l.LedgerSnapshotRemoved && l.Group == "g" && l.Dir == file })
		_, statErr := h.fs.Stat(file)
		if !removed || dry != (statErr == nil) {
			t.Fatalf("repair (dry run %v): reported %+v, file there: %v", dry, repaired, statErr == nil)
		}
	}
	if got := deliveredAfterRepair(h, n, n); len(got) != n {
		t.Fatalf("%d messages delivered again, want all %d", len(got), n)
	}
}

// TestCorruptTopicListIsRebuiltByRepair: a topics.json damaged with its
// copy stops the node at start with an error that says what to do;
// repair rebuilds it from the partition directories, and every record is
// there again.
func TestCorruptTopicListIsRebuiltByRepair(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	h.declare("t", 3)
	values := publishTo(h, "t", 2, 10)
	h.node.Close()
	for _, f := range []string{"/data/topics.json", "/data/topics.json" + storage.CopySuffix} {
		if err := h.fs.FlipBit(f, 12, 1); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.nowMs}}, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if _, err := Open(cfg); err == nil || !strings.Contains(err.Error(), "nereus repair") {
		t.Fatalf("open with a damaged topics.json: %v", err)
	}
	repaired, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
	if err != nil || len(repaired) == 0 || repaired[0].TopicsRebuilt != 1 {
		t.Fatalf("repair: %+v, %v", repaired, err)
	}
	h.open()
	meta := h.node.Metadata([]string{"t"})
	if len(meta) != 1 || meta[0].Config.Partitions != 3 {
		t.Fatalf("after repair: %+v", meta)
	}
	if served, refused := readVisible(t, h, "t", 2, values); served != len(values) || len(refused) != 0 {
		t.Fatalf("served %d of %d, refused %v", served, len(values), refused)
	}
}

// TopicsKeptTwice: a single node keeps topics.json twice, so a bit
// flipped in either loses nothing: the node starts with every topic and
// its settings (retention here), says so (ERROR), and writes both files
// again. With TopicsOnce (no copy) the flip stops the node until a
// repair, which rebuilds the list with default settings.
func TestDamagedTopicListIsReadFromItsCopy(t *testing.T) {
	for _, tc := range []struct {
		name, flipped string
		once          bool
	}{
		{"topics.json flipped", "/data/topics.json", false},
		{"its copy flipped", "/data/topics.json" + storage.CopySuffix, false},
		{"topics.json flipped, no copy (TopicsOnce)", "/data/topics.json", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuffer
			h := newCorruptionHarness(t, &logs)
			tune := h.tune
			h.tune = func(c *Config) { tune(c); c.Mutations.TopicsOnce = tc.once }
			h.node.Close()
			h.open()
			cfg := wire.TopicConfig{Name: "t", Partitions: 3, RetentionMs: 60_000}
			if _, err := h.node.Declare(cfg); err != nil {
				t.Fatal(err)
			}
			values := publishTo(h, "t", 1, 5)
			h.node.Close()
			if err := h.fs.FlipBit(tc.flipped, 14, 2); err != nil {
				t.Fatal(err)
			}
			err := h.tryOpen()
			if tc.once {
				if err == nil || !strings.Contains(err.Error(), "nereus repair") {
					t.Fatalf("open with topics.json damaged and no copy: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("open with one copy of topics.json damaged: %v", err)
			}
			meta := h.node.Metadata([]string{"t"})
			if len(meta) != 1 || meta[0].Config.Partitions != 3 || meta[0].Config.RetentionMs != 60_000 {
				t.Fatalf("after the flip: %+v", meta)
			}
			if served, refused := readVisible(t, h, "t", 1, values); served != len(values) || len(refused) != 0 {
				t.Fatalf("served %d of %d, refused %v", served, len(values), refused)
			}
			if !strings.Contains(logs.String(), "topics.json or its copy damaged") {
				t.Fatalf("no ERROR line for the damaged topics.json:\n%s", logs.String())
			}
			for _, f := range []string{"/data/topics.json", "/data/topics.json" + storage.CopySuffix} {
				if _, err := storage.ReadFileAtomic(h.fs, f); err != nil {
					t.Fatalf("%s after the start: %v (want it written again)", f, err)
				}
			}
		})
	}
}

// GroupsKeptTwice: a single node keeps groups.json and a copy; a bit flip
// in either leaves the other, which stands in: the node opens with its
// members, says so at ERROR, and writes both again. With GroupsOnce (no
// copy) the flip stops the node until a repair that forgets every member.
func TestGroupStateKeptTwice(t *testing.T) {
	for _, file := range []string{"/data/groups.json", "/data/groups.json.copy"} {
		t.Run(path.Base(file), func(t *testing.T) {
			h := newMemberHarness(t)
			if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
				t.Fatal(err)
			}
			ok := h.join("a", 1, &noticeBox{})
			h.n.Close()
			if err := h.fs.FlipBit(file, 20, 1); err != nil {
				t.Fatal(err)
			}
			var logs logBuffer
			n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.now}}, Manual: true,
				ScrubBytesPerSecond: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatalf("open with %s damaged: %v", file, err)
			}
			h.n = n
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "groups.json or its copy damaged") {
				t.Fatalf("the damaged copy was not reported:\n%s", logs.String())
			}
			if err := h.request(&wire.Heartbeat{MemberRef: wire.MemberRef{Group: "g", Member: "a", Incarnation: ok.Incarnation}}); err != nil {
				t.Fatalf("the member's heartbeat after the start: %v", err)
			}
			for _, f := range []string{"/data/groups.json", "/data/groups.json.copy"} {
				if _, err := storage.ReadFileAtomic(h.fs, f); err != nil {
					t.Fatalf("%s after the start: %v (want it written again)", f, err)
				}
			}
		})
	}
	t.Run("GroupsOnce", func(t *testing.T) {
		h := newMemberHarness(t)
		h.n.Close()
		cfg := Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.now}}, Manual: true,
			ScrubBytesPerSecond: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Mutations: Mutations{GroupsOnce: true}}
		n, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.n = n
		if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		h.join("a", 1, &noticeBox{})
		h.n.Close()
		if err := h.fs.FlipBit("/data/groups.json", 20, 1); err != nil {
			t.Fatal(err)
		}
		if n, err := Open(cfg); err == nil || !strings.Contains(err.Error(), "nereus repair") {
			if n != nil {
				n.Close()
			}
			t.Fatalf("with GroupsOnce a damaged groups.json: %v, want a refusal naming the repair", err)
		}
	})
}

// TestCorruptGroupStateIsResetByRepair: groups.json and its copy both
// damaged stop the node at start with an error that says what to do;
// repair removes them, the node opens with no members, and a member of
// before is told to join again.
func TestCorruptGroupStateIsResetByRepair(t *testing.T) {
	h := newMemberHarness(t)
	if _, err := h.n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	ok := h.join("a", 1, &noticeBox{})
	h.n.Close()
	for _, f := range []string{"/data/groups.json", "/data/groups.json.copy"} {
		if err := h.fs.FlipBit(f, 20, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.now}}, Manual: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err == nil || !strings.Contains(err.Error(), "nereus repair") {
		t.Fatalf("open with a damaged groups.json: %v", err)
	}
	dry, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage, DryRun: true})
	if err != nil || !slices.ContainsFunc(dry, func(r RepairedLog) bool { return r.GroupsReset }) {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
		t.Fatal(err)
	}
	h.now.Add(60_000) // the repair took a minute
	h.open()
	if gs := h.n.GroupStates(); len(gs) != 0 {
		t.Fatalf("groups after the reset: %+v", gs)
	}
	if err := h.request(&wire.Heartbeat{MemberRef: wire.MemberRef{Group: "g", Member: "a", Incarnation: ok.Incarnation}}); !errors.Is(err, wire.ErrStaleAssignment) {
		t.Fatalf("a forgotten member's heartbeat: %v", err)
	}
	if got := h.join("a", 1, &noticeBox{}); got.Incarnation <= ok.Incarnation {
		t.Fatalf("incarnation %d after the reset, %d before: a zombie of before could pass for the new member", got.Incarnation, ok.Incarnation)
	}
}

// DamageStaysLocal in a cluster: a partition with one replica has no
// healthy copy to rebuild from, so its member refuses to open a damaged
// log. That used to stop the whole node at start (every other topic it
// holds with it). Now only that partition is down: it answers
// DATA_CORRUPT naming the fix, Damaged (/readyz) lists it, and the
// topic's other partitions on the node and a replicated topic work;
// `nereus repair` on the stopped node turns the damaged range's seqs into
// lost records (skipped by readers), and the partition comes back: every
// other message delivered, new ones above the old end, a producer's retry
// of the lost record appended again.
func TestDamagedMemberAloneStaysLocal(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "one", Partitions: 4, Replicas: 1})
	tc.declare("n1", wire.TopicConfig{Name: "three", Partitions: 1, Replicas: 3})
	holder := tc.leaderOf("one", 0)
	neighbour := -1 // another partition of the topic on the same node
	for q := 1; q < 4; q++ {
		if tc.leaderOf("one", q) == holder {
			neighbour = q
		}
	}
	if neighbour < 0 {
		t.Fatal("no second partition of the topic on the node (placement changed?)")
	}
	const n = 50
	producerSeqAt := map[uint64]uint64{} // log seq → producer seq
	for i := range n {
		ok, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, ProducerID: 7, ProducerSeq: uint64(i + 1),
			Value: fmt.Appendf(nil, "m%03d-%s", i, strings.Repeat("x", 100))})
		if err != nil {
			t.Fatal(err)
		}
		producerSeqAt[ok.Seq] = uint64(i + 1)
	}
	tc.stop(holder)
	dir := path.Join("/"+holder, "topics", "one", "0")
	segment := path.Join(dir, "00000000000000000001.log")
	data := readAll(t, tc.fs, segment)
	if err := tc.fs.FlipBit(segment, int64(len(bytes.TrimRight(data, "\x00")))/2, 4); err != nil {
		t.Fatal(err)
	}
	tc.start(holder)
	_, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: []byte("refused")})
	if err == nil || err.Code != wire.CodeDataCorrupt || !strings.Contains(err.Message, "nereus repair") {
		t.Fatalf("publish to the damaged partition: %v, want DATA_CORRUPT naming nereus repair", err)
	}
	if d := tc.nodes[holder].Damaged(); len(d) != 1 || !strings.HasPrefix(d[0], "one/0: seqs ") {
		t.Fatalf("the node reports damage %q, want one/0's range (/readyz)", d)
	}
	tc.leaderOf("one", neighbour)
	if _, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: int32(neighbour), Value: []byte("ok")}); err != nil {
		t.Fatalf("publish to the topic's healthy partition %d on the node: %v", neighbour, err)
	}
	// The replicated topic runs on the node: it follows (or leads) and
	// commits a new publish.
	ok3, err := publishOn(t, tc.nodes[tc.leaderOf("three", 0)], &wire.Pub{Topic: "three", Partition: 0, Value: []byte("ok")})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the node commits the replicated topic's publish", func() bool {
		t3, err := tc.nodes[holder].topic("three")
		return err == nil && t3.partitions[0].commitSeq.Load() >= ok3.Seq
	})

	tc.stop(holder)
	rep, rerr := Repair(tc.fs, "/"+holder, RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
	if rerr != nil {
		t.Fatal(rerr)
	}
	var repaired []RepairedLog
	for _, r := range rep {
		if r.Topic == "three" {
			t.Fatalf("repair listed a replicated partition: %+v", r)
		}
		if r.Damaged() {
			repaired = append(repaired, r)
		}
	}
	if len(repaired) != 1 || repaired[0].Partition != 0 || len(repaired[0].Report.Damage) != 1 {
		t.Fatalf("repair of the members alone: %+v, want one damaged log (one/0)", rep)
	}
	lost, nextSeq := repaired[0].Report.Damage[0], repaired[0].Report.NextSeq
	if _, err := tc.fs.Stat(path.Join(dir, dedupSnapshotFile)); err != nil {
		t.Fatalf("the repair removed the dedup snapshot, whose point it kept: %v", err)
	}
	tc.start(holder)
	tc.leaderOf("one", 0) // its member elects itself again
	if d := tc.nodes[holder].Damaged(); len(d) != 0 {
		t.Fatalf("damage reported after the repair: %q", d)
	}
	ok, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: []byte("after")})
	if err != nil || ok.Seq < nextSeq {
		t.Fatalf("publish after the repair: seq %d, %v; want one above the old end %d", ok.Seq, err, nextSeq-1)
	}
	// A retry of a lost record is appended again, not answered as a
	// duplicate of what the repair dropped (the dedup snapshot that knew
	// it is gone).
	pseq := producerSeqAt[lost.FirstSeq]
	again, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, ProducerID: 7, ProducerSeq: pseq, Value: []byte("again")})
	if err != nil || again.Duplicate || again.Seq <= ok.Seq {
		t.Fatalf("retry of producer seq %d, lost at seq %d: %+v, %v; want it appended again", pseq, lost.FirstSeq, again, err)
	}
	// The others' retries stay duplicates (the snapshot rewritten without
	// the lost seqs still stands for them).
	for seq, ps := range producerSeqAt {
		if seq >= lost.FirstSeq && seq <= lost.LastSeq {
			continue
		}
		dup, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, ProducerID: 7, ProducerSeq: ps, Value: []byte("again")})
		if err != nil || !dup.Duplicate || dup.Seq != seq {
			t.Fatalf("retry of producer seq %d, kept at seq %d: %+v, %v; want a duplicate", ps, seq, dup, err)
		}
	}
	s := newSink()
	sub, serr := tc.nodes[holder].Subscribe("one", "g", GroupOptions{AckWaitMs: 60_000}, s)
	if serr != nil {
		t.Fatal(serr)
	}
	sub.AddCredit(1000)
	want := n + 3 - int(lost.Seqs()) // + "ok" on the neighbour, "after", "again"
	s.waitFor(t, want)
	time.Sleep(100 * time.Millisecond) // room for a lost record to show
	for _, m := range s.all() {
		if m.Partition == 0 && m.Seq >= lost.FirstSeq && m.Seq <= lost.LastSeq {
			t.Fatalf("seq %d of the lost range delivered: %q", m.Seq, m.Value)
		}
	}
	if len(s.all()) != want {
		t.Fatalf("after the repair %d messages delivered, want %d", len(s.all()), want)
	}
}

// DamageStaysLocal for a replica of a larger group whose hard state is
// damaged (S24): the promises it made are unknown, so it must not vote,
// nor follow, on a guess. That used to stop the node at start, then to
// keep the topic down on it for good. The replica now starts with its
// promise lost, learns every other replica's, and follows again: the
// node's other topic runs throughout, nothing is reported damaged once
// it recovered, and it holds what the group committed before and after.
func TestDamagedHardStateOfAReplicaIsRecovered(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "three", Partitions: 1, Replicas: 3})
	tc.declare("n1", wire.TopicConfig{Name: "other", Partitions: 1, Replicas: 3})
	leader := tc.leaderOf("three", 0)
	x, err := publishOn(t, tc.nodes[leader], &wire.Pub{Topic: "three", Partition: 0, Value: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	sick := ""
	for id := range tc.nodes {
		if id != leader {
			sick = id
		}
	}
	third := "n1"
	for third == leader || third == sick {
		third = fmt.Sprintf("n%d", third[1]-'0'+1)
	}
	eventually(t, sick+" holds x (its hard state written)", func() bool {
		v, ok := tc.nodes[sick].Replica("three", 0)
		return ok && v.Status.Durable >= x.Seq
	})
	tc.stop(sick)
	tc.stop(third) // until it is back, not every peer can report
	if err := tc.fs.FlipBit("/"+sick+"/topics/three/0/hardstate", 15, 1); err != nil {
		t.Fatal(err)
	}
	tc.start(sick)
	if _, err := tc.nodes[sick].topic("other"); err != nil {
		t.Fatalf("the node's other topic: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	info := tc.nodes[sick].Metadata([]string{"three"})[0].Partitions[0]
	if !slices.ContainsFunc(info.Replicas, func(r wire.ReplicaInfo) bool { return r.Node == sick && r.State == ReplicaPromiseLost }) {
		t.Fatalf("with a peer down the damaged replica reports %+v", info.Replicas)
	}
	if got, _, _ := sample(t, tc.nodes[sick].metrics, "nereus_replica_promise_lost", map[string]string{"topic": "three"}); got != 1 {
		t.Fatalf("nereus_replica_promise_lost %v, want 1", got)
	}
	tc.start(third)
	eventually(t, "the damaged replica recovers its promise and follows", func() bool {
		v, ok := tc.nodes[sick].Replica("three", 0)
		return ok && !v.Status.PromiseLost && v.Status.Leader != 0
	})
	ok, err := publishOn(t, tc.nodes[tc.leaderOf("three", 0)], &wire.Pub{Topic: "three", Partition: 0, Value: []byte("y")})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the recovered replica holds y", func() bool {
		v, _ := tc.nodes[sick].Replica("three", 0)
		return v.Status.Durable >= ok.Seq
	})
	// Between x and y, only install entries of later epochs (each
	// election adds one; under load there may be some).
	if got := tc.readAll(sick, "three", 0, ok.Seq); len(got) != 2 || got[0] != fmt.Sprintf("%d:x", x.Seq) || got[1] != fmt.Sprintf("%d:y", ok.Seq) {
		t.Fatalf("the recovered replica reads %q", got)
	}
	if d := tc.nodes[sick].Damaged(); len(d) != 0 {
		t.Fatalf("damage reported after the recovery: %q", d)
	}
	if got, _, _ := sample(t, tc.nodes[sick].metrics, "nereus_replica_promise_lost", map[string]string{"topic": "three"}); got != 0 {
		t.Fatalf("nereus_replica_promise_lost %v after the recovery, want 0", got)
	}
}

// DamageNeverSilent for a partition with one replica in a cluster: damage
// found while the node runs — by the scrubber in a sealed segment, or by
// the apply of committed entries after a restart (no dedup snapshot, so
// it reads the log from its start) — used to be dropped (no healthy copy
// to rebuild from: only a metric moved) or to stall the apply for good.
// The partition now goes corrupt as a single node's does: publishes are
// refused with DATA_CORRUPT, Damaged (/readyz) lists it, and consumers
// get every record but the damaged ones.
func TestDamageInAMemberAloneIsNotSilent(t *testing.T) {
	logs := &logBuffer{}
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.SegmentBytesMax = 4 << 10
		c.ScrubBytesPerSecond = -1 // the test steps the scrubber
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	tc.declare("n1", wire.TopicConfig{Name: "one", Partitions: 1, Replicas: 1})
	holder := tc.leaderOf("one", 0)
	const n = 200
	for i := range n {
		if _, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: fmt.Appendf(nil, "m%03d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	dir := path.Join("/"+holder, "topics", "one", "0")
	names, _ := tc.fs.List(dir)
	var segs []string
	for _, name := range slices.Sorted(slices.Values(names)) {
		if strings.HasSuffix(name, ".log") {
			segs = append(segs, path.Join(dir, name))
		}
	}
	if len(segs) < 3 {
		t.Fatalf("%d segments, want sealed ones", len(segs))
	}
	if err := tc.fs.FlipBit(segs[1], 80, 2); err != nil { // a record of the first batch, not a header
		t.Fatal(err)
	}
	damagedRange := func(h *Node) string {
		for _, d := range h.Damaged() {
			if strings.HasPrefix(d, "one/0: seqs ") {
				return d
			}
		}
		return ""
	}
	expectCorrupt := func(h *Node, when string) {
		t.Helper()
		if _, err := publishOn(t, h, &wire.Pub{Topic: "one", Partition: 0, Value: []byte("refused")}); err == nil || err.Code != wire.CodeDataCorrupt {
			t.Fatalf("%s: publish %v, want DATA_CORRUPT", when, err)
		}
		if logs.count("partition data corrupt") == 0 {
			t.Fatalf("%s: no ERROR line", when)
		}
	}
	s := &scrubber{n: tc.nodes[holder], from: map[*partitionRunner]uint64{}}
	for i := 0; i < 3 && damagedRange(tc.nodes[holder]) == ""; i++ {
		s.step(1 << 30) // a pass over every log
	}
	if damagedRange(tc.nodes[holder]) == "" {
		t.Fatalf("the scrubber's find left the partition healthy: %q", tc.nodes[holder].Damaged())
	}
	expectCorrupt(tc.nodes[holder], "after the scrubber's find")

	// A restart trusts the sealed segment through its index; without a
	// dedup snapshot the apply reads the log from its start and finds
	// the damage: it steps over it instead of stalling.
	tc.stop(holder)
	if err := tc.fs.Remove(path.Join(dir, dedupSnapshotFile)); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	tc.start(holder)
	eventually(t, "the apply finds the damage", func() bool { return damagedRange(tc.nodes[holder]) != "" })
	expectCorrupt(tc.nodes[holder], "after the apply's find")
	sink := newSink()
	sub, err := tc.nodes[holder].Subscribe("one", "g", GroupOptions{AckWaitMs: 60_000}, sink)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(1000)
	eventually(t, "every record after the damage delivered", func() bool {
		all := sink.all()
		return len(all) > 0 && all[len(all)-1].Value != nil && string(all[len(all)-1].Value) == fmt.Sprintf("m%03d", n-1)
	})
	if got := len(sink.all()); got >= n || got < n-20 {
		t.Fatalf("%d of %d records delivered, want all but the damaged batch", got, n)
	}
}

// A one-replica partition's hard state and snapshot point have no
// healthy copy either: damaged, they leave the partition unopened
// (DATA_CORRUPT, Damaged), and `nereus repair` rewrites them from the
// repaired log — its last epoch promised to itself, the point before
// where the log starts — after which the partition elects its member in
// a later epoch, keeps every record it held, and takes publishes above.
func TestDamagedStateFilesOfAMemberAlone(t *testing.T) {
	for _, file := range []string{"hardstate", "snapshot"} {
		t.Run(file, func(t *testing.T) {
			tc := newTestClusterWith(t, 3, func(c *Config) {
				c.SegmentBytesMax = 4 << 10
				c.RetentionCheckMs = 20
			})
			tc.declare("n1", wire.TopicConfig{Name: "one", Partitions: 1, Replicas: 1, RetentionBytes: 8 << 10})
			holder := tc.leaderOf("one", 0)
			var last wire.PubOK
			for i := range 200 {
				ok, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: fmt.Appendf(nil, "m%03d", i)})
				if err != nil {
					t.Fatal(err)
				}
				last = ok
			}
			dir := path.Join("/"+holder, "topics", "one", "0")
			eventually(t, "a compaction writes the snapshot point", func() bool {
				_, err := tc.fs.ReadFile(path.Join(dir, "snapshot"))
				return err == nil
			})
			// Retention runs every 20 ms: wait until it has nothing left
			// to compact, so the start read here is the one on disk.
			var start uint64
			eventually(t, "retention settles", func() bool {
				before := tc.startSeqOf(holder, "one")
				time.Sleep(100 * time.Millisecond)
				start = tc.startSeqOf(holder, "one")
				return start == before
			})
			tc.stop(holder)
			if err := tc.fs.FlipBit(path.Join(dir, file), 2, 1); err != nil {
				t.Fatal(err)
			}
			tc.start(holder)
			if _, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: []byte("refused")}); err == nil || err.Code != wire.CodeDataCorrupt {
				t.Fatalf("publish with a damaged %s: %v, want DATA_CORRUPT", file, err)
			}
			if d := tc.nodes[holder].Damaged(); len(d) != 1 || !strings.HasPrefix(d[0], "one/0: not opened") {
				t.Fatalf("damage reported %q", d)
			}
			tc.stop(holder)
			rep, err := Repair(tc.fs, "/"+holder, RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep) != 1 || rep[0].HardStateReset != (file == "hardstate") || rep[0].SnapshotPointReset != (file == "snapshot") {
				t.Fatalf("repair: %+v", rep)
			}
			// The repair keeps the log's start. (Once the node runs again,
			// retention may move it on: under load the wait above can end
			// before retention ran out of work.)
			lg, err := storage.Open(tc.fs, dir, storage.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s := lg.StartSeq(); s != start {
				t.Fatalf("the log starts at %d after the repair, at %d before", s, start)
			}
			lg.Close()
			tc.start(holder)
			tc.leaderOf("one", 0)
			ok, perr := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: []byte("after")})
			if perr != nil || ok.Seq <= last.Seq || ok.Epoch <= last.Epoch {
				t.Fatalf("publish after the repair: %+v, %v; want above seq %d in an epoch after %d", ok, perr, last.Seq, last.Epoch)
			}
			// The point before the log's start, in the epoch of its first
			// entry (the only reign before the repair: 1).
			tp, _ := tc.nodes[holder].topic("one")
			if st := tp.partitions[0].store.(*replicaStore).repl.Status(); len(st.Epochs) == 0 || st.Epochs[0].StartSeq != st.SnapSeq || st.SnapSeq < start-1 || st.Epochs[0].Epoch != 1 {
				t.Fatalf("after the repair: snapshot point %d, epochs %+v; want the first at the point, in epoch 1, at seq %d or later", st.SnapSeq, st.Epochs, start-1)
			}
			s := newSink()
			sub, serr := tc.nodes[holder].Subscribe("one", "g", GroupOptions{AckWaitMs: 60_000}, s)
			if serr != nil {
				t.Fatal(serr)
			}
			sub.AddCredit(1000)
			eventually(t, "every record kept delivered", func() bool {
				all := s.all()
				return len(all) > 0 && string(all[len(all)-1].Value) == "after"
			})
			// Every message from the log's start (where retention left
			// it) to the last before the damage, and the one after.
			all := s.all()
			if first := all[0].Seq; first < start || len(all) != int(last.Seq-first+1)+1 {
				t.Fatalf("%d records delivered from seq %d to %d, want every one from a start at %d or later", len(all), first, ok.Seq, start)
			}
		})
	}
}

// TestDamagedMetaStateAtNodeLevel (N25): a node whose meta.json went bad
// used to refuse to start. Repair, which reads from it which partitions
// the node holds alone, says to start the node first; the node starts,
// rebuilds the file from its metadata log and serves its topics — a
// replicated one and one it holds alone — and repair then works.
func TestDamagedMetaStateAtNodeLevel(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "three", Partitions: 1, Replicas: 3})
	tc.declare("n1", wire.TopicConfig{Name: "single", Partitions: 3, Replicas: 1})
	for p := range int32(3) {
		tc.publishAnywhere(&wire.Pub{Topic: "single", Partition: p, Value: []byte("s")})
	}
	_, ok := tc.publishAnywhere(&wire.Pub{Topic: "three", Partition: 0, Value: []byte("x")})
	sick := "n2"
	tc.stop(sick)
	if err := tc.fs.FlipBit("/"+sick+"/"+cluster.MetaStateFile, 30, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := Repair(tc.fs, "/"+sick, RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err == nil || !strings.Contains(err.Error(), "start the node once") {
		t.Fatalf("repair with a damaged %s: %v", cluster.MetaStateFile, err)
	}
	tc.start(sick)
	eventually(t, "the metadata replayed", func() bool {
		_, err1 := tc.nodes[sick].topic("three")
		_, err2 := tc.nodes[sick].topic("single")
		return err1 == nil && err2 == nil
	})
	if got := tc.readAll(sick, "three", 0, ok.Seq); len(got) != 1 {
		t.Fatalf("the replicated topic on %s reads %q", sick, got)
	}
	eventually(t, "meta.json written again", func() bool {
		_, err := storage.ReadFileAtomic(tc.fs, "/"+sick+"/"+cluster.MetaStateFile)
		return err == nil
	})
	tc.stop(sick)
	if _, err := Repair(tc.fs, "/"+sick, RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
		t.Fatalf("repair after the rebuild: %v", err)
	}
	tc.start(sick)
}

// TestDamagedGroupFilesAreSetAgain: a group's settings.json (this node's
// configuration of the group) or its incarnation files (the count of its
// loads, the high bits of its delivery ids, in two copies) that went bad
// used to keep the group from loading for good, with a bare error.
// Neither holds acks: the group loads with a line saying so — settings
// set again as for a new group; the count taken from the copy that
// verifies, or with both damaged from a fresh range past any count of
// before — and delivers nothing it acked, only what is new, under
// delivery ids never used before.
func TestDamagedGroupFilesAreSetAgain(t *testing.T) {
	for _, c := range []struct {
		name  string
		files []string
		line  string
	}{
		{"settings", []string{"settings.json"}, "group settings damaged"},
		{"incarnation", []string{incarnationFile}, "group incarnation copy damaged"},
		{"incarnation copy", []string{incarnationCopyFile}, "group incarnation copy damaged"},
		{"both incarnation copies", []string{incarnationFile, incarnationCopyFile}, "group incarnation damaged"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs logBuffer
			h := newCorruptionHarness(t, &logs)
			const n = 5
			ackOneByOne(h, n, 0)
			loads, _, _, err := readLoadCount(h.fs, ledgerTestGroupDir)
			if err != nil || loads == 0 {
				t.Fatalf("load count %d before the flips (%v)", loads, err)
			}
			for _, f := range c.files {
				if err := h.fs.FlipBit(path.Join(ledgerTestGroupDir, f), 3, 1); err != nil {
					t.Fatal(err)
				}
			}
			h.open()
			s := newSink()
			sub, err := h.node.Subscribe("t", "g", GroupOptions{}, s)
			if err != nil {
				t.Fatalf("subscribe: %v", err)
			}
			if !strings.Contains(logs.String(), c.line) {
				t.Fatalf("no line %q:\n%s", c.line, logs.String())
			}
			sub.AddCredit(n + 1)
			fresh := h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("new")})
			got := s.waitFor(t, 1)
			h.sync("t", "g")
			if len(s.all()) != 1 || got[0].Seq != fresh.Seq {
				t.Fatalf("delivered %v, want only the new seq %d", s.all(), fresh.Seq)
			}
			for _, f := range append(c.files, incarnationFile, incarnationCopyFile) {
				if _, err := storage.ReadFileAtomic(h.fs, path.Join(ledgerTestGroupDir, f)); err != nil {
					t.Fatalf("%s not written again: %v", f, err)
				}
			}
			inc, _, _, _ := readLoadCount(h.fs, ledgerTestGroupDir)
			switch id := got[0].DeliveryID; {
			case id>>40 != inc:
				t.Fatalf("delivery id %#x under load %d", id, inc)
			case c.name == "both incarnation copies" && inc <= 1<<23:
				t.Fatalf("load %d with both copies damaged: want a fresh range past 2^23", inc)
			case c.name != "both incarnation copies" && inc != loads+1:
				t.Fatalf("load %d after %d: want the count to go on from the copy that verifies", inc, loads)
			}
		})
	}
}

// readDamageCases: where a read meets damage no check located (the
// active segment, or a sealed one trusted through its index), and the
// mutation that keeps the old behaviour (node.Mutations.ReadDamageUnverified).
var readDamageCases = []struct {
	name     string
	sealed   bool
	mutation bool
}{{"active segment", false, false}, {"sealed segment", true, false}, {"unverified", false, true}}

// DamageNeverSilent for damage a read finds but cannot locate: a batch
// that went bad after open, in the active segment (which the scrubber
// never reads) or in a sealed segment trusted through its index. The
// group's delivery used to retry that record for good, the partition
// taking publishes and nothing asking for a repair. Now the partition's
// goroutine verifies the segment holding the seq: the range is recorded,
// the partition goes corrupt (DATA_CORRUPT naming `nereus repair`,
// Damaged), and the group gets every other record. With
// ReadDamageUnverified the partition stays as it was.
func TestDamageADeliveryReadFindsIsLocated(t *testing.T) {
	for _, tc := range readDamageCases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) {
				c.Mutations.ReadDamageUnverified = tc.mutation
				c.ScrubBytesPerSecond = -1 // the read alone finds it
				if tc.sealed {
					c.SegmentBytesMax = 4 << 10
				}
			}
			h.restart()
			h.declare("t", 1)
			n := 20
			if tc.sealed {
				n = 200 // several sealed segments, then the active one
			}
			for i := range n {
				h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: fmt.Appendf(nil, "m%03d-%s", i, strings.Repeat("x", 40))})
			}
			flipInSegments(t, h.fs, "/data/topics/t/0", []byte("m005-")) // in the first segment: sealed when there are several
			s := newSink()
			sub, err := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 60_000}, s)
			if err != nil {
				t.Fatal(err)
			}
			sub.AddCredit(1000)
			s.waitFor(t, n-1)
			_, perr := h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("after")})
			if tc.mutation {
				if perr != nil || len(h.node.Damaged()) != 0 {
					t.Fatalf("unverified: publish %v, damaged %q; want the partition as it was", perr, h.node.Damaged())
				}
				return
			}
			eventually(t, "the read's damage is located", func() bool { return len(h.node.Damaged()) == 1 })
			_, perr = h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("after")})
			if we, ok := perr.(*wire.Error); !ok || we.Code != wire.CodeDataCorrupt || !strings.Contains(we.Message, "nereus repair") {
				t.Fatalf("publish after the located damage: %v, want DATA_CORRUPT naming nereus repair", perr)
			}
			if d := h.node.Damaged()[0]; !strings.Contains(d, "seqs 6-6") {
				t.Fatalf("damaged %q, want seq 6 named", d)
			}
		})
	}
}

// DamageNeverSilent for a cluster partition's only replica (N7f): a read
// that fails on damage no check located — a batch gone bad after it was
// verified, in the active segment (which the scrubber never reads) or in
// a sealed one trusted through its index — has the member verify the
// segment holding the seq on its own goroutine (replog.Log.DamagedAt).
// The range is recorded, the group gets every other record, the
// partition refuses publishes until a repair. Before, the member ignored
// a read's damage that named no range, and the group retried that record
// for good.
func TestDamageAMemberAlonesReadFindsIsLocated(t *testing.T) {
	for _, tc := range readDamageCases {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuffer
			c := newTestClusterWith(t, 1, func(cfg *Config) {
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				cfg.Mutations.ReadDamageUnverified = tc.mutation
				cfg.ScrubBytesPerSecond = -1 // the read alone finds it
				if tc.sealed {
					cfg.SegmentBytesMax = 4 << 10
				}
			})
			c.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 1})
			c.leaderOf("t", 0)
			node := c.nodes["n1"]
			n := 20
			if tc.sealed {
				n = 200 // several sealed segments, then the active one
			}
			for i := range n {
				if _, err := publishOn(t, node, &wire.Pub{Topic: "t", Partition: 0, Value: fmt.Appendf(nil, "m%03d-%s", i, strings.Repeat("x", 40))}); err != nil {
					t.Fatal(err)
				}
			}
			// Applied when answered: only the group's read meets the flip.
			flipInSegments(t, c.fs, "/n1/topics/t/0", []byte("m005-"))
			s := newSink()
			sub, err := node.Subscribe("t", "g", GroupOptions{AckWaitMs: 60_000}, s)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			sub.AddCredit(1000)
			s.waitFor(t, n-1)
			if tc.mutation {
				if _, perr := publishOn(t, node, &wire.Pub{Topic: "t", Partition: 0, Value: []byte("after")}); perr != nil || len(node.Damaged()) != 0 {
					t.Fatalf("unverified: publish %v, damaged %q; want the partition as it was", perr, node.Damaged())
				}
				return
			}
			eventually(t, "the read's damage is located", func() bool { return len(node.Damaged()) == 1 })
			if d := node.Damaged()[0]; !strings.Contains(d, "t/0: seqs 7-7") {
				t.Fatalf("damaged %q, want seq 7 of t/0 named (seq 1 is the install entry)", d)
			}
			// Reads refused by name say nothing new: the range was said once.
			for range 3 {
				if _, err := node.Read("t", 0, 7, 1); !errors.Is(err, storage.ErrCorrupt) {
					t.Fatalf("read of the damaged seq: %v, want it refused", err)
				}
			}
			if said := strings.Count(logs.String(), `msg="partition data corrupt; publishes refused until `+"`nereus repair`"+`"`); said != 1 {
				t.Fatalf("the damaged range was said %d times, want once:\n%s", said, logs.String())
			}
			_, perr := publishOn(t, node, &wire.Pub{Topic: "t", Partition: 0, Value: []byte("after")})
			if perr == nil || perr.Code != wire.CodeDataCorrupt || !strings.Contains(perr.Message, "nereus repair") {
				t.Fatalf("publish after the located damage: %v, want DATA_CORRUPT naming nereus repair", perr)
			}
		})
	}
}

// A partition's torn tail is said — a WARN naming the file and the first
// seq cut — before it is cut: an open that cuts it and then fails (an
// fsync) used to cut in silence, and the next open had nothing left to
// say (found by the single-node simulator, seed 20400, once its checker
// required every cut of committed records to be said).
func TestPartitionTornTailIsSaidEvenWhenTheOpenFails(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	h.declare("t", 1)
	publishTo(h, "t", 0, 3)
	h.node.Close()
	tearActiveSegment(t, h.fs, "/data/topics/t/0")
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSync && strings.HasSuffix(name, ".log") {
			return errInjected
		}
		return nil
	})
	if err := h.tryOpen(); err == nil {
		t.Fatal("the open succeeded without its fsync")
	}
	h.fs.SetInjector(nil)
	if line := `msg="torn tail truncated" topic=t partition=0`; !strings.Contains(logs.String(), line) || !strings.Contains(logs.String(), "first_seq=4") {
		t.Fatalf("the failed open did not say the cut (%q, first_seq=4):\n%s", line, logs.String())
	}
	h.open()
}

// TestOneNodeClusterMetaLogNotCutBelowApplied (MetaNotCutBelowApplied): a
// one-node cluster's metadata log is its only copy, and the node applied
// it only as far as it synced. A bit flip into its last batches looked
// like a torn write: the open cut committed entries (with a WARN), the
// next entries took their seqs, and the applier — past those seqs by
// meta.json — skipped them for good: a DECLARE committed there was never
// applied (found by the cluster simulator flipping a one-node cluster's
// metadata log). The open now refuses a log ending below what meta.json
// applied, and the node says why it cannot start.
func TestOneNodeClusterMetaLogNotCutBelowApplied(t *testing.T) {
	tc := newTestCluster(t, 1)
	tc.declare("n1", wire.TopicConfig{Name: "a", Partitions: 1})
	tc.declare("n1", wire.TopicConfig{Name: "b", Partitions: 1})
	tc.stop("n1")
	st, err := storage.ReadFileAtomic(tc.fs, "/n1/"+cluster.MetaStateFile)
	if err != nil || !strings.Contains(string(st), `"b"`) {
		t.Fatalf("setup: meta.json %q, %v", st, err)
	}
	segs, err := tc.fs.List("/n1/meta")
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, n := range segs {
		if strings.HasSuffix(n, ".log") {
			last = "/n1/meta/" + n
		}
	}
	data, err := tc.fs.ReadFile(last)
	at := bytes.LastIndex(data, []byte(`"Name":"b"`)) // the last batch: topic b's declare
	if err != nil || at < 0 {
		t.Fatalf("setup: %s: %v, declare of b at %d", last, err, at)
	}
	if err := tc.fs.FlipBit(last, int64(at), 1); err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeID: "n1", DataDir: "/n1", Env: env.Env{FS: tc.fs}, ClientAddr: "client-of-n1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Cluster: &ClusterConfig{Members: tc.members, Secret: []byte("test-cluster-secret-0123456789"),
			Tick: 5 * time.Millisecond, ElectionTicks: 30}}
	n, err := Open(cfg)
	if err == nil {
		n.Close()
		t.Fatal("a one-node cluster whose metadata log lost applied entries started")
	}
	if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), "--one-node-cluster") {
		t.Fatalf("start: %v", err)
	}
	// The repair fills the lost entry (seq 3) as a lost record, cuts
	// nothing the node applied; the node starts from meta.json, which
	// kept what the entry did, and applies what comes next.
	logs, err := Repair(tc.fs, "/n1", RepairOptions{Partition: -1, Mode: storage.RepairSalvage, OneNodeCluster: true})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(logs, func(l RepairedLog) bool { return l.Topic == meta.MetaTopic })
	if i < 0 || !slices.Equal(logs[i].Report.Dropped, []storage.SeqRange{{First: 3, Last: 3}}) {
		t.Fatalf("repair: %+v", logs)
	}
	tc.start("n1")
	eventually(t, "topic b still known", func() bool { _, err := tc.nodes["n1"].topic("b"); return err == nil })
	tc.declare("n1", wire.TopicConfig{Name: "c", Partitions: 1}) // applied, not skipped
}

// TestOneNodeClusterAnswersWhatMetaStateHolds (StateDurableBeforeAnswer):
// a one-node cluster's metadata log is its only copy, and its open may
// cut entries above what meta.json applied as a torn tail. So the node
// answers a metadata command only once meta.json holds its entry: while
// that write fails, a DECLARE or a topic update applied here is not
// answered (nor the declared topic started); the write is tried again
// until it lands, and then they are.
func TestOneNodeClusterAnswersWhatMetaStateHolds(t *testing.T) {
	tc := newTestCluster(t, 1)
	tc.declare("n1", wire.TopicConfig{Name: "a", Partitions: 1})
	n := tc.nodes["n1"]
	file := "/n1/" + cluster.MetaStateFile
	var failing atomic.Bool
	tc.fs.SetInjector(func(op vfs.Op, name string) error {
		if failing.Load() && strings.HasPrefix(name, file) {
			return errors.New("injected: disk full")
		}
		return nil
	})
	defer tc.fs.SetInjector(nil)
	// A member holding both partitions of "c": a second member's JOIN
	// takes one from it, by a NOTICE REVOKE.
	tc.declare("n1", wire.TopicConfig{Name: "c", Partitions: 2})
	first := &noticeBox{}
	join := func(member string, id uint64, sink NoticeSink, done func(*wire.JoinOK, error)) {
		n.JoinGroup(&wire.Join{Group: "g", Member: member, Topics: []string{"c"}, SessionTimeoutMs: 30_000, RebalanceTimeoutMs: 20_000, JoinID: id}, sink, done)
	}
	joined := make(chan *wire.JoinOK, 1)
	join("m1", 1, first, func(ok *wire.JoinOK, err error) {
		if err != nil {
			t.Error(err)
		}
		joined <- ok
	})
	okM1 := <-joined
	var assigned []*wire.Notice
	eventually(t, "m1's ASSIGN", func() bool { assigned = append(assigned, first.take()...); return len(assigned) > 0 })
	acked := make(chan error, 1)
	n.GroupRequest(&wire.ControlAck{MemberRef: wire.MemberRef{Group: "g", Member: "m1", Incarnation: okM1.Incarnation}, NoticeID: assigned[0].NoticeID},
		func(_ uint64, err error) { acked <- err })
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		command func(answered chan<- error)
		applied func(*meta.State) bool
		held    string // in meta.json once answered
		starts  string // the topic it starts
		// noticed is the NOTICE that the command makes the coordinator
		// send, none of which may go while meta.json lags.
		noticed func() []*wire.Notice
	}{
		{"declare", func(answered chan<- error) {
			_, err := n.Declare(wire.TopicConfig{Name: "b", Partitions: 1})
			answered <- err
		}, func(st *meta.State) bool { _, ok := st.Topics["b"]; return ok }, `"b"`, "b", nil},
		{"update", func(answered chan<- error) {
			u := wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: "a"}, Set: wire.SetRetentionMs, RetentionMs: 987654}
			n.UpdateTopic(u, func(_ wire.TopicConfig, _ uint64, err error) { answered <- err })
		}, func(st *meta.State) bool { return st.Topics["a"].Config.RetentionMs == 987654 }, "987654", "", nil},
		{"join", func(answered chan<- error) {
			join("m2", 2, &noticeBox{}, func(_ *wire.JoinOK, err error) { answered <- err })
		}, func(st *meta.State) bool { return st.Groups["g"] != nil && st.Groups["g"].Members["m2"] != nil }, `"m2"`, "", first.take},
	} {
		failing.Store(true)
		answered := make(chan error, 1)
		go c.command(answered)
		eventually(t, c.name+" applied", func() (applied bool) {
			n.cluster.ReadGroups(func(st *meta.State) { applied = c.applied(st) })
			return applied
		})
		time.Sleep(50 * time.Millisecond) // the applier's pass that applied it ends
		select {
		case err := <-answered:
			t.Fatalf("%s answered (%v) while meta.json could not hold it", c.name, err)
		default:
		}
		if _, err := n.topic(c.starts); c.starts != "" && err == nil {
			t.Fatalf("%s: topic %s started while meta.json could not hold it", c.name, c.starts)
		}
		if c.noticed != nil {
			time.Sleep(2 * coordinatorTick)
			if ns := c.noticed(); len(ns) > 0 {
				t.Fatalf("%s: the coordinator sent %+v while meta.json could not hold what it acts on", c.name, ns[0])
			}
		}
		failing.Store(false)
		select {
		case err := <-answered:
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		case <-time.After(waitMax):
			t.Fatalf("%s not answered once meta.json could be written", c.name)
		}
		st, err := storage.ReadFileAtomic(tc.fs, file)
		if err != nil || !strings.Contains(string(st), c.held) {
			t.Fatalf("meta.json after the %s's answer: %q, %v", c.name, st, err)
		}
		if c.starts != "" {
			eventually(t, "topic "+c.starts+" started", func() bool { _, err := n.topic(c.starts); return err == nil })
		}
		if c.noticed != nil {
			eventually(t, c.name+"'s NOTICE once meta.json holds it", func() bool { return len(c.noticed()) > 0 })
		}
	}
}
