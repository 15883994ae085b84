package node

import (
	"fmt"
	"path"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// compactingSched makes a harness whose scheduler shards checkpoint
// every few records, in small segments, compacted often.
func compactingSched(t *testing.T) *harness {
	h := &harness{t: t, fs: vfs.NewMem()}
	h.nowMs.Store(1_000_000)
	h.tune = func(c *Config) {
		c.SegmentBytesMax = 4 << 10
		c.RetentionCheckMs = 5
		c.SchedCheckpointEvery = 24
		c.SchedWindow = 2
	}
	h.open()
	t.Cleanup(func() { h.node.Close() })
	return h
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(t *testing.T, fs vfs.FS, dir string) int64 {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, name := range names {
		p := path.Join(dir, name)
		if sub, err := fs.List(p); err == nil && len(sub) > 0 {
			n += dirBytes(t, fs, p)
			continue
		}
		if st, err := fs.Stat(p); err == nil {
			n += st
		}
	}
	return n
}

// shardStarts returns where each scheduler shard's log starts.
func (h *harness) shardStarts() []uint64 {
	t, err := h.node.topic(wire.SchedTopic)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []uint64
	for _, p := range t.partitions {
		out = append(out, p.startSeq.Load())
	}
	return out
}

// A shard with steady schedule-and-fire traffic keeps its log bounded
// while a few far-future schedules stay pending: the owner carries their
// messages forward and checkpoints, and the prefix goes. A carried
// schedule is still cancelled by its id, and after a restart (from the
// latest checkpoint) the others fire with their own messages.
func TestSchedShardLogStaysBounded(t *testing.T) {
	h := compactingSched(t)
	h.declare("t", 1)
	now := h.nowMs.Load()
	far := now + 1_000_000
	var farIDs []wire.ScheduleOK
	for i := range 3 {
		farIDs = append(farIDs, h.mustSchedule("t", fmt.Sprintf("far%d", i), far+int64(i)))
	}
	var fired []string
	var sizes []int64
	for round := range 60 {
		now += 10
		for i := range 6 {
			v := fmt.Sprintf("r%d-%d", round, i)
			h.mustSchedule("t", v, now)
			fired = append(fired, v)
		}
		h.at(now)
		h.waitValues("t", fired...)
		if round%20 == 19 {
			sizes = append(sizes, dirBytes(t, h.fs, "/data/topics/"+wire.SchedTopic))
		}
	}
	t.Logf("__sched on disk after 20, 40, 60 rounds: %v bytes; shard logs start at %v", sizes, h.shardStarts())
	eventually(t, "every shard's log start passes the far schedules' records", func() bool {
		h.at(now)
		for i, start := range h.shardStarts() {
			for _, ok := range farIDs {
				if ok.Shard == uint32(i) && start <= ok.ID {
					return false
				}
			}
		}
		return true
	})
	if sizes[2] > 2*sizes[0] {
		t.Fatalf("__sched grew from %d to %d bytes between rounds 20 and 60", sizes[0], sizes[2])
	}

	// Cancel by id, though the schedule's own record is compacted away.
	if _, err := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedCancel, Shard: farIDs[0].Shard, ID: farIDs[0].ID}); err != nil {
		t.Fatalf("cancel far0 (id %d): %v", farIDs[0].ID, err)
	}
	h.restart()
	st, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus})
	if err != nil {
		t.Fatal(err)
	}
	var pending uint32
	for _, s := range st.Shards {
		pending += s.Pending
	}
	if pending != 2 {
		t.Fatalf("after the restart %d schedules pending, want 2: %+v", pending, st.Shards)
	}
	h.at(far + 10)
	h.waitValues("t", append(fired, "far1", "far2")...)
}
