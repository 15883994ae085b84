package node

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// schedule sends a SCHEDULE and waits for its answer.
func (h *harness) schedule(f *wire.Schedule) (wire.ScheduleOK, *wire.Error) {
	h.t.Helper()
	type res struct {
		ok  wire.ScheduleOK
		err *wire.Error
	}
	ch := make(chan res, 1)
	h.node.Schedule(f, func(ok wire.ScheduleOK, err *wire.Error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		return r.ok, r.err
	case <-time.After(waitMax):
		h.t.Fatal("schedule: no reply")
		return wire.ScheduleOK{}, nil
	}
}

func (h *harness) mustSchedule(topic, value string, atMs int64) wire.ScheduleOK {
	h.t.Helper()
	ok, err := h.schedule(&wire.Schedule{Pub: wire.Pub{Topic: topic, Partition: wire.PartitionAuto, Key: []byte(value), Value: []byte(value)}, DeliverAtMs: atMs})
	if err != nil {
		h.t.Fatalf("schedule %s at %d: %v", value, atMs, err)
	}
	return ok
}

func (h *harness) schedAdmin(f *wire.SchedAdmin) (*wire.SchedAdminOK, *wire.Error) {
	h.t.Helper()
	type res struct {
		ok  *wire.SchedAdminOK
		err *wire.Error
	}
	ch := make(chan res, 1)
	h.node.SchedAdmin(f, func(ok *wire.SchedAdminOK, err *wire.Error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		return r.ok, r.err
	case <-time.After(waitMax):
		h.t.Fatal("sched admin: no reply")
		return nil, nil
	}
}

// schedAdminAll asks every shard (as a client does) and merges the answers;
// the first refusal is returned.
func (h *harness) schedAdminAll(f wire.SchedAdmin) (*wire.SchedAdminOK, *wire.Error) {
	h.t.Helper()
	t, err := h.node.topic(wire.SchedTopic)
	if err != nil {
		h.t.Fatal(err)
	}
	out := &wire.SchedAdminOK{}
	for shard := range t.partitions {
		f.Shard = uint32(shard)
		ok, err := h.schedAdmin(&f)
		if err != nil {
			return nil, err
		}
		out.Schedules = append(out.Schedules, ok.Schedules...)
		out.Shards = append(out.Shards, ok.Shards...)
		out.Lanes = append(out.Lanes, ok.Lanes...)
	}
	return out, nil
}

// at moves the test's clock and wakes the shards' runners (their timers
// run on real time).
func (h *harness) at(ms int64) {
	h.nowMs.Store(ms)
	h.node.schedMu.Lock()
	for _, r := range h.node.sched {
		r.poke()
	}
	h.node.schedMu.Unlock()
}

// values reads every visible record of topic, counting each value.
func (h *harness) values(topic string) map[string]int {
	h.t.Helper()
	t, err := h.node.topic(topic)
	if err != nil {
		h.t.Fatal(err)
	}
	n := map[string]int{}
	for p := range t.partitions {
		for from := uint64(1); ; {
			es, err := h.node.Read(topic, uint32(p), from, 1000)
			if gap := (*storage.GapError)(nil); errors.As(err, &gap) && gap.Next > from {
				from = gap.Next // a torn tail's seqs, kept
				continue
			}
			if err != nil {
				h.t.Fatal(err)
			}
			if len(es) == 0 {
				break
			}
			for _, e := range es {
				n[string(e.Record.Value)]++
				from = e.Seq + 1
			}
		}
	}
	return n
}

// waitValues waits until topic holds exactly want (each once).
func (h *harness) waitValues(topic string, want ...string) {
	h.t.Helper()
	deadline := time.Now().Add(waitMax)
	for {
		got := h.values(topic)
		ok := len(got) == len(want)
		for _, v := range want {
			ok = ok && got[v] == 1
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s holds %v, want each of %v once", topic, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stays checks that topic still holds exactly want after the runners had
// time to act.
func (h *harness) stays(topic string, want ...string) {
	h.t.Helper()
	time.Sleep(100 * time.Millisecond)
	h.waitValues(topic, want...)
}

func TestScheduledMessagesFireOnceWhenDue(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 3)
	now := h.nowMs.Load()
	var all []string
	for i := range 6 {
		v := fmt.Sprintf("m%d", i)
		all = append(all, v)
		ok := h.mustSchedule("t", v, now+100*int64(i+1))
		if ok.ID == 0 || ok.DeliverAtMs != now+100*int64(i+1) {
			t.Fatalf("SCHEDULE_OK %+v", ok)
		}
	}
	h.stays("t")
	h.at(now + 300)
	h.waitValues("t", all[:3]...)
	h.stays("t", all[:3]...)
	h.at(now + 1000)
	h.waitValues("t", all...)

	// A shard records an intent fired once the destination acknowledged
	// its publish (a KindFired record): its status follows the visible
	// values by that record's commit.
	var st *wire.SchedAdminOK
	eventually(t, "every shard records its schedules fired", func() bool {
		var err *wire.Error
		if st, err = h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus}); err != nil {
			t.Fatal(err)
		}
		var fired, pending uint64
		for _, s := range st.Shards {
			fired, pending = fired+s.Fired, pending+uint64(s.Pending)
		}
		return fired == 6 && pending == 0
	})
	for _, s := range st.Shards {
		if s.Lifecycle != "ACTIVE_FOR_COMMANDS" {
			t.Fatalf("shard %+v", s)
		}
	}
	if len(st.Lanes) == 0 {
		t.Fatalf("status %+v", st)
	}

	// Fired schedules stay fired across a restart.
	h.restart()
	h.at(now + 2000)
	h.stays("t", all...)
}

func TestSchedulesSurviveARestartAndFireAfterIt(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	now := h.nowMs.Load()
	h.mustSchedule("t", "later", now+500)
	h.restart()
	h.at(now + 400)
	h.stays("t")
	h.at(now + 500)
	h.waitValues("t", "later")
	list, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedList})
	if err != nil || len(list.Schedules) != 0 {
		t.Fatalf("list after firing: %+v %v", list, err)
	}
}

// A retry of a SCHEDULE (same producer identity) is answered from the
// shard's dedup table with the original id, and fires once.
func TestScheduleRetryIsDeduplicated(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 2)
	now := h.nowMs.Load()
	f := &wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 77, ProducerSeq: 1, Value: []byte("once")}, DeliverAtMs: now + 50}
	first, err := h.schedule(f)
	if err != nil {
		t.Fatal(err)
	}
	again, err := h.schedule(f)
	if err != nil || !again.Duplicate || again.ID != first.ID || again.Shard != first.Shard {
		t.Fatalf("retry answered %+v %v, first %+v", again, err, first)
	}
	h.at(now + 50)
	h.waitValues("t", "once")
	h.stays("t", "once")
}

// RetryIsItsOriginal: a retried SCHEDULE is answered with the original's
// SCHEDULE_OK whatever the lane's gate is now: the schedule was admitted,
// is live and fires once the lane opens. Refused because its lane was
// closed since (SchedRetryRefusedOnClosedLane, as before), the retry told
// its client "not scheduled" of a message that then fired.
//
// RefusalIsFinal: a new schedule to the closed lane is refused, and its
// producer_seq keeps that answer — sent again once the lane is open (as
// a retry of a send whose answer was late arrives), it is refused again
// and never fires; a new producer_seq is taken. With
// SchedRefusalNotRecorded (nothing appended, as before) the second send
// is taken as new and fires, though its client was told "refused" (found
// by the cluster simulator: seed 616 of `--replicas 1 --schedules 30
// --lane-pauses 4 --lane-recreate`, RefusedNeverPublished).
func TestScheduleRetryOnAClosedLaneIsItsOriginal(t *testing.T) {
	for _, mut := range []string{"", "SchedRetryRefusedOnClosedLane", "SchedRefusalNotRecorded"} {
		t.Run(cmp.Or(mut, "guarded"), func(t *testing.T) {
			h := &harness{t: t, fs: vfs.NewMem(), tune: func(c *Config) {
				c.Mutations.SchedRetryRefusedOnClosedLane = mut == "SchedRetryRefusedOnClosedLane"
				c.Mutations.SchedRefusalNotRecorded = mut == "SchedRefusalNotRecorded"
			}}
			h.nowMs.Store(1_000_000)
			h.open()
			t.Cleanup(func() { h.node.Close() })
			h.declare("t", 1)
			now := h.nowMs.Load()
			f := &wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 77, ProducerSeq: 1, Value: []byte("admitted")}, DeliverAtMs: now + 50}
			first, err := h.schedule(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneClose}); err != nil {
				t.Fatal(err)
			}
			again, err := h.schedule(f)
			original := err == nil && again.Duplicate && again.ID == first.ID && again.Shard == first.Shard
			if want := mut != "SchedRetryRefusedOnClosedLane"; original != want {
				t.Fatalf("retry on the closed lane answered %+v %v (the original %+v): answered as the original %v, want %v", again, err, first, original, want)
			}
			late := &wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 78, ProducerSeq: 1, Value: []byte("late")}, DeliverAtMs: now + 50}
			if ok, err := h.schedule(late); err == nil || err.Code != wire.CodeInvalidArgument {
				t.Fatalf("a new schedule on the closed lane answered %+v %v, want INVALID_ARGUMENT", ok, err)
			}
			h.at(now + 1000)
			h.stays("t")
			if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneResume}); err != nil {
				t.Fatal(err)
			}
			ok, err := h.schedule(late)
			if refused := err != nil && err.Code == wire.CodeInvalidArgument; refused != (mut == "") {
				t.Fatalf("the refused schedule sent again to the open lane answered %+v %v: refused again %v", ok, err, refused)
			}
			fresh := &wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 78, ProducerSeq: 2, Value: []byte("fresh")}, DeliverAtMs: now + 50}
			if ok, err := h.schedule(fresh); err != nil || ok.Duplicate {
				t.Fatalf("a new producer_seq on the open lane answered %+v %v, want taken", ok, err)
			}
			want := []string{"admitted", "fresh"}
			if mut != "" { // nothing appended: the refused send taken as new
				want = []string{"admitted", "fresh", "late"}
			}
			h.waitValues("t", want...)
			h.stays("t", want...)
		})
	}
}

// RefusalOutlivesItsAnswer: a schedule admitted while its lane was open,
// whose record applies after the lane's CLOSE (in a cluster, a SCHEDULE
// that crossed the network while the CLOSE did not), is refused as it
// applies. A retry of it after a restart that restored the shard from a
// checkpoint past that record used to be answered OK — the runner's
// memory of the refusal gone, the shard's producer table taking the
// retry for a duplicate — of a schedule that does not exist. The lane
// remembers the spans of seqs in which it refused schedules, in its
// checkpoints too. With SchedRefusalForgotten the retry is answered OK
// and nothing is ever published, as before.
func TestRefusedScheduleRetriedAfterARestartIsRefused(t *testing.T) {
	for _, mut := range []bool{false, true} {
		t.Run(fmt.Sprintf("SchedRefusalForgotten=%v", mut), func(t *testing.T) {
			h := compactingSchedTuned(t, func(c *Config) { c.Mutations.SchedRefusalForgotten = mut })
			h.declare("t", 1)
			now := h.nowMs.Load()
			key := []byte("raced")
			shard := wire.SchedShard("t", key, 0, 0, 0, SchedShards)
			f := &wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Key: key, ProducerID: 77, ProducerSeq: 1, Value: []byte("raced")}, DeliverAtMs: now + 50}
			h.declare("u", 1)
			runners, werr := h.node.schedRunners()
			if werr != nil {
				t.Fatal(werr)
			}
			if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneClose}); err != nil {
				t.Fatal(err)
			}
			// The record of a SCHEDULE admitted before the close, appended
			// after it, as the runner's intake appends it.
			v, err := (&sched.Record{Kind: sched.KindSchedule, Schedule: sched.Schedule{DeliverAtMs: f.DeliverAtMs, Topic: "t", Incarnation: h.node.scheduleIncarnation("t")}}).Encode()
			if err != nil {
				t.Fatal(err)
			}
			appended := make(chan wire.PubOK, 1)
			runners[shard].p.enqueue(&pubReq{
				rec:        storage.Record{TimestampMs: now, Key: key, Value: f.Pub.Value, Headers: []storage.Header{{Key: schedHeader, Value: v}}, ProducerID: 77, ProducerSeq: 1},
				producerID: 77, producerSeq: 1,
				reply: replyTo{fn: func(ok wire.PubOK, err *wire.Error) {
					if err != nil {
						t.Error(err)
					}
					appended <- ok
				}},
			})
			var raced wire.PubOK
			select {
			case raced = <-appended:
			case <-time.After(waitMax):
				t.Fatal("the raced record was not appended")
			}
			if _, err := h.schedule(f); err == nil || err.Code != wire.CodeInvalidArgument {
				t.Fatalf("the retry at once answered %v, want INVALID_ARGUMENT (the record was refused as it applied)", err)
			}
			// Open the lane, and let the shard checkpoint past the record
			// and drop it.
			if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneResume}); err != nil {
				t.Fatal(err)
			}
			at := h.nowMs.Load()
			for range 30 {
				at += 10
				h.scheduleOnShard("u", shard, 6, 64, at)
				h.at(at)
			}
			eventually(t, "the shard's log start passes the raced record", func() bool {
				h.at(at)
				return h.shardStarts()[shard] > raced.Seq
			})
			h.restart()
			ok, err2 := h.schedule(f)
			switch {
			case !mut && (err2 == nil || err2.Code != wire.CodeInvalidArgument):
				t.Fatalf("the retry after the restart answered %+v %v, want INVALID_ARGUMENT", ok, err2)
			case mut && (err2 != nil || !ok.Duplicate || ok.ID != raced.Seq):
				t.Fatalf("SchedRefusalForgotten: the retry after the restart answered %+v %v, want the lie: OK, a duplicate of %d", ok, err2, raced.Seq)
			}
			if !mut {
				// RefusalNeverForgottenAsOK: once the lane has closed
				// RefusingSpansMax times more, it no longer remembers the
				// span of the refusal: OUTCOME_UNKNOWN, never OK.
				for range sched.RefusingSpansMax {
					for _, op := range []uint8{wire.LaneClose, wire.LaneResume} {
						if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: op}); err != nil {
							t.Fatal(err)
						}
					}
				}
				if ok, err := h.schedule(f); err == nil || err.Code != wire.CodeOutcomeUnknown {
					t.Fatalf("the retry after %d more closes answered %+v %v, want OUTCOME_UNKNOWN", sched.RefusingSpansMax, ok, err)
				}
			}
			h.at(h.nowMs.Load() + 1000)
			h.stays("t")
		})
	}
}

// A retry of a pending schedule from before a lane's oldest remembered
// refusal is a duplicate, also when the schedule lies in the lane's
// spill (RefusalNeverForgottenAsOK counts spilled schedules live): the
// lane closed more than RefusingSpansMax times since, and a schedule its
// window keeps on disk is as live as a resident one.
func TestRetriedSpilledScheduleBelowForgottenRefusalsIsADuplicate(t *testing.T) {
	h := compactingSched(t) // a window of 2: most of the lane spills
	h.declare("t", 1)
	key := []byte("k")
	var sent []*wire.Schedule
	var first []wire.ScheduleOK
	for i := range 6 {
		f := &wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Key: key, ProducerID: 90, ProducerSeq: uint64(i + 1), Value: []byte("v")},
			DeliverAtMs: h.nowMs.Load() + 1_000_000_000 + int64(i)}
		ok, err := h.schedule(f)
		if err != nil {
			t.Fatal(err)
		}
		sent, first = append(sent, f), append(first, ok)
	}
	for range sched.RefusingSpansMax + 1 {
		for _, op := range []uint8{wire.LaneClose, wire.LaneResume} {
			if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: op}); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.restart()
	for i, f := range sent {
		ok, err := h.schedule(f)
		if err != nil || !ok.Duplicate || ok.ID != first[i].ID {
			t.Fatalf("retry of pending schedule %d (seq %d): %+v %v, want OK, a duplicate", i+1, first[i].ID, ok, err)
		}
	}
}

// A new SCHEDULE to a RETIRED lane is refused with nothing written to its
// shard: a retired lane never opens again, so no later send of it needs
// its refusal kept as a record (as RefusalIsFinal keeps a CLOSED lane's).
// A retry of a schedule admitted before the retire is still answered as
// its original (RetryIsItsOriginal).
func TestNewScheduleToARetiredLaneWritesNothing(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	key := []byte("k")
	pub := wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Key: key, ProducerID: 5, ProducerSeq: 1, Value: []byte("v")}
	admitted := &wire.Schedule{Pub: pub, DeliverAtMs: h.nowMs.Load() + 1_000_000}
	first, err := h.schedule(admitted)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneRetire}); err != nil {
		t.Fatal(err)
	}
	fresh := *admitted
	fresh.Pub.ProducerSeq = 2
	if _, err := h.schedule(&fresh); err == nil || err.Code != wire.CodeInvalidArgument {
		t.Fatalf("a new schedule to the retired lane: %v, want INVALID_ARGUMENT", err)
	}
	if ok, err := h.schedule(admitted); err != nil || !ok.Duplicate || ok.ID != first.ID {
		t.Fatalf("the retry of the schedule admitted before the retire: %+v %v, want its original %d", ok, err, first.ID)
	}
	runners, werr := h.node.schedRunners()
	if werr != nil {
		t.Fatal(werr)
	}
	shard := wire.SchedShard("t", key, pub.ProducerID, pub.ProducerSeq, 0, SchedShards)
	entries, rerr := runners[shard].p.read(1, 1000, 1<<20)
	if rerr != nil {
		t.Fatal(rerr)
	}
	for _, e := range entries {
		if e.Record.ProducerID == pub.ProducerID && e.Record.ProducerSeq == fresh.Pub.ProducerSeq {
			t.Fatalf("the refused schedule was written to shard %d at seq %d", shard, e.Seq)
		}
	}
}

func TestScheduleLaneGatesAndCancel(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	now := h.nowMs.Load()
	h.mustSchedule("t", "held", now+10)
	gone := h.mustSchedule("t", "cancelled", now+10)
	if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LanePause}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedCancel, Shard: gone.Shard, ID: gone.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedCancel, Shard: gone.Shard, ID: gone.ID}); err == nil || err.Code != wire.CodeNotFound {
		t.Fatalf("cancelling twice: %v, want NOT_FOUND", err)
	}
	h.at(now + 1000)
	h.stays("t")
	st, _ := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus, Topic: "t"})
	for _, l := range st.Lanes {
		if l.Pending > 0 && l.Gate != "ADMIN_PAUSED" {
			t.Fatalf("lane %+v, want ADMIN_PAUSED", l)
		}
	}
	if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneResume}); err != nil {
		t.Fatal(err)
	}
	h.waitValues("t", "held")

	if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneClose}); err != nil {
		t.Fatal(err)
	}
	_, err := h.schedule(&wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Key: []byte("held"), Value: []byte("x")}, DeliverAtMs: now})
	if err == nil {
		t.Fatal("a CLOSED lane took a schedule")
	}
	h.stays("t", "held")
}

func TestScheduleRefusesBadInput(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	for _, tc := range []struct {
		f    wire.Schedule
		code wire.Code
	}{
		{wire.Schedule{Pub: wire.Pub{Topic: "missing", Partition: wire.PartitionAuto}}, wire.CodeNotFound},
		{wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: 5}}, wire.CodeNotFound},
		{wire.Schedule{Pub: wire.Pub{Topic: "__sched", Partition: wire.PartitionAuto}}, wire.CodeInvalidArgument},
		{wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Headers: []wire.Header{{Key: schedHeader, Value: []byte{1}}}}}, wire.CodeInvalidArgument},
	} {
		if _, err := h.schedule(&tc.f); err == nil || err.Code != tc.code {
			t.Fatalf("%+v: %v, want %v", tc.f, err, tc.code)
		}
	}
	if _, err := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedLane, Topic: "nolane", LaneOp: wire.LanePause}); err == nil || err.Code != wire.CodeNotFound {
		t.Fatalf("pausing the lane of a missing topic: %v, want NOT_FOUND", err)
	}
	if _, err := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedStatus, Shard: 99}); err == nil || err.Code != wire.CodeNotFound {
		t.Fatalf("status of shard 99: %v, want NOT_FOUND", err)
	}
	if _, err := h.schedAdmin(&wire.SchedAdmin{Op: 99}); err == nil {
		t.Fatal("an unknown operation was accepted")
	}
}

// Schedules acknowledged before kill -9 style crashes (unsynced writes
// lost, torn tails) at random points — while schedules are taken and
// while due ones fire — are each published exactly once, and nothing is
// visible before its deliver_at (the clock only moves forward here, so a
// value seen at time T must be due by T). A schedule whose answer was
// lost may fire too, at most once.
func TestScheduledDeliveryAcrossCrashes(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			h := newHarness(t)
			h.declare("t", 2)
			rng := rand.New(rand.NewPCG(seed, 0))
			start := h.nowMs.Load()
			due := map[string]int64{}
			acked := map[string]bool{}
			check := func() {
				t.Helper()
				now := h.nowMs.Load()
				for v, n := range h.values("t") {
					if n > 1 {
						t.Fatalf("%s published %d times", v, n)
					}
					if due[v] > now {
						t.Fatalf("%s visible at %d, due at %d", v, now, due[v])
					}
				}
			}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for i := range 40 {
				v := fmt.Sprint("s", i)
				at := start + rng.Int64N(1500)
				mu.Lock()
				due[v] = at
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := h.schedule(&wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 1000 + uint64(i), ProducerSeq: 1, Value: []byte(v)}, DeliverAtMs: at})
					if err == nil {
						mu.Lock()
						acked[v] = true
						mu.Unlock()
					}
				}()
				if i%5 == 4 {
					wg.Wait()
					h.at(h.nowMs.Load() + rng.Int64N(200))
					// Crash while due schedules fire: between a publish
					// landing and its FIRED record, a restart publishes
					// again and the destination must deduplicate.
					time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
					h.fs.Crash(rng)
					h.node.Close()
					h.open()
					h.at(h.nowMs.Load())
					check()
				}
			}
			wg.Wait()
			h.at(start + 2000)
			deadline := time.Now().Add(waitMax)
			for {
				got := h.values("t")
				missing := 0
				for v := range acked {
					if got[v] == 0 {
						missing++
					}
				}
				if missing == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d acknowledged schedules never published; got %v", missing, got)
				}
				time.Sleep(5 * time.Millisecond)
			}
			check()
			if len(acked) < 10 {
				t.Fatalf("only %d schedules acknowledged", len(acked))
			}
		})
	}
}

// A crash between a scheduled publish landing and its FIRED record
// becoming durable: after the restart the schedule is still firing, the
// runner publishes it again, and the destination takes the retry for the
// original (same producer identity and fire sequence) — one copy.
func TestScheduledPublishAgainAfterACrashBeforeFired(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	now := h.nowMs.Load()
	h.mustSchedule("t", "first", now+1_000_000) // creates __sched and the lane; never due here
	var landed, failing atomic.Bool
	failed := make(chan struct{}, 1)
	failing.Store(true)
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op != vfs.OpSync {
			return nil
		}
		if strings.Contains(name, "/t/") {
			landed.Store(true)
		}
		// Once the destination synced the message, the shard's disk
		// fails: its FIRED record never becomes durable.
		if strings.Contains(name, wire.SchedTopic) && landed.Load() && failing.Load() {
			select {
			case failed <- struct{}{}:
			default:
			}
			return errors.New("injected fsync error")
		}
		return nil
	})
	h.mustSchedule("t", "once", now)
	select {
	case <-failed:
	case <-time.After(waitMax):
		t.Fatal("no FIRED record was written")
	}
	h.fs.Crash(rand.New(rand.NewPCG(1, 2)))
	h.node.Close()
	failing.Store(false)
	h.open()
	h.at(now + 1000)
	h.waitValues("t", "once")
	deadline := time.Now().Add(waitMax)
	for {
		st, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus})
		if err != nil {
			t.Fatal(err)
		}
		var fired uint64
		for _, s := range st.Shards {
			fired += s.Fired
		}
		if fired == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v: the schedule was not resolved after the restart", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.stays("t", "once")
}

// A scheduled message whose destination is deleted and declared again
// between the lane's last check and its publish does not land in the new
// incarnation: the publish is bound to the incarnation the lane vouched
// for (publishInto) and answered NOT_FOUND, the lane finds the new
// incarnation and stays ORDERING_BROKEN, and a resume resolves the
// schedule UNKNOWN: it is never published into the new topic. Under the
// mutation PublishIgnoresIncarnation it lands there at once.
func TestScheduledPublishIsBoundToItsDestinationsIncarnation(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignored=%v", mutated), func(t *testing.T) {
			h := newHarness(t)
			var once sync.Once
			recreated := make(chan error, 1)
			h.tune = func(c *Config) {
				c.Mutations.PublishIgnoresIncarnation = mutated
				c.SchedPublishObserver = func(_ uint32, p sched.Publish) {
					if p.Topic != "t" {
						return
					}
					once.Do(func() { // another client, just before the publish
						done := make(chan error, 1)
						go func() {
							var err error
							h.node.DeleteTopic("t", p.Incarnation, func(_ uint64, e error) {
								if err = e; err == nil {
									_, err = h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 1})
								}
								done <- err
							})
						}()
						select {
						case err := <-done:
							recreated <- err
						case <-time.After(waitMax):
							recreated <- errors.New("delete and declare did not finish while the publish waited")
						}
					})
				}
			}
			h.restart()
			h.declare("t", 1)
			now := h.nowMs.Load()
			h.mustSchedule("t", "once", now+10)
			h.at(now + 1000)
			select {
			case err := <-recreated:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(waitMax):
				t.Fatal("the schedule was never published")
			}
			if md := h.node.Metadata([]string{"t"}); len(md) != 1 || md[0].Incarnation != 2 {
				t.Fatalf("topic t: %+v, want incarnation 2", md)
			}
			if mutated {
				h.waitValues("t", "once") // caught: it landed in the new topic
				return
			}
			h.stays("t")
			if l := h.waitLane("t", "ORDERING_BROKEN", "BLOCKED"); l.Incarnation != 1 {
				t.Fatalf("broken lane pinned to incarnation %d, want 1", l.Incarnation)
			}
			h.stays("t")
			// Resumed into the new incarnation, the intent claimed for the
			// deleted one is resolved UNKNOWN (UnprovableNeverResent): never
			// published into the new topic.
			if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneResume}); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(waitMax); ; time.Sleep(5 * time.Millisecond) {
				h.at(h.nowMs.Load() + 1000) // the next probe of the destination
				st, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus})
				if err != nil {
					t.Fatal(err)
				}
				var unknown uint64
				for _, s := range st.Shards {
					unknown += s.Unknown
				}
				if unknown == 1 {
					break
				}
				if time.Now().After(deadline) {
					l, _ := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus, Topic: "t"})
					t.Fatalf("shards %+v lanes %+v: the schedule was not resolved UNKNOWN after the resume", st.Shards, l.Lanes)
				}
			}
			h.stays("t")
		})
	}
}

// flipInShards flips a bit in the victim's bytes in every schedule
// shard's segment that holds them (the node closed), and reports whether
// one did.
func (h *harness) flipInShards(victim []byte) bool {
	flipped := false
	shards, _ := h.fs.List("/data/topics/" + wire.SchedTopic)
	for _, s := range shards {
		dir := path.Join("/data/topics", wire.SchedTopic, s)
		names, _ := h.fs.List(dir)
		for _, n := range names {
			if b, err := h.fs.ReadFile(path.Join(dir, n)); err == nil && strings.HasSuffix(n, ".log") && bytes.Contains(b, victim) {
				flipInSegments(h.t, h.fs, dir, victim)
				flipped = true
			}
		}
	}
	return flipped
}

// A schedule shard whose log a repair cut: the runner steps over the
// dropped seqs (sched.State.Drop) and every schedule outside them fires
// once when due. Before, the shard stopped at the repair's gap for good
// and none of its schedules fired again.
func TestSchedulesOfARepairedShardFire(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	now := h.nowMs.Load()
	var want []string
	for i := range 20 {
		v := fmt.Sprintf("sched-%02d-%s", i, strings.Repeat("x", 24))
		h.mustSchedule("t", v, now+1000)
		if i != 5 {
			want = append(want, v)
		}
	}
	h.node.Close()
	if !h.flipInShards([]byte("sched-05-")) {
		t.Fatal("no shard holds sched-05")
	}
	h.open()
	if d := h.node.Damaged(); len(d) != 1 || !strings.HasPrefix(d[0], wire.SchedTopic+"/") {
		t.Fatalf("damaged %q, want the shard", d)
	}
	h.node.Close()
	if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
		t.Fatal(err)
	}
	h.open()
	h.at(now + 1000)
	h.waitValues("t", want...)
	h.stays("t", want...)
}

// LostMessageResolvedUnknown: a checkpoint lists a schedule whose own
// record — its message — a repair then dropped. It can never be
// published: it is resolved UNKNOWN (recorded, never guessed: an earlier
// office may have published it) and leaves the shard. Before, its
// publish failed at every try, it stayed FIRING for good and blocked its
// lane each time. Second-batch schedules are added until a shard's latest
// checkpoint lists one whose message lies in a batch apart from that
// checkpoint's chunks; those batches alone are flipped. (When a shard
// checkpoints depends on when its owner's upkeep runs, so the test reads
// the logs rather than counting checkpoints.)
func TestAScheduleWhoseMessageARepairDroppedIsResolvedUnknown(t *testing.T) {
	var mu sync.Mutex
	checkpoints := map[uint32]int{}
	var logs logBuffer
	h := newHarness(t)
	h.tune = func(c *Config) {
		c.SchedCheckpointEvery, c.ScrubBytesPerSecond = 4, -1
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.SchedCompactObserver = func(shard uint32, event string) {
			if event == "checkpoint" {
				mu.Lock()
				checkpoints[shard]++
				mu.Unlock()
			}
		}
	}
	h.restart()
	h.declare("t", 1)
	now := h.nowMs.Load()
	var firsts []string
	for i := range 20 {
		v := fmt.Sprintf("first-%02d-%s", i, strings.Repeat("x", 24))
		h.mustSchedule("t", v, now+1000)
		firsts = append(firsts, v)
	}
	eventually(t, "a checkpoint on each shard", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(checkpoints) == 2 && checkpoints[0] >= 1 && checkpoints[1] >= 1
	})
	const secondsMax = 200
	seconds := 0
	for ; len(h.checkpointedMessages("second-")) == 0; seconds++ {
		if seconds == secondsMax {
			t.Fatalf("%d second-batch schedules, and no checkpoint lists one apart from its message", secondsMax)
		}
		h.mustSchedule("t", fmt.Sprintf("second-%03d-%s", seconds, strings.Repeat("x", 24)), now+1000)
	}
	h.node.Close()
	victims := h.checkpointedMessages("second-")
	if len(victims) == 0 {
		t.Fatal("the shards' final checkpoints list no second-batch schedule apart from its message")
	}
	t.Logf("%d second-batch schedules; %d of their messages flipped", seconds, len(victims))
	for _, v := range victims {
		if err := h.fs.FlipBit(v.file, v.offset, 1); err != nil {
			t.Fatal(err)
		}
	}
	h.open()
	h.node.Close()
	if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
		t.Fatal(err)
	}
	h.open()
	h.at(now + 1000)
	eventually(t, "no schedule left", func() bool {
		list, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedList})
		return err == nil && len(list.Schedules) == 0
	})
	if n := strings.Count(logs.String(), "its schedule is resolved unknown"); n < len(victims) {
		t.Fatalf("%d lost messages resolved unknown, want %d (one per flipped message)", n, len(victims))
	}
	// What fired, fired once; a message the repair dropped never did.
	time.Sleep(100 * time.Millisecond)
	got := h.values("t")
	for v, n := range got {
		if n != 1 {
			t.Fatalf("%q published %d times, want once", v, n)
		}
	}
	for _, v := range victims {
		if got[v.value] != 0 {
			t.Fatalf("%q was published, but the repair dropped its message", v.value)
		}
	}
	for _, v := range firsts {
		if got[v] != 0 {
			return
		}
	}
	t.Fatal("no first-batch schedule fired")
}

// checkpointedMessage is a message a shard's latest checkpoint lists
// apart from its chunks: a byte of it to flip.
type checkpointedMessage struct {
	file   string
	offset int64
	value  string
}

// checkpointedMessages reads each schedule shard's segments and returns
// the messages, with the given prefix, of the schedules its latest whole
// checkpoint lists whose message record lies in a batch without any of
// that checkpoint's chunks: a repair that drops such a batch leaves the
// checkpoint whole and the schedule without its message.
func (h *harness) checkpointedMessages(prefix string) []checkpointedMessage {
	h.t.Helper()
	type held struct {
		file        string
		segment     []byte
		start, end  int64  // the batch's bytes
		first, last uint64 // the batch's seqs
		value       []byte
	}
	var out []checkpointedMessage
	shards, _ := h.fs.List("/data/topics/" + wire.SchedTopic)
	for _, s := range shards {
		dir := path.Join("/data/topics", wire.SchedTopic, s)
		names, _ := h.fs.List(dir)
		records := map[uint64]held{}
		chunks := map[uint64]sched.Checkpoint{} // by seq
		for _, n := range names {
			if !strings.HasSuffix(n, ".log") {
				continue
			}
			file := path.Join(dir, n)
			b, err := h.fs.ReadFile(file)
			if err != nil {
				continue // compacted away while the node runs
			}
			for _, sb := range storage.SegmentBatches(b) {
				if len(sb.Entries) == 0 {
					continue
				}
				first, last := sb.Entries[0].Seq, sb.Entries[len(sb.Entries)-1].Seq
				for _, e := range sb.Entries {
					hs := e.Record.Headers
					if len(hs) == 0 || hs[0].Key != schedHeader {
						continue
					}
					d, err := sched.Decode(hs[0].Value)
					if err != nil {
						h.t.Fatal(err)
					}
					switch d.Kind {
					case sched.KindCheckpoint:
						chunks[e.Seq] = d.Checkpoint
					case sched.KindSchedule, sched.KindCarry:
						records[e.Seq] = held{file, b, sb.Offset, sb.End, first, last, e.Record.Value}
					}
				}
			}
		}
		// The latest whole checkpoint: chunk 0 at Base+1 and every other
		// chunk after it.
		var latest []sched.Checkpoint
		for seq, c := range chunks {
			if c.Chunk != 0 || seq != c.Base+1 || (len(latest) > 0 && c.Base < latest[0].Base) {
				continue
			}
			whole := []sched.Checkpoint{c}
			for i := uint32(1); i < c.Chunks; i++ {
				if next, ok := chunks[seq+uint64(i)]; ok && next.Base == c.Base && next.Chunk == i {
					whole = append(whole, next)
				}
			}
			if len(whole) == int(c.Chunks) {
				latest = whole
			}
		}
		if len(latest) == 0 {
			continue
		}
		lo, hi := latest[0].Base+1, latest[0].Base+uint64(latest[0].Chunks)
		for _, c := range latest {
			for _, e := range c.Entries {
				r, ok := records[e.At]
				if !ok || !bytes.HasPrefix(r.value, []byte(prefix)) || (r.first <= hi && r.last >= lo) {
					continue
				}
				i := bytes.Index(r.segment[r.start:r.end], r.value)
				if i < 0 {
					h.t.Fatalf("%s: message %q not in its batch", r.file, r.value)
				}
				out = append(out, checkpointedMessage{r.file, r.start + int64(i), string(r.value)})
			}
		}
	}
	return out
}
