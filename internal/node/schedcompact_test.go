package node

import (
	"encoding/binary"
	"fmt"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// compactingSched makes a harness whose scheduler shards checkpoint
// every few records, in small segments, compacted often.
func compactingSched(t *testing.T) *harness { return compactingSchedTuned(t, func(*Config) {}) }

// compactingSchedTuned is compactingSched with tune applied to its
// configuration too.
func compactingSchedTuned(t *testing.T, tune func(*Config)) *harness {
	h := &harness{t: t, fs: vfs.NewMem()}
	h.nowMs.Store(1_000_000)
	h.tune = func(c *Config) {
		c.SegmentBytesMax = 4 << 10
		c.RetentionCheckMs = 5
		c.SchedCheckpointEvery = 24
		c.SchedWindow = 2
		tune(c)
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
	h.waitPending(2) // far1 and far2, from the checkpoint
	h.at(far + 10)
	h.waitValues("t", append(fired, "far1", "far2")...)
}

// scheduleMany schedules n messages of payload bytes into topic, due at
// atMs, many in flight at once, and waits for every answer.
func (h *harness) scheduleMany(topic string, n, payload int, atMs int64) {
	h.t.Helper()
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprint(i))
	}
	h.scheduleKeys(topic, keys, payload, atMs)
}

// scheduleOnShard is scheduleMany with every message on one shard (a
// schedule's shard follows its topic and key).
func (h *harness) scheduleOnShard(topic string, shard uint32, n, payload int, atMs int64) {
	h.t.Helper()
	var keys [][]byte
	for i := 0; len(keys) < n; i++ {
		if k := []byte(fmt.Sprint(i)); wire.SchedShard(topic, k, 0, 0, 0, SchedShards) == shard {
			keys = append(keys, k)
		}
	}
	h.scheduleKeys(topic, keys, payload, atMs)
}

// scheduleKeys schedules a message of payload bytes under each key.
func (h *harness) scheduleKeys(topic string, keys [][]byte, payload int, atMs int64) {
	h.t.Helper()
	n := len(keys)
	value := make([]byte, payload)
	errs := make(chan *wire.Error, n)
	const inflight = 512
	sem := make(chan struct{}, inflight)
	for _, key := range keys {
		sem <- struct{}{}
		f := &wire.Schedule{Pub: wire.Pub{Topic: topic, Partition: wire.PartitionAuto, Key: key, Value: value}, DeliverAtMs: atMs}
		h.node.Schedule(f, func(_ wire.ScheduleOK, err *wire.Error) {
			<-sem
			errs <- err
		})
	}
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				h.t.Fatalf("schedule: %v", err)
			}
		case <-time.After(waitMax):
			h.t.Fatal("schedule: no reply")
		}
	}
}

// schedReadBytes sums what the shards' runners read of their logs.
func (h *harness) schedReadBytes() int64 {
	h.node.schedMu.Lock()
	defer h.node.schedMu.Unlock()
	var n int64
	for _, r := range h.node.sched {
		if r != nil {
			n += r.readBytes.Load()
		}
	}
	return n
}

// waitPending waits until every shard is active, with want pending
// schedules among them.
func (h *harness) waitPending(want uint32) {
	h.t.Helper()
	eventually(h.t, fmt.Sprintf("every shard active with %d pending", want), func() bool {
		st, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus})
		if err != nil {
			return false
		}
		var pending uint32
		for _, s := range st.Shards {
			if s.Lifecycle != "ACTIVE_FOR_COMMANDS" {
				return false
			}
			pending += s.Pending
		}
		return pending == want
	})
}

// pendingNode is a node with n far-future schedules of payload bytes
// pending, then small ones (1 byte): with checkpointEvery > 0, since a
// checkpoint follows at least max(checkpointEvery, live/2) records after
// the last, as many as it takes until each shard checkpointed after the
// big ones (so what a restart replays after the checkpoints holds none of
// their messages); else small ones (so that a node without checkpoints
// can be compared with one that has them). It returns the node and how
// many small ones it scheduled.
//
// A runner reports a checkpoint after the batch of entries it applied it
// in, whose later schedules may have been answered already: a status
// request to each shard, which its runner takes between passes, lets the
// checkpoints among the big ones be reported before they are counted.
// Small ones go only to a shard that has not checkpointed since: one
// given more could reach its next round, whose carries re-write big
// messages after its latest checkpoint, for the restart to read again.
func pendingNode(t testing.TB, n, payload, checkpointEvery, small int) (*harness, int) {
	h := &harness{t: t, fs: vfs.NewMem()}
	h.nowMs.Store(1_000_000)
	var checkpoints [SchedShards]atomic.Int64
	h.tune = func(c *Config) {
		c.SchedCheckpointEvery = checkpointEvery
		c.SchedWindow = 64
		c.SchedCompactObserver = func(shard uint32, ev string) {
			if ev == "checkpoint" {
				checkpoints[shard].Add(1)
			}
		}
	}
	h.open()
	t.Cleanup(func() { h.node.Close() })
	h.declare("t", 1)
	due := h.nowMs.Load() + 1_000_000
	h.scheduleMany("t", n, payload, due)
	if checkpointEvery <= 0 {
		h.scheduleMany("t", small, 1, due)
		return h, small
	}
	if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus}); err != nil {
		t.Fatal(err)
	}
	var before [SchedShards]int64
	for s := range before {
		before[s] = checkpoints[s].Load()
	}
	small = 0
	for {
		var behind []uint32
		for s := range before {
			if checkpoints[s].Load() == before[s] {
				behind = append(behind, uint32(s))
			}
		}
		if len(behind) == 0 {
			return h, small
		}
		if small > 4*(n+checkpointEvery) {
			t.Fatalf("the shards do not checkpoint (%d, %d after %d)", checkpoints[0].Load(), checkpoints[1].Load(), before)
		}
		for _, s := range behind {
			h.scheduleOnShard("t", s, 64, 1, due)
			small += 64
		}
		h.at(h.nowMs.Load())
	}
}

// restartPending restarts h and waits until its n schedules are pending
// again; it returns what the runners read of the shards' logs.
func restartPending(h *harness, n int) int64 {
	h.t.Helper()
	h.restart()
	h.waitPending(uint32(n))
	return h.schedReadBytes()
}

// A restart loads the shards from their latest checkpoints: it reads
// their index, not the pending schedules' messages (without checkpoints
// it reads every one of them).
func TestSchedRestartReadsNoPayloads(t *testing.T) {
	const n, payload = 1000, 1024
	h, small := pendingNode(t, n, payload, 100, 0)
	fromCheckpoint := restartPending(h, n+small)
	h, _ = pendingNode(t, n, payload, -1, small)
	full := restartPending(h, n+small)
	t.Logf("restart with %d pending of %d bytes (and %d of 1 byte) read %d bytes of the shards' logs without checkpoints, %d from them",
		n, payload, small, full, fromCheckpoint)
	if full < n*payload {
		t.Fatalf("a replay of the whole log read %d bytes, less than the %d of the messages", full, n*payload)
	}
	if fromCheckpoint >= n*payload/8 {
		t.Fatalf("a restart from checkpoints read %d bytes for %d pending of %d bytes", fromCheckpoint, n, payload)
	}
}

// BenchmarkSchedRestartPending restarts a node with 100,000 pending
// schedules of 256 bytes (and the 1-byte ones pendingNode adds), with and
// without checkpoints (the shards' whole logs replayed): the time until
// every shard is active again and the bytes of log its runners read.
//
//	go test -run '^$' -bench SchedRestartPending -benchtime 1x ./internal/node
func BenchmarkSchedRestartPending(b *testing.B) {
	const n, payload = 100_000, 256
	var small int
	for _, tc := range []struct {
		name  string
		every int
	}{{"checkpoint", SchedCheckpointEveryDefault}, {"replay", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			h, s := pendingNode(b, n, payload, tc.every, small)
			small = s // the replay node gets as many small ones
			var read int64
			for b.Loop() {
				read = restartPending(h, n+small)
			}
			b.ReportMetric(float64(read)/(1<<20), "MiB-read/restart")
			b.ReportMetric(float64(n+small), "pending")
		})
	}
}

// The checkpoint hint is only a place to look: one that names no
// checkpoint (here: the seq before the shard's last record, a schedule
// after every checkpoint) makes the restart read the shard's log from
// its start, and every schedule is pending again.
func TestSchedBadHintFallsBackToTheLogStart(t *testing.T) {
	h, small := pendingNode(t, 200, 16, 50, 0)
	h.scheduleMany("t", 8, 16, h.nowMs.Load()+1_000_000)
	top, err := h.node.topic(wire.SchedTopic)
	if err != nil {
		t.Fatal(err)
	}
	for shard, p := range top.partitions {
		name := path.Join("/data", schedHintDir, fmt.Sprint(shard))
		if _, err := h.fs.Stat(name); err != nil {
			t.Fatalf("shard %d has no checkpoint hint: %v", shard, err)
		}
		if err := storage.WriteFileAtomic(h.fs, name, binary.BigEndian.AppendUint64(nil, p.commitSeq.Load()-1)); err != nil {
			t.Fatal(err)
		}
	}
	h.restart()
	h.waitPending(uint32(200 + small + 8))
}
