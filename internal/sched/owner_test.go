package sched

import (
	"errors"
	"slices"
	"testing"
)

func TestFiresExactlyOnceWhenDue(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	early := w.schedule("a", 1100, 0)
	late := w.schedule("a", 1300, 1)
	w.settle(true)
	w.expectDelivered("a") // nothing is due at 1000

	w.at(1099)
	w.settle(true)
	w.expectDelivered("a")
	w.at(1100)
	w.settle(true)
	w.expectDelivered("a", early)
	w.at(1500)
	w.settle(true)
	w.expectDelivered("a", early, late)
	if c := w.st.Counts(); c.Fired != 2 || w.st.Live() != 0 {
		t.Fatalf("counts %+v, %d live; want 2 fired, none live", c, w.st.Live())
	}
	if l, _ := w.st.Lane("a"); l.Pending != 0 || l.Gate != GateOpen {
		t.Fatalf("lane %+v", l)
	}
}

// The NeverEarly guard is what holds a schedule back: deleted
// (ClaimsBeforeDue), the owner claims and publishes it at once.
func TestClaimsBeforeDueFiresEarly(t *testing.T) {
	for _, mut := range []bool{false, true} {
		w := activeWorld(t, Mutations{ClaimsBeforeDue: mut})
		w.schedule("a", 1100, 0)
		w.settle(true)
		if early := len(w.published) > 0; early != mut {
			t.Fatalf("ClaimsBeforeDue %v: published at 1000 a schedule due at 1100: %v", mut, early)
		}
	}
}

func TestClockJumpingBackFiresNothingEarly(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	w.at(2000)
	id := w.schedule("a", 2500, 0)
	w.at(1200) // the clock jumps back
	w.settle(true)
	w.at(2499)
	w.settle(true)
	w.expectDelivered("a")
	w.at(2500)
	w.settle(true)
	w.expectDelivered("a", id)
}

func TestLifecycleActiveOnlyWithBothGatesAfterTheBarrier(t *testing.T) {
	st := NewState()
	o := NewOwner(testConfig, st)
	if o.Lifecycle() != Unassigned {
		t.Fatal(o.Lifecycle())
	}
	a := Authority{Assigned: true, Leader: true, Epoch: 3, GuardUntilMs: 5000, Barrier: 2}
	o.SetAuthority(1000, a)
	if o.Lifecycle() != Restoring {
		t.Fatalf("%v before the state is loaded, want RESTORING", o.Lifecycle())
	}
	st.MarkLoaded()
	o.Step(1000)
	if o.Lifecycle() != CatchingUp {
		t.Fatalf("%v before the barrier is applied, want CATCHING_UP", o.Lifecycle())
	}
	if err := o.Admit(1000, Schedule{Topic: "a", DeliverAtMs: 1}); err == nil {
		t.Fatal("admitted while catching up")
	}
	st.Apply(1, nil)
	st.Apply(2, nil)
	o.Step(1000)
	if o.Lifecycle() != Active {
		t.Fatalf("%v after the barrier, want ACTIVE", o.Lifecycle())
	}
	o.Step(5000) // the lease guard closes
	if o.Lifecycle() != Fenced {
		t.Fatalf("%v after the guard closed, want FENCED", o.Lifecycle())
	}
	a.GuardUntilMs = 9000
	o.SetAuthority(5001, a)
	if o.Lifecycle() != Active {
		t.Fatalf("%v with both gates again, want ACTIVE", o.Lifecycle())
	}
	a.Assigned = false
	o.SetAuthority(5002, a)
	if o.Lifecycle() != Fenced {
		t.Fatalf("%v without the assignment, want FENCED", o.Lifecycle())
	}
	a.Assigned, a.Epoch, a.Barrier = true, 4, 3
	o.SetAuthority(5003, a)
	if o.Lifecycle() != CatchingUp || o.Epoch() != 4 {
		t.Fatalf("%v in epoch %d, want CATCHING_UP in 4", o.Lifecycle(), o.Epoch())
	}
	st.failed = errShort
	o.Step(5004)
	if o.Lifecycle() != Failed {
		t.Fatalf("%v after an integrity failure, want FAILED", o.Lifecycle())
	}
	a.Epoch = 5
	o.SetAuthority(5005, a)
	if o.Lifecycle() != Failed {
		t.Fatal("FAILED came back by itself")
	}
}

// An owner that lost a gate publishes nothing more, and neither claims
// nor resolves (NoPublishWithoutBothGates). Each mutation that keeps it
// going must break this.
func TestNoPublishWithoutBothGates(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     Mutations
		lose    func(w *world)
		violate bool
	}{
		{name: "guard closes", lose: closeGuard},
		{name: "guard closes, PublishWithoutLease", mut: Mutations{PublishWithoutLease: true}, lose: closeGuard, violate: true},
		{name: "leadership lost", lose: func(w *world) { w.auth.Leader = false; w.o.SetAuthority(w.now, w.auth) }},
		{name: "leadership lost, FencedStillFires", mut: Mutations{FencedStillFires: true}, lose: func(w *world) { w.auth.Leader = false; w.o.SetAuthority(w.now, w.auth) }, violate: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := activeWorld(t, tc.mut)
			w.schedule("a", 1100, 0)
			w.settle(true)
			tc.lose(w)
			w.settle(true)
			before := len(w.published)
			w.at(w.now + 200)
			w.settle(true)
			if got := len(w.published) > before; got != tc.violate {
				t.Fatalf("published after losing a gate: %v, want %v (lifecycle %v)", got, tc.violate, w.o.Lifecycle())
			}
		})
	}
}

// closeGuard lets the owner's lease guard close.
func closeGuard(w *world) {
	w.auth.GuardUntilMs = w.now + 50
	w.o.SetAuthority(w.now, w.auth)
	w.at(w.now + 50)
}

// A publish waits for its intent to commit: a crash between the claim
// and the commit leaves nothing published, and a later owner claims the
// schedule again. PublishBeforeIntent publishes under a fire sequence
// that never committed: the later owner gives that sequence to another
// schedule, which the destination drops as a retry, and publishes the
// first a second time.
func TestPublishOnlyAfterTheIntentCommits(t *testing.T) {
	for _, mut := range []bool{false, true} {
		cfg := testConfig
		cfg.Mutations.PublishBeforeIntent = mut
		w := newWorld(t, cfg)
		w.activate(1)
		id := w.schedule("a", 1000, 0)
		w.settle(false) // the intent is proposed, not committed
		if got := len(w.published) > 0; got != mut {
			t.Fatalf("mutation %v: published before the intent committed: %v", mut, got)
		}
		// The owner crashes; the intent never commits; another takes over.
		w.queue = nil
		w.o = NewOwner(cfg, w.st)
		// An earlier schedule appended since is claimed first.
		w.append(&Record{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: 1, Topic: "a", Incarnation: 7}})
		first := w.st.Applied()
		w.activate(2)
		w.settle(true)
		got := w.delivered("a")
		if ok := got[id] == 1 && got[first] == 1; ok == mut {
			t.Fatalf("mutation %v: delivered %v (ids %d, %d)", mut, got, first, id)
		}
	}
}

// A new owner publishes the intents an earlier owner left unresolved;
// the destination deduplicates the retry of one that landed, and the
// shard records it FIRED at the original seq.
func TestNewOwnerRepublishesUnresolvedIntents(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	id := w.schedule("a", 1000, 1)
	w.hold = true
	w.settle(true) // intent committed, publish in flight
	if len(w.inFlight) != 1 {
		t.Fatalf("%d publishes in flight, want 1", len(w.inFlight))
	}
	p := w.inFlight[0]
	w.deliver(p) // it lands, but the FIRED proposal is lost with the owner
	w.o.TakeEffects()
	w.inFlight, w.hold, w.queue = nil, false, nil

	w.o = NewOwner(testConfig, w.st)
	w.activate(2)
	w.settle(true)
	w.expectDelivered("a", id)
	if c := w.st.Counts(); c.Fired != 1 || w.st.Live() != 0 {
		t.Fatalf("counts %+v, %d live", c, w.st.Live())
	}
	if n := len(w.published); n != 2 {
		t.Fatalf("%d publishes, want the first and the new owner's retry", n)
	}
}

// When the destination can no longer prove a retry's outcome the
// schedule is resolved UNKNOWN, not published again.
func TestUnprovableOutcomeIsRecordedUnknown(t *testing.T) {
	w := newWorld(t, testConfig)
	w.dests["a"] = newDest(7, 1, 1) // a dedup window of one sequence
	w.activate(1)
	first := w.schedule("a", 1000, 0)
	w.hold = true
	w.settle(true)
	w.deliver(w.inFlight[0]) // it lands; the FIRED is lost with the owner
	w.o.TakeEffects()
	w.inFlight, w.hold, w.queue = nil, false, nil
	// Another writer under the identity moves the window past sequence 1
	// (in the real system: the lane's window check keeps the scheduler
	// itself from doing that; eviction or retention can).
	dp := w.dests["a"].parts[0]
	dp.producers.Record(producerID("a", 0), 5, 99, 1)
	w.o = NewOwner(testConfig, w.st)
	w.activate(2)
	w.settle(true)
	if c := w.st.Counts(); c.Unknown != 1 || c.Fired != 0 {
		t.Fatalf("counts %+v, want one unknown", c)
	}
	if _, live := w.st.Entry(first); live {
		t.Fatal("the unprovable schedule is still live")
	}
	w.expectDelivered("a", first)
}

// A lane whose destination refuses writes is BLOCKED; another lane's due
// schedules fire on time and intake goes on (BlockedLaneIsolated,
// IntakeNeverBlocked).
func TestBlockedLaneIsolated(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	w.dests["a"].writable = false
	a1 := w.schedule("a", 1000, 0)
	b1 := w.schedule("b", 1000, 0)
	w.settle(true)
	w.expectDelivered("b", b1)
	w.expectDelivered("a")
	if r := w.o.LaneReadiness("a"); r != Blocked {
		t.Fatalf("lane a %v, want BLOCKED", r)
	}
	a2 := w.schedule("a", 1000, 1) // intake into the blocked lane
	b2 := w.schedule("b", 1000, 0)
	w.settle(true)
	w.expectDelivered("b", b1, b2)
	probes := w.probes
	w.settle(true)
	w.at(w.now + 10)
	w.settle(true)
	if w.probes != probes {
		t.Fatalf("probed %d times within ProbeEveryMs", w.probes-probes)
	}
	w.dests["a"].writable = true
	w.at(w.now + testConfig.ProbeEveryMs)
	w.settle(true)
	w.expectDelivered("a", a1, a2)
}

// Pause holds a lane's due schedules until resume; close refuses new
// ones; retire cancels what is pending. Recovery of the destination
// never clears a pause.
// The gate is what holds a paused lane: ignored (PauseIgnored), the owner
// publishes a due schedule under a standing pause.
func TestPauseIgnoredPublishesWhilePaused(t *testing.T) {
	for _, mut := range []bool{false, true} {
		w := activeWorld(t, Mutations{PauseIgnored: mut})
		w.schedule("a", 1100, 0)
		if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LanePause}); err != nil {
			t.Fatal(err)
		}
		w.settle(true)
		w.at(1200)
		w.answerProbe("a")
		w.settle(true)
		if published := len(w.published) > 0; published != mut {
			t.Fatalf("PauseIgnored %v: published on a paused lane: %v", mut, published)
		}
	}
}

// GateClosesAtItsAnswer: a pause applied in the same pass as the intent
// that made a schedule's publish due — the shell answers the pause before
// it takes the effects — holds that publish too; it goes out after the
// resume, once. Without the re-check at take (GateNotRecheckedAtTake) it
// is sent after the pause was answered.
func TestPauseAppliedWithTheIntentHoldsItsPublish(t *testing.T) {
	for _, mut := range []bool{false, true} {
		w := activeWorld(t, Mutations{GateNotRecheckedAtTake: mut})
		id := w.schedule("a", 1100, 0)
		w.at(1100)
		w.settle(false) // the intent proposed, not committed
		if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LanePause}); err != nil {
			t.Fatal(err)
		}
		w.settle(false)
		if len(w.queue) != 2 || w.queue[0].Record.Kind != KindIntent || w.queue[1].Record.Kind != KindLane {
			t.Fatalf("proposed %+v, want the intent then the pause", w.queue)
		}
		w.commitAll() // both applied in one pass, then the effects taken
		w.settle(true)
		if sent := len(w.published) > 0; sent != mut {
			t.Fatalf("GateNotRecheckedAtTake %v: published after the pause applied: %v", mut, sent)
		}
		if mut {
			continue
		}
		if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneResume}); err != nil {
			t.Fatal(err)
		}
		w.settle(true)
		w.expectDelivered("a", id)
	}
}

// A RETIRE of a RETIRED lane is answered OK — the operator's retry of a
// retire whose answer was lost; every other command there is refused.
// With RetireRetriedRefused the retry fails, as it did before: the
// cluster simulator's operator asked it again for good (Liveness).
func TestRetriedRetireIsAnsweredOK(t *testing.T) {
	for _, mut := range []bool{false, true} {
		w := activeWorld(t, Mutations{})
		w.st.Mutations.RetireRetriedRefused = mut
		w.schedule("a", 5000, 0)
		retire := &Record{Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: LaneRetire}}
		if res := w.append(retire); res.Err != nil {
			t.Fatal(res.Err)
		}
		if res := w.append(retire); (res.Err == nil) == mut {
			t.Fatalf("RetireRetriedRefused %v: the retried retire answered %v", mut, res.Err)
		}
		if res := w.append(&Record{Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: LaneResume}}); res.Err == nil {
			t.Fatal("a RETIRED lane resumed")
		}
		if l, _ := w.st.Lane("a"); l.Gate != GateRetired {
			t.Fatalf("lane %+v, want RETIRED", l)
		}
	}
}

// A schedule admitted while its lane was open, whose record commits
// after a CLOSE or RETIRE of the lane, is refused as it applies
// (ClosedAdmitsNone) and leaves nothing live; with ClosedLaneAdmits it
// is taken — in a retired lane, never to be published.
func TestScheduleAppliedAfterACloseIsRefused(t *testing.T) {
	for _, op := range []LaneOp{LaneClose, LaneRetire} {
		for _, mut := range []bool{false, true} {
			w := activeWorld(t, Mutations{})
			w.st.Mutations.ClosedLaneAdmits = mut
			if err := w.o.Admit(w.now, Schedule{DeliverAtMs: 1, Topic: "a"}); err != nil {
				t.Fatal(err)
			}
			if res := w.append(&Record{Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: op}}); res.Err != nil {
				t.Fatal(res.Err)
			}
			res := w.append(&Record{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: 1, Topic: "a"}})
			if refused := res.Err != nil && w.st.Live() == 0; refused == mut {
				t.Fatalf("%v, ClosedLaneAdmits %v: the schedule applied after it answered %v, %d live", op, mut, res.Err, w.st.Live())
			}
		}
	}
}

// RefusalOutlivesItsAnswer: a lane remembers the spans of seqs in which
// it refused schedules (CLOSED or RETIRED; its last RefusingSpansMax),
// and its checkpoints carry them, so a retry of a schedule refused as it
// applied is answered with the refusal long after (Refused).
func TestRefusedRemembersTheLanesClosedSpans(t *testing.T) {
	st := NewState()
	lane := func(op LaneOp) Record { return Record{Kind: KindLane, Lane: LaneCommand{Topic: "a", Op: op}} }
	sc := Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}}
	res := applyAll(t, st, sc, lane(LaneClose), sc, lane(LanePause), lane(LaneResume), sc, lane(LaneRetire), sc)
	if res[2].Err == nil || res[5].Err != nil || res[7].Err == nil {
		t.Fatalf("results %+v", res)
	}
	want := map[uint64]bool{1: false, 2: false, 3: true, 4: true, 5: false, 6: false, 7: false, 8: true, 99: true}
	check := func(st *State, what string) {
		t.Helper()
		for seq, refused := range want {
			if err := st.Refused("a", seq); (err != nil) != refused || refused && !errors.Is(err, ErrLaneAdmitsNone) {
				t.Fatalf("%s: Refused(a, %d) = %v, want refused %v", what, seq, err, refused)
			}
		}
		if err := st.Refused("b", 3); err != nil {
			t.Fatalf("%s: a lane never closed answered %v", what, err)
		}
	}
	check(st, "applied")
	recs, err := st.Checkpoint(10)
	if err != nil {
		t.Fatal(err)
	}
	restored := NewState()
	restored.Restore(st.Applied() + 1)
	applyAll(t, restored, recs...)
	check(restored, "restored from a checkpoint")

	// A lane loaded CLOSED from a checkpoint made before spans were kept
	// knows none; its resume closes nothing.
	st = NewState()
	applyAll(t, st, sc, lane(LaneClose), sc)
	if recs, err = st.Checkpoint(10); err != nil {
		t.Fatal(err)
	}
	recs[0].Checkpoint.Refusing = nil
	restored = NewState()
	restored.Restore(st.Applied() + 1)
	applyAll(t, restored, recs...)
	applyAll(t, restored, lane(LaneResume), lane(LaneClose))
	if l, _ := restored.Lane("a"); restored.Refused("a", 3) != nil || !slices.Equal(l.Refusing(), []SeqSpan{{From: 6}}) {
		t.Fatalf("a lane restored closed without spans, resumed and closed: %+v", l.Refusing())
	}

	// Only the last RefusingSpansMax spans are kept; below the oldest, a
	// schedule that is not live has an outcome no longer known
	// (RefusalNeverForgottenAsOK): never nil, which would answer a
	// refused one OK.
	st = NewState()
	applyAll(t, st, Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1 << 40}}) // seq 1: live
	for range RefusingSpansMax + 1 {
		applyAll(t, st, lane(LaneClose), sc, lane(LaneResume))
	}
	for seq, want := range map[uint64]error{1: nil, 3: ErrRefusalForgotten, 5: ErrRefusalForgotten, 6: ErrLaneAdmitsNone, 3*RefusingSpansMax + 3: ErrLaneAdmitsNone} {
		if err := st.Refused("a", seq); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("after %d spans: Refused(a, %d) = %v, want %v", RefusingSpansMax+1, seq, err, want)
		}
	}

	// A live schedule the lane spilled is live too: its retry is a
	// duplicate, not an outcome no longer known.
	st = NewState()
	spill := NewMemSpill()
	st.SetSpill(spill, 2)
	far := func(ms int64) Record {
		return Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: ms}}
	}
	applyAll(t, st, far(1<<40), far(1<<41), far(1<<42), far(1<<43), far(1<<44), far(1<<45)) // seqs 1-6
	for range RefusingSpansMax + 1 {
		applyAll(t, st, lane(LaneClose), sc, lane(LaneResume))
	}
	if spill.Len() == 0 {
		t.Fatal("the window spilled nothing")
	}
	for seq := uint64(1); seq <= 6; seq++ {
		if err := st.Refused("a", seq); err != nil {
			t.Fatalf("live schedule %d (%d spilled): Refused = %v, want nil", seq, spill.Len(), err)
		}
	}
	if err := st.Refused("a", 8); !errors.Is(err, ErrRefusalForgotten) {
		t.Fatalf("refused schedule 8 below the oldest span: Refused = %v, want ErrRefusalForgotten", err)
	}
}

func TestLaneGates(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	a1 := w.schedule("a", 1100, 0)
	manage := func(op LaneOp, inc uint64) {
		t.Helper()
		if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: op, Incarnation: inc}); err != nil {
			t.Fatal(err)
		}
		w.settle(true)
	}
	manage(LanePause, 0)
	w.at(1200)
	w.settle(true)
	w.expectDelivered("a")
	w.answerProbe("a") // fresh evidence: READY, still paused
	w.settle(true)
	w.expectDelivered("a")
	manage(LaneResume, 0)
	w.expectDelivered("a", a1)

	manage(LaneClose, 0)
	if err := w.o.Admit(w.now, Schedule{DeliverAtMs: 1, Topic: "a"}); err == nil {
		t.Fatal("a CLOSED lane admitted a schedule")
	}
	// A schedule appended anyway (admitted before the close applied) is
	// refused when applied.
	if res := w.append(&Record{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: 1, Topic: "a", Incarnation: 7}}); res.Err == nil {
		t.Fatal("a CLOSED lane took a schedule")
	}
	manage(LaneResume, 0)
	a2 := w.schedule("a", 5000, 0)
	manage(LaneRetire, 0)
	if _, live := w.st.Entry(a2); live {
		t.Fatal("retire left a pending schedule")
	}
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneBreak}); err == nil {
		t.Fatal("an operator proposed an ordering break")
	}
	w.at(6000)
	w.settle(true)
	w.expectDelivered("a", a1)
	if c := w.st.Counts(); c.Cancelled != 1 || c.Rejected != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// A destination deleted and re-created is another incarnation: the lane
// breaks its ordering and fires nothing into it until an operator
// resumes, pinning the new one (LaneFiresOnlyIntoItsIncarnation).
func TestRecreatedDestinationBreaksTheLane(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	w.schedule("a", 1000, 0)
	w.settle(true)
	id := w.schedule("a", 2000, 1) // admitted for incarnation 7
	w.dests["a"] = newDest(8, 2, 16)
	w.at(1000 + 10_000) // the certificate expires: a new probe sees incarnation 8
	w.settle(true)
	if l, _ := w.st.Lane("a"); l.Gate != GateOrderingBroken {
		t.Fatalf("lane %+v, want ORDERING_BROKEN", l)
	}
	w.expectDelivered("a")
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneResume, Incarnation: 8}); err != nil {
		t.Fatal(err)
	}
	w.settle(true)
	w.at(w.now + testConfig.ProbeEveryMs)
	w.settle(true)
	w.expectDelivered("a", id)
}

// A READY certificate is checked before each claim and publish: once it
// expired nothing goes out until fresh evidence; ReadyNotRevalidated
// publishes into a re-created destination on a stale certificate.
func TestReadyIsRevalidated(t *testing.T) {
	for _, mut := range []bool{false, true} {
		cfg := testConfig
		cfg.Mutations.ReadyNotRevalidated = mut
		w := newWorld(t, cfg)
		w.activate(1)
		w.schedule("a", 1000, 0)
		w.settle(true) // READY until 11000
		// Admitted before the destination is declared again (one admitted
		// after would break the lane as it applies).
		w.schedule("a", 20_000, 0)
		w.dests["a"] = newDest(8, 2, 16)
		w.at(20_000)
		effects := w.o.TakeEffects()
		var pubs, probes int // claims and publishes, probes
		for _, e := range effects {
			if e.Publish != nil || e.Propose != nil && e.Propose.Record.Kind == KindIntent {
				pubs++
			}
			if e.Probe != "" {
				probes++
			}
		}
		if mut && pubs == 0 || !mut && (pubs != 0 || probes != 1) {
			t.Fatalf("mutation %v: %d claims and publishes, %d probes on an expired certificate", mut, pubs, probes)
		}
	}
}

// Fire sequences stay within FireWindow of the lowest unresolved one, so
// the destination can always prove a retry (FireWithinDedupWindow).
func TestFireWindowBoundsSequencesInFlight(t *testing.T) {
	cfg := testConfig
	cfg.FireWindow = 3
	w := newWorld(t, cfg)
	w.activate(1)
	for range 7 {
		w.schedule("b", 1000, 0)
	}
	w.hold = true
	w.settle(true)
	if n := len(w.inFlight); n != 3 {
		t.Fatalf("%d publishes in flight with a window of 3", n)
	}
	if last := w.st.LastFire("b", 0); last != 3 {
		t.Fatalf("last fire sequence %d, want 3", last)
	}
	for len(w.inFlight) > 0 {
		w.hold = true
		held := w.inFlight
		w.inFlight = nil
		for _, p := range held {
			w.deliver(p)
		}
		w.settle(true)
	}
	if c := w.st.Counts(); c.Fired != 7 {
		t.Fatalf("counts %+v, want 7 fired", c)
	}
}

// A destination partition whose fire window is full does not hold back
// another's due schedules, even ones due later: the claim pass walks on
// until every partition's window is full (then it stops, which a burst
// relies on).
func TestFullWindowHoldsOnlyItsPartition(t *testing.T) {
	cfg := testConfig
	cfg.FireWindow = 2
	w := newWorld(t, cfg)
	w.activate(1)
	var first []uint64
	for range 3 {
		first = append(first, w.schedule("a", 1000, 0)) // partition 0: one more than its window
	}
	other := w.schedule("a", 1001, 1) // partition 1, due after them
	w.at(1001)
	w.hold = true
	w.settle(true)
	inFlight := map[uint64]bool{}
	for _, p := range w.inFlight {
		inFlight[p.ID] = true
	}
	if len(w.inFlight) != 3 || !inFlight[first[0]] || !inFlight[first[1]] || !inFlight[other] {
		t.Fatalf("in flight %v; want the first two of partition 0 (its window) and partition 1's", inFlight)
	}
}

// An intent that reuses a destination partition's fire sequence is
// skipped: the destination would drop it as a retry of the first.
func TestFireSeqNeverReused(t *testing.T) {
	for _, mut := range []bool{false, true} {
		st := NewState()
		st.Mutations.ReuseFireSeq = mut
		apply := func(r Record) Result {
			res, err := st.Apply(st.Applied()+1, &r)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		apply(Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
		apply(Record{Kind: KindSchedule, Schedule: Schedule{Topic: "a", DeliverAtMs: 1}})
		apply(Record{Kind: KindIntent, Epoch: 1, Intents: []Intent{{ID: 1, FireSeq: 1}}})
		res := apply(Record{Kind: KindIntent, Epoch: 2, Intents: []Intent{{ID: 2, FireSeq: 1}}})
		e, _ := st.Entry(2)
		if mut != (e.Status == StatusFiring) || mut == (len(res.Skipped) == 1) {
			t.Fatalf("mutation %v: second intent under a used sequence: %v, skipped %v", mut, e.Status, res.Skipped)
		}
	}
}

// TestDrain: a draining owner admits nothing and claims nothing, records
// what its publishes in flight did (DrainPersistsOutcomes: FIRED before
// it releases, so no later owner publishes them again) and releases; a
// drain past its deadline leaves the shard FENCED.
func TestDrain(t *testing.T) {
	if drainedFired(t, Mutations{DrainForgetsOutcomes: true}) {
		t.Fatal("mutated (DrainForgetsOutcomes): the outcome was recorded anyway; the test no longer proves the guard")
	}
	w := draining(t, Mutations{})
	if w.o.Lifecycle() != Draining {
		t.Fatal(w.o.Lifecycle())
	}
	if err := w.o.Admit(w.now, Schedule{Topic: "a", DeliverAtMs: 1}); err == nil {
		t.Fatal("a draining owner admitted a schedule")
	}
	w.release()
	w.settle(true)
	if w.o.Lifecycle() != Unassigned {
		t.Fatalf("%v after the drain, want UNASSIGNED", w.o.Lifecycle())
	}
	if c := w.st.Counts(); c.Fired != 1 {
		t.Fatalf("counts %+v after the drain: the publish in flight at the drain was not recorded FIRED", c)
	}
	released := func() bool {
		for _, e := range w.o.TakeEffects() {
			if e.Release {
				return true
			}
		}
		return false
	}
	// A drain that times out leaves the shard FENCED and released.
	w = newWorld(t, testConfig)
	w.activate(1)
	w.schedule("a", 1000, 0)
	w.hold = true
	w.settle(true)
	w.o.Drain(w.now, w.now+100)
	w.at(w.now + 100)
	if w.o.Lifecycle() != Fenced || !released() {
		t.Fatalf("%v after the drain's deadline, want FENCED and released", w.o.Lifecycle())
	}
}

// drainedFired runs a drain over one publish in flight and reports
// whether its outcome was recorded FIRED before the release.
func drainedFired(t *testing.T, mut Mutations) bool {
	w := draining(t, mut)
	w.release()
	w.settle(true)
	return w.st.Counts().Fired == 1
}

// draining is an owner draining with one publish in flight (held), its
// drain due at now+100.
func draining(t *testing.T, mut Mutations) *world {
	w := activeWorld(t, mut)
	w.schedule("a", 1000, 0)
	w.hold = true
	w.settle(true)
	w.o.Drain(w.now, w.now+100)
	return w
}

func TestCancel(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	keep := w.schedule("a", 5000, 0)
	gone := w.schedule("a", 5000, 0)
	ref, err := w.o.Cancel(w.now, []uint64{gone, 12345})
	if err != nil || ref == 0 {
		t.Fatal(ref, err)
	}
	w.settle(true)
	if _, live := w.st.Entry(gone); live {
		t.Fatal("cancelled schedule still live")
	}
	w.at(5000)
	w.settle(true)
	w.expectDelivered("a", keep)
}

// A cancel takes a PENDING schedule only: one FIRING (its publish on its
// way) is too late, and lands once. With CancelFiring the cancel takes it
// and its publish lands all the same: cancelled, and delivered.
func TestCancelOfAFiringScheduleIsTooLate(t *testing.T) {
	for _, mut := range []bool{false, true} {
		w := activeWorld(t, Mutations{})
		w.st.Mutations.CancelFiring = mut
		id := w.heldPublish("a", 1000, 0) // due now: claimed, its publish held in flight
		if _, err := w.o.Cancel(w.now, []uint64{id}); err != nil {
			t.Fatal(err)
		}
		w.settle(true)
		if _, live := w.st.Entry(id); live == mut {
			t.Fatalf("CancelFiring %v: the firing schedule still live after its cancel: %v", mut, live)
		}
		w.release()
		w.settle(true)
		w.expectDelivered("a", id) // it lands either way; only the mutation called it cancelled
	}
}

// An intent the log refused (a degraded leader) is not proposed again
// before ProbeEveryMs: a refusal must not turn into a busy loop.
func TestRefusedIntentWaitsBeforeClaimingAgain(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	w.schedule("a", 1000, 0)
	w.settle(false)
	intents := func() int {
		n := 0
		for _, p := range w.queue {
			if p.Record.Kind == KindIntent {
				n++
			}
		}
		return n
	}
	if intents() != 1 {
		t.Fatalf("%d intents proposed, want 1", intents())
	}
	ref := w.queue[len(w.queue)-1].Ref
	w.queue = nil
	w.o.Proposed(w.now, ref, errShort)
	w.settle(false)
	if n := intents(); n != 0 {
		t.Fatalf("%d intents proposed again at once after a refusal", n)
	}
	if at := w.o.NextWakeMs(w.now); at != w.now+testConfig.ProbeEveryMs {
		t.Fatalf("next wake %d, want %d", at, w.now+testConfig.ProbeEveryMs)
	}
	w.at(w.now + testConfig.ProbeEveryMs)
	w.settle(false)
	if n := intents(); n != 1 {
		t.Fatalf("%d intents proposed after the wait, want 1", n)
	}
}

// A pause of a lane the shard never held is a standing order: the
// topic's first schedule in this shard is held, and pinned to its
// incarnation (no ordering break).
func TestStandingPauseHoldsTheFirstSchedule(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LanePause}); err != nil {
		t.Fatal(err)
	}
	w.settle(true)
	id := w.schedule("a", 1000, 0)
	w.at(2000)
	w.settle(true)
	w.expectDelivered("a")
	if l, _ := w.st.Lane("a"); l.Gate != GatePaused || l.Incarnation != 7 {
		t.Fatalf("lane %+v, want ADMIN_PAUSED pinned to 7", l)
	}
	if _, err := w.o.Manage(w.now, LaneCommand{Topic: "a", Op: LaneResume}); err != nil {
		t.Fatal(err)
	}
	w.settle(true)
	w.expectDelivered("a", id)
}

// A FIRED record the log refused leaves its schedule firing; its message
// is published again (the destination deduplicates it) only after
// ProbeEveryMs, not at once: a refusing log must not make a loop.
func TestRefusedFiredWaitsBeforePublishingAgain(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	id := w.schedule("a", 1000, 0)
	w.settle(false)
	w.commitAll() // the intent
	w.settle(false)
	var fired *Proposal
	for _, p := range w.queue {
		if p.Record.Kind == KindFired {
			fired = &p
		}
	}
	if fired == nil {
		t.Fatalf("no FIRED proposed: %+v", w.queue)
	}
	w.queue = nil
	publishes := len(w.published)
	w.o.Proposed(w.now, fired.Ref, errShort)
	w.settle(false)
	if n := len(w.published) - publishes; n != 0 {
		t.Fatalf("published %d times at once after the FIRED was refused", n)
	}
	w.at(w.now + testConfig.ProbeEveryMs)
	w.settle(true)
	if n := len(w.published) - publishes; n != 1 {
		t.Fatalf("published %d times after the wait, want 1", n)
	}
	w.expectDelivered("a", id)
	if c := w.st.Counts(); c.Fired != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// Outcomes reported before a Step are recorded together: one FIRED
// record for all of them (one per message made a due burst slow).
func TestOutcomesOfABatchShareOneFiredRecord(t *testing.T) {
	w := newWorld(t, testConfig)
	w.activate(1)
	for range 3 {
		w.schedule("b", 1000, 0)
	}
	w.hold = true
	w.settle(true)
	if len(w.inFlight) != 3 {
		t.Fatalf("%d publishes in flight, want 3", len(w.inFlight))
	}
	for _, p := range w.inFlight {
		w.publishAt(p) // outcomes, no Step yet
	}
	w.inFlight, w.hold = nil, false
	w.o.Step(w.now)
	var fired []Proposal
	for _, e := range w.o.TakeEffects() {
		if e.Propose != nil && e.Propose.Record.Kind == KindFired {
			fired = append(fired, *e.Propose)
		}
	}
	if len(fired) != 1 || len(fired[0].Record.Fired) != 3 {
		t.Fatalf("FIRED proposals %+v, want one holding 3", fired)
	}
	w.queue = append(w.queue, fired...)
	w.commitAll()
	if c := w.st.Counts(); c.Fired != 3 || w.st.Live() != 0 {
		t.Fatalf("counts %+v, %d live", c, w.st.Live())
	}
}

// Effects the owner emitted under gates it then learns are gone are not
// carried out: the shell takes effects after it reports the gates, and a
// fence in between drops the untaken ones. Found by the cluster simulator
// (seed 16 with destination outages): a publish completion stepped the
// owner under the lease guard of the previous pass, which emitted the
// publish of a committed intent; the same pass then read the lease closed
// (a leadership transfer had begun) and fenced the owner, and the shell
// still carried out the publish (NoPublishWithoutBothGates).
func TestFenceDropsEffectsNotYetTaken(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  Mutations
		want bool // effects survive the fence
	}{
		{name: "fence drops them"},
		{name: "FencedStillFires keeps them", mut: Mutations{FencedStillFires: true}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := activeWorld(t, tc.mut)
			w.schedule("a", 1100, 0)
			w.at(1100)
			w.settle(true) // claimed, intent committed, published
			w.hold = true
			w.schedule("a", 1100, 1)
			w.settle(true) // the second one's publish is in flight
			if len(w.inFlight) != 1 {
				t.Fatalf("%d publishes in flight, want 1", len(w.inFlight))
			}
			// Its outcome is refused; a fresh probe finds the lane ready
			// again, so the owner — still under the old guard — emits the
			// publish again. Before the shell takes it, the gates are
			// read again: the lease is gone.
			w.o.Published(w.now, w.inFlight[0], Refused, 0)
			w.inFlight = nil
			w.o.Step(w.now)
			w.answerProbe("a")
			w.auth.GuardUntilMs = w.now
			w.o.SetAuthority(w.now, w.auth)
			if w.o.Lifecycle() != Fenced {
				t.Fatalf("lifecycle %v with the guard closed, want FENCED", w.o.Lifecycle())
			}
			var kept []Effect
			for _, e := range w.o.TakeEffects() {
				if e.Publish != nil || e.Propose != nil {
					kept = append(kept, e)
				}
			}
			if got := len(kept) > 0; got != tc.want {
				t.Fatalf("publishes or proposals left to carry out after the fence: %+v, want any: %v", kept, tc.want)
			}
		})
	}
}
