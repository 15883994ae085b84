package node

import (
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/sched/schedtest"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// spillOnDisk makes spills on fs: the first in /spill, the next ones
// (states restored from checkpoints) beside it.
func spillOnDisk(t *testing.T, fs vfs.FS, tableMax int) func(schedtest.Find) sched.Spill {
	made := 0
	return func(find schedtest.Find) sched.Spill {
		dir := "/spill"
		if made++; made > 1 {
			dir = fmt.Sprintf("/spill-restored-%d", made)
		}
		sp, err := newSchedSpill(fs, dir, tableMax, func(id uint64) (string, sched.Key, bool, error) {
			lane, k, ok, compacted := find(id)
			if compacted {
				return "", sched.Key{}, false, errScheduleCompacted
			}
			return lane, k, ok, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
}

// The shard's spill on disk holds what a State bounded to a small window
// gives it exactly as if everything stayed resident: tables turning into
// runs, runs merging, deletions inside runs, pops across runs.
func TestSchedSpillEquivalent(t *testing.T) {
	for seed := range uint64(6) {
		for _, tableMax := range []int{2, 7} {
			fs := vfs.NewMem()
			schedtest.Equivalence(t, seed, 1500, 3, spillOnDisk(t, fs, tableMax))
			if names, _ := fs.List("/spill"); len(names) != 0 {
				t.Fatalf("seed %d: the drained spill left %v", seed, names)
			}
		}
	}
}

// A flipped bit in a run is an error, never a wrong schedule; and the
// next spill in the directory starts empty (the log rebuilds it).
func TestSchedSpillDamage(t *testing.T) {
	fs := vfs.NewMem()
	keys := map[uint64]sched.Key{}
	find := func(id uint64) (string, sched.Key, bool, error) { k, ok := keys[id]; return "a", k, ok, nil }
	sp, err := newSchedSpill(fs, "/spill", 4, find)
	if err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 8; id++ {
		keys[id] = sched.Key{DeliverAtMs: int64(100 - id), ID: id}
		if err := sp.Put("a", keys[id]); err != nil {
			t.Fatal(err)
		}
	}
	names, _ := fs.List("/spill")
	if len(names) != 1 {
		t.Fatalf("runs %v, want the two tables merged into one", names)
	}
	// Entry 0 of the run (ids 8..1 by due time) holds id 8.
	if err := fs.FlipBit("/spill/"+names[0], 3, 1); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := sp.Delete(8); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("delete over a flipped bit: %v, want a checksum error", err)
	}
	if _, err := sp.Pop("a", 2); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("pop over a flipped bit: %v, want a checksum error", err)
	}
	sp.close()
	if _, err := newSchedSpill(fs, "/spill", 4, find); err != nil {
		t.Fatal(err)
	}
	if names, _ := fs.List("/spill"); len(names) != 0 {
		t.Fatalf("a new spill kept %v", names)
	}
}

// What a lane keeps in RAM and on disk stays bounded however many
// schedules it holds and however many of them are deleted: its table and
// its runs' deleted ids stay under the table size, its runs logarithmic
// in its schedules.
func TestSchedSpillBounded(t *testing.T) {
	fs := vfs.NewMem()
	keys := map[uint64]sched.Key{}
	find := func(id uint64) (string, sched.Key, bool, error) { k, ok := keys[id]; return "a", k, ok, nil }
	const tableMax = 16
	sp, err := newSchedSpill(fs, "/spill", tableMax, find)
	if err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		l := sp.lanes["a"]
		names, _ := fs.List("/spill")
		if len(l.table) >= tableMax || l.dead >= tableMax || len(l.runs) > bits.Len(uint(l.n))+1 || len(names) != len(l.runs) {
			t.Fatalf("table %d, deleted %d, runs %d, files %d", len(l.table), l.dead, len(l.runs), len(names))
		}
	}
	for id := uint64(1); id <= 5000; id++ {
		keys[id] = sched.Key{DeliverAtMs: int64(id*7919) % 1000, ID: id}
		if err := sp.Put("a", keys[id]); err != nil {
			t.Fatal(err)
		}
		check()
	}
	for id := uint64(1); id <= 5000; id += 2 {
		if _, _, ok, err := sp.Delete(id); !ok || err != nil {
			t.Fatalf("delete %d: %v %v", id, ok, err)
		}
		check()
	}
	ks, err := sp.Pop("a", 5000)
	if err != nil || len(ks) != 2500 {
		t.Fatalf("pop: %d, %v", len(ks), err)
	}
	for i, k := range ks {
		if k.ID%2 != 0 || i > 0 && sched.CompareKeys(ks[i-1], k) >= 0 {
			t.Fatalf("pop %d: %+v after %+v", i, k, ks[max(i-1, 0)])
		}
	}
}

// A node whose lanes keep 3 pending schedules in RAM fires hundreds, none
// early, each once, the cancelled ones never: across a restart (the spill
// is rebuilt from the log) and a write error in the spill (the shard's
// state is rebuilt from the log, not failed).
func TestScheduledDeliveryThroughTheSpill(t *testing.T) {
	h := newHarness(t)
	h.tune = func(c *Config) { c.SchedWindow = 3 }
	h.restart()
	h.declare("t", 2)
	h.declare("u", 1)
	now := h.nowMs.Load()
	rng := rand.New(rand.NewPCG(7, 7))
	type sch struct {
		topic, value string
		at           int64
		ok           wire.ScheduleOK
	}
	var all []sch
	for i := range 160 {
		s := sch{topic: "t", value: fmt.Sprintf("m%d", i), at: now + 100 + rng.Int64N(900)}
		if i%4 == 0 {
			s.topic = "u"
		}
		s.ok = h.mustSchedule(s.topic, s.value, s.at)
		all = append(all, s)
	}
	resident, spilled := 0, 0
	h.node.schedMu.Lock()
	runners := h.node.sched
	h.node.schedMu.Unlock()
	for _, r := range runners {
		done := make(chan struct{})
		r.send(schedCmd{admin: &wire.SchedAdmin{Op: wire.SchedStatus}, adminReply: func(*wire.SchedAdminOK, *wire.Error) {
			resident += len(r.st.Entries(0))
			spilled += r.st.Spilled()
			close(done)
		}})
		<-done
	}
	if resident > 2*3*2*2 || spilled < 100 {
		t.Fatalf("resident %d, spilled %d: want at most 2×window per lane and shard resident, the rest spilled", resident, spilled)
	}
	cancelled := map[string]bool{}
	for _, s := range all[1:40] {
		if s.at > now+500 {
			if _, err := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedCancel, Shard: s.ok.Shard, ID: s.ok.ID}); err != nil {
				t.Fatalf("cancel %s: %v", s.value, err)
			}
			cancelled[s.value] = true
		}
	}
	if len(cancelled) < 5 {
		t.Fatalf("cancelled only %d", len(cancelled))
	}
	want := func(topic string, until int64) []string {
		var vs []string
		for _, s := range all {
			if s.topic == topic && s.at <= until && !cancelled[s.value] {
				vs = append(vs, s.value)
			}
		}
		return vs
	}
	// One write of the spill fails while the restarted node replays the
	// log: the shard starts over from its log.
	var failed atomic.Bool
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpWrite && strings.Contains(name, "sched-spill/") && failed.CompareAndSwap(false, true) {
			return errors.New("injected write error")
		}
		return nil
	})
	h.restart()
	h.at(now + 500)
	h.waitValues("t", want("t", now+500)...)
	h.waitValues("u", want("u", now+500)...)
	h.stays("t", want("t", now+500)...)
	h.at(now + 1000)
	h.waitValues("t", want("t", now+1000)...)
	h.waitValues("u", want("u", now+1000)...)
	if !failed.Load() {
		t.Fatal("no spill write failed")
	}
}
