package node

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// markPeriodMs is the synced-mark period of these tests.
const markPeriodMs = 10

// waitSyncedMark waits until the synced mark in dir holds want, or, when
// marks are skipped, lets ten periods pass.
func waitSyncedMark(t *testing.T, fsys vfs.FS, dir string, want uint64, skipped bool) {
	t.Helper()
	if skipped {
		time.Sleep(10 * markPeriodMs * time.Millisecond)
		return
	}
	eventually(t, fmt.Sprintf("the synced mark of %s at %d", dir, want), func() bool {
		mark, err := readSyncedMark(fsys, dir)
		return err == nil && mark == want
	})
}

// DurableTailNotTorn over an idle tail after a crash: a single node's
// dedup snapshot stands only for what it held at its last write, which a
// crash (no close) leaves far behind; the last batches of the active
// segment have no later batch to prove them synced. A bit flip there was
// cut at the next start as a torn write and the acknowledged records'
// seqs handed out again. The synced mark, written once the partition sat
// idle for a period with everything synced, now makes it damage:
// DATA_CORRUPT until `nereus repair`, which drops the seqs as a gap.
func TestIdleTailIsNotCutAsTornAfterACrash(t *testing.T) {
	for _, skipped := range []bool{false, true} {
		t.Run(fmt.Sprintf("mark skipped=%v", skipped), func(t *testing.T) {
			h := newHarness(t)
			h.tune = func(c *Config) {
				c.SyncedMarkMs = markPeriodMs
				c.Mutations.SyncedMarkSkipped = skipped
			}
			h.restart()
			h.declare("t", 1)
			var last wire.PubOK
			for i := range uint64(10) {
				last = h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: i, Value: fmt.Appendf(nil, "record-%02d", i)})
			}
			dir := "/data/topics/t/0"
			waitSyncedMark(t, h.fs, dir, last.Seq, skipped)
			h.crash() // no close: no dedup snapshot stands for the records
			if point := durablePoint(h.fs, dir); point != 0 {
				t.Fatalf("a dedup snapshot stands for seq %d: the crash wrote one", point)
			}
			flipInSegments(t, h.fs, dir, []byte("record-09"))
			h.open()
			next, err := h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("after the flip")})
			if skipped {
				// Taken for a torn write: accepted, the lost seq kept
				// (TornSeqsNotReused) but its loss not refused.
				if err != nil || next.Seq != last.Seq+1 {
					t.Fatalf("marks skipped: publish after the flip got %+v, %v; want seq %d, after the lost record's kept seq", next, err, last.Seq+1)
				}
				return
			}
			if we, ok := err.(*wire.Error); !ok || we.Code != wire.CodeDataCorrupt || !strings.Contains(we.Message, "nereus repair") {
				t.Fatalf("publish to the partition whose idle tail is damaged: %+v, %v; want DATA_CORRUPT naming nereus repair", next, err)
			}
			h.node.Close()
			out, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
			if err != nil || len(out) != 1 || out[0].Report.TornTail != nil || len(out[0].Report.Dropped) != 1 || out[0].Report.Dropped[0].Last != last.Seq {
				t.Fatalf("repair: %+v, %v; want seq %d dropped, no torn tail", out, err, last.Seq)
			}
			h.open()
			if after := h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("after the repair")}); after.Seq <= last.Seq {
				t.Fatalf("after the repair a new record took seq %d, at or below the lost %d", after.Seq, last.Seq)
			}
		})
	}
}

// A clean close covers its tail with the dedup snapshot; when none is
// written (snapshots off here; a table too large to snapshot, or a write
// that failed), with the synced mark: a flip into the last batch is
// damage at the next start, not a torn write.
func TestCleanCloseMarksATailNoSnapshotStandsFor(t *testing.T) {
	h := newHarness(t)
	h.tune = func(c *Config) { c.DedupSnapshotBytes = -1 }
	h.restart()
	h.declare("t", 1)
	var last wire.PubOK
	for i := range uint64(3) {
		last = h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: fmt.Appendf(nil, "record-%02d", i)})
	}
	h.node.Close()
	dir := "/data/topics/t/0"
	if mark, err := readSyncedMark(h.fs, dir); err != nil || mark != last.Seq {
		t.Fatalf("synced mark after a clean close: %d, %v; want %d", mark, err, last.Seq)
	}
	flipInSegments(t, h.fs, dir, []byte("record-02"))
	h.open()
	if _, err := h.publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("after the flip")}); !errors.Is(err, wire.ErrDataCorrupt) {
		t.Fatalf("publish after a flip into the closed partition's last batch: %v; want DATA_CORRUPT", err)
	}
}

// The same for a cluster partition's only replica.
func TestCleanCloseMarksAMemberAlonesTail(t *testing.T) {
	tc := newTestClusterWith(t, 3, func(c *Config) { c.DedupSnapshotBytes = -1 })
	tc.declare("n1", wire.TopicConfig{Name: "one", Partitions: 1, Replicas: 1})
	holder := tc.leaderOf("one", 0)
	last := publishRecs(t, tc.nodes[holder], "one", 0)
	tc.stop(holder)
	dir := path.Join("/"+holder, "topics", "one", "0")
	if mark, err := readSyncedMark(tc.fs, dir); err != nil || mark != last.Seq {
		t.Fatalf("synced mark after a clean close: %d, %v; want %d", mark, err, last.Seq)
	}
	flipInSegments(t, tc.fs, dir, []byte("rec-09"))
	tc.start(holder)
	if _, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: []byte("after the flip")}); err == nil || err.Code != wire.CodeDataCorrupt {
		t.Fatalf("publish after a flip into the closed partition's last batch: %v; want DATA_CORRUPT", err)
	}
}

// TestIdleTailIsNotCutAsTornAfterACrash for a cluster partition's only
// replica: it commits what it synced, so it writes the mark too, and its
// next start refuses the open of a log whose idle tail a flip took
// (DATA_CORRUPT) instead of cutting it and handing its seqs out again;
// the repair drops the seqs.
func TestIdleTailOfAMemberAloneIsNotCutAfterACrash(t *testing.T) {
	for _, skipped := range []bool{false, true} {
		t.Run(fmt.Sprintf("mark skipped=%v", skipped), func(t *testing.T) {
			tc := newTestClusterWith(t, 3, func(c *Config) {
				c.SyncedMarkMs = markPeriodMs
				c.Mutations.SyncedMarkSkipped = skipped
			})
			tc.declare("n1", wire.TopicConfig{Name: "one", Partitions: 1, Replicas: 1})
			holder := tc.leaderOf("one", 0)
			last := publishRecs(t, tc.nodes[holder], "one", 7)
			dir := path.Join("/"+holder, "topics", "one", "0")
			waitSyncedMark(t, tc.fs, dir, last.Seq, skipped)
			// A crash of the holder: its stop writes nothing (no dedup
			// snapshot); what it published was synced.
			root := "/" + holder + "/"
			tc.fs.SetInjector(func(_ vfs.Op, name string) error {
				if strings.HasPrefix(name, root) {
					return errInjected
				}
				return nil
			})
			tc.stop(holder)
			tc.fs.SetInjector(nil)
			if point := durablePoint(tc.fs, dir); point != 0 {
				t.Fatalf("a dedup snapshot stands for seq %d: the crash wrote one", point)
			}
			flipInSegments(t, tc.fs, dir, []byte("rec-09"))
			tc.start(holder)
			if skipped {
				tc.leaderOf("one", 0)
			}
			after, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: []byte("after the flip")})
			if skipped {
				// Taken for a torn write: accepted, the lost seq kept
				// (TornSeqsNotReused) and the new reign's install entry
				// after it, but its loss not refused.
				if err != nil || after.Seq != last.Seq+2 {
					t.Fatalf("marks skipped: publish after the flip got %+v, %v; want seq %d, after the lost record's kept seq and the install entry", after, err, last.Seq+2)
				}
				return
			}
			if err == nil || err.Code != wire.CodeDataCorrupt || !strings.Contains(err.Message, "nereus repair") {
				t.Fatalf("publish to the partition whose idle tail is damaged: %+v, %v; want DATA_CORRUPT naming nereus repair", after, err)
			}
			tc.stop(holder)
			rep, rerr := Repair(tc.fs, "/"+holder, RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
			if rerr != nil || len(rep) != 1 || rep[0].Report.TornTail != nil || len(rep[0].Report.Dropped) != 1 ||
				rep[0].Report.Dropped[0].First > last.Seq || rep[0].Report.Dropped[0].Last < last.Seq {
				t.Fatalf("repair: %+v, %v; want seq %d dropped, no torn tail", rep, rerr, last.Seq)
			}
			tc.start(holder)
			tc.leaderOf("one", 0)
			if after, err := publishOn(t, tc.nodes[holder], &wire.Pub{Topic: "one", Partition: 0, Value: []byte("after the repair")}); err != nil || after.Seq <= last.Seq {
				t.Fatalf("publish after the repair: %+v, %v; want a seq above %d", after, err, last.Seq)
			}
		})
	}
}

// The mark's rules, step by step: a period that took an append writes
// none (a log under steady load writes no marks); an idle one writes the
// synced seq once it passed the known point, and only then.
func TestSyncedMarkOnlyAfterAnIdlePeriod(t *testing.T) {
	h := newHarness(t)
	const dir = "/marks"
	if err := h.fs.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	var m syncedMarks
	for i, step := range []struct {
		last, synced uint64
		wrote        bool
		mark         uint64
	}{
		{3, 3, false, 0}, // appended through the period (0 -> 3)
		{5, 5, false, 0}, // again (3 -> 5)
		{5, 4, true, 4},  // idle: the synced seq, even behind the last
		{5, 4, false, 4}, // idle, nothing synced past the mark
		{5, 5, true, 5},
		{6, 6, false, 5}, // an append: no mark, however synced
	} {
		if wrote := h.node.markSynced(&m, dir, step.last, step.synced, "test"); wrote != step.wrote {
			t.Fatalf("step %d %+v: wrote %v", i, step, wrote)
		}
		if mark, err := readSyncedMark(h.fs, dir); err != nil || mark != step.mark {
			t.Fatalf("step %d %+v: mark %d, %v", i, step, mark, err)
		}
	}
}
