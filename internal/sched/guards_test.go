package sched

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// intentsIn returns the intent proposals among effects.
func intentsIn(effects []Effect) []Record {
	var rs []Record
	for _, e := range effects {
		if e.Propose != nil && e.Propose.Record.Kind == KindIntent {
			rs = append(rs, e.Propose.Record)
		}
	}
	return rs
}

// probesIn counts the probes among effects.
func probesIn(effects []Effect) int {
	n := 0
	for _, e := range effects {
		if e.Probe != "" {
			n++
		}
	}
	return n
}

// queued counts the proposals of kind in the world's queue.
func (w *world) queued(kind Kind) int {
	n := 0
	for _, p := range w.queue {
		if p.Record.Kind == kind {
			n++
		}
	}
	return n
}

// TestNewOwnerRefusesAConfigThatCannotFire pins NewOwner's panic on
// ClaimMax < 1, FireWindow 0 or ProbeEveryMs < 1 — and that the least
// config that works, (1, 1, 1), is taken.
func TestNewOwnerRefusesAConfigThatCannotFire(t *testing.T) {
	panics := func(cfg Config) (p bool) {
		defer func() { p = recover() != nil }()
		NewOwner(cfg, NewState())
		return false
	}
	if panics(Config{ClaimMax: 1, FireWindow: 1, ProbeEveryMs: 1}) {
		t.Fatal("NewOwner refused ClaimMax 1, FireWindow 1, ProbeEveryMs 1")
	}
	for _, cfg := range []Config{
		{ClaimMax: 0, FireWindow: 1, ProbeEveryMs: 1},
		{ClaimMax: -1, FireWindow: 1, ProbeEveryMs: 1},
		{ClaimMax: 1, FireWindow: 0, ProbeEveryMs: 1},
		{ClaimMax: 1, FireWindow: 1, ProbeEveryMs: 0},
		{ClaimMax: 1, FireWindow: 1, ProbeEveryMs: -1},
	} {
		if !panics(cfg) {
			t.Fatalf("NewOwner took %+v", cfg)
		}
	}
}

// TestOwnerOutOfOfficeHoldsNothing pins Lifecycle.inOffice (an
// UNASSIGNED owner is not fenced by a Step, takes no evidence and has no
// wake-up; a RESTORING or CATCHING_UP one takes evidence and is fenced
// when a gate goes) and firing's FencedStillFires conjunction (a FENCED
// owner neither probes nor wakes).
func TestOwnerOutOfOfficeHoldsNothing(t *testing.T) {
	w := newWorld(t, testConfig)
	w.append(&Record{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: 1000, Topic: "a", Incarnation: 7}})
	w.o.Step(w.now)
	if lc := w.o.Lifecycle(); lc != Unassigned {
		t.Fatalf("%v without gates, want UNASSIGNED", lc)
	}
	w.answerProbe("a")
	if r := w.o.LaneReadiness("a"); r != RecoveringEvidence {
		t.Fatalf("an UNASSIGNED owner took evidence: lane %v", r)
	}
	if at := w.o.NextWakeMs(w.now); at != 0 {
		t.Fatalf("an UNASSIGNED owner wakes at %d", at)
	}
	if e := w.o.TakeEffects(); len(e) != 0 {
		t.Fatalf("an UNASSIGNED owner emitted %+v", e)
	}

	// RESTORING (the state is not loaded) and CATCHING_UP (the barrier
	// is not applied) hold office: they take evidence and are fenced when
	// a gate goes.
	for _, loaded := range []bool{false, true} {
		st := NewState()
		if _, err := st.Apply(1, &Record{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: 5000, Topic: "a", Incarnation: 7}}); err != nil {
			t.Fatal(err)
		}
		if loaded {
			st.MarkLoaded()
		}
		o := NewOwner(testConfig, st)
		a := Authority{Assigned: true, Leader: true, Epoch: 1, GuardUntilMs: 1e6, Barrier: 2}
		o.SetAuthority(1000, a)
		want := map[bool]Lifecycle{false: Restoring, true: CatchingUp}[loaded]
		if o.Lifecycle() != want {
			t.Fatalf("lifecycle %v, want %v", o.Lifecycle(), want)
		}
		o.Evidence(1000, Evidence{Topic: "a", Incarnation: 7, Partitions: 2, Writable: true, ValidUntilMs: 2000})
		if r := o.LaneReadiness("a"); r != Ready {
			t.Fatalf("%v: evidence not taken: lane %v", want, r)
		}
		a.Leader = false
		o.SetAuthority(1001, a)
		if o.Lifecycle() != Fenced {
			t.Fatalf("%v without the lease: %v, want FENCED", want, o.Lifecycle())
		}
	}

	// A FENCED owner with a pending schedule neither probes nor wakes.
	w = newWorld(t, testConfig)
	w.activate(1)
	w.schedule("a", 5000, 0)
	w.settle(true)
	closeGuard(w)
	if w.o.Lifecycle() != Fenced {
		t.Fatalf("%v after the guard closed, want FENCED", w.o.Lifecycle())
	}
	w.o.TakeEffects()
	w.at(w.now + testConfig.ProbeEveryMs)
	if e := w.o.TakeEffects(); len(e) != 0 {
		t.Fatalf("a FENCED owner emitted %+v", e)
	}
	if at := w.o.NextWakeMs(w.now); at != 0 {
		t.Fatalf("a FENCED owner wakes at %d", at)
	}
}

// TestDrainEndsReleasedAndForgotten pins Step's end of a drain whose
// publishes and proposals all completed: the Release effect, and the
// reset that forgets the office's certificates.
func TestDrainEndsReleasedAndForgotten(t *testing.T) {
	w := draining(t, Mutations{})
	if r := w.o.LaneReadiness("a"); r != Ready {
		t.Fatalf("lane %v while draining, want READY", r)
	}
	w.release()
	releases := 0
	for range 10 {
		for _, e := range w.o.TakeEffects() {
			if e.Propose != nil {
				w.queue = append(w.queue, *e.Propose)
			}
			if e.Release {
				releases++
			}
		}
		w.commitAll()
	}
	if w.o.Lifecycle() != Unassigned || releases != 1 {
		t.Fatalf("%v and %d releases after the drain, want UNASSIGNED and one", w.o.Lifecycle(), releases)
	}
	if r := w.o.LaneReadiness("a"); r != RecoveringEvidence {
		t.Fatalf("lane %v after the drain, want the office's certificate forgotten", r)
	}
}

// TestFailedOwnerForgetsItsRuntime pins Step's reset when the state
// failed: the FAILED owner holds no certificate.
func TestFailedOwnerForgetsItsRuntime(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("a", 5000, 0)
	w.settle(true)
	if r := w.o.LaneReadiness("a"); r != Ready {
		t.Fatalf("lane %v, want READY", r)
	}
	w.st.failed = errShort
	w.o.Step(w.now)
	if w.o.Lifecycle() != Failed || w.o.LaneReadiness("a") != RecoveringEvidence {
		t.Fatalf("%v with lane %v after the state failed, want FAILED and no certificate", w.o.Lifecycle(), w.o.LaneReadiness("a"))
	}
}

// TestFenceForgetsCertificates pins fence's reset: an owner fenced and
// back in office under the same epoch (its lease guard closed, then
// renewed) probes its lanes again before it claims.
func TestFenceForgetsCertificates(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("a", 1100, 0)
	w.settle(true) // READY until 11000
	closeGuard(w)
	if w.o.Lifecycle() != Fenced || w.o.LaneReadiness("a") != RecoveringEvidence {
		t.Fatalf("%v with lane %v, want FENCED and no certificate", w.o.Lifecycle(), w.o.LaneReadiness("a"))
	}
	w.o.TakeEffects()
	w.auth.GuardUntilMs = 1e6
	w.o.SetAuthority(1100, w.auth)
	w.now = 1100
	effects := w.o.TakeEffects()
	if w.o.Lifecycle() != Active || probesIn(effects) != 1 || len(intentsIn(effects)) != 0 {
		t.Fatalf("%v back in office: %+v; want ACTIVE, a probe and no claim", w.o.Lifecycle(), effects)
	}
}

// TestReadyRechecksTheIncarnation pins ready's check of the
// certificate's incarnation against the lane's: a lane resumed into a
// new incarnation is probed again, and its next claim is for the new one.
func TestReadyRechecksTheIncarnation(t *testing.T) {
	w := activeWorld(t, Mutations{})
	first := w.schedule("a", 1000, 0)
	w.settle(true) // READY for incarnation 7 until 11000
	w.expectDelivered("a", first)
	w.dests["a"] = newDest(8, 2, 16)
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneResume, Incarnation: 8}); err != nil {
		t.Fatal(err)
	}
	w.settle(true)
	probes := w.probes
	id := w.schedule("a", 1000, 0)
	w.at(w.now + testConfig.ProbeEveryMs) // the lane was probed at 1000
	w.settle(false)
	if w.probes != probes+1 {
		t.Fatalf("%d probes after the lane was re-pinned, want 1", w.probes-probes)
	}
	if w.queued(KindIntent) != 1 || w.queue[len(w.queue)-1].Record.Incarnation != 8 {
		t.Fatalf("claims %+v, want one for incarnation 8", w.queue)
	}
	w.settle(true)
	w.expectDelivered("a", id)
}

// TestExpiredCertificateIsNoLongerReady pins ready's demotion of a
// lane whose certificate expired to RECOVERING_EVIDENCE.
func TestExpiredCertificateIsNoLongerReady(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("a", 20_000, 0)
	w.settle(true) // READY until 11000
	if r := w.o.LaneReadiness("a"); r != Ready {
		t.Fatalf("lane %v, want READY", r)
	}
	w.at(11_000)
	if r := w.o.LaneReadiness("a"); r != RecoveringEvidence {
		t.Fatalf("lane %v once its certificate expired, want RECOVERING_EVIDENCE", r)
	}
}

// TestNoProbeForAnIdleOrPausedLane pins stepLane's probe condition: a
// lane that is not READY is probed only while it is OPEN and holds
// pending schedules.
func TestNoProbeForAnIdleOrPausedLane(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("a", 1000, 0) // fires: lane a is left with nothing
	w.schedule("b", 50_000, 0)
	w.settle(true)
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "b", Op: LanePause}); err != nil {
		t.Fatal(err)
	}
	w.settle(true)
	w.at(20_000) // both certificates expired
	if n := probesIn(w.o.TakeEffects()); n != 0 {
		t.Fatalf("%d probes of an empty lane and a paused one", n)
	}
}

// TestFiringIntentOfAnotherIncarnationIsUnknown pins publishFiring's
// resolution of an intent claimed for an incarnation the lane no longer
// pins: UNKNOWN, proposed once while it is on its way (resolving), and
// proposed again after a refusal (resolutions), never published into
// the new incarnation.
func TestFiringIntentOfAnotherIncarnationIsUnknown(t *testing.T) {
	w := activeWorld(t, Mutations{})
	id := w.schedule("a", 1000, 0)
	w.hold = true
	w.settle(true) // its intent committed, its publish in flight
	w.dests["a"] = newDest(8, 2, 16)
	w.release() // refused: the destination is another incarnation now
	w.settle(true)
	w.at(w.now + testConfig.ProbeEveryMs)
	w.settle(true) // the probe sees incarnation 8: the lane breaks
	if l, _ := w.st.Lane("a"); l.Gate != GateOrderingBroken {
		t.Fatalf("lane %+v, want ORDERING_BROKEN", l)
	}
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneResume, Incarnation: 8}); err != nil {
		t.Fatal(err)
	}
	w.settle(true)
	w.at(w.now + testConfig.ProbeEveryMs)
	w.settle(false)
	w.o.Step(w.now)
	w.settle(false)
	if n := w.queued(KindUnknown); n != 1 {
		t.Fatalf("%d UNKNOWN proposals for the intent of incarnation 7, want 1: %+v", n, w.queue)
	}
	ref := w.queue[len(w.queue)-1].Ref
	w.queue = nil
	w.o.Proposed(w.now, ref, errShort)
	w.at(w.now + testConfig.ProbeEveryMs)
	w.settle(true)
	if c := w.st.Counts(); c.Unknown != 1 || w.st.Live() != 0 {
		t.Fatalf("counts %+v, %d live: want the intent resolved UNKNOWN", c, w.st.Live())
	}
	for _, p := range w.published {
		if p.ID == id && p.Incarnation == 8 {
			t.Fatalf("published %+v into the new incarnation", p)
		}
	}
	w.expectDelivered("a")
}

// TestScheduleOfALaterIncarnationBreaksTheLane pins applySchedule's
// NoClaimForAnEarlierIncarnation: a schedule admitted for the
// destination declared again, while the lane's certificate for the
// deleted incarnation is still valid, breaks the lane as it applies —
// nothing is claimed for the deleted topic, and after the operator's
// resume into the new one the schedule is delivered there. With
// LaterIncarnationAdmitted the lane claims it for the deleted
// incarnation: refused there, then resolved UNKNOWN at the resume, never
// delivered.
func TestScheduleOfALaterIncarnationBreaksTheLane(t *testing.T) {
	for _, mut := range []bool{false, true} {
		w := activeWorld(t, Mutations{})
		w.st.Mutations.LaterIncarnationAdmitted = mut
		w.schedule("a", 1000, 0)
		w.settle(true) // READY for incarnation 7 until 11000
		w.dests["a"] = newDest(8, 2, 16)
		id := w.schedule("a", 2000, 1) // admitted for incarnation 8
		w.at(2000)                     // due, the certificate still valid
		w.settle(true)
		l, _ := w.st.Lane("a")
		if !mut && (l.Gate != GateOrderingBroken || w.st.Counts().Unknown != 0) {
			t.Fatalf("lane %+v, counts %+v: want ORDERING_BROKEN at once, nothing claimed", l, w.st.Counts())
		}
		if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneResume, Incarnation: 8}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			w.settle(true)
			w.at(w.now + testConfig.ProbeEveryMs)
		}
		w.settle(true)
		got := w.delivered("a")
		if delivered := got[id] == 1; delivered == mut {
			t.Fatalf("mutation %v: incarnation 8 holds %v (schedule %d), counts %+v", mut, got, id, w.st.Counts())
		}
	}
}

// TestIntentClaimsAtMostClaimMax pins claimDue's len(intents) >=
// ClaimMax: five due schedules are claimed four, then one.
func TestIntentClaimsAtMostClaimMax(t *testing.T) {
	w := activeWorld(t, Mutations{})
	for range 5 {
		w.schedule("b", 2000, 0)
	}
	w.settle(true)
	w.at(2000)
	rs := intentsIn(w.o.TakeEffects())
	if len(rs) != 1 || len(rs[0].Intents) != testConfig.ClaimMax {
		t.Fatalf("intents %+v, want one claiming %d", rs, testConfig.ClaimMax)
	}
}

// TestClaimPassVisitBudget pins claimDue's visit budget, ClaimMax*8
// (plus the claims in flight): entries whose partition's window is full
// use it up, so a due schedule of another partition behind 31 of them is
// claimed in the pass, and one behind 32 is not.
func TestClaimPassVisitBudget(t *testing.T) {
	for _, ahead := range []int{31, 32} {
		cfg := testConfig
		cfg.FireWindow = 1
		w := newWorld(t, cfg)
		w.activate(1)
		w.schedule("a", 1000, 0)
		w.hold = true
		w.settle(true) // partition 0's window is full
		for range ahead {
			w.schedule("a", 1500, 0)
		}
		other := w.schedule("a", 1500, 1)
		w.o.TakeEffects()
		w.at(1500)
		var claimed []uint64
		for _, r := range intentsIn(w.o.TakeEffects()) {
			for _, in := range r.Intents {
				claimed = append(claimed, in.ID)
			}
		}
		want := ahead < 4*8
		if got := len(claimed) == 1 && claimed[0] == other; got != want || len(claimed) > 1 {
			t.Fatalf("%d entries ahead: claimed %v, want partition 1's %d claimed: %v", ahead, claimed, other, want)
		}
	}
}

// TestClaimedScheduleIsNotClaimedAgain pins claimDue's skip of a
// schedule whose intent is proposed and not completed.
func TestClaimedScheduleIsNotClaimedAgain(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("a", 1000, 0)
	w.settle(false)
	if n := w.queued(KindIntent); n != 1 {
		t.Fatalf("%d intents, want 1", n)
	}
	w.o.Step(w.now)
	if rs := intentsIn(w.o.TakeEffects()); len(rs) != 0 {
		t.Fatalf("claimed again with its intent in flight: %+v", rs)
	}
}

// TestFenceDropsReportedOutcomes pins reset's forgetting of outcomes
// reported and not yet proposed: they are the fenced office's, and the
// next office publishes the intent again instead of recording them.
func TestFenceDropsReportedOutcomes(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.heldPublish("a", 1000, 0)
	w.publishAt(w.inFlight[0]) // landed, reported, not stepped
	w.inFlight, w.hold = nil, false
	w.auth.GuardUntilMs = w.now
	w.o.SetAuthority(w.now, w.auth)
	if w.o.Lifecycle() != Fenced {
		t.Fatalf("%v, want FENCED", w.o.Lifecycle())
	}
	w.auth.GuardUntilMs = 1e6
	w.o.SetAuthority(w.now, w.auth)
	for _, e := range w.o.TakeEffects() {
		if e.Propose != nil && e.Propose.Record.Kind == KindFired {
			t.Fatalf("the new office proposed the fenced one's outcome: %+v", e.Propose.Record)
		}
	}
}

// TestClaimsInFlightHoldTheirFireSequences pins nextFireSeq's record of
// the sequences it hands out (o.fire, c.high, c.seqs) and
// lowestUnresolved's use of them: a second claim pass while the first
// one's intent is on its way uses new sequences, and stays within the
// fire window counted from the first pass's lowest.
func TestClaimsInFlightHoldTheirFireSequences(t *testing.T) {
	for _, window := range []uint64{8, 2} {
		cfg := testConfig
		cfg.FireWindow = window
		w := newWorld(t, cfg)
		w.activate(1)
		for range 6 {
			w.schedule("b", 2000, 0)
		}
		w.settle(true) // READY
		w.at(2000)
		w.settle(false) // the first pass's intent is proposed, not committed
		w.o.Step(w.now)
		w.settle(false)
		seqs := map[uint64]bool{}
		for _, p := range w.queue {
			for _, in := range p.Record.Intents {
				if seqs[in.FireSeq] {
					t.Fatalf("window %d: fire sequence %d claimed twice: %+v", window, in.FireSeq, w.queue)
				}
				seqs[in.FireSeq] = true
			}
		}
		want := map[uint64]int{8: 6, 2: 2}[window] // two passes of 4 and 2; or the window
		if len(seqs) != want {
			t.Fatalf("window %d: %d fire sequences claimed in flight, want %d", window, len(seqs), want)
		}
		w.settle(true)
		if c := w.st.Counts(); c.Fired != 6 {
			t.Fatalf("window %d: counts %+v, want 6 fired", window, c)
		}
	}
}

// TestOwnerRuntimeDoesNotGrowWithHistory pins Proposed's forgetting of
// a completed proposal's intents and resolutions: an owner that has
// settled digests to the same length after one schedule fired as after
// ten.
func TestOwnerRuntimeDoesNotGrowWithHistory(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("b", 1000, 0)
	w.settle(true)
	one := len(w.o.AppendDigest(nil))
	for range 9 {
		w.schedule("b", 1000, 0)
		w.settle(true)
	}
	if c := w.st.Counts(); c.Fired != 10 {
		t.Fatalf("counts %+v, want 10 fired", c)
	}
	if ten := len(w.o.AppendDigest(nil)); ten != one {
		t.Fatalf("the owner's digest grew from %d to %d bytes over nine more schedules", one, ten)
	}
}

// TestStaleOutcomeChangesNothing pins Published's check that the
// outcome is of the publish this office has in flight: an earlier
// office's outcome is ignored — not recorded, and it does not end the
// current publish.
func TestStaleOutcomeChangesNothing(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.heldPublish("a", 1000, 0)
	old := w.inFlight[0]
	w.inFlight = nil
	w.auth.Epoch, w.auth.Barrier = 2, w.st.Applied()
	w.o.SetAuthority(w.now, w.auth) // a new office: the intent is published again
	w.settle(true)
	if len(w.inFlight) != 1 || w.inFlight[0].Epoch != 2 {
		t.Fatalf("in flight %+v, want the new office's publish", w.inFlight)
	}
	w.o.Published(w.now, old, Landed, 1)
	w.o.Step(w.now)
	if e := w.o.TakeEffects(); len(e) != 0 {
		t.Fatalf("the earlier office's outcome made %+v", e)
	}
	w.release()
	w.settle(true)
	if c := w.st.Counts(); c.Fired != 1 {
		t.Fatalf("counts %+v, want the new office's publish recorded", c)
	}
}

// TestOutcomeOfAScheduleNoLongerFiringIsDropped pins Published's return
// for a schedule that left the state while its publish was in flight
// (its lane retired): no FIRED is proposed for it.
func TestOutcomeOfAScheduleNoLongerFiringIsDropped(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.heldPublish("a", 1000, 0)
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneRetire}); err != nil {
		t.Fatal(err)
	}
	w.settle(true)
	if c := w.st.Counts(); c.Unknown != 1 || w.st.Live() != 0 {
		t.Fatalf("counts %+v, %d live after the retire", c, w.st.Live())
	}
	w.publishAt(w.inFlight[0])
	w.inFlight = nil
	w.o.Step(w.now)
	for _, e := range w.o.TakeEffects() {
		if e.Propose != nil {
			t.Fatalf("proposed %+v for a schedule the retire resolved", e.Propose.Record)
		}
	}
}

// TestLandedIsNotPublishedAgainWhileItsFiredIsOnItsWay pins Published's
// resolving mark: between a Landed outcome and its FIRED's commit the
// message is not published again.
func TestLandedIsNotPublishedAgainWhileItsFiredIsOnItsWay(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("a", 1000, 0)
	w.settle(false)
	w.commitAll() // the intent
	w.settle(false)
	if len(w.published) != 1 || w.queued(KindFired) != 1 {
		t.Fatalf("%d publishes, %d FIRED proposed; want 1 and 1", len(w.published), w.queued(KindFired))
	}
	w.o.Step(w.now)
	w.settle(false)
	if len(w.published) != 1 {
		t.Fatalf("published %d times with its FIRED on its way", len(w.published))
	}
}

// TestRefusedPublishBlocksTheLane pins Published's Refused branch: the
// lane is BLOCKED until a probe finds it ready.
func TestRefusedPublishBlocksTheLane(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.heldPublish("a", 1000, 0)
	w.o.Published(w.now, w.inFlight[0], Refused, 0)
	if r := w.o.LaneReadiness("a"); r != Blocked {
		t.Fatalf("lane %v after a refused publish, want BLOCKED", r)
	}
}

// TestEvidenceVerdicts pins Evidence's cases: evidence of a lane the
// state does not hold is ignored; a gone destination (incarnation 0), one
// not writable, one without partitions or evidence already expired
// (ValidUntilMs = now) block the lane without breaking it; another
// incarnation blocks it whatever it was before.
func TestEvidenceVerdicts(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.schedule("a", 50_000, 0)
	w.settle(true)
	good := Evidence{Topic: "a", Incarnation: 7, Partitions: 2, Writable: true, ValidUntilMs: w.now + 1000}
	w.o.Evidence(w.now, Evidence{Topic: "x", Incarnation: 1, Partitions: 1, Writable: true, ValidUntilMs: w.now + 1000})
	if r := w.o.LaneReadiness("x"); r != RecoveringEvidence {
		t.Fatalf("evidence of a lane the shard does not hold made it %v", r)
	}
	for _, tc := range []struct {
		name string
		edit func(*Evidence)
	}{
		{"gone", func(e *Evidence) { e.Incarnation = 0 }},
		{"not writable", func(e *Evidence) { e.Writable = false }},
		{"no partitions", func(e *Evidence) { e.Partitions = 0 }},
		{"expired", func(e *Evidence) { e.ValidUntilMs = w.now }},
	} {
		w.o.Evidence(w.now, good)
		if r := w.o.LaneReadiness("a"); r != Ready {
			t.Fatalf("lane %v on good evidence", r)
		}
		ev := good
		tc.edit(&ev)
		w.o.TakeEffects()
		w.o.Evidence(w.now, ev)
		if r := w.o.LaneReadiness("a"); r != Blocked {
			t.Fatalf("%s: lane %v, want BLOCKED", tc.name, r)
		}
		for _, e := range w.o.TakeEffects() {
			if e.Propose != nil {
				t.Fatalf("%s: proposed %+v", tc.name, e.Propose.Record)
			}
		}
		if l, _ := w.st.Lane("a"); l.Gate != GateOpen {
			t.Fatalf("%s: lane %+v, want OPEN", tc.name, l)
		}
	}
	w.o.Evidence(w.now, good)
	ev := good
	ev.Incarnation = 8
	w.o.Evidence(w.now, ev)
	if r := w.o.LaneReadiness("a"); r != Blocked {
		t.Fatalf("lane %v on another incarnation, want BLOCKED", r)
	}
}

// TestOrderingBreakProposedOnceForOpenOrPaused pins Evidence's break
// condition: an OPEN or ADMIN_PAUSED lane whose destination is another
// incarnation gets one LaneBreak however often it is seen, from the
// active owner only; a CLOSED lane gets none.
func TestOrderingBreakProposedOnceForOpenOrPaused(t *testing.T) {
	for _, gate := range []LaneOp{0, LanePause, LaneClose} {
		w := newWorld(t, testConfig)
		w.activate(1)
		w.schedule("a", 50_000, 0)
		w.settle(true)
		if gate != 0 {
			if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: gate}); err != nil {
				t.Fatal(err)
			}
			w.settle(true)
		}
		ev := Evidence{Topic: "a", Incarnation: 8, Partitions: 2, Writable: true, ValidUntilMs: w.now + 1000}
		w.o.Evidence(w.now, ev)
		w.o.Evidence(w.now, ev)
		w.settle(false)
		want := map[LaneOp]int{0: 1, LanePause: 1, LaneClose: 0}[gate]
		if n := w.queued(KindLane); n != want {
			t.Fatalf("gate after %v: %d ordering breaks proposed, want %d", gate, n, want)
		}
		w.settle(true)
		l, _ := w.st.Lane("a")
		if wantGate := map[LaneOp]Gate{0: GateOrderingBroken, LanePause: GateOrderingBroken, LaneClose: GateClosed}[gate]; l.Gate != wantGate {
			t.Fatalf("lane %+v, want %v", l, wantGate)
		}
	}
	// Not from an owner that is not active yet.
	st := NewState()
	if _, err := st.Apply(1, &Record{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: 5000, Topic: "a", Incarnation: 7}}); err != nil {
		t.Fatal(err)
	}
	o := NewOwner(testConfig, st)
	o.SetAuthority(1000, Authority{Assigned: true, Leader: true, Epoch: 1, GuardUntilMs: 1e6, Barrier: 2})
	o.Evidence(1000, Evidence{Topic: "a", Incarnation: 8, Partitions: 2, Writable: true, ValidUntilMs: 2000})
	if e := o.TakeEffects(); len(e) != 0 || o.LaneReadiness("a") != Blocked {
		t.Fatalf("a RESTORING owner: %+v, lane %v; want nothing proposed, BLOCKED", e, o.LaneReadiness("a"))
	}
}

// TestCommandsJudgedAtTheirInstant pins the Step that Admit, Manage,
// Cancel (active), Serving and Maintain take first: an owner whose lease
// guard closed since its last Step refuses them, and maintains nothing.
func TestCommandsJudgedAtTheirInstant(t *testing.T) {
	cfg := testConfig
	cfg.CheckpointEvery = 1
	w := newWorld(t, cfg)
	w.activate(1)
	w.schedule("a", 50_000, 0)
	w.settle(true)
	w.auth.GuardUntilMs = w.now + 10
	w.o.SetAuthority(w.now, w.auth)
	late := w.now + 10
	if err := w.o.Admit(late, Schedule{Topic: "a", DeliverAtMs: 1}); err == nil {
		t.Fatal("admitted past the lease guard")
	}
	for name, f := range map[string]func(*Owner) error{
		"manage":  func(o *Owner) error { _, err := o.Manage(late, LaneCommand{Topic: "a", Op: LanePause}); return err },
		"cancel":  func(o *Owner) error { _, err := o.Cancel(late, []uint64{1}); return err },
		"serving": func(o *Owner) error { return o.Serving(late) },
	} {
		o := NewOwner(cfg, w.st)
		o.SetAuthority(w.now, w.auth)
		if o.Lifecycle() != Active {
			t.Fatalf("%s: %v", name, o.Lifecycle())
		}
		if err := f(o); err == nil {
			t.Fatalf("%s: taken past the lease guard", name)
		}
		if e := o.TakeEffects(); len(e) != 0 {
			t.Fatalf("%s: %+v past the lease guard", name, e)
		}
	}
	o := NewOwner(cfg, w.st)
	o.SetAuthority(w.now, w.auth)
	o.Maintain(late)
	if e := o.TakeEffects(); len(e) != 0 {
		t.Fatalf("maintained past the lease guard: %+v", e)
	}
}

// TestServingOnlyInOffice pins Serving: a listing is answered by an
// ACTIVE or DRAINING owner, and by none other.
func TestServingOnlyInOffice(t *testing.T) {
	st := NewState()
	o := NewOwner(testConfig, st)
	if err := o.Serving(1000); !errors.Is(err, ErrNotActive) {
		t.Fatalf("UNASSIGNED: %v", err)
	}
	a := Authority{Assigned: true, Leader: true, Epoch: 1, GuardUntilMs: 1e6, Barrier: 1}
	o.SetAuthority(1000, a)
	if err := o.Serving(1000); !errors.Is(err, ErrNotActive) || o.Lifecycle() != Restoring {
		t.Fatalf("%v: %v", o.Lifecycle(), err)
	}
	st.MarkLoaded()
	if err := o.Serving(1000); !errors.Is(err, ErrNotActive) || o.Lifecycle() != CatchingUp {
		t.Fatalf("%v: %v", o.Lifecycle(), err)
	}
	st.Apply(1, nil)
	if err := o.Serving(1000); err != nil || o.Lifecycle() != Active {
		t.Fatalf("%v: %v", o.Lifecycle(), err)
	}
	w := draining(t, Mutations{}) // a publish in flight
	if err := w.o.Serving(w.now); err != nil || w.o.Lifecycle() != Draining {
		t.Fatalf("%v: %v", w.o.Lifecycle(), err)
	}
}

// TestCommandsRefusedWhole pins the checks of Admit (the topic), Manage
// (active, an encodable command) and Cancel (active, 1..RecordEntriesMax
// ids): a refused command proposes nothing and has no ref.
func TestCommandsRefusedWhole(t *testing.T) {
	w := activeWorld(t, Mutations{})
	for _, topic := range []string{"", strings.Repeat("t", TopicBytesMax+1)} {
		if err := w.o.Admit(w.now, Schedule{Topic: topic, DeliverAtMs: 1}); err == nil {
			t.Fatalf("admitted a schedule to a topic of %d bytes", len(topic))
		}
	}
	refused := func(name string, ref uint64, err error) {
		t.Helper()
		if err == nil || ref != 0 {
			t.Fatalf("%s: ref %d, %v; want refused with no ref", name, ref, err)
		}
		if e := w.o.TakeEffects(); len(e) != 0 {
			t.Fatalf("%s: proposed %+v", name, e)
		}
	}
	ref, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneBreak, Incarnation: 7})
	refused("break", ref, err)
	ref, err = w.o.Manage(w.now, LaneCommand{Topic: "", Op: LanePause})
	refused("no topic", ref, err)
	ref, err = w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneBreak + 1})
	refused("no such op", ref, err)
	ref, err = w.o.Cancel(w.now, nil)
	refused("cancel nothing", ref, err)
	ref, err = w.o.Cancel(w.now, make([]uint64, RecordEntriesMax+1))
	refused("cancel too many", ref, err)
	w.auth.Leader = false
	w.o.SetAuthority(w.now, w.auth)
	ref, err = w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LanePause})
	refused("manage, not active", ref, err)
	ref, err = w.o.Cancel(w.now, []uint64{1})
	refused("cancel, not active", ref, err)
}

// TestNextWakeMsNamesEachDeadline pins NextWakeMs's deadlines: the
// lease guard, the drain's deadline, a READY lane's certificate expiry
// and next due schedule, a probe to repeat.
func TestNextWakeMsNamesEachDeadline(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.auth.GuardUntilMs = 500_000
	w.o.SetAuthority(w.now, w.auth)
	if at := w.o.NextWakeMs(w.now); at != 500_000 {
		t.Fatalf("next wake %d with nothing but the lease guard, want 500000", at)
	}
	w.schedule("a", 5000, 0)
	w.settle(true) // READY until 11000
	if at := w.o.NextWakeMs(w.now); at != 5000 {
		t.Fatalf("next wake %d, want the schedule due at 5000", at)
	}
	w.at(5000)
	w.settle(true)
	if at := w.o.NextWakeMs(w.now); at != 11_000 {
		t.Fatalf("next wake %d, want the certificate's expiry at 11000", at)
	}
	w.dests["a"].writable = false
	w.schedule("a", 20_000, 0)
	w.at(11_000) // expired: probed, BLOCKED
	w.settle(true)
	if at := w.o.NextWakeMs(w.now); at != 11_000+testConfig.ProbeEveryMs {
		t.Fatalf("next wake %d, want the probe again at %d", at, 11_000+testConfig.ProbeEveryMs)
	}
	w.auth.Leader = false // FENCED: nothing to wake for, the lease guard neither
	w.o.SetAuthority(w.now, w.auth)
	if at := w.o.NextWakeMs(w.now); at != 0 {
		t.Fatalf("a FENCED owner wakes at %d", at)
	}
	w = draining(t, Mutations{}) // until now+100
	if at := w.o.NextWakeMs(w.now); at != w.now+100 {
		t.Fatalf("next wake %d while draining, want the deadline %d", at, w.now+100)
	}
}

// TestDrainWithNothingInFlightReleasesAtOnce pins Drain's Step: a drain
// with nothing in flight ends in the call, released.
func TestDrainWithNothingInFlightReleasesAtOnce(t *testing.T) {
	w := activeWorld(t, Mutations{})
	w.o.Drain(w.now, w.now+100)
	released := false
	for _, e := range w.o.TakeEffects() {
		released = released || e.Release
	}
	if w.o.Lifecycle() != Unassigned || !released {
		t.Fatalf("%v, released %v: want UNASSIGNED and released", w.o.Lifecycle(), released)
	}
}

// busyWorld is an owner with a runtime of every kind: READY lanes,
// publishes in flight, an intent proposed, outcomes reported and not
// yet stepped, effects not taken.
func busyWorld(t *testing.T) *world {
	cfg := testConfig
	cfg.ClaimMax = 2
	w := newWorld(t, cfg)
	w.activate(1)
	for range 3 {
		w.schedule("a", 1000, 0)
	}
	w.schedule("b", 1000, 0)
	w.hold = true
	w.settle(false)
	w.commitAll()
	w.settle(false) // publishes in flight
	w.schedule("a", 1000, 1)
	w.settle(false) // its intent proposed
	w.publishAt(w.inFlight[0])
	w.o.Step(w.now)
	w.settle(false) // its FIRED proposed
	w.publishAt(w.inFlight[1])
	w.inFlight = w.inFlight[2:]
	return w
}

// TestOwnerCloneSharesNothing pins Owner.Clone's copies: the clone
// digests as the original, reads its own state, and driving it to the
// end leaves the original as it was.
func TestOwnerCloneSharesNothing(t *testing.T) {
	w := busyWorld(t)
	d0 := string(w.o.AppendDigest(nil))
	c := &world{t: t, st: w.st.Clone(), now: w.now, auth: w.auth, dests: map[string]*destTopic{}, hold: false}
	c.o = w.o.Clone(c.st)
	c.dests["a"] = newDest(7, 2, 16)
	c.dests["b"] = newDest(9, 1, 16)
	c.dests["a"].writable = false
	if string(c.o.AppendDigest(nil)) != d0 {
		t.Fatal("the clone digests otherwise than the original")
	}
	c.queue = append(c.queue, w.queue...)
	for _, p := range w.inFlight {
		c.deliver(p) // refused: lane a BLOCKED in the clone
	}
	c.settle(true)
	c.dests["a"].writable = true
	c.at(c.now + testConfig.ProbeEveryMs)
	c.settle(true)
	if got := c.st.Counts(); got.Fired != 5 || c.st.Live() != 0 {
		t.Fatalf("the clone ended with counts %+v, %d live; want 5 fired", got, c.st.Live())
	}
	if string(w.o.AppendDigest(nil)) != d0 || w.st.Counts().Fired != 0 {
		t.Fatal("driving the clone changed the original")
	}
	// The original, stepped, records what it was recording and
	// publishes nothing it had published.
	w.o.Step(w.now)
	for _, e := range w.o.TakeEffects() {
		if e.Publish != nil {
			t.Fatalf("driving the clone made the original publish %+v again", *e.Publish)
		}
	}
}

// TestOwnerCloneKeepsItsOwnEffects pins Owner.Clone's copy of the
// effects not taken: what the original and the clone emit after the
// clone are each their own.
func TestOwnerCloneKeepsItsOwnEffects(t *testing.T) {
	w := activeWorld(t, Mutations{})
	for range 3 {
		if _, err := w.o.Cancel(w.now, []uint64{100}); err != nil {
			t.Fatal(err)
		}
	}
	st := w.st.Clone()
	c := w.o.Clone(st)
	if _, err := w.o.Cancel(w.now, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(w.now, []uint64{2}); err != nil {
		t.Fatal(err)
	}
	for want, o := range map[uint64]*Owner{1: w.o, 2: c} {
		e := o.TakeEffects()
		if len(e) != 4 || e[3].Propose == nil || !slices.Equal(e[3].Propose.Record.IDs, []uint64{want}) {
			t.Fatalf("effects %+v, want the fourth to cancel %d", e, want)
		}
	}
}

// TestUnprovableIsNotPublishedAgain pins Published's resolving mark for
// an Unprovable outcome: while its UNKNOWN is on its way the message is
// not published again (UnprovableNeverResent).
func TestUnprovableIsNotPublishedAgain(t *testing.T) {
	w := newWorld(t, testConfig)
	w.dests["a"] = newDest(7, 1, 1) // a dedup window of one sequence
	w.activate(1)
	first := w.heldPublish("a", 1000, 0)
	w.deliver(w.inFlight[0]) // it lands; the FIRED is lost with the owner
	w.o.TakeEffects()
	w.inFlight, w.hold, w.queue = nil, false, nil
	w.dests["a"].parts[0].producers.Record(producerID("a", 0), 5, 99, 1)
	w.o = NewOwner(testConfig, w.st)
	w.activate(2)
	before := len(w.published)
	w.settle(false)
	w.o.Step(w.now)
	w.settle(false)
	if n := len(w.published) - before; n != 1 || w.queued(KindUnknown) != 1 {
		t.Fatalf("%d publishes of schedule %d and %d UNKNOWN proposals; want 1 and 1", n, first, w.queued(KindUnknown))
	}
}

// TestOwnerDigestTellsRuntimesApart pins AppendDigest's fields: owners
// that differ in any one part of their runtime digest differently.
func TestOwnerDigestTellsRuntimesApart(t *testing.T) {
	w := busyWorld(t)
	base := w.o
	base.lanes["a"].probed, base.lanes["a"].probedAt, base.lanes["a"].brokeFor = true, 0, 0
	base.resolutions[999] = []uint64{1}
	base.unprovable = []uint64{5}
	if len(base.claims) == 0 || len(base.intents) == 0 || len(base.publishing) == 0 || len(base.landed) == 0 {
		t.Fatalf("a runtime without claims, intents, publishes or outcomes: %+v", base)
	}
	d := func(o *Owner) string { return string(o.AppendDigest(nil)) }
	anyKey := func(m map[uint64]bool) uint64 {
		for k := range m {
			return k
		}
		t.Fatal("empty")
		return 0
	}
	for name, edit := range map[string]func(o *Owner){
		"life":          func(o *Owner) { o.life = Draining },
		"epoch":         func(o *Owner) { o.epoch++ },
		"drainUntil":    func(o *Owner) { o.drainUntil++ },
		"retryAfter":    func(o *Owner) { o.retryAfter++ },
		"maintainAfter": func(o *Owner) { o.maintainAfter++ },
		"nextRef":       func(o *Owner) { o.nextRef++ },
		"lane topic":    func(o *Owner) { o.lanes["c"] = o.lanes["b"]; delete(o.lanes, "b") },
		"readiness":     func(o *Owner) { o.lanes["a"].readiness = Blocked },
		"cert epoch":    func(o *Owner) { o.lanes["a"].cert.Epoch++ },
		"cert inc":      func(o *Owner) { o.lanes["a"].cert.Incarnation++ },
		"cert parts":    func(o *Owner) { o.lanes["a"].cert.Partitions++ },
		"cert until":    func(o *Owner) { o.lanes["a"].cert.UntilMs++ },
		"not probed":    func(o *Owner) { o.lanes["a"].probed = false },
		"probedAt":      func(o *Owner) { o.lanes["a"].probedAt++ },
		"brokeFor":      func(o *Owner) { o.lanes["a"].brokeFor++ },
		"claim id": func(o *Owner) {
			id := slices.Max(slices.Collect(maps.Keys(o.claims)))
			o.claims[id+100] = o.claims[id]
			delete(o.claims, id)
		},
		"claim ref": func(o *Owner) {
			for id := range o.claims {
				o.claims[id] += 100
			}
		},
		"intent ref":    func(o *Owner) { o.intents[999] = intentClaim{} },
		"intent id":     func(o *Owner) { forIntent(o, func(in *Intent) { in.ID++ }) },
		"intent part":   func(o *Owner) { forIntent(o, func(in *Intent) { in.Partition++ }) },
		"intent seq":    func(o *Owner) { forIntent(o, func(in *Intent) { in.FireSeq++ }) },
		"fire topic":    func(o *Owner) { o.fire[dest{"c", 0}] = o.fire[dest{"b", 0}]; delete(o.fire, dest{"b", 0}) },
		"fire part":     func(o *Owner) { o.fire[dest{"b", 5}] = o.fire[dest{"b", 0}]; delete(o.fire, dest{"b", 0}) },
		"fire high":     func(o *Owner) { o.fire[dest{"a", 1}].high++ },
		"fire seqs":     func(o *Owner) { s := o.fire[dest{"a", 1}].seqs; k := anyKey(s); delete(s, k); s[k+100] = true },
		"publishing id": func(o *Owner) { forPublish(o, func(p *Publish) { p.ID += 100 }) },
		"publish seq":   func(o *Owner) { forPublish(o, func(p *Publish) { p.FireSeq++ }) },
		"publish epoch": func(o *Owner) { forPublish(o, func(p *Publish) { p.Epoch++ }) },
		"publish inc":   func(o *Owner) { forPublish(o, func(p *Publish) { p.Incarnation++ }) },
		"resolution":    func(o *Owner) { o.resolutions[998] = o.resolutions[999]; delete(o.resolutions, 999) },
		"resolution id": func(o *Owner) { o.resolutions[999] = []uint64{2} },
		"inflight":      func(o *Owner) { o.inflight[999] = true },
		"landed id":     func(o *Owner) { o.landed[0].ID++ },
		"landed seq":    func(o *Owner) { o.landed[0].DestSeq++ },
		"unprovable":    func(o *Owner) { o.unprovable = []uint64{6} },
	} {
		c := base.Clone(w.st)
		edit(c)
		if d(c) == d(base) {
			t.Errorf("%s: the digest does not tell the owners apart", name)
		}
	}
	// The lists' lengths delimit them: the landed outcome (2, 9) and the
	// unprovable ids 9 and 0 are other runtimes, and so are an empty
	// resolution and a resolution of id 0.
	a, b := base.Clone(w.st), base.Clone(w.st)
	a.landed, a.unprovable = nil, []uint64{9, 0}
	b.landed, b.unprovable = []Fired{{ID: 2, DestSeq: 9}}, nil
	if d(a) == d(b) {
		t.Error("landed and unprovable lists run together in the digest")
	}
	// Nor is one runtime's digest a prefix of another's (the model
	// checker appends more after it).
	a.landed, a.unprovable = nil, nil
	b.landed, b.unprovable = nil, []uint64{7}
	if strings.HasPrefix(d(b), d(a)) {
		t.Error("a digest is a prefix of another's")
	}
	// Every list is delimited, not only the last two: a resolution of ref
	// 5 for id 7 and nothing in flight is not refs 5 and 7 in flight.
	a, b = base.Clone(w.st), base.Clone(w.st)
	a.resolutions, a.inflight = map[uint64][]uint64{5: {7}}, map[uint64]bool{}
	b.resolutions, b.inflight = map[uint64][]uint64{}, map[uint64]bool{5: true, 7: true}
	if d(a) == d(b) {
		t.Error("resolutions and the refs in flight run together in the digest")
	}
}

func forIntent(o *Owner, f func(*Intent)) {
	for ref, ic := range o.intents {
		ins := slices.Clone(ic.intents)
		f(&ins[0])
		o.intents[ref] = intentClaim{ic.topic, ins}
		return
	}
}

// forPublish edits the publish in flight of the highest id.
func forPublish(o *Owner, f func(*Publish)) {
	id := slices.Max(slices.Collect(maps.Keys(o.publishing)))
	p := o.publishing[id]
	delete(o.publishing, id)
	f(&p)
	o.publishing[p.ID] = p
}

// applyAll applies records at st's next seqs and returns their results.
func applyAll(t *testing.T, st *State, rs ...Record) []Result {
	t.Helper()
	var out []Result
	for i := range rs {
		res, err := st.Apply(st.Applied()+1, &rs[i])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res)
	}
	return out
}

// TestApplyRefusesGapsAndStopsWhenFailed pins Apply's seq check and its
// stop once failed: a gap is refused and applies nothing; a record of no
// kind fails the state, which then applies nothing more.
func TestApplyRefusesGapsAndStopsWhenFailed(t *testing.T) {
	st := NewState()
	applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
	if _, err := st.Apply(3, &Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}}); err == nil || st.Applied() != 1 || st.Live() != 1 {
		t.Fatalf("applied seq 3 after 1: %v, applied %d, %d live", err, st.Applied(), st.Live())
	}
	if _, err := st.Apply(2, &Record{Kind: 99}); err == nil || st.Failed() == nil {
		t.Fatalf("a record of kind 99: %v, failed %v", err, st.Failed())
	}
	if _, err := st.Apply(3, &Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}}); err == nil || st.Applied() != 2 || st.Live() != 1 {
		t.Fatalf("a failed state applied: %v, applied %d, %d live", err, st.Applied(), st.Live())
	}
}

// TestApplyReportsWhatItSkipped pins the Skipped lists and counts of
// Apply: FIRED and UNKNOWN of an id not firing (a pending one stays
// pending), an intent or a cancel of an unknown id; Admitted and
// Cancelled.
func TestApplyReportsWhatItSkipped(t *testing.T) {
	st := NewState()
	applyAll(t, st,
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}},
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 2}})
	res := applyAll(t, st,
		Record{Kind: KindFired, Fired: []Fired{{ID: 1, DestSeq: 1}, {ID: 99}}},
		Record{Kind: KindUnknown, IDs: []uint64{2, 99}},
		Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 99, FireSeq: 1}}},
		Record{Kind: KindCancel, IDs: []uint64{1, 99}})
	want := [][]uint64{{1, 99}, {2, 99}, {99}, {99}}
	for i, r := range res {
		if !slices.Equal(r.Skipped, want[i]) {
			t.Fatalf("record %d skipped %v, want %v", i, r.Skipped, want[i])
		}
	}
	if e, ok := st.Entry(2); !ok || e.Status != StatusPending {
		t.Fatalf("schedule 2 after an UNKNOWN while pending: %+v %v", e, ok)
	}
	if c := st.Counts(); c != (Counts{Admitted: 2, Cancelled: 1}) {
		t.Fatalf("counts %+v", c)
	}
}

// TestLaneTransitions pins applyLane's closed transitions: a resume or
// break of a lane the shard never held creates none; a retried pause is
// no error, a pause of a lane not OPEN is; a break naming another
// incarnation, or of a CLOSED lane, is ignored; a retire is RETIRED for
// good.
func TestLaneTransitions(t *testing.T) {
	st := NewState()
	lane := func(op LaneOp, inc uint64) error {
		t.Helper()
		return applyAll(t, st, Record{Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: op, Incarnation: inc}})[0].Err
	}
	gate := func(want Gate) {
		t.Helper()
		if l, ok := st.Lane("a"); !ok || l.Gate != want {
			t.Fatalf("lane %+v %v, want %v", l, ok, want)
		}
	}
	lane(LaneResume, 7)
	lane(LaneBreak, 7)
	if ls := st.Lanes(); len(ls) != 0 {
		t.Fatalf("a resume and a break of no lane made %v", ls)
	}
	applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", Incarnation: 7, DeliverAtMs: 1}})
	if err := lane(LanePause, 0); err != nil {
		t.Fatal(err)
	}
	if err := lane(LanePause, 0); err != nil {
		t.Fatalf("a retried pause: %v", err)
	}
	gate(GatePaused)
	lane(LaneBreak, 6) // stale: names another incarnation
	gate(GatePaused)
	lane(LaneClose, 0)
	if err := lane(LanePause, 0); err == nil {
		t.Fatal("paused a CLOSED lane")
	}
	lane(LaneBreak, 7)
	gate(GateClosed)
	lane(LaneRetire, 0)
	gate(GateRetired)
	if err := lane(LaneResume, 0); err == nil {
		t.Fatal("resumed a RETIRED lane")
	}
	gate(GateRetired)
}

// TestRefusedFirstIntentIsClaimedAgain pins lowestFiring's 0 for a
// destination partition no intent was applied to: after its first
// intent was refused, the window is counted from what is claimed next,
// and the schedules fire.
func TestRefusedFirstIntentIsClaimedAgain(t *testing.T) {
	cfg := testConfig
	cfg.FireWindow = 2
	w := newWorld(t, cfg)
	w.activate(1)
	w.schedule("b", 1000, 0)
	w.schedule("b", 1000, 0)
	w.settle(false)
	if w.queued(KindIntent) != 1 {
		t.Fatalf("proposed %+v, want one intent", w.queue)
	}
	ref := w.queue[len(w.queue)-1].Ref
	w.queue = nil
	w.o.Proposed(w.now, ref, errShort)
	w.at(w.now + cfg.ProbeEveryMs)
	w.settle(true)
	if c := w.st.Counts(); c.Fired != 2 {
		t.Fatalf("counts %+v after the refused intent, want 2 fired", c)
	}
}

// TestStateReadsOfLanesAndEntries pins NextDue of a lane the state
// does not hold, Lanes in order, and Entries' order and limit.
func TestStateReadsOfLanesAndEntries(t *testing.T) {
	st := NewState()
	if at, ok := st.NextDue("x"); ok || at != 0 {
		t.Fatalf("next due of no lane: %d %v", at, ok)
	}
	topics := []string{"f", "b", "e", "a", "d", "c"}
	ats := []int64{50, 20, 60, 10, 40, 30}
	for i := range topics {
		applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: topics[i], DeliverAtMs: ats[i]}})
	}
	if ls := st.Lanes(); !slices.Equal(ls, []string{"a", "b", "c", "d", "e", "f"}) {
		t.Fatalf("lanes %v, want them in order", ls)
	}
	at := func(es []Entry) []int64 {
		var out []int64
		for _, e := range es {
			out = append(out, e.DeliverAtMs)
		}
		return out
	}
	for n, want := range map[int][]int64{0: {10, 20, 30, 40, 50, 60}, 1: {10}, 2: {10, 20}, 6: {10, 20, 30, 40, 50, 60}, 9: {10, 20, 30, 40, 50, 60}} {
		if got := at(st.Entries(n)); !slices.Equal(got, want) {
			t.Fatalf("Entries(%d) due at %v, want %v", n, got, want)
		}
	}
}

// failingSpill is a MemSpill whose every call fails once fail is set.
type failingSpill struct {
	*MemSpill
	fail     bool
	failDrop bool                            // Drop fails
	loose    bool                            // Scan ignores from
	short    bool                            // Pop returns one fewer
	lie      func(string, Key) (string, Key) // what Delete reports
}

var errDisk = errors.New("disk")

func (f *failingSpill) Put(lane string, k Key) error {
	if f.fail {
		return errDisk
	}
	return f.MemSpill.Put(lane, k)
}

func (f *failingSpill) Scan(lane string, from *Key, fn func(Key) bool) error {
	if f.fail {
		return errDisk
	}
	if f.loose {
		from = nil
	}
	return f.MemSpill.Scan(lane, from, fn)
}

func (f *failingSpill) Drop(lane string) error {
	if f.fail || f.failDrop {
		return errDisk
	}
	return f.MemSpill.Drop(lane)
}

func (f *failingSpill) Move(lane string, k Key) (bool, error) {
	if f.fail {
		return false, errDisk
	}
	return f.MemSpill.Move(lane, k)
}

func (f *failingSpill) Pop(lane string, n int) ([]Key, error) {
	if f.fail {
		return nil, errDisk
	}
	ks, err := f.MemSpill.Pop(lane, n)
	if f.short && len(ks) > 0 {
		ks = ks[:len(ks)-1]
	}
	return ks, err
}

func (f *failingSpill) Delete(id uint64) (string, Key, bool, error) {
	if f.fail {
		return "", Key{}, false, errDisk
	}
	lane, k, ok, err := f.MemSpill.Delete(id)
	if ok && f.lie != nil {
		lane, k = f.lie(lane, k)
	}
	return lane, k, ok, err
}

// TestSpillFailureStopsTheState pins SetSpill's refusal of a state that
// applied an entry, and spillFailed: a failing spill fails the state
// with ErrSpill, and the first failure is the one kept.
func TestSpillFailureStopsTheState(t *testing.T) {
	st := NewState()
	if _, err := st.Apply(1, nil); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("SetSpill on a state that applied an entry")
			}
		}()
		st.SetSpill(NewMemSpill(), 2)
	}()
	st = NewState()
	sp := &failingSpill{MemSpill: NewMemSpill()}
	st.SetSpill(sp, 2)
	for range 6 {
		applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
	}
	if st.Spilled() == 0 {
		t.Fatal("nothing spilled")
	}
	sp.fail = true
	if _, err := st.Apply(st.Applied()+1, &Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 2}}); !errors.Is(err, ErrSpill) || !errors.Is(st.Failed(), errDisk) {
		t.Fatalf("a failing spill: %v, state failed %v", err, st.Failed())
	}
	first := st.Failed()
	if _, _, err := st.List("", ListCursor{}, 10); err == nil || st.Failed() != first {
		t.Fatalf("listing a failed state: %v; failure %v, was %v", err, st.Failed(), first)
	}
}

// TestRepublishInPartitionAndSequenceOrder pins State.firing's order: a
// new owner publishes the intents left unresolved by partition, then
// fire sequence.
func TestRepublishInPartitionAndSequenceOrder(t *testing.T) {
	cfg := testConfig
	cfg.ClaimMax = 8
	w := newWorld(t, cfg)
	w.activate(1)
	for _, p := range []uint32{1, 0, 1, 0, 1, 0} {
		w.schedule("a", 2000, p)
	}
	w.settle(true)
	w.hold = true
	w.at(2000)
	w.settle(true) // all six firing, in flight
	w.inFlight, w.hold, w.queue = nil, false, nil
	w.o = NewOwner(cfg, w.st)
	w.hold = true
	w.activate(2)
	w.settle(true)
	var got [][2]uint64
	for _, p := range w.inFlight {
		got = append(got, [2]uint64{uint64(p.Partition), p.FireSeq})
	}
	want := [][2]uint64{{0, 1}, {0, 2}, {0, 3}, {1, 1}, {1, 2}, {1, 3}}
	if !slices.Equal(got, want) {
		t.Fatalf("published again as (partition, fire sequence) %v, want %v", got, want)
	}
}

// TestRecordBounds pins Encode's and Decode's checks: a FIRED without
// entries and a lane command without a topic are not encoded; exactly
// RecordEntriesMax ids are; a value of no kind, a lane command of no op,
// a record naming an empty topic, a list of no entries are not decoded;
// a one-byte topic is.
func TestRecordBounds(t *testing.T) {
	for _, r := range []Record{
		{Kind: KindFired},
		{Kind: KindLane, Lane: LaneCommand{Op: LanePause}},
	} {
		if b, err := r.Encode(); err == nil {
			t.Fatalf("encoded %+v as %x", r, b)
		}
	}
	for _, r := range []Record{
		{Kind: KindCancel, IDs: make([]uint64, RecordEntriesMax)},
		{Kind: KindSchedule, Schedule: Schedule{Topic: "t", DeliverAtMs: 1}},
		{Kind: KindLane, Lane: LaneCommand{Topic: "t", Op: LaneBreak}},
	} {
		b, err := r.Encode()
		if err != nil {
			t.Fatalf("%v: %v", r.Kind, err)
		}
		if got, err := Decode(b); err != nil || got.Kind != r.Kind {
			t.Fatalf("%v: decoded %v, %v", r.Kind, got.Kind, err)
		}
	}
	lane := func(op byte) []byte { return []byte{byte(KindLane), 1, 't', op, 0, 0, 0, 0, 0, 0, 0, 7} }
	for name, b := range map[string][]byte{
		"kind 0":        {0},
		"kind 9":        {9},
		"lane op 0":     lane(0),
		"lane op 6":     lane(byte(LaneBreak) + 1),
		"empty topic":   append(append([]byte{byte(KindSchedule)}, make([]byte, 8)...), make([]byte, 1+8+4)...),
		"cancel none":   {byte(KindCancel), 0, 0, 0, 0},
		"intent none":   append(append([]byte{byte(KindIntent)}, make([]byte, 16)...), 0, 0, 0, 0),
		"lane no topic": {byte(KindLane), 0, byte(LanePause), 0, 0, 0, 0, 0, 0, 0, 7},
	} {
		if r, err := Decode(b); err == nil {
			t.Fatalf("%s: decoded %+v", name, r)
		}
	}
	if _, err := Decode(lane(byte(LanePause))); err != nil {
		t.Fatalf("a lane command on a one-byte topic: %v", err)
	}
}

// TestRestoreOnlyAFreshState pins Restore's refusal of a state that
// applied anything (an entry of another's, a lane's standing order) and
// its start: a log that starts at 1 (or 0) holds everything, one that
// starts later leaves the state RESTORING at the seq before it, holding
// nothing until a checkpoint.
func TestRestoreOnlyAFreshState(t *testing.T) {
	for name, r := range map[string]*Record{
		"an install entry": nil,
		"a standing pause": {Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: LanePause}},
	} {
		st := NewState()
		if _, err := st.Apply(1, r); err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("Restore after %s", name)
				}
			}()
			st.Restore(5)
		}()
	}
	for _, from := range []uint64{0, 1} {
		st := NewState()
		st.Restore(from)
		if st.Restoring() || st.Applied() != 0 {
			t.Fatalf("Restore(%d): restoring %v at %d, want a state that takes the log from 1", from, st.Restoring(), st.Applied())
		}
	}
	st := NewState()
	st.Restore(5)
	if !st.Restoring() || st.Applied() != 4 {
		t.Fatalf("Restore(5): restoring %v at %d, want RESTORING at 4", st.Restoring(), st.Applied())
	}
	applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
	if st.Live() != 0 || st.CompactLimit() != 0 {
		t.Fatalf("a restoring state holds %d, compaction limit %d", st.Live(), st.CompactLimit())
	}
	if _, _, err := st.List("", ListCursor{}, 10); !errors.Is(err, ErrListUnavailable) {
		t.Fatalf("listed a restoring state: %v", err)
	}
	if _, err := st.Checkpoint(10); err == nil {
		t.Fatal("a checkpoint of a restoring state")
	}
}

// TestCarryCandidatesBounds pins CarryCandidates' guards: none for seq
// 0 or n < 1, and at most n, the lowest At first.
func TestCarryCandidatesBounds(t *testing.T) {
	st := NewState()
	for range 5 {
		applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
	}
	for _, tc := range []struct {
		seq  uint64
		n    int
		want []uint64
	}{
		{0, 5, nil}, {5, 0, nil}, {5, -1, nil}, {5, 1, []uint64{1}}, {3, 5, []uint64{1, 2, 3}}, {5, 2, []uint64{1, 2}}, {1, 5, []uint64{1}},
	} {
		cs, err := st.CarryCandidates(tc.seq, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		var ids []uint64
		for _, c := range cs {
			ids = append(ids, c.ID)
		}
		if !slices.Equal(ids, tc.want) {
			t.Fatalf("CarryCandidates(%d, %d): %v, want %v", tc.seq, tc.n, ids, tc.want)
		}
	}
}

// TestMaintainGuards pins Maintain's conditions and its carry queue:
// CheckpointEvery 0 never maintains and 1 does; a refusal holds it back
// until exactly retryAfter; CarryMax 0 carries one at a time; the queue
// of a scan is dropped — and the live schedules scanned again — after a
// refused proposal and in a new office.
func TestMaintainGuards(t *testing.T) {
	for _, every := range []uint64{0, 1} {
		cfg := testConfig
		cfg.CheckpointEvery = every
		w := newWorld(t, cfg)
		w.activate(1)
		w.schedule("a", 1e9, 0)
		w.settle(true)
		w.o.Maintain(w.now)
		if k := w.proposedKinds(); (len(k) > 0) != (every == 1) {
			t.Fatalf("CheckpointEvery %d: proposed %v", every, k)
		}
	}

	cfg := testConfig
	cfg.CheckpointEvery, cfg.CheckpointChunkEntries = 2, 64
	w := newWorld(t, cfg)
	w.activate(1)
	for range 3 {
		w.schedule("a", 1e9, 0)
	}
	w.settle(true)
	ref, err := w.o.Cancel(w.now, []uint64{12345})
	if err != nil {
		t.Fatal(err)
	}
	w.o.TakeEffects()
	w.o.Proposed(w.now, ref, errShort) // held back until now+ProbeEveryMs
	w.o.Maintain(w.now + cfg.ProbeEveryMs - 1)
	if k := w.proposedKinds(); len(k) != 0 {
		t.Fatalf("proposed %v before the retry", k)
	}
	w.now += cfg.ProbeEveryMs
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 1 || k[0] != KindCheckpoint {
		t.Fatalf("proposed %v at the retry, want a checkpoint", k)
	}
	w.commitAll()
	for range 4 {
		w.schedule("b", 1e9, 0) // enough since the checkpoint: a carry round
	}
	w.settle(true)
	scans := w.st.carryScans
	w.o.Maintain(w.now)
	var carries []Proposal
	for _, e := range w.o.TakeEffects() {
		if e.Propose != nil && e.Propose.Record.Kind == KindCarry {
			carries = append(carries, *e.Propose)
		}
	}
	if len(carries) != 1 || w.st.carryScans != scans+1 {
		t.Fatalf("CarryMax 0: %d carries after %d scans, want one after one", len(carries), w.st.carryScans-scans)
	}
	w.o.Proposed(w.now, carries[0].Ref, errShort) // its message could not be read
	w.now += cfg.ProbeEveryMs
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 1 || k[0] != KindCarry || w.st.carryScans != scans+2 {
		t.Fatalf("after a refused carry: proposed %v after %d scans, want a carry from a new scan", k, w.st.carryScans-scans)
	}
	w.commitAll()
	w.auth.Epoch, w.auth.Barrier = 2, w.st.Applied()
	w.o.SetAuthority(w.now, w.auth)
	w.settle(true)
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 1 || k[0] != KindCarry || w.st.carryScans != scans+3 {
		t.Fatalf("in a new office: proposed %v after %d scans, want a carry from a new scan", k, w.st.carryScans-scans)
	}
}

// TestCheckpointOfExactlyTheMostChunks pins State.Checkpoint's bound,
// CheckpointChunksMax chunks and not one more, and Maintain's wait of
// exactly maintainRetryMs after a checkpoint could not be made.
func TestCheckpointOfExactlyTheMostChunks(t *testing.T) {
	cfg := testConfig
	cfg.CheckpointEvery, cfg.CheckpointChunkEntries = 1, 1
	w := newWorld(t, cfg)
	w.activate(1)
	for range CheckpointChunksMax + 1 {
		w.append(&Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", Incarnation: 7, DeliverAtMs: 1e9}})
	}
	w.settle(true)
	if _, err := w.st.Checkpoint(1); err == nil {
		t.Fatalf("a checkpoint of %d schedules a chunk each", w.st.Live())
	}
	w.o.Maintain(w.now)
	if k := w.proposedKinds(); len(k) != 0 {
		t.Fatalf("proposed %v", k)
	}
	w.append(&Record{Kind: KindCancel, IDs: []uint64{w.st.Applied()}})
	w.o.Maintain(w.now + maintainRetryMs - 1)
	if k := w.proposedKinds(); len(k) != 0 {
		t.Fatalf("proposed %v before the retry", k)
	}
	w.o.Maintain(w.now + maintainRetryMs)
	if k := w.proposedKinds(); len(k) != CheckpointChunksMax {
		t.Fatalf("proposed %d records at the retry, want a checkpoint of %d chunks", len(k), CheckpointChunksMax)
	}
}

// TestMaintainSpillFailureFailsTheOffice pins Maintain's Step after a
// failed carry scan or checkpoint: a spill that fails them fails the
// state, and the office with it at once.
func TestMaintainSpillFailureFailsTheOffice(t *testing.T) {
	for _, carry := range []bool{false, true} {
		cfg := testConfig
		cfg.CheckpointEvery, cfg.CheckpointChunkEntries, cfg.CarryMax = 2, 64, 2
		st := NewState()
		sp := &failingSpill{MemSpill: NewMemSpill()}
		st.SetSpill(sp, 2)
		st.MarkLoaded()
		w := &world{t: t, st: st, o: NewOwner(cfg, st), now: 1000, dests: map[string]*destTopic{"a": newDest(7, 2, 16)}}
		w.activate(1)
		for range 8 {
			w.schedule("a", 1e9, 0)
		}
		w.settle(true)
		if carry {
			w.o.Maintain(w.now)
			w.settle(true) // a checkpoint: the next round carries
			for range 8 {
				w.schedule("a", 1e9, 0)
			}
			w.settle(true)
		}
		sp.fail = true
		w.o.Maintain(w.now)
		if w.st.Failed() == nil || w.o.Lifecycle() != Failed {
			t.Fatalf("carry %v: state failed %v, owner %v; want both failed", carry, w.st.Failed(), w.o.Lifecycle())
		}
	}
}

// TestListPageSize pins List's page bound: n below 1 or above
// ListPageMax lists ListPageMax, and more follow.
func TestListPageSize(t *testing.T) {
	st := NewState()
	for range ListPageMax + 2 {
		applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
	}
	for n, want := range map[int]int{0: ListPageMax, -1: ListPageMax, 1: 1, ListPageMax: ListPageMax, ListPageMax + 1: ListPageMax} {
		page, more, err := st.List("", ListCursor{}, n)
		if err != nil || len(page) != want || !more {
			t.Fatalf("List(%d): %d schedules, more %v, %v; want %d and more", n, len(page), more, err, want)
		}
	}
}

// TestStateCloneSharesNothing pins State.Clone's copies of the entries,
// lanes, due queues and fire logs — records applied to the clone leave
// the original as it was — and its refusal of a state with a spill.
func TestStateCloneSharesNothing(t *testing.T) {
	st := NewState()
	applyAll(t, st,
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 10}},
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 20}},
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "b", DeliverAtMs: 30}},
		Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 1, FireSeq: 1}}})
	c := st.Clone()
	applyAll(t, c,
		Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 2, FireSeq: 2}}},
		Record{Kind: KindFired, Fired: []Fired{{ID: 1}}},
		Record{Kind: KindCancel, IDs: []uint64{3}},
		Record{Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: LanePause}},
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 5}})
	if e, _ := st.Entry(1); e.Status != StatusFiring {
		t.Fatalf("schedule 1 in the original: %+v", e)
	}
	for _, id := range []uint64{2, 3} {
		if e, ok := st.Entry(id); !ok || e.Status != StatusPending {
			t.Fatalf("schedule %d in the original: %+v %v", id, e, ok)
		}
	}
	if at, _ := st.NextDue("a"); at != 20 || st.Live() != 3 || st.LastFire("a", 0) != 1 || st.Counts().Fired != 0 {
		t.Fatalf("the original: next due %d, %d live, last fire %d, counts %+v", at, st.Live(), st.LastFire("a", 0), st.Counts())
	}
	if l, _ := st.Lane("a"); l.Gate != GateOpen || l.Pending != 2 {
		t.Fatalf("the original's lane %+v", l)
	}
	if res := applyAll(t, st, Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 2, FireSeq: 2}}}); len(res[0].Skipped) != 0 {
		t.Fatalf("the original skipped an intent its clone applied: %v", res[0].Skipped)
	}
	sp := NewState()
	sp.SetSpill(NewMemSpill(), 2)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("cloned a state with a spill")
			}
		}()
		sp.Clone()
	}()
}

// TestCheckpointChunkBounds pins Checkpoint.check's bounds — exactly
// CheckpointChunksMax chunks, ckptTopicsMax topics, RecordEntriesMax
// lanes, fires and entries are taken, one more of any is not — its
// topic indexes of fires and entries, the decoder's lists of one, and
// the decoder's check of what it read.
func TestCheckpointChunkBounds(t *testing.T) {
	encodes := func(c Checkpoint) bool {
		r := Record{Kind: KindCheckpoint, Checkpoint: c}
		b, err := r.Encode()
		if err != nil {
			return false
		}
		if _, err := Decode(b); err != nil {
			t.Fatalf("encoded, not decoded: %v", err)
		}
		return true
	}
	topics := func(n int) []string { return slices.Repeat([]string{"t"}, n) }
	lanes := func(n int) []CheckpointLane { return slices.Repeat([]CheckpointLane{{Gate: GateOpen}}, n) }
	fires := func(n int) []CheckpointFire { return make([]CheckpointFire, n) }
	entries := func(n int) []CheckpointEntry { return slices.Repeat([]CheckpointEntry{{Status: StatusPending}}, n) }
	for _, tc := range []struct {
		name       string
		ok, beyond Checkpoint
	}{
		{"chunks", Checkpoint{Chunk: 0, Chunks: CheckpointChunksMax}, Checkpoint{Chunk: 0, Chunks: CheckpointChunksMax + 1}},
		{"one chunk", Checkpoint{Chunk: 0, Chunks: 1}, Checkpoint{Chunk: 1, Chunks: 1}},
		{"topics", Checkpoint{Chunks: 1, Topics: topics(ckptTopicsMax)}, Checkpoint{Chunks: 1, Topics: topics(ckptTopicsMax + 1)}},
		{"lanes", Checkpoint{Chunks: 1, Topics: topics(1), Lanes: lanes(RecordEntriesMax)}, Checkpoint{Chunks: 1, Topics: topics(1), Lanes: lanes(RecordEntriesMax + 1)}},
		{"fires", Checkpoint{Chunks: 1, Topics: topics(1), Fires: fires(RecordEntriesMax)}, Checkpoint{Chunks: 1, Topics: topics(1), Fires: fires(RecordEntriesMax + 1)}},
		{"entries", Checkpoint{Chunks: 1, Topics: topics(1), Entries: entries(RecordEntriesMax)}, Checkpoint{Chunks: 1, Topics: topics(1), Entries: entries(RecordEntriesMax + 1)}},
		{"fire topic", Checkpoint{Chunks: 1, Topics: topics(1), Fires: []CheckpointFire{{Topic: 0}}}, Checkpoint{Chunks: 1, Topics: topics(1), Fires: []CheckpointFire{{Topic: 1}}}},
		{"entry topic", Checkpoint{Chunks: 1, Topics: topics(1), Entries: []CheckpointEntry{{Topic: 0, Status: StatusPending}}}, Checkpoint{Chunks: 1, Topics: topics(1), Entries: []CheckpointEntry{{Topic: 1, Status: StatusPending}}}},
	} {
		if !encodes(tc.ok) {
			t.Fatalf("%s: refused at the bound", tc.name)
		}
		if encodes(tc.beyond) {
			t.Fatalf("%s: taken beyond the bound", tc.name)
		}
	}
	// A chunk of one topic, lane, fire and entry comes back as it was.
	one := Record{Kind: KindCheckpoint, Checkpoint: Checkpoint{Base: 9, Chunks: 1, Topics: []string{"t"},
		Lanes:   []CheckpointLane{{Gate: GatePaused, Incarnation: 3}},
		Fires:   []CheckpointFire{{Partition: 2, Last: 4}},
		Entries: []CheckpointEntry{{Status: StatusPending, ID: 5, DeliverAtMs: 6, Partition: 1, At: 5}}}}
	b, err := one.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Decode(b); err != nil || !reflect.DeepEqual(got, one) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, one)
	}
	// The lane's gate byte follows its topic index: 9 is no gate, and
	// the decoder checks what it read.
	gate := bytes.Index(b, []byte{0, 0, 0, 1, 0, 0, byte(GatePaused)}) + 6
	bad := slices.Clone(b)
	bad[gate] = 9
	if r, err := Decode(bad); err == nil {
		t.Fatalf("decoded a lane of gate 9: %+v", r)
	}
}

// TestCheckpointCountsOnlyAtItsBase pins applyCheckpoint's rules: a
// checkpoint counts only when its first chunk lands right after its base
// and the others follow it; one that counts resets SinceCheckpoint to 0
// and limits compaction below the lowest message it lists, a message at
// seq 1 included (CompactKeepsLiveMessages); one of no schedules at
// base 1 allows compaction through 1.
func TestCheckpointCountsOnlyAtItsBase(t *testing.T) {
	st := NewState()
	if _, err := st.Apply(1, nil); err != nil {
		t.Fatal(err)
	}
	recs, err := st.Checkpoint(10)
	if err != nil {
		t.Fatal(err)
	}
	applyAll(t, st, recs...)
	if st.LastCheckpoint() != 1 || st.CompactLimit() != 1 || st.SinceCheckpoint() != 0 {
		t.Fatalf("checkpoint at %d, compaction limit %d, %d since; want 1, 1, 0", st.LastCheckpoint(), st.CompactLimit(), st.SinceCheckpoint())
	}

	st = NewState()
	applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}},
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 2}})
	recs, err = st.Checkpoint(1) // two chunks
	if err != nil || len(recs) != 2 {
		t.Fatalf("%d chunks, %v", len(recs), err)
	}
	late := Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 3}}
	applyAll(t, st, late, recs[0], recs[1]) // something got in first
	if st.LastCheckpoint() != 0 {
		t.Fatalf("a checkpoint landing after another record counted: at %d", st.LastCheckpoint())
	}
	recs, _ = st.Checkpoint(10) // one chunk
	applyAll(t, st, late, recs[0])
	if st.LastCheckpoint() != 0 {
		t.Fatalf("a checkpoint of one chunk landing after another record counted: at %d", st.LastCheckpoint())
	}
	recs, _ = st.Checkpoint(1)
	applyAll(t, st, recs[0], late, recs[1]) // a record between its chunks
	if st.LastCheckpoint() != 0 {
		t.Fatalf("a checkpoint with a record between its chunks counted: at %d", st.LastCheckpoint())
	}
	recs, _ = st.Checkpoint(2)
	applyAll(t, st, recs...)
	if st.LastCheckpoint() == 0 || st.SinceCheckpoint() != 0 || st.CompactLimit() != 0 {
		t.Fatalf("checkpoint at %d, %d since, compaction limit %d: want one, 0 since, and schedule 1's message kept",
			st.LastCheckpoint(), st.SinceCheckpoint(), st.CompactLimit())
	}
	if recs, _ := st.Checkpoint(0); len(recs) != st.Live() {
		t.Fatalf("%d chunks of %d schedules for chunkEntries 0, want one a schedule", len(recs), st.Live())
	}
}

// TestRestoreRefusesAContradictingCheckpoint pins loadEntries' checks:
// a checkpoint listing a schedule of a lane it does not list, one twice,
// or a firing one without its fire log, or two under one fire
// sequence, fails the restoring state.
func TestRestoreRefusesAContradictingCheckpoint(t *testing.T) {
	firing := func(id, seq uint64) CheckpointEntry {
		return CheckpointEntry{Status: StatusFiring, ID: id, At: id, FireSeq: seq, Epoch: 1, Incarnation: 1}
	}
	pending := func(id uint64) CheckpointEntry { return CheckpointEntry{Status: StatusPending, ID: id, At: id} }
	lane := []CheckpointLane{{Gate: GateOpen, Incarnation: 1}}
	fire := []CheckpointFire{{Last: 9}}
	for name, c := range map[string]Checkpoint{
		"no lane":         {Entries: []CheckpointEntry{pending(1)}},
		"twice":           {Lanes: lane, Entries: []CheckpointEntry{pending(1), pending(1)}},
		"no fire log":     {Lanes: lane, Entries: []CheckpointEntry{firing(1, 1)}},
		"one fire seq":    {Lanes: lane, Fires: fire, Entries: []CheckpointEntry{firing(1, 1), firing(2, 1)}},
		"firing and fine": {Lanes: lane, Fires: fire, Entries: []CheckpointEntry{firing(1, 1), firing(2, 2), pending(3)}},
	} {
		st := NewState()
		st.Restore(11)
		c.Base, c.Chunks, c.Topics = 10, 1, []string{"a"}
		if _, err := st.Apply(11, &Record{Kind: KindCheckpoint, Checkpoint: c}); (err == nil) != (name == "firing and fine") {
			t.Fatalf("%s: %v", name, err)
		}
		if name == "firing and fine" {
			// Its firing schedules are the lane's, each under its sequence.
			if fs := st.firing("a"); len(fs) != 2 || fs[0].ID != 1 || fs[1].ID != 2 {
				t.Fatalf("firing after the restore: %+v", fs)
			}
		}
	}
}

// TestCarryOfNothingLive pins applyCarry's spill condition: a carry of
// a schedule of no lane is skipped, with a spill or without.
func TestCarryOfNothingLive(t *testing.T) {
	for _, spill := range []bool{false, true} {
		st := NewState()
		if spill {
			st.SetSpill(NewMemSpill(), 2)
		}
		res := applyAll(t, st, Record{Kind: KindCarry, Carry: Carry{ID: 99, Topic: "x", From: 1}})
		if !slices.Equal(res[0].Skipped, []uint64{99}) {
			t.Fatalf("spill %v: a carry of nothing: %+v", spill, res[0])
		}
	}
}

// TestCheckpointOfTheMostLanesAndFireLogs pins State.Checkpoint's
// bounds: ckptTopicsMax lanes fit a checkpoint and one more does not;
// RecordEntriesMax fire logs fit and one more does not.
func TestCheckpointOfTheMostLanesAndFireLogs(t *testing.T) {
	st := NewState()
	for i := range ckptTopicsMax {
		applyAll(t, st, Record{Kind: KindLane, Lane: LaneCommand{Topic: fmt.Sprint(i), Op: LanePause}})
	}
	if _, err := st.Checkpoint(10); err != nil {
		t.Fatalf("%d lanes: %v", len(st.Lanes()), err)
	}
	applyAll(t, st, Record{Kind: KindLane, Lane: LaneCommand{Topic: "x", Op: LanePause}})
	if _, err := st.Checkpoint(10); err == nil {
		t.Fatalf("a checkpoint of %d lanes", len(st.Lanes()))
	}

	st = NewState()
	applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
	// An intent skipped for its fire sequence 0 still opens its
	// destination partition's fire log.
	for p := range uint32(RecordEntriesMax) {
		applyAll(t, st, Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 1, Partition: p}}})
	}
	if _, err := st.Checkpoint(10); err != nil {
		t.Fatalf("%d fire logs: %v", RecordEntriesMax, err)
	}
	applyAll(t, st, Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 1, Partition: RecordEntriesMax}}})
	if _, err := st.Checkpoint(10); err == nil {
		t.Fatalf("a checkpoint of %d fire logs", RecordEntriesMax+1)
	}
}

// spilledState is a state with a window of 2 (4 resident at most) and
// its spill, holding n schedules of lane a due at 1..n.
func spilledState(t *testing.T, n int) (*State, *failingSpill) {
	st := NewState()
	sp := &failingSpill{MemSpill: NewMemSpill()}
	st.SetSpill(sp, 2)
	for i := range n {
		applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: int64(i + 1)}})
	}
	return st, sp
}

// TestSpillWindowExact pins the window's bounds: twice the window
// resident before anything spills (then the window is kept), and a
// refill only once fewer than half the window are resident.
func TestSpillWindowExact(t *testing.T) {
	st := NewState()
	st.SetSpill(NewMemSpill(), 4)
	for i := range 9 {
		applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: int64(i + 1)}})
		if want := map[bool]int{true: 0, false: 5}[i < 8]; st.Spilled() != want {
			t.Fatalf("%d schedules, window 4: %d spilled, want %d", i+1, st.Spilled(), want)
		}
	}
	applyAll(t, st, Record{Kind: KindCancel, IDs: []uint64{1, 2}}) // 2 resident: half the window
	if st.Spilled() != 5 {
		t.Fatalf("%d spilled with half the window resident, want 5", st.Spilled())
	}
	applyAll(t, st, Record{Kind: KindCancel, IDs: []uint64{3}}) // below half: refilled to the window
	if st.Spilled() != 2 || len(st.Entries(0)) != 4 {
		t.Fatalf("%d spilled, %d resident after the refill; want 2 and 4", st.Spilled(), len(st.Entries(0)))
	}
}

// TestSpillAnswersChecked pins the State's checks of its spill: a
// failure to put (trim), pop (refill), delete (unspill) or scan (List)
// fails the state, and so does a pop that returns fewer than asked and
// a delete that names a lane that spilled nothing or another schedule;
// a cancel of the one schedule spilled takes it from the spill; a
// listing over a spill that seeks loosely skips what lies before its
// cursor; a page of exactly what is left says no more follow.
func TestSpillAnswersChecked(t *testing.T) {
	st, sp := spilledState(t, 4)
	sp.fail = true
	st.Apply(st.Applied()+1, &Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 9}})
	if !errors.Is(st.Failed(), ErrSpill) {
		t.Fatalf("a failing put in a trim: state failed %v", st.Failed())
	}
	for name, f := range map[string]func(*failingSpill){
		"pop fails": func(sp *failingSpill) { sp.fail = true },
		"pop short": func(sp *failingSpill) { sp.short = true },
	} {
		st, sp := spilledState(t, 5) // 2 resident, 3 spilled
		f(sp)
		st.Apply(st.Applied()+1, &Record{Kind: KindCancel, IDs: []uint64{1, 2}})
		if !errors.Is(st.Failed(), ErrSpill) {
			t.Fatalf("%s in a refill: state failed %v", name, st.Failed())
		}
	}
	for name, f := range map[string]func(*failingSpill){
		"delete fails":        func(sp *failingSpill) { sp.fail = true },
		"delete of no lane":   func(sp *failingSpill) { sp.lie = func(_ string, k Key) (string, Key) { return "zz", k } },
		"delete of lane b":    func(sp *failingSpill) { sp.lie = func(_ string, k Key) (string, Key) { return "b", k } },
		"delete of another":   func(sp *failingSpill) { sp.lie = func(l string, k Key) (string, Key) { k.ID++; return l, k } },
		"scan fails (listed)": func(sp *failingSpill) { sp.fail = true },
	} {
		st, sp := spilledState(t, 5)
		applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "b", DeliverAtMs: 1}})
		f(sp)
		var err error
		if name == "scan fails (listed)" {
			_, _, err = st.List("", ListCursor{}, 10)
		} else {
			_, err = st.Apply(st.Applied()+1, &Record{Kind: KindCancel, IDs: []uint64{5}})
		}
		if err == nil || !errors.Is(st.Failed(), ErrSpill) {
			t.Fatalf("%s: %v, state failed %v", name, err, st.Failed())
		}
	}

	st, _ = spilledState(t, 5) // 3, 4 and 5 spilled
	applyAll(t, st, Record{Kind: KindCancel, IDs: []uint64{4, 5}})
	if st.Spilled() != 1 {
		t.Fatalf("%d spilled, want 1", st.Spilled())
	}
	if res := applyAll(t, st, Record{Kind: KindCancel, IDs: []uint64{3}}); len(res[0].Skipped) != 0 || st.Live() != 2 {
		t.Fatalf("cancel of the one schedule spilled: %+v, %d live", res[0], st.Live())
	}

	st, sp = spilledState(t, 8)
	sp.loose = true
	page, more, err := st.List("a", ListCursor{DeliverAtMs: 6, ID: 6}, 10)
	if err != nil || more || len(page) != 2 || page[0].ID != 7 || page[1].ID != 8 {
		t.Fatalf("listing after schedule 6 over a loose spill: %+v, more %v, %v", page, more, err)
	}
	page, more, err = st.List("a", ListCursor{DeliverAtMs: 1, ID: 1}, 7)
	if err != nil || more || len(page) != 7 || page[0].ID != 2 {
		t.Fatalf("listing the 7 after schedule 1 by 7: %d (first %+v), more %v, %v", len(page), page[0], more, err)
	}
	if page, more, err := st.List("nosuch", ListCursor{}, 10); err != nil || more || len(page) != 0 {
		t.Fatalf("listing a lane the state does not hold: %+v, %v, %v", page, more, err)
	}
}

// TestSpillFailuresOfDropAndMove pins the failures of a spill's Drop
// (a lane retired, a checkpoint loaded over a void one) and Move (a
// carry of a spilled schedule): each fails the state with ErrSpill. A
// bug the sweep found: a Drop failing in loadHead was overwritten by
// loadEntries' "contradicts it" (the void checkpoint's schedules were
// still there), so the shell, which rebuilds a state only on ErrSpill,
// left the shard FAILED for a disk error.
func TestSpillFailuresOfDropAndMove(t *testing.T) {
	st, sp := spilledState(t, 6)
	sp.failDrop = true
	st.Apply(st.Applied()+1, &Record{Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: LaneRetire}})
	if !errors.Is(st.Failed(), ErrSpill) {
		t.Fatalf("a failing drop at a retire: state failed %v", st.Failed())
	}

	st, sp = spilledState(t, 6) // 5 and 6 spilled
	sp.fail = true
	st.Apply(st.Applied()+1, &Record{Kind: KindCarry, Carry: Carry{ID: 6, Topic: "a", DeliverAtMs: 6, From: 6}})
	if !errors.Is(st.Failed(), ErrSpill) {
		t.Fatalf("a failing move at a carry: state failed %v", st.Failed())
	}

	// A restoring state loads a checkpoint's first chunk (spilling its
	// schedules), which a record then voids; loading the next one drops
	// the spill of the void one.
	st = NewState()
	sp = &failingSpill{MemSpill: NewMemSpill()}
	st.SetSpill(sp, 2)
	st.Restore(11)
	var es []CheckpointEntry
	for id := range uint64(6) {
		es = append(es, CheckpointEntry{Status: StatusPending, ID: id + 1, DeliverAtMs: int64(id), At: id + 1})
	}
	head := Checkpoint{Base: 10, Chunks: 2, Topics: []string{"a"}, Lanes: []CheckpointLane{{Gate: GateOpen}}, Entries: es}
	if _, err := st.Apply(11, &Record{Kind: KindCheckpoint, Checkpoint: head}); err != nil || st.Spilled() == 0 {
		t.Fatalf("the first chunk: %v, %d spilled", err, st.Spilled())
	}
	if _, err := st.Apply(12, nil); err != nil {
		t.Fatal(err)
	}
	sp.failDrop = true
	head.Base, head.Chunks, head.Entries = 12, 1, es[:2] // nothing to spill
	st.Apply(13, &Record{Kind: KindCheckpoint, Checkpoint: head})
	if !errors.Is(st.Failed(), ErrSpill) {
		t.Fatalf("a failing drop at a checkpoint's load: state failed %v", st.Failed())
	}
}

// TestSkippedIntentLeavesTheQueueWhole pins applyIntent's re-admission
// of a skipped schedule only when it came from the spill: one skipped at
// the front of its lane's due queue stays there once, and once it fires
// the lane has nothing due.
func TestSkippedIntentLeavesTheQueueWhole(t *testing.T) {
	st := NewState()
	applyAll(t, st,
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}},
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 2}},
		Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 1, FireSeq: 1}}})
	if res := applyAll(t, st, Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 2, FireSeq: 1}}}); len(res[0].Skipped) != 1 {
		t.Fatalf("an intent reusing fire sequence 1: %+v", res[0])
	}
	applyAll(t, st, Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 2, FireSeq: 2}}})
	if at, ok := st.NextDue("a"); ok {
		t.Fatalf("lane a still has a schedule due at %d, with both firing", at)
	}
}

// TestDropStepsOverARepairsGap pins State.Drop: the cursor moves over the
// dropped seqs (they count since the checkpoint), a checkpoint they cut
// completes nothing, and a drop out of order is refused.
func TestDropStepsOverARepairsGap(t *testing.T) {
	st := NewState()
	applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}},
		Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 2}})
	recs, err := st.Checkpoint(1) // two chunks at 3 and 4
	if err != nil || len(recs) != 2 {
		t.Fatalf("%d chunks, %v", len(recs), err)
	}
	applyAll(t, st, recs[0])
	if err := st.Drop(4, 5); err != nil { // the second chunk, and one more
		t.Fatal(err)
	}
	if st.Applied() != 5 || st.Live() != 2 || st.SinceCheckpoint() != 5 {
		t.Fatalf("after the drop: applied %d, %d live, %d since the checkpoint; want 5, 2, 5", st.Applied(), st.Live(), st.SinceCheckpoint())
	}
	applyAll(t, st, recs[1]) // the cut checkpoint's last chunk, late: it completes nothing
	if st.LastCheckpoint() != 0 {
		t.Fatalf("a checkpoint a drop cut counted: at %d", st.LastCheckpoint())
	}
	for _, d := range [][2]uint64{{6, 6}, {8, 9}, {8, 7}} {
		if err := st.Drop(d[0], d[1]); err == nil || st.Applied() != 6 {
			t.Fatalf("Drop(%d, %d) after 6: %v, applied %d", d[0], d[1], err, st.Applied())
		}
	}
}
