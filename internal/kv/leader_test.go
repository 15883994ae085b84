package kv

import (
	"errors"
	"fmt"
	"testing"
)

// leaderRun is a bucket's leader: its committed state and its overlay.
type leaderRun struct {
	*bucketRun
	l       *Leader
	pending map[uint64]Proposal // proposed, by id
	replies map[uint64]Reply
	nextID  uint64
}

func newLeaderRun(m Mutations) *leaderRun {
	l, err := NewLeader(testConfig(m), 0)
	if err != nil {
		panic(err)
	}
	l.SetLease(true)
	return &leaderRun{bucketRun: newRun(m), l: l, pending: map[uint64]Proposal{}, replies: map[uint64]Reply{}}
}

func (lr *leaderRun) take(eff LeaderEffects) {
	for _, p := range eff.Propose {
		lr.pending[p.ID] = p
	}
	for _, r := range eff.Replies {
		if _, dup := lr.replies[r.ID]; dup {
			panic(fmt.Sprintf("request %d answered twice", r.ID))
		}
		lr.replies[r.ID] = r
	}
}

// submit returns the request's id and whether it was proposed.
func (lr *leaderRun) submit(w Write) (uint64, bool) {
	lr.nextID++
	id := lr.nextID
	lr.take(lr.l.Submit(lr.b, Request{ID: id, Write: w}, 0))
	_, proposed := lr.pending[id]
	return id, proposed
}

func (lr *leaderRun) casPut(key, value string, expected uint64) (uint64, bool) {
	return lr.submit(Write{Op: OpPut, Key: []byte(key), Value: []byte(value), Conditional: true, Expected: expected})
}

// commit applies proposal id's record as the next seq and tells the leader.
func (lr *leaderRun) commit(t tb, id uint64) {
	t.Helper()
	p, ok := lr.pending[id]
	if !ok {
		t.Fatalf("request %d was not proposed", id)
	}
	delete(lr.pending, id)
	seq, res := lr.mustApply(t, p.Record)
	lr.take(lr.l.Applied(lr.b, id, seq, res))
}

func (lr *leaderRun) fail(id uint64) {
	delete(lr.pending, id)
	lr.take(lr.l.Failed(lr.b, id, errors.New("refused before append")))
}

func (lr *leaderRun) reply(t tb, id uint64) Reply {
	t.Helper()
	r, ok := lr.replies[id]
	if !ok {
		t.Fatalf("request %d not answered", id)
	}
	return r
}

func mismatchCurrent(t tb, r Reply) uint64 {
	t.Helper()
	var m *MismatchError
	if !errors.As(r.Err, &m) || !errors.Is(r.Err, ErrRevisionMismatch) {
		t.Fatalf("reply %+v is not a REVISION_MISMATCH", r)
	}
	return m.Current
}

// TestConcurrentCASOnlyOneProposed: two CASes of one expected revision
// arrive before either commits. The first is proposed; the second costs
// no record, and is refused (with the first's revision as current) only
// once the first committed — never against a write that might not.
func TestConcurrentCASOnlyOneProposed(t *testing.T) { concurrentCASOnlyOneProposed(t, Mutations{}) }

func concurrentCASOnlyOneProposed(t tb, m Mutations) {
	lr := newLeaderRun(m)
	lr.mustApply(t, put("a", "v0", 0)) // 1
	first, proposed := lr.casPut("a", "v1", 1)
	if !proposed {
		t.Fatal("first CAS not proposed")
	}
	second, proposed := lr.casPut("a", "v2", 1)
	if proposed {
		t.Fatal("second CAS of the same expected revision was proposed: the overlay was ignored")
	}
	if _, answered := lr.replies[second]; answered || lr.l.Parked() != 1 {
		t.Fatalf("second CAS answered before the first committed (parked %d)", lr.l.Parked())
	}
	lr.commit(t, first)
	if r := lr.reply(t, first); r.Err != nil || r.Revision != 2 {
		t.Fatalf("first: %+v", r)
	}
	if cur := mismatchCurrent(t, lr.reply(t, second)); cur != 2 {
		t.Fatalf("second refused with current %d, want 2", cur)
	}
}

// TestCASAgainstCommittedStateAnswersAtOnce: with nothing in flight on
// the key a refusal is decided against committed state, at once.
func TestCASAgainstCommittedStateAnswersAtOnce(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	lr.mustApply(t, put("a", "v0", 0))
	id, proposed := lr.casPut("a", "v1", 7)
	if proposed || mismatchCurrent(t, lr.reply(t, id)) != 1 {
		t.Fatal("stale CAS not refused at once with current 1")
	}
	id, proposed = lr.casPut("b", "v1", 3)
	if proposed || mismatchCurrent(t, lr.reply(t, id)) != 0 {
		t.Fatal("CAS of an absent key not refused with current 0")
	}
}

// TestCASRefusedOnlyUnderTheLease (RefusalUnderLease): a CAS the
// committed state refuses is a read of that state; without the lease the
// leader answers ErrLeaseLapsed, proposes nothing, and refuses again once
// it holds its lease. A CAS it would propose needs no lease: it is decided
// when it commits. RefuseWithoutLease answers the stale refusal.
func TestCASRefusedOnlyUnderTheLease(t *testing.T) {
	for _, m := range []Mutations{{}, {RefuseWithoutLease: true}} {
		lr := newLeaderRun(m)
		lr.mustApply(t, put("a", "v0", 0)) // 1
		lr.l.SetLease(false)
		id, proposed := lr.casPut("a", "v1", 7)
		r := lr.reply(t, id)
		if m.RefuseWithoutLease {
			if proposed || mismatchCurrent(t, r) != 1 {
				t.Fatalf("mutated: %+v", r)
			}
			continue
		}
		if proposed || !errors.Is(r.Err, ErrLeaseLapsed) {
			t.Fatalf("a refusal without the lease: proposed %v, %+v; want ErrLeaseLapsed", proposed, r)
		}
		if id, proposed = lr.casPut("a", "v1", 1); !proposed {
			t.Fatal("a CAS that holds was not proposed without the lease")
		}
		lr.commit(t, id)
		lr.l.SetLease(true)
		if id, proposed = lr.casPut("a", "v2", 1); proposed || mismatchCurrent(t, lr.reply(t, id)) != 2 {
			t.Fatal("a stale CAS not refused with current 2 under the lease")
		}
	}
}

// TestCreateBehindPendingDelete: a create-only CAS after a delete in
// flight is proposed behind it; both commit in order.
func TestCreateBehindPendingDelete(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	lr.mustApply(t, put("a", "v0", 0))
	d, _ := lr.submit(Write{Op: OpDelete, Key: []byte("a")})
	c, proposed := lr.casPut("a", "new", 0)
	if !proposed {
		t.Fatal("create behind a pending delete not proposed")
	}
	lr.commit(t, d)
	lr.commit(t, c)
	if r := lr.reply(t, c); r.Err != nil || r.Revision != 3 {
		t.Fatalf("create: %+v", r)
	}
}

// TestCASBehindTruncatedPredecessor: a create is proposed behind a delete
// in flight; the delete never reaches the log but the create does. The
// create must not apply against the delete that never committed: every
// replica checks the condition again when applying.
func TestCASBehindTruncatedPredecessor(t *testing.T) { casBehindTruncatedPredecessor(t, Mutations{}) }

func casBehindTruncatedPredecessor(t tb, m Mutations) {
	lr := newLeaderRun(m)
	lr.mustApply(t, put("a", "v0", 0)) // 1
	d, _ := lr.submit(Write{Op: OpDelete, Key: []byte("a")})
	c, proposed := lr.casPut("a", "new", 0)
	if !proposed {
		t.Fatal("create behind a pending delete not proposed")
	}
	lr.fail(d)
	if r := lr.reply(t, d); !errors.Is(r.Err, ErrNotCommitted) {
		t.Fatalf("failed delete: %+v", r)
	}
	lr.commit(t, c) // seq 2, with no delete before it
	if cur := mismatchCurrent(t, lr.reply(t, c)); cur != 1 {
		t.Fatalf("create refused with current %d, want 1", cur)
	}
	if rev, ok := lr.b.Get("a"); !ok || string(rev.Value) != "v0" {
		t.Fatalf("a = %+v, %v: the create applied over a live key", rev, ok)
	}
}

// TestParkedCASDecidedAgainWhenItsPredecessorFails: a CAS parked behind
// a write that then fails is decided again against the committed state
// (where its condition holds) instead of being refused.
func TestParkedCASDecidedAgainWhenItsPredecessorFails(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	lr.mustApply(t, put("a", "v0", 0))
	p, _ := lr.submit(Write{Op: OpPut, Key: []byte("a"), Value: []byte("v1")})
	c, proposed := lr.casPut("a", "v2", 1)
	if proposed {
		t.Fatal("CAS behind a pending put proposed")
	}
	lr.fail(p)
	if _, proposed := lr.pending[c]; !proposed {
		t.Fatalf("parked CAS not proposed once its predecessor failed: %+v", lr.replies[c])
	}
	lr.commit(t, c)
	if r := lr.reply(t, c); r.Err != nil || r.Revision != 2 {
		t.Fatalf("CAS: %+v", r)
	}
}

func TestLeadershipLostDiscardsOverlay(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	lr.mustApply(t, put("a", "v0", 0))
	p, _ := lr.casPut("a", "v1", 1)
	parked, _ := lr.casPut("a", "v2", 1)
	lr.take(lr.l.LeadershipLost())
	for _, id := range []uint64{p, parked} {
		if r := lr.reply(t, id); !errors.Is(r.Err, ErrLeadershipLost) {
			t.Fatalf("request %d: %+v", id, r)
		}
	}
	if lr.l.Inflight() != 0 || lr.l.Parked() != 0 {
		t.Fatal("overlay kept")
	}
	// A completion of a write of the old reign answers nothing again.
	lr.take(lr.l.Applied(lr.b, p, 2, ApplyResult{Outcome: Written}))
	// The next reign checks against the committed state only.
	if _, proposed := lr.casPut("a", "v3", 1); !proposed {
		t.Fatal("CAS after leadership loss still saw the discarded overlay")
	}
}

func TestSubmitRefusesBadWritesAndBounds(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	for _, tc := range []struct {
		w    Write
		want error
	}{
		{Write{Op: OpPut}, ErrEmptyKey},
		{Write{Op: OpPut, Key: make([]byte, 65)}, ErrKeyTooLarge},
		{Write{Op: OpPut, Key: []byte("k"), Value: make([]byte, 1025)}, ErrValueTooLarge},
		{Write{Op: OpCompact}, ErrBadWrite},
		{Write{Op: OpDelete, Key: []byte("k"), Value: []byte("v")}, ErrBadWrite},
	} {
		id, proposed := lr.submit(tc.w)
		if r := lr.reply(t, id); proposed || !errors.Is(r.Err, tc.want) {
			t.Errorf("%+v: %+v, want %v", tc.w, r, tc.want)
		}
	}
	var ids []uint64
	for range testConfig(Mutations{}).InflightWritesMax {
		id, proposed := lr.submit(Write{Op: OpPut, Key: []byte("k")})
		if !proposed {
			t.Fatal("write under the bound not proposed")
		}
		ids = append(ids, id)
	}
	if id, proposed := lr.submit(Write{Op: OpPut, Key: []byte("k")}); proposed || !errors.Is(lr.reply(t, id).Err, ErrBusy) {
		t.Fatal("write over InflightWritesMax not refused ErrBusy")
	}
	lr.commit(t, ids[0]) // room in flight: what follows is parked
	for range testConfig(Mutations{}).ParkedWritesMax {
		if id, proposed := lr.casPut("k", "v", 1); proposed || lr.replies[id].Err != nil {
			t.Fatalf("CAS behind a pending put not parked: %+v", lr.replies[id])
		}
	}
	if id, _ := lr.casPut("k", "v", 1); !errors.Is(lr.reply(t, id).Err, ErrBusy) {
		t.Fatal("CAS over ParkedWritesMax not refused ErrBusy")
	}
	for _, id := range ids[1:] {
		lr.commit(t, id)
	}
	// Every parked CAS was decided again and refused against committed
	// state.
	refused := 0
	for _, r := range lr.replies {
		if errors.Is(r.Err, ErrRevisionMismatch) {
			refused++
		}
	}
	if refused != testConfig(Mutations{}).ParkedWritesMax || lr.l.Parked() != 0 {
		t.Fatalf("%d parked CASes refused, %d still parked", refused, lr.l.Parked())
	}
}

// TestLeaderWaitsForItsReignStart: a new leader whose bucket has not
// applied its install entry refuses writes: its committed state may miss
// a write the previous leader acknowledged, and a CAS refused against it
// would name a revision older than one the client already saw.
// SubmitBeforeReignStart takes the CAS and refuses it with current 1.
func TestLeaderWaitsForItsReignStart(t *testing.T) { leaderWaitsForItsReignStart(t, Mutations{}) }

func leaderWaitsForItsReignStart(t tb, m Mutations) {
	lr := newLeaderRun(m)
	lr.mustApply(t, put("a", "v0", 0)) // 1, committed under the last leader
	l, err := NewLeader(testConfig(m), 3)
	if err != nil {
		t.Fatal(err)
	}
	l.SetLease(true)
	lr.l = l
	// 2, acknowledged by the last leader; the new one has not applied it.
	id, proposed := lr.casPut("a", "v2", 2)
	if r := lr.reply(t, id); proposed || !errors.Is(r.Err, ErrLeaderNotReady) {
		t.Fatalf("write before the reign's start applied: %+v", r)
	}
	lr.mustApply(t, put("a", "v1", 0)) // 2
	id, proposed = lr.casPut("a", "v2", 2)
	if r := lr.reply(t, id); proposed || !errors.Is(r.Err, ErrLeaderNotReady) {
		t.Fatalf("write before the reign's start applied: %+v", r)
	}
	lr.mustApply(t, Record{Headers: []Header{{Key: "nereus-control", Value: []byte("install")}}}) // 3
	if _, proposed := lr.casPut("a", "v2", 2); !proposed {
		t.Fatal("CAS at the current revision not proposed once the reign's start applied")
	}
}
