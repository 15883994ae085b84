package node

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// listPage asks for one page of a shard's listing and waits for it.
func (h *harness) listPage(f *wire.SchedListPage) (*wire.SchedListPageOK, *wire.Error) {
	h.t.Helper()
	type res struct {
		ok  *wire.SchedListPageOK
		err *wire.Error
	}
	ch := make(chan res, 1)
	h.node.SchedListPage(f, func(ok *wire.SchedListPageOK, err *wire.Error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		return r.ok, r.err
	case <-time.After(waitMax):
		h.t.Fatal("sched list page: no reply")
		return nil, nil
	}
}

// listShard pages through shard's schedules of topic from cursor, limit a
// page, until a page says no more follow, and fails the test if a page is
// over its bound, out of order or says more with fewer than limit. A page
// refused UNAVAILABLE (the shard restarting) is asked again until
// waitMax; unavailable counts those refusals.
func (h *harness) listShard(shard uint32, topic string, cursor sched.ListCursor, limit int, unavailable *int) []wire.ScheduleInfo {
	h.t.Helper()
	bound := limit
	if bound <= 0 || bound > wire.SchedListLimitMax {
		bound = wire.SchedListLimitMax
	}
	deadline := time.Now().Add(waitMax)
	var out []wire.ScheduleInfo
	for {
		ok, err := h.listPage(&wire.SchedListPage{Shard: shard, Topic: topic, AfterDeliverAtMs: cursor.DeliverAtMs, AfterID: cursor.ID, Limit: uint32(limit)})
		if err != nil && err.Code == wire.CodeUnavailable && time.Now().Before(deadline) {
			if unavailable != nil {
				*unavailable++
			}
			h.at(h.nowMs.Load()) // wake the runner: it starts over
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			h.t.Fatalf("list shard %d after %+v: %v", shard, cursor, err)
		}
		if len(ok.Schedules) > bound || (ok.More && len(ok.Schedules) < bound) {
			h.t.Fatalf("list shard %d: a page of %d (bound %d), more %v", shard, len(ok.Schedules), bound, ok.More)
		}
		for _, s := range ok.Schedules {
			if s.Shard != shard || (topic != "" && s.Topic != topic) || cmp.Or(cmp.Compare(s.DeliverAtMs, cursor.DeliverAtMs), cmp.Compare(s.ID, cursor.ID)) <= 0 && cursor.ID != 0 {
				h.t.Fatalf("list shard %d topic %q after %+v: %+v", shard, topic, cursor, s)
			}
			cursor = sched.ListCursor{DeliverAtMs: s.DeliverAtMs, ID: s.ID}
			out = append(out, s)
		}
		if !ok.More {
			return out
		}
	}
}

type listed struct {
	shard uint32
	id    uint64
	at    int64
	topic string
}

func sortListed(ls []listed) {
	slices.SortFunc(ls, func(a, b listed) int {
		return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.at, b.at), cmp.Compare(a.id, b.id))
	})
}

func asListed(ss []wire.ScheduleInfo) []listed {
	var out []listed
	for _, s := range ss {
		out = append(out, listed{s.Shard, s.ID, s.DeliverAtMs, s.Topic})
	}
	return out
}

// wantListed is the schedules of shard and topic ("" = all) in listing
// order.
func wantListed(all []listed, shard uint32, topic string) []listed {
	var out []listed
	for _, l := range all {
		if l.shard == shard && (topic == "" || l.topic == topic) {
			out = append(out, l)
		}
	}
	sortListed(out)
	return out
}

// TestSchedListPagesThroughTheSpill: with lanes that keep 3 pending
// schedules in RAM and hundreds pending, a listing page by page holds
// every pending schedule of the shard exactly once, in (deliver_at, id)
// order — the spilled ones too — for every page size and with a topic
// filter; a page never holds more than its limit, nor more than 1,000
// whatever the limit asks.
func TestSchedListPagesThroughTheSpill(t *testing.T) {
	h := newHarness(t)
	h.tune = func(c *Config) { c.SchedWindow = 3 }
	h.restart()
	h.declare("t", 2)
	h.declare("u", 1)
	now := h.nowMs.Load()
	rng := rand.New(rand.NewPCG(14, 14))
	var all []listed
	for i := range 2300 {
		topic := "t"
		if i%5 == 0 {
			topic = "u"
		}
		at := now + 60_000 + rng.Int64N(400) // colliding due times: the id breaks ties
		ok := h.mustSchedule(topic, fmt.Sprintf("m%d", i), at)
		all = append(all, listed{ok.Shard, ok.ID, at, topic})
	}
	spilled := 0
	h.node.schedMu.Lock()
	runners := h.node.sched
	h.node.schedMu.Unlock()
	for _, r := range runners {
		done := make(chan struct{})
		r.send(schedCmd{admin: &wire.SchedAdmin{Op: wire.SchedStatus}, adminReply: func(*wire.SchedAdminOK, *wire.Error) {
			spilled += r.st.Spilled()
			close(done)
		}})
		<-done
	}
	if spilled < 2000 {
		t.Fatalf("spilled %d of %d: the listing would not read the spill", spilled, len(all))
	}
	for _, limit := range []int{0, 1, 7, 1000, 5000} {
		for _, topic := range []string{"", "u"} {
			for shard := range uint32(SchedShards) {
				got := asListed(h.listShard(shard, topic, sched.ListCursor{}, limit, nil))
				if want := wantListed(all, shard, topic); !slices.Equal(got, want) {
					t.Fatalf("limit %d topic %q shard %d: listed %d schedules, want %d (first difference at %d)",
						limit, topic, shard, len(got), len(want), firstDiff(got, want))
				}
			}
		}
	}
	// The SCHED_ADMIN list (protocol v1's first form) is the first page.
	ok, werr := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedList, Shard: 0})
	if werr != nil || !slices.Equal(asListed(ok.Schedules), wantListed(all, 0, "")[:wire.SchedListLimitMax]) {
		t.Fatalf("SCHED_ADMIN list: %d schedules, %v; want the first %d", len(ok.Schedules), werr, wire.SchedListLimitMax)
	}
}

func firstDiff(a, b []listed) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestSchedListCursorAcrossChanges: a listing continued from a cursor
// after the shard changed — schedules cancelled and fired, new ones
// before and after the cursor, the node restarted (its spill rebuilt
// from the log), and a read error in the spill (the listing is refused
// UNAVAILABLE, never answered in part; the shard starts over from its
// log) — lists every schedule pending throughout that lies after the
// cursor exactly once, in order, none cancelled or fired, and the new
// ones after the cursor.
func TestSchedListCursorAcrossChanges(t *testing.T) {
	h := newHarness(t)
	h.tune = func(c *Config) { c.SchedWindow = 3 }
	h.restart()
	h.declare("t", 2)
	now := h.nowMs.Load()
	rng := rand.New(rand.NewPCG(15, 15))
	var all []listed
	for i := range 400 {
		at := now + 1_000 + rng.Int64N(5_000)
		ok := h.mustSchedule("t", fmt.Sprintf("m%d", i), at)
		all = append(all, listed{ok.Shard, ok.ID, at, "t"})
	}
	const shard = 0
	// The first pages, up to a cursor in the middle of the shard.
	var first []wire.ScheduleInfo
	var cursor sched.ListCursor
	for len(first) < 100 {
		ok, werr := h.listPage(&wire.SchedListPage{Shard: shard, AfterDeliverAtMs: cursor.DeliverAtMs, AfterID: cursor.ID, Limit: 25})
		if werr != nil || !ok.More {
			t.Fatalf("page after %+v: %v (more %v)", cursor, werr, ok != nil && ok.More)
		}
		first = append(first, ok.Schedules...)
		last := ok.Schedules[len(ok.Schedules)-1]
		cursor = sched.ListCursor{DeliverAtMs: last.DeliverAtMs, ID: last.ID}
	}
	if !slices.Equal(asListed(first), wantListed(all, shard, "")[:100]) {
		t.Fatal("the first pages are not the shard's first schedules")
	}
	// Changes between the pages.
	gone := map[uint64]bool{}
	for _, l := range wantListed(all, shard, "")[100:] {
		if rng.IntN(4) == 0 {
			if _, werr := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedCancel, Shard: shard, ID: l.id}); werr != nil {
				t.Fatalf("cancel %d: %v", l.id, werr)
			}
			gone[l.id] = true
		}
	}
	var added []listed
	var addedValues []string
	for i := range 60 {
		at := cursor.DeliverAtMs - 500 + rng.Int64N(3_000) // before and after the cursor
		v := fmt.Sprintf("n%d", i)
		ok := h.mustSchedule("t", v, at)
		added = append(added, listed{ok.Shard, ok.ID, at, "t"})
		addedValues = append(addedValues, v)
	}
	h.restart() // the spill is rebuilt from the log
	// What fell due fires: those before the cursor, and some after it.
	fireTo := cursor.DeliverAtMs + 200
	h.at(fireTo)
	var due []string
	firedHere := uint64(0)
	for i, l := range append(slices.Clone(all), added...) {
		if l.at <= fireTo && !(l.shard == shard && gone[l.id]) {
			if i < len(all) {
				due = append(due, fmt.Sprintf("m%d", i))
			} else {
				due = append(due, addedValues[i-len(all)])
			}
			if l.shard == shard {
				firedHere++
			}
		}
	}
	h.waitValues("t", due...)
	// Until the shard applied their FIRED records (each is live until
	// then, as FIRING).
	deadline := time.Now().Add(waitMax)
	for {
		st, werr := h.schedAdmin(&wire.SchedAdmin{Op: wire.SchedStatus, Shard: shard})
		if werr == nil && st.Shards[0].Fired == firedHere {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard %d: status %+v (%v), want %d fired", shard, st, werr, firedHere)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A read of the spill fails: the page is refused, not answered in
	// part, and the next one (the shard started over) is whole.
	var failed atomic.Bool
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpRead && strings.Contains(name, "sched-spill/") && failed.CompareAndSwap(false, true) {
			return errors.New("injected read error")
		}
		return nil
	})
	unavailable := 0
	rest := asListed(h.listShard(shard, "", cursor, 40, &unavailable))
	if !failed.Load() || unavailable == 0 {
		t.Fatalf("the spill's read error (%v) was not seen by the listing (%d refusals)", failed.Load(), unavailable)
	}
	var want []listed
	for _, l := range append(slices.Clone(all), added...) {
		k := sched.Key{DeliverAtMs: l.at, ID: l.id}
		if l.shard == shard && !gone[l.id] && l.at > fireTo && sched.CompareKeys(k, sched.Key{DeliverAtMs: cursor.DeliverAtMs, ID: cursor.ID}) > 0 {
			want = append(want, l)
		}
	}
	sortListed(want)
	if !slices.Equal(rest, want) {
		t.Fatalf("after the cursor: listed %d, want %d (first difference at %d)", len(rest), len(want), firstDiff(rest, want))
	}
}

// listPageOn asks node n for one page of a shard's listing.
func listPageOn(t *testing.T, n *Node, f *wire.SchedListPage) (*wire.SchedListPageOK, *wire.Error) {
	t.Helper()
	type res struct {
		ok  *wire.SchedListPageOK
		err *wire.Error
	}
	ch := make(chan res, 1)
	n.SchedListPage(f, func(ok *wire.SchedListPageOK, err *wire.Error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		return r.ok, r.err
	case <-time.After(waitMax):
		t.Fatal("sched list page: no reply")
		return nil, nil
	}
}

// TestClusterSchedListOnlyAtTheOwner: in a cluster only the shard's owner
// in office answers a page — its followers, whose state may lag the
// shard's commits, refuse NOT_LEADER, and so does the owner once it is
// fenced (cut off from its replicas, its lease guard closed), since
// another node may be firing and cancelling its schedules by then.
func TestClusterSchedListOnlyAtTheOwner(t *testing.T) {
	tc := newTestClusterWith(t, 3, func(c *Config) { c.Cluster.ElectionTicks = 200 })
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})
	far := time.Now().Add(time.Hour).UnixMilli()
	owner, first := tc.scheduleAnywhere(&wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Key: []byte("k"), Value: []byte("v")}, DeliverAtMs: far})
	shard := first.Shard
	var ok *wire.SchedListPageOK
	eventually(t, "the owner lists its schedule", func() bool {
		var werr *wire.Error
		ok, werr = listPageOn(t, tc.nodes[owner], &wire.SchedListPage{Shard: shard})
		return werr == nil
	})
	if len(ok.Schedules) != 1 || ok.Schedules[0].ID != first.ID || ok.More {
		t.Fatalf("the owner listed %+v, want schedule %d alone", ok, first.ID)
	}
	for id, n := range tc.nodes {
		if id == owner {
			continue
		}
		if got, werr := listPageOn(t, n, &wire.SchedListPage{Shard: shard}); werr == nil || werr.Code != wire.CodeNotLeader {
			t.Fatalf("follower %s answered %+v, %v; want NOT_LEADER", id, got, werr)
		}
	}
	for id := range tc.nodes {
		if id != owner {
			tc.stop(id)
		}
	}
	r := tc.nodes[owner].sched[shard]
	eventually(t, "the owner is fenced", func() bool {
		ch := make(chan string, 1)
		r.send(schedCmd{admin: &wire.SchedAdmin{Op: wire.SchedStatus, Shard: shard}, adminReply: func(ok *wire.SchedAdminOK, err *wire.Error) {
			if err != nil || len(ok.Shards) != 1 {
				ch <- fmt.Sprint(err)
				return
			}
			ch <- ok.Shards[0].Lifecycle
		}})
		return <-ch == sched.Fenced.String()
	})
	if got, werr := listPageOn(t, tc.nodes[owner], &wire.SchedListPage{Shard: shard}); werr == nil {
		t.Fatalf("the fenced owner answered %+v", got)
	}
}

// TestSchedListAppliesWhatCommittedFirst: a page reflects everything the
// shard committed before it was asked, even what its runner has not
// applied yet. Manual mode makes the interleaving exact: a cancel is
// committed by the shard's partition, then a page is asked before the
// runner's next pass — it must not list the cancelled schedule.
func TestSchedListAppliesWhatCommittedFirst(t *testing.T) {
	var now atomic.Int64
	now.Store(1_000_000)
	n := openManual(t, &now)
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	schedule := func(v string) wire.ScheduleOK {
		t.Helper()
		var got *wire.ScheduleOK
		for attempt := 0; got == nil; attempt++ {
			if attempt == 10 {
				t.Fatalf("schedule %s: not taken", v)
			}
			n.Schedule(&wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: 0, Key: []byte("k"), Value: []byte(v)}, DeliverAtMs: now.Load() + 3_600_000},
				func(ok wire.ScheduleOK, err *wire.Error) {
					if err == nil {
						got = &ok
					}
				})
			n.Step()
		}
		return *got
	}
	a, b := schedule("a"), schedule("b")
	if a.Shard != b.Shard {
		t.Fatalf("shards %d and %d: want one", a.Shard, b.Shard)
	}
	r := n.sched[a.Shard]
	// The cancel of a: proposed by the runner, committed by the shard's
	// partition — and not applied yet.
	var cancelled *wire.Error
	cancelDone := false
	n.SchedAdmin(&wire.SchedAdmin{Op: wire.SchedCancel, Shard: a.Shard, ID: a.ID}, func(_ *wire.SchedAdminOK, err *wire.Error) { cancelled, cancelDone = err, true })
	r.step(now.Load())
	commit := r.p.commitSeq.Load()
	r.p.step(now.Load())
	if r.p.commitSeq.Load() == commit || r.st.Applied() >= r.p.commitSeq.Load() || cancelDone {
		t.Fatalf("the cancel is not committed-but-unapplied: commit %d → %d, applied %d, answered %v", commit, r.p.commitSeq.Load(), r.st.Applied(), cancelDone)
	}
	var page *wire.SchedListPageOK
	var werr *wire.Error
	n.SchedListPage(&wire.SchedListPage{Shard: a.Shard}, func(ok *wire.SchedListPageOK, err *wire.Error) { page, werr = ok, err })
	n.Step()
	if werr != nil || page == nil {
		t.Fatalf("page: %+v, %v", page, werr)
	}
	if len(page.Schedules) != 1 || page.Schedules[0].ID != b.ID {
		t.Fatalf("listed %+v after a's cancel committed, want b (%d) alone", page.Schedules, b.ID)
	}
	if !cancelDone || cancelled != nil {
		t.Fatalf("the cancel: answered %v, %v", cancelDone, cancelled)
	}
}
