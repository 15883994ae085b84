package replica

// Tests that pin guards a mutation sweep found untested: each names, in a
// one-line comment, the guard it pins; each fails with that guard dropped
// or flipped.

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
)

// answer delivers m to its addressee on a quiet network and returns what
// it sent in reply.
func (c *cluster) answer(m Message) []Message {
	c.t.Helper()
	c.queue = nil
	c.deliver(m)
	out := c.queue
	c.queue = nil
	return out
}

// settled3 is a 3-replica group led by n1 in epoch e, everything settled,
// with entries a and b committed everywhere.
func settled3(t *testing.T) (*cluster, uint64) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.propose(1, "b")
	c.tick(1) // the commit reaches the followers
	return c, c.rs[1].Status().Hard.Promised
}

// Step: a message not addressed to this replica, from itself, or from a
// replica outside the group is ignored.
func TestStepIgnoresMessagesNotForItOrFromOutside(t *testing.T) {
	c, e := settled3(t)
	before := c.rs[2].Status()
	for _, m := range []Message{
		{Type: MsgPrepare, From: 3, To: 9, Epoch: e + 5, LastEpoch: e, LastSeq: 99, Forced: true},
		{Type: MsgPrepare, From: 2, To: 2, Epoch: e + 5, LastEpoch: e, LastSeq: 99, Forced: true},
		{Type: MsgPrepare, From: 9, To: 2, Epoch: e + 5, LastEpoch: e, LastSeq: 99, Forced: true},
	} {
		c.rs[2].Step(m)
		if c.rs[2].HasReady() {
			t.Fatalf("%v: n2 has work to do: %+v", m, c.rs[2].Ready())
		}
		if st := c.rs[2].Status(); st.Hard != before.Hard || st.Leader != before.Leader {
			t.Fatalf("%v changed n2: %+v", m, st)
		}
	}
}

// wellFormed: an Append no leader could have sent is ignored, whatever
// else it says.
func TestMalformedAppendsAreIgnored(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.elect(2) // epoch 2: an entry of epoch 1 is an epoch going back
	c.propose(2, "a")
	c.tick(1)
	e := c.rs[2].Status().Hard.Promised
	last := c.rs[2].Status().Last
	for name, m := range map[string]Message{
		"entries not after prev":   {PrevSeq: last, PrevEpoch: e, Entries: []Entry{{Seq: last + 2, Epoch: e}}},
		"an entry of epoch 0":      {PrevSeq: 0, PrevEpoch: 0, Entries: []Entry{{Seq: 1, Epoch: 0}}},
		"an entry above its epoch": {PrevSeq: last, PrevEpoch: e, Entries: []Entry{{Seq: last + 1, Epoch: e + 1}}},
		"an epoch going back":      {PrevSeq: last, PrevEpoch: e, Entries: []Entry{{Seq: last + 1, Epoch: e}, {Seq: last + 2, Epoch: e - 1}}},
		"prev above its epoch":     {PrevSeq: last, PrevEpoch: e + 1},
		"seqs past the end":        {PrevSeq: ^uint64(0) - 1, PrevEpoch: e, Entries: []Entry{{Seq: ^uint64(0), Epoch: e}}},
	} {
		m.Type, m.From, m.To, m.Epoch, m.CommitSeq = MsgAppend, 2, 3, e, last
		if out := c.answer(m); len(out) != 0 {
			t.Fatalf("%s: n3 answered %v", name, out)
		}
		if st := c.rs[3].Status(); st.Last != last || st.Anomalies != 0 {
			t.Fatalf("%s: n3 took it: %+v", name, st)
		}
	}
}

// stepAppend's anomaly guard: a second sender of the epoch's Appends (to
// a follower of another, or to the leader itself) is refused and counted.
func TestAppendFromASecondLeaderOfTheEpochIsRefused(t *testing.T) {
	c, e := settled3(t)
	last := c.rs[2].Status().Last
	forged := Message{Type: MsgAppend, Epoch: e, PrevSeq: last, PrevEpoch: e, Entries: []Entry{{Seq: last + 1, Epoch: e, Data: []byte("x")}}}
	for _, to := range []NodeID{2, 1} {
		m := forged
		m.From, m.To = 3, to
		if out := c.answer(m); len(out) != 0 {
			t.Fatalf("n%d answered a second leader: %v", to, out)
		}
		st := c.rs[to].Status()
		if st.Anomalies != 1 || st.Last != last || st.Leader != 1 {
			t.Fatalf("n%d after a second leader's Append: %+v", to, st)
		}
	}
}

// stepAppend: an Append whose prev lies past the log is a mismatch even
// when it names epoch 0 (epochAt past the log is 0 too).
func TestAppendWithPrevPastTheLogIsAMismatch(t *testing.T) {
	c, e := settled3(t)
	last := c.rs[2].Status().Last
	out := c.answer(Message{Type: MsgAppend, From: 1, To: 2, Epoch: e, PrevSeq: last + 5, PrevEpoch: 0})
	if len(out) != 1 || out[0].Reject != RejectMismatch || out[0].HintSeq != last {
		t.Fatalf("n2 answered %v, want a mismatch hinting %d", out, last)
	}
}

// stepAppend's `e.Seq <= r.commit` guard: an Append that would rewrite a
// committed entry is refused and counted, not obeyed (truncating below
// the commit point).
func TestAppendRewritingACommittedEntryIsRefused(t *testing.T) {
	c, e := settled3(t)
	st := c.rs[2].Status()
	if st.CommitSeq < 2 {
		t.Fatalf("setup: n2 commit %d", st.CommitSeq)
	}
	commit := st.CommitSeq
	// A leader of a later epoch (so no anomaly of the epoch) rewrites the
	// committed entry at commit, from prev commit-1.
	m := Message{Type: MsgAppend, From: 3, To: 2, Epoch: e + 1, PrevSeq: commit - 1, PrevEpoch: e,
		Entries: []Entry{{Seq: commit, Epoch: e + 1, Data: []byte("x")}}}
	c.answer(m)
	after := c.rs[2].Status()
	if after.Anomalies != 1 || after.Last != st.Last || after.CommitSeq != commit {
		t.Fatalf("n2 after an Append rewriting committed seq %d: %+v", commit, after)
	}
	if got, want := c.logString(2), c.logString(1); got != want {
		t.Fatalf("n2's log changed: %s, want %s", got, want)
	}
}

// truncateAfter's `len(r.epochs) > 0`: a follower whose every entry is
// uncommitted and of another epoch truncates its whole log (after seq 0).
func TestAppendReplacingTheWholeLogTruncatesToEmpty(t *testing.T) {
	r, err := New(Config{ID: 2, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10},
		PersistedFrom(HardState{Promised: 1, PromisedTo: 1}, []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	r.Step(Message{Type: MsgAppend, From: 3, To: 2, Epoch: 2, Entries: []Entry{{Seq: 1, Epoch: 2}}})
	rd := r.Ready()
	if !rd.Truncate || rd.TruncateAfter != 0 || len(rd.Entries) != 1 {
		t.Fatalf("Ready: truncate %v after %d, entries %v", rd.Truncate, rd.TruncateAfter, rd.Entries)
	}
	if st := r.Status(); st.Last != 1 || !slices.Equal(st.Epochs, []EpochStart{{Epoch: 2, StartSeq: 1}}) {
		t.Fatalf("after its whole log was replaced: %+v", st)
	}
}

// truncateAfter's `!r.pending.Truncate || seq < r.pending.TruncateAfter`
// and its pending-entry cut `e.Seq > seq`: two truncations in one Ready
// keep the lower cut, and the pending entries up to it.
func TestTwoTruncationsInOneReadyKeepTheLowerCut(t *testing.T) {
	for _, order := range [][2]uint64{{5, 3}, {3, 4}} {
		r, err := New(Config{ID: 2, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10}, PersistedFrom(HardState{Promised: 1, PromisedTo: 1},
			[]Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}, {Seq: 3, Epoch: 1}, {Seq: 4, Epoch: 1}, {Seq: 5, Epoch: 1}, {Seq: 6, Epoch: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		// Epoch 2's leader replaces from order[0]+1 on with entries of
		// epoch 2, then (same Ready) epoch 3's from order[1]+1 on.
		var entries2 []Entry
		for s := order[0] + 1; s <= 6; s++ {
			entries2 = append(entries2, Entry{Seq: s, Epoch: 2})
		}
		r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 2, PrevSeq: order[0], PrevEpoch: 1, Entries: entries2})
		prevEpoch := uint64(1)
		if order[1] > order[0] {
			prevEpoch = 2
		}
		r.Step(Message{Type: MsgAppend, From: 3, To: 2, Epoch: 3, PrevSeq: order[1], PrevEpoch: prevEpoch,
			Entries: []Entry{{Seq: order[1] + 1, Epoch: 3}}})
		rd := r.Ready()
		low := min(order[0], order[1])
		if !rd.Truncate || rd.TruncateAfter != low {
			t.Fatalf("cuts %v: Ready truncates %v after %d, want after %d", order, rd.Truncate, rd.TruncateAfter, low)
		}
		var seqs []uint64
		for _, e := range rd.Entries {
			seqs = append(seqs, e.Seq)
		}
		want := []uint64{}
		for s := low + 1; s <= order[1]+1; s++ {
			want = append(want, s)
		}
		if !slices.Equal(seqs, want) {
			t.Fatalf("cuts %v: Ready appends seqs %v, want %v", order, seqs, want)
		}
	}
}

// IsEmpty: any one part of a Ready is work.
func TestReadyIsEmptyOnlyWithNothingInIt(t *testing.T) {
	if rd := (Ready{}); !rd.IsEmpty() {
		t.Fatal("the zero Ready is not empty")
	}
	for name, rd := range map[string]Ready{
		"hard state": {HardState: &HardState{Promised: 1}},
		"truncate":   {Truncate: true},
		"entries":    {Entries: []Entry{{Seq: 1, Epoch: 1}}},
		"messages":   {Messages: []Message{{Type: MsgAppend}}},
		"early":      {Early: []Message{{Type: MsgAppend}}},
		"commit":     {CommitSeq: 1},
		"snapshot":   {Snapshot: &SnapshotMeta{Seq: 1, Epoch: 1}},
	} {
		if rd.IsEmpty() {
			t.Fatalf("a Ready with only its %s is empty", name)
		}
	}
}

// PersistedFromSnapshot: one epoch boundary per run of an epoch, and the
// snapshot's only when there is one.
func TestPersistedFromListsEachEpochRunOnce(t *testing.T) {
	log := []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}, {Seq: 3, Epoch: 2}, {Seq: 4, Epoch: 2}}
	if got, want := PersistedFrom(HardState{}, log).Epochs, []EpochStart{{1, 1}, {2, 3}}; !slices.Equal(got, want) {
		t.Fatalf("epochs %v, want %v", got, want)
	}
	p := PersistedFromSnapshot(HardState{}, 2, 1, log[2:])
	if want := []EpochStart{{1, 2}, {2, 3}}; !slices.Equal(p.Epochs, want) || p.Last != 4 {
		t.Fatalf("after a snapshot at 2: epochs %v last %d, want %v last 4", p.Epochs, p.Last, want)
	}
}

// Outcome's `r.epochAt(r.commit) > epoch`: a deposed leader's proposal
// beyond the commit point, when the committed prefix still ends in its
// own epoch, is Pending — the next leader may commit it.
func TestOutcomePendingWhileTheCommittedPrefixEndsInItsEpoch(t *testing.T) {
	c, e := settled3(t)
	c.cut[2], c.cut[3] = true, true
	seq, epoch, err := c.rs[1].Propose([]byte("maybe"))
	if err != nil {
		t.Fatal(err)
	}
	c.settle()
	c.cut[2], c.cut[3] = false, false
	c.rs[1].Step(Message{Type: MsgPrepare, From: 2, To: 1, Epoch: e + 1, LastEpoch: e, LastSeq: seq, Forced: true})
	c.flush(1)
	c.queue = nil
	st := c.rs[1].Status()
	if st.Hard.Promised != e+1 || st.CommitSeq >= seq {
		t.Fatalf("setup: n1 %+v", st)
	}
	if got := c.rs[1].Outcome(seq, epoch); got != Pending {
		t.Fatalf("Outcome = %v, want Pending", got)
	}
}

// snapshotTo builds a SNAPSHOT from leader `from` of epoch e at (seq, sEpoch).
func snapshotTo(from, to NodeID, e, seq, sEpoch, commit uint64) Message {
	return Message{Type: MsgSnapshot, From: from, To: to, Epoch: e, PrevSeq: seq, PrevEpoch: sEpoch, CommitSeq: commit}
}

// stepSnapshot's guards: a malformed SNAPSHOT is ignored, one of an older
// epoch refused (STALE_LEADER_EPOCH), one from a second leader of the
// epoch refused and counted.
func TestSnapshotFromNoLeaderIsRefused(t *testing.T) {
	c, e := settled3(t)
	last := c.rs[2].Status().Last
	for name, m := range map[string]Message{
		"epoch 0 snapshot":         snapshotTo(1, 2, e, last+3, 0, last+3),
		"epoch 0 snapshot at 1":    snapshotTo(1, 2, e, 1, 0, 1),
		"snapshot above its epoch": snapshotTo(1, 2, e, last+3, e+1, last+3),
	} {
		if out := c.answer(m); len(out) != 0 || c.snapshots != 0 {
			t.Fatalf("%s: n2 answered %v (%d installs)", name, out, c.snapshots)
		}
	}
	c.rs[2].Step(Message{Type: MsgPrepare, From: 3, To: 2, Epoch: e + 1, LastEpoch: e, LastSeq: last, Forced: true})
	c.flush(2)
	out := c.answer(snapshotTo(1, 2, e, last+3, e, last+3))
	if len(out) != 1 || out[0].Reject != RejectStaleEpoch || out[0].Epoch != e+1 || c.snapshots != 0 {
		t.Fatalf("a stale leader's snapshot: n2 answered %v (%d installs)", out, c.snapshots)
	}
	c2, e2 := settled3(t)
	last2 := c2.rs[2].Status().Last
	for _, to := range []NodeID{2, 1} {
		if out := c2.answer(snapshotTo(3, to, e2, last2+3, e2, last2+3)); len(out) != 0 || c2.snapshots != 0 {
			t.Fatalf("n%d answered a second leader's snapshot: %v", to, out)
		}
		if st := c2.rs[to].Status(); st.Anomalies != 1 || st.Last != last2 {
			t.Fatalf("n%d after a second leader's snapshot: %+v", to, st)
		}
	}
}

// stepSnapshot: a candidate of the epoch hears its leader in a SNAPSHOT
// as in an APPEND — it follows the sender.
func TestSnapshotMakesACandidateOfTheEpochFollow(t *testing.T) {
	c, e := settled3(t)
	c.rs[2].Campaign()
	c.flush(2)
	c.queue = nil
	last := c.rs[2].Status().Last
	c.answer(snapshotTo(3, 2, e+1, last, e, last))
	if st := c.rs[2].Status(); st.Role != Follower || st.Leader != 3 {
		t.Fatalf("candidate n2 after n3's snapshot of its epoch: %+v", st)
	}
}

// stepSnapshot's "already holds the prefix" test: a snapshot at or below
// its own snapshot point, or at an entry it holds, is answered without an
// install, and advances (never lowers) its commit; one at an entry of
// another epoch, or to a rebuilding replica, is installed.
func TestSnapshotInstalledOnlyWhenThePrefixIsNotHeld(t *testing.T) {
	c, e := settled3(t)
	c.propose(1, "c")
	c.propose(1, "d")
	c.tick(1)
	st := c.rs[2].Status()
	if st.CommitSeq != st.Last || st.Last < 4 {
		t.Fatalf("setup: n2 %+v", st)
	}
	last, commit := st.Last, st.CommitSeq
	// At its last entry, and below: no install, no commit going back.
	for _, seq := range []uint64{last, 2} {
		out := c.answer(snapshotTo(1, 2, e, seq, e, seq))
		if c.snapshots != 0 || len(out) != 1 || out[0].FlushedSeq != seq {
			t.Fatalf("snapshot at %d: n2 answered %v (%d installs)", seq, out, c.snapshots)
		}
		if got := c.rs[2].Status(); got.CommitSeq != commit || got.Last != last {
			t.Fatalf("snapshot at %d: n2 commit %d last %d, want %d %d", seq, got.CommitSeq, got.Last, commit, last)
		}
	}
	// Below its own snapshot point: answered with the point.
	if got := c.rs[2].CompactTo(3); got != 3 {
		t.Fatalf("n2 compacted to %d", got)
	}
	c.stores[2].snapSeq, c.stores[2].snapEp = 3, e
	if out := c.answer(snapshotTo(1, 2, e, 2, e, 2)); c.snapshots != 0 || len(out) != 1 || out[0].FlushedSeq != 3 {
		t.Fatalf("snapshot below n2's own: answered %v (%d installs)", out, c.snapshots)
	}

	// A follower behind the leader's commit learns it from the snapshot's.
	c3, e3 := settled3(t)
	c3.cut[3] = true
	c3.propose(1, "c")
	c3.tick(1)
	c3.cut[3] = false
	c3.queue = nil
	st3 := c3.rs[3].Status()
	c3.answer(snapshotTo(1, 3, e3, st3.Last, e3, st3.Last+1))
	if got := c3.rs[3].Status(); c3.snapshots != 0 || got.CommitSeq != st3.Last {
		t.Fatalf("n3 commit %d after a snapshot at its last %d (%d installs)", got.CommitSeq, st3.Last, c3.snapshots)
	}
}

// stepSnapshot: an entry of another epoch at the snapshot's seq, or a
// rebuilding log, does not hold the prefix: the snapshot is installed.
func TestSnapshotReplacesADivergentOrRebuildingLog(t *testing.T) {
	r, err := New(Config{ID: 2, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10},
		PersistedFrom(HardState{Promised: 2, PromisedTo: 3}, []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 2}, {Seq: 3, Epoch: 2}}))
	if err != nil {
		t.Fatal(err)
	}
	r.Step(snapshotTo(1, 2, 3, 2, 3, 2))
	if rd := r.Ready(); rd.Snapshot == nil || *rd.Snapshot != (SnapshotMeta{Seq: 2, Epoch: 3}) {
		t.Fatalf("a snapshot at an entry of another epoch was not installed: %+v", rd)
	}
	p := PersistedFrom(HardState{Promised: 1, PromisedTo: 1}, []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}})
	p.Rebuilding = true
	r, err = New(Config{ID: 2, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10}, p)
	if err != nil {
		t.Fatal(err)
	}
	r.Step(snapshotTo(1, 2, 1, 2, 1, 2))
	if rd := r.Ready(); rd.Snapshot == nil || r.Status().Rebuilding {
		t.Fatalf("a rebuilding replica did not install the snapshot: %+v", rd)
	}
}

// stepAppendAck's lease guards `m.Tick <= r.ticks && m.Tick > r.leaseFrom[i]`:
// an answer claiming an Append from the future does not date the lease,
// and a late answer to an older Append does not move it back.
func TestLeaseIgnoresAnswersFromTheFutureAndThePast(t *testing.T) {
	c, e := settled3(t)
	c.tick(2)
	r := c.rs[1]
	st := r.Status()
	if st.LeaseTicks == 0 {
		t.Fatalf("setup: no lease: %+v", st)
	}
	from := st.LeaseFrom
	ack := func(peer NodeID, tick uint64) {
		r.Step(Message{Type: MsgAppendAck, From: peer, To: 1, Epoch: e, FlushedSeq: st.Last, Tick: tick})
		c.flush(1)
		c.queue = nil
	}
	ack(2, 1) // an answer to an Append of the reign's first tick
	ack(3, 1)
	if got := r.Status().LeaseFrom; got != from {
		t.Fatalf("late answers moved the lease from tick %d to %d", from, got)
	}
	for range 6 {
		r.Tick()
		c.flush(1)
		c.queue = nil
		// Status's `left > 0`: LeaseFrom only while the lease lasts.
		if st := r.Status(); st.LeaseTicks == 0 && st.LeaseFrom != 0 {
			t.Fatalf("an expired lease dates from tick %d", st.LeaseFrom)
		}
	}
	if got := r.Status().LeaseTicks; got != 0 {
		t.Fatalf("setup: lease ticks %d after 6 silent ticks", got)
	}
	ack(2, r.Ticks()+50) // an Append it never sent
	ack(3, r.Ticks()+50)
	if got := r.Status(); got.LeaseTicks != 0 {
		t.Fatalf("answers to Appends from the future renewed the lease: %+v", got)
	}
}

// stepAppendAck's `m.FlushedSeq > r.match[i]`: a FLUSHED that arrives
// after a later one never moves the peer's match back.
func TestReorderedFlushedNeverLowersTheMatch(t *testing.T) {
	c, e := settled3(t)
	last := c.rs[1].Status().Last
	c.rs[1].Step(Message{Type: MsgAppendAck, From: 2, To: 1, Epoch: e, FlushedSeq: 1})
	c.flush(1)
	c.queue = nil
	if m := c.peerMatch(1, 2); m != last {
		t.Fatalf("n2's match went from %d to %d", last, m)
	}
}

// A leader that loses its epoch forgets what it still had to send: no
// Append leaves it, HasReady turns false, and it reports no lease, no
// peers.
func TestDeposedLeaderSendsNothingAndHoldsNoLease(t *testing.T) {
	c, e := settled3(t)
	c.tick(2)
	r := c.rs[1]
	if st := r.Status(); st.LeaseTicks == 0 {
		t.Fatalf("setup: no lease: %+v", st)
	}
	if _, _, err := r.Propose([]byte("x")); err != nil { // every peer dirty
		t.Fatal(err)
	}
	r.Step(Message{Type: MsgPrepare, From: 2, To: 1, Epoch: e + 1, LastEpoch: e, LastSeq: 99, Forced: true})
	rd := r.Ready()
	for _, m := range append(rd.Early, rd.Messages...) {
		if m.Type == MsgAppend || m.Type == MsgSnapshot {
			t.Fatalf("a deposed leader sends %v", m)
		}
	}
	c.executor(1).Finish(r, rd)
	c.queue = nil
	if r.HasReady() {
		t.Fatalf("a deposed leader has work: %+v", r.Ready())
	}
	if st := r.Status(); st.LeaseTicks != 0 || st.LeaseFrom != 0 || st.Peers != nil {
		t.Fatalf("a deposed leader reports %+v", st)
	}
}

// Status: a leader that lost its quorum is read-only but never
// LeaderSilent (that is a follower's word about its leader), and the
// leader's Silent mark and quorum count agree at AckTimeoutTicks.
func TestDegradedLeaderIsNotLeaderSilent(t *testing.T) {
	c, _ := settled3(t)
	c.cut[2], c.cut[3] = true, true
	ack := c.rs[1].cfg.AckTimeoutTicks
	c.tick(ack)
	st := c.rs[1].Status()
	if st.ReadOnly || st.Peers[0].Silent || st.Peers[1].Silent {
		t.Fatalf("after %d silent ticks (the ack timeout): %+v", ack, st)
	}
	c.tick(1)
	st = c.rs[1].Status()
	if !st.ReadOnly || st.LeaderSilent || !st.Peers[0].Silent {
		t.Fatalf("leader after its quorum went silent: %+v", st)
	}
}

// Propose's `r.role != Leader`: a follower appends nothing.
func TestFollowerRefusesProposals(t *testing.T) {
	c, _ := settled3(t)
	last := c.rs[2].Status().Last
	if _, _, err := c.rs[2].Propose([]byte("x")); err != ErrNotLeader {
		t.Fatalf("follower's Propose: %v", err)
	}
	if st := c.rs[2].Status(); st.Last != last || c.rs[2].HasReady() {
		t.Fatalf("follower after a refused Propose: %+v", st)
	}
}

// A single replica commits its proposals on its own durability: HasReady
// sees its entries (no message goes with them) and Advance counts them.
func TestSingleReplicaCommitsOnItsOwnFlush(t *testing.T) {
	c := newCluster(t, 1, SyncQuorum)
	c.elect(1)
	seq, _, err := c.rs[1].Propose([]byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.rs[1].HasReady() {
		t.Fatal("a single replica's proposal leaves nothing to do")
	}
	// Run carries out the Ready that commits it too (after Advance).
	if commit, err := c.executor(1).Run(c.rs[1]); err != nil || commit != seq {
		t.Fatalf("Run: commit %d, %v; want %d", commit, err, seq)
	}
	if st := c.rs[1].Status(); st.CommitSeq != seq || c.rs[1].HasReady() {
		t.Fatalf("single replica: commit %d, want %d", st.CommitSeq, seq)
	}
}

// AppendShort's `i >= 0`: the peer at index 0 (the lowest ID) is a peer.
func TestAppendShortToTheLowestPeer(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 4 })
	c.elect(3)
	c.cut[1] = true
	for i := range 8 {
		c.propose(3, string(rune('a'+i)))
	}
	c.cut[1] = false
	c.entriesMax = 2
	mismatches := 0
	c.drop = func(m Message) bool {
		if m.From == 1 && m.Type == MsgAppendAck && m.Reject == RejectMismatch {
			mismatches++
		}
		return false
	}
	c.tick(1)
	mismatches = 0
	for range 20 {
		c.tick(1)
	}
	if got, want := c.logString(1), c.logString(3); got != want || mismatches != 0 {
		t.Fatalf("n1 (%d mismatches):\n n1 %s\n n3 %s", mismatches, got, want)
	}
}

// Ready: only Appends go Early; a leader's other messages (an answer to
// a pre-vote here) wait for the Ready's writes.
func TestEarlyHoldsNothingButAppends(t *testing.T) {
	c, e := settled3(t)
	r := c.rs[1]
	if _, _, err := r.Propose([]byte("x")); err != nil {
		t.Fatal(err)
	}
	r.Step(Message{Type: MsgPreVote, From: 2, To: 1, Epoch: e + 1, LastEpoch: e, LastSeq: 1})
	rd := r.Ready()
	if len(rd.Early) != 2 {
		t.Fatalf("early %v", rd.Early)
	}
	for _, m := range rd.Early {
		if m.Type != MsgAppend {
			t.Fatalf("early %v", m)
		}
	}
	if len(rd.Messages) != 1 || rd.Messages[0].Type != MsgPreVoteAck {
		t.Fatalf("messages %v", rd.Messages)
	}
}

// Campaign and ElectionTimeout: a leader ignores both (it would depose
// itself); a rebuilding replica does not pre-vote.
func TestLeaderAndRebuildingReplicaDoNotCampaign(t *testing.T) {
	c, e := settled3(t)
	c.rs[1].Campaign()
	c.rs[1].ElectionTimeout()
	if st := c.rs[1].Status(); st.Role != Leader || st.Hard.Promised != e || c.rs[1].preVoting {
		t.Fatalf("leader after Campaign and ElectionTimeout: %+v", st)
	}
	c.crash(2)
	c.stores[2].rebuilding = true
	c.start(2)
	c.rs[2].ElectionTimeout()
	if c.rs[2].HasReady() || c.rs[2].preVoting {
		t.Fatalf("a rebuilding replica pre-votes: %+v", c.rs[2].Ready())
	}
}

// leaseExpired's `r.preVoting`: a follower whose own election timer fired
// has stopped vouching for its leader, however recently it heard it.
func TestPreVotingFollowerGrantsAPeersPreVote(t *testing.T) {
	c, e := settled3(t)
	c.rs[3].ElectionTimeout() // forced: it heard n1 a tick ago
	c.flush(3)
	c.queue = nil
	le, ls := c.lineage(3)
	if ack := c.askPreVote(3, 2, e+1, le, ls); !ack.Granted {
		t.Fatalf("a pre-voting follower refused a peer's pre-vote: %v", ack)
	}
}

// sendPrepares: a candidate PREPAREs each peer but itself, and repeats
// its PREPARE only to the peers that have not answered.
func TestPreparesGoToEachUnansweredPeerOnly(t *testing.T) {
	c := newClusterWith(t, 5, SyncQuorum, func(cfg *Config) { cfg.ElectionTicks = 30 })
	r := c.rs[1]
	r.Campaign()
	rd := r.Ready()
	var to []NodeID
	for _, m := range rd.Messages {
		if m.Type == MsgPrepare {
			to = append(to, m.To)
		}
	}
	if !slices.Equal(to, []NodeID{2, 3, 4, 5}) {
		t.Fatalf("PREPAREs to %v", to)
	}
	c.executor(1).Finish(r, rd)
	c.queue = nil
	r.Step(Message{Type: MsgPrepareAck, From: 2, To: 1, Epoch: 1, Granted: true})
	r.Step(Message{Type: MsgPrepareAck, From: 3, To: 1, Epoch: 1, Damaged: true})
	c.flush(1)
	c.queue = nil
	for range r.cfg.HeartbeatTicks {
		r.Tick()
	}
	c.flush(1)
	to = nil
	for _, m := range c.queue {
		if m.Type == MsgPrepare {
			to = append(to, m.To)
		}
	}
	if r.Status().Role != Candidate || !slices.Equal(to, []NodeID{4, 5}) {
		t.Fatalf("repeated PREPAREs to %v (role %v), want to 4 and 5", to, r.Status().Role)
	}
}

// granted's `n >= r.quorum`: in a group of four, two grants (a half) do
// not elect.
func TestHalfOfAnEvenGroupDoesNotElect(t *testing.T) {
	c := newCluster(t, 4, SyncQuorum)
	r := c.rs[1]
	r.Campaign()
	c.flush(1)
	c.queue = nil
	r.Step(Message{Type: MsgPrepareAck, From: 2, To: 1, Epoch: 1, Granted: true})
	if st := r.Status(); st.Role == Leader {
		t.Fatalf("two grants of four elected n1: %+v", st)
	}
	r.Step(Message{Type: MsgPrepareAck, From: 3, To: 1, Epoch: 1, Granted: true})
	if st := r.Status(); st.Role != Leader {
		t.Fatalf("three grants of four did not elect n1: %+v", st)
	}
}

// stepPreVoteAck's `from < 0`/`from >= 0`: the peer at index 0 (lowest
// ID) counts like any other — its pre-grant, and its refusal (it is not
// asked again).
func TestPreVoteAnswersOfTheLowestPeerCount(t *testing.T) {
	c, e := settled3(t)
	c.startPreVote(3)
	c.rs[3].Step(Message{Type: MsgPreVoteAck, From: 1, To: 3, Epoch: e + 1, Granted: true})
	c.flush(3)
	if st := c.rs[3].Status(); st.Role != Candidate || st.Hard.Promised != e+1 {
		t.Fatalf("n3 with n1's pre-grant: %+v", st)
	}

	c2, e2 := settled3(t)
	c2.startPreVote(3)
	c2.rs[3].Step(Message{Type: MsgPreVoteAck, From: 1, To: 3, Epoch: e2})
	c2.flush(3)
	c2.queue = nil
	for range c2.rs[3].cfg.HeartbeatTicks {
		c2.rs[3].Tick()
	}
	c2.flush(3)
	for _, m := range c2.queue {
		if m.Type == MsgPreVote && m.To == 1 {
			t.Fatalf("n1 refused and is asked again: %v", c2.queue)
		}
	}
}

// stepPrepare's `renewed` needs the same epoch: a delayed PREPARE of an
// older epoch from the candidate it promised a newer one is refused.
func TestOlderPrepareFromThePromisedCandidateIsRefused(t *testing.T) {
	r, _ := New(Config{ID: 1, Replicas: []NodeID{1, 2, 3}, Seed: 1}, Persisted{Hard: HardState{Promised: 5, PromisedTo: 2}})
	r.Step(Message{Type: MsgPrepare, From: 2, To: 1, Epoch: 4, Forced: true})
	rd := r.Ready()
	if len(rd.Messages) != 1 || rd.Messages[0].Granted || rd.Messages[0].Epoch != 5 || rd.HardState != nil {
		t.Fatalf("answer to an older PREPARE of the promised candidate: %+v", rd)
	}
}

// stepPrepare: a renewed PREPARE (the candidate asks again) is granted
// even by a replica that still holds the old leader's lease, and changes
// nothing else — a follower of the candidate keeps following it.
func TestRenewedPrepareIsGrantedAndKeepsTheLeader(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.ElectionTicks = 30 })
	c.elect(1)
	c.tick(1)
	c.rs[2].Campaign() // forced: n3 grants though it hears n1
	c.flush(2)
	prepare := c.take(MsgPrepare, 2, 3)
	c.queue = nil
	c.deliver(prepare)
	c.queue = nil // the grant is lost
	prepare.Forced = false
	out := c.answer(prepare)
	if len(out) != 1 || !out[0].Granted {
		t.Fatalf("n3 answered a renewed PREPARE with %v", out)
	}

	c2, e := settled3(t)
	r := c2.rs[2]
	if st := r.Status(); st.Hard.PromisedTo != 1 && st.Hard.PromisedTo != 0 {
		t.Fatalf("setup: %+v", st)
	}
	c2.answer(Message{Type: MsgPrepare, From: 1, To: 2, Epoch: e, LastEpoch: 0, LastSeq: 0})
	if st := r.Status(); st.Leader != 1 || st.Role != Follower {
		t.Fatalf("n2 after its leader's PREPARE replayed: %+v", st)
	}
}

// stepPrepare: a replica that refuses a candidate's lineage promises the
// epoch to no one, and its election timer runs on; a grant restarts it.
func TestRefusedPrepareNeitherNamesTheCandidateNorResetsTheTimer(t *testing.T) {
	r, _ := New(Config{ID: 1, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10, Seed: 1},
		PersistedFrom(HardState{Promised: 1}, []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}}))
	for range 3 {
		r.Tick()
	}
	due := r.NextTickDue()
	r.Step(Message{Type: MsgPrepare, From: 2, To: 1, Epoch: 2, LastEpoch: 1, LastSeq: 1, Forced: true})
	rd := r.Ready()
	if rd.HardState == nil || *rd.HardState != (HardState{Promised: 2}) || rd.Messages[0].Granted {
		t.Fatalf("refusing a worse lineage: %+v", rd)
	}
	r.Advance(rd)
	if got := r.NextTickDue(); got != due {
		t.Fatalf("the refusal moved the election timer: due in %d, was %d", got, due)
	}
	r.Step(Message{Type: MsgPrepare, From: 3, To: 1, Epoch: 3, LastEpoch: 1, LastSeq: 2, Forced: true})
	rd = r.Ready()
	if !rd.Messages[0].Granted || r.electionElapsed != 0 {
		t.Fatalf("granting: %+v, election clock %d", rd, r.electionElapsed)
	}
}

// stepPrepareAck: a refusal from a newer epoch makes the candidate a
// follower of it; a grant of an epoch it no longer campaigns for does
// not count.
func TestPrepareAcksOfAnotherEpoch(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	r := c.rs[1]
	r.Campaign()
	c.flush(1)
	c.queue = nil
	if st := r.Status(); st.Role != Candidate || st.Leader != 0 {
		t.Fatalf("a candidate knows a leader: %+v", st)
	}
	r.Step(Message{Type: MsgPrepareAck, From: 2, To: 1, Epoch: 7})
	if st := r.Status(); st.Role != Follower || st.Hard != (HardState{Promised: 7}) || st.Leader != 0 {
		t.Fatalf("candidate after a refusal of epoch 7: %+v", st)
	}

	c2 := newCluster(t, 3, SyncQuorum)
	r = c2.rs[1]
	r.Campaign()
	r.Campaign() // epoch 2: its first campaign timed out
	c2.flush(1)
	c2.queue = nil
	r.Step(Message{Type: MsgPrepareAck, From: 2, To: 1, Epoch: 1, Granted: true})
	if st := r.Status(); st.Role != Candidate || st.Hard.Promised != 2 {
		t.Fatalf("a grant of epoch 1 counted for epoch 2: %+v", st)
	}
}

// follower2 is n2 of {1,2,3} following n1 in epoch 1, its log 1..4 of
// epoch 1 and nothing known committed.
func follower2(t *testing.T, p Persisted) *Replica {
	t.Helper()
	if p.Last == 0 {
		p = PersistedFrom(HardState{Promised: 1, PromisedTo: 1}, []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}, {Seq: 3, Epoch: 1}, {Seq: 4, Epoch: 1}})
	}
	r, err := New(Config{ID: 2, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10, Seed: 2}, p)
	if err != nil {
		t.Fatal(err)
	}
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: p.Hard.Promised, PrevSeq: p.Last, PrevEpoch: r.lastEpoch()})
	r.Advance(r.Ready())
	if st := r.Status(); st.Leader != 1 || st.Role != Follower {
		t.Fatalf("setup: %+v", st)
	}
	return r
}

// stepAppend and stepSnapshot adopt a newer epoch of the leader they
// already follow, and follow the sender of an epoch whose leader they
// did not know (a granted PREPARE forgot it); a SNAPSHOT of a newer epoch
// from another replica is no second leader.
func TestLeaderMessagesOfANewEpochAreFollowed(t *testing.T) {
	for _, typ := range []MsgType{MsgAppend, MsgSnapshot} {
		r := follower2(t, Persisted{})
		r.Step(Message{Type: typ, From: 1, To: 2, Epoch: 2, PrevSeq: 4, PrevEpoch: 1})
		if st := r.Status(); st.Hard.Promised != 2 || st.Leader != 1 {
			t.Fatalf("%v of epoch 2 from its leader: %+v", typ, st)
		}
		r = follower2(t, Persisted{})
		r.Step(Message{Type: MsgPrepare, From: 3, To: 2, Epoch: 2, LastEpoch: 1, LastSeq: 4, Forced: true})
		r.Advance(r.Ready())
		r.Step(Message{Type: typ, From: 3, To: 2, Epoch: 2, PrevSeq: 4, PrevEpoch: 1})
		if st := r.Status(); st.Leader != 3 || st.Anomalies != 0 {
			t.Fatalf("%v from the winner of the epoch it granted: %+v", typ, st)
		}
		r = follower2(t, Persisted{})
		r.Step(Message{Type: typ, From: 3, To: 2, Epoch: 2, PrevSeq: 4, PrevEpoch: 1})
		if st := r.Status(); st.Leader != 3 || st.Hard.Promised != 2 || st.Anomalies != 0 {
			t.Fatalf("%v of epoch 2 from n3: %+v", typ, st)
		}
	}
	// A candidate of the epoch follows its leader's APPEND.
	r := follower2(t, Persisted{})
	r.Campaign()
	r.Advance(r.Ready())
	r.Step(Message{Type: MsgAppend, From: 3, To: 2, Epoch: 2, PrevSeq: 4, PrevEpoch: 1})
	if st := r.Status(); st.Role != Follower || st.Leader != 3 {
		t.Fatalf("candidate after an APPEND of its epoch: %+v", st)
	}
}

// stepAppend's `len(m.Entries) == 0` after the snapshot skip: entries
// past the snapshot point in an Append that starts below it are taken.
func TestAppendStartingBelowTheSnapshotKeepsItsTail(t *testing.T) {
	r := compactedAt3(t)
	var entries []Entry
	for s := uint64(2); s <= 6; s++ {
		entries = append(entries, Entry{Seq: s, Epoch: 1})
	}
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 1, PrevSeq: 1, PrevEpoch: 1, Entries: entries, CommitSeq: 4})
	rd := r.Ready()
	if rd.Truncate || len(rd.Entries) != 2 || len(rd.Messages) != 1 || rd.Messages[0].FlushedSeq != 6 {
		t.Fatalf("Ready: %+v", rd)
	}
}

// stepSnapshot: a snapshot at an entry held advances the commit to it.
func TestSnapshotOfAHeldPrefixAdvancesTheCommit(t *testing.T) {
	r := follower2(t, Persisted{})
	r.Step(snapshotTo(1, 2, 1, 3, 1, 4))
	rd := r.Ready()
	if rd.Snapshot != nil || rd.CommitSeq != 3 || r.Status().CommitSeq != 3 {
		t.Fatalf("Ready %+v, commit %d", rd, r.Status().CommitSeq)
	}
}

// mismatchHint: a prev at the start of an epoch's run, or inside it,
// hints the seq just before the run.
func TestMismatchAtAnEpochStartHintsTheSeqBefore(t *testing.T) {
	r := follower2(t, PersistedFrom(HardState{Promised: 2, PromisedTo: 1},
		[]Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}, {Seq: 3, Epoch: 1}, {Seq: 4, Epoch: 2}, {Seq: 5, Epoch: 2}}))
	for _, prev := range []uint64{4, 5} { // the run's start, and inside it
		r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 2, PrevSeq: prev, PrevEpoch: 1})
		rd := r.Ready()
		r.Advance(rd)
		if len(rd.Messages) != 1 || rd.Messages[0].Reject != RejectMismatch || rd.Messages[0].HintSeq != 3 {
			t.Fatalf("prev %d: answer %v, want a mismatch hinting 3 (before epoch 2's run)", prev, rd.Messages)
		}
	}
}

// stepAppend: appending after the log's end truncates nothing.
func TestPlainAppendTruncatesNothing(t *testing.T) {
	r := follower2(t, Persisted{})
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 1, PrevSeq: 4, PrevEpoch: 1, Entries: []Entry{{Seq: 5, Epoch: 1}}})
	if rd := r.Ready(); rd.Truncate || len(rd.Entries) != 1 {
		t.Fatalf("Ready %+v", rd)
	}
}

// New: an uncertain replica's uncertainty dates from its promise: its
// own epoch's leader does not make it certain.
func TestUncertainReplicaStaysUncertainUnderItsEpochsLeader(t *testing.T) {
	p := PersistedFrom(HardState{Promised: 1, PromisedTo: 1}, []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}})
	p.Uncertain = true
	r := follower2(t, p)
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 1, PrevSeq: 2, PrevEpoch: 1, CommitSeq: 2})
	if st := r.Status(); !st.Uncertain || st.CommitSeq != 2 {
		t.Fatalf("after its epoch's leader's commit: %+v", st)
	}
}

// Outcome and epochAt below the snapshot point: an entry compacted away
// is committed or lost, never asked of a log that no longer holds it.
func TestOutcomeBelowTheSnapshotIsLost(t *testing.T) {
	r := compactedAt3(t)
	if got := r.Outcome(2, 1); got != Lost {
		t.Fatalf("Outcome below the snapshot: %v", got)
	}
	if got := r.Outcome(4, 1); got != Committed {
		t.Fatalf("Outcome above the snapshot: %v", got)
	}
}

// compactedAt3 is follower 2 of a group whose leader committed seqs 1–4
// in epoch 1, compacted to 3.
func compactedAt3(t *testing.T) *Replica {
	t.Helper()
	r := follower2(t, Persisted{})
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 1, PrevSeq: 4, PrevEpoch: 1, CommitSeq: 4})
	r.Advance(r.Ready())
	if got := r.CompactTo(3); got != 3 {
		t.Fatalf("compacted to %d", got)
	}
	return r
}

// CompactTo's `seq <= r.snapSeq`: a compaction never goes back.
func TestCompactToNeverGoesBack(t *testing.T) {
	r := compactedAt3(t)
	if got := r.CompactTo(2); got != 3 {
		t.Fatalf("CompactTo(2) after 3 = %d", got)
	}
	if st := r.Status(); st.SnapSeq != 3 || !slices.Equal(st.Epochs, []EpochStart{{Epoch: 1, StartSeq: 3}}) {
		t.Fatalf("after compacting back: %+v", st)
	}
}

// validate: a configuration without an ID, not a member, with a
// preferred leader outside the group or a heartbeat as long as the
// election timeout is refused; the defaults derive from ElectionTicks.
func TestConfigValidation(t *testing.T) {
	ok := Config{ID: 1, Replicas: []NodeID{1, 2, 3}}
	for name, cfg := range map[string]Config{
		"no ID":                   {Replicas: []NodeID{1, 2}},
		"ID 0 listed":             {Replicas: []NodeID{0, 1, 2}},
		"not a member":            {ID: 4, Replicas: []NodeID{1, 2, 3}},
		"preferred not a member":  {ID: 1, Replicas: []NodeID{1, 2, 3}, PreferredLeader: 4},
		"heartbeat = election":    {ID: 1, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10, HeartbeatTicks: 10},
		"heartbeat past election": {ID: 1, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10, HeartbeatTicks: 11},
	} {
		if _, err := New(cfg, Persisted{}); err == nil {
			t.Fatalf("%s: New accepted %+v", name, cfg)
		}
	}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	want := Config{ID: 1, Replicas: ok.Replicas, ElectionTicks: 30, HeartbeatTicks: 3, AckTimeoutTicks: 60, AppendEntriesMax: 256,
		ReservationTicks: 120, ChaseTicks: 120, ReservationEntriesMax: 1 << 20, TransferTicks: 30, RebalanceStableTicks: 60, RebalanceEveryTicks: 150}
	if !reflect.DeepEqual(ok, want) {
		t.Fatalf("defaults %+v, want %+v", ok, want)
	}
	set := Config{ID: 1, Replicas: ok.Replicas, ElectionTicks: 20, HeartbeatTicks: 4, AckTimeoutTicks: 7, AppendEntriesMax: 8,
		ReservationTicks: 9, ChaseTicks: 11, ReservationEntriesMax: 12, TransferTicks: 13, RebalanceStableTicks: 14, RebalanceEveryTicks: 15}
	got := set
	if err := got.validate(); err != nil || !reflect.DeepEqual(got, set) {
		t.Fatalf("set values changed: %+v, %v", got, err)
	}
}

// nextTickDueIsExact checks NextTickDue on r, which hears nothing: the
// ticks before the due one change neither its Ready nor its Status, and
// the due one changes one of them.
func nextTickDueIsExact(t *testing.T, name string, r *Replica) {
	t.Helper()
	due := r.NextTickDue()
	if r.HasReady() {
		r.Advance(r.Ready())
	}
	before := r.Status()
	for i := 1; i < due; i++ {
		r.Tick()
		if r.HasReady() || !reflect.DeepEqual(r.Status(), before) {
			t.Fatalf("%s: tick %d of a due %d did something: %+v", name, i, due, r.Ready())
		}
	}
	r.Tick()
	if !r.HasReady() && reflect.DeepEqual(r.Status(), before) {
		t.Fatalf("%s: the due tick %d did nothing", name, due)
	}
}

// NextTickDue and Tick's election clock: exact for a follower that hears
// its leader (it falls silent), one that never did (its timer fires), a
// pre-voting one and a candidate (they ask again), a lost one (it
// queries), and a leader with a lease (it shortens every tick).
func TestNextTickDueIsTheFirstTickThatActs(t *testing.T) {
	nextTickDueIsExact(t, "hearing its leader", follower2(t, Persisted{}))
	fresh, _ := New(Config{ID: 2, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10, Seed: 2}, Persisted{})
	nextTickDueIsExact(t, "never heard a leader", fresh)
	r := follower2(t, Persisted{})
	r.ElectionTimeout()
	r.Advance(r.Ready())
	r.Tick()
	nextTickDueIsExact(t, "pre-voting", r)
	r = follower2(t, Persisted{})
	r.Campaign()
	r.Advance(r.Ready())
	r.Tick()
	nextTickDueIsExact(t, "candidate", r)
	lost, _ := New(Config{ID: 2, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10, HeartbeatTicks: 3, Seed: 2}, Persisted{PromiseLost: true, LostNonce: 1})
	lost.Tick()
	lost.Advance(lost.Ready())
	nextTickDueIsExact(t, "lost", lost)
	lost.Tick()
	lost.Tick() // one tick before its next queries
	nextTickDueIsExact(t, "lost, a tick from its queries", lost)
	r = follower2(t, Persisted{})
	for r.silentIn() > 1 {
		r.Tick()
	}
	nextTickDueIsExact(t, "a tick from falling silent", r)
	c, _ := settled3(t)
	c.tick(1)
	if c.rs[1].Status().LeaseTicks == 0 {
		t.Fatal("setup: no lease")
	}
	if due := c.rs[1].NextTickDue(); due != 1 {
		t.Fatalf("leader: due in %d", due)
	}
}

// tickLost: a lost replica asks, every HeartbeatTicks, only the peers
// that have not reported.
func TestLostReplicaAsksOnlyTheUnreportedEveryHeartbeat(t *testing.T) {
	r, _ := New(Config{ID: 1, Replicas: []NodeID{1, 2, 3}, ElectionTicks: 10, HeartbeatTicks: 3, Seed: 1}, Persisted{PromiseLost: true, LostNonce: 7})
	queries := func() []NodeID {
		rd := r.Ready()
		r.Advance(rd)
		var to []NodeID
		for _, m := range rd.Messages {
			if m.Type == MsgPromiseQuery {
				to = append(to, m.To)
			}
		}
		return to
	}
	r.Tick()
	if to := queries(); !slices.Equal(to, []NodeID{2, 3}) {
		t.Fatalf("first tick asks %v", to)
	}
	r.Step(Message{Type: MsgPromiseReport, From: 2, To: 1, Epoch: 4, Tick: 7})
	for i := 1; i <= 3; i++ {
		r.Tick()
		to := queries()
		if want := []NodeID(nil); i < 3 && !slices.Equal(to, want) {
			t.Fatalf("tick %d after a query asks %v", i, to)
		}
		if i == 3 && !slices.Equal(to, []NodeID{3}) {
			t.Fatalf("a heartbeat on, it asks %v, want n3 only", to)
		}
	}
}

// stepPromiseReport: a PROMISE_UNKNOWN from a peer that reported since
// the loss (or said so before) is stale: it clears no report.
func TestStaleUnknownClearsNoReport(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.settle()
	c.loseHardState(3, 5)
	r := c.rs[3]
	r.Step(Message{Type: MsgPromiseReport, From: 1, To: 3, Epoch: 1, Tick: 5})
	r.Step(Message{Type: MsgPromiseUnknown, From: 1, To: 3, Tick: 5})
	r.Step(Message{Type: MsgPromiseReport, From: 2, To: 3, Epoch: 1, Tick: 5})
	if st := r.Status(); st.PromiseLost {
		t.Fatalf("n3 still lost after both peers reported: %+v", st)
	}
}

// recoverPromise's `unknown == 0`: in a group of two, the lost replica
// recovers on its one peer's report.
func TestLostReplicaOfTwoRecoversOnItsPeersReport(t *testing.T) {
	r, _ := New(Config{ID: 2, Replicas: []NodeID{1, 2}, ElectionTicks: 10, Seed: 1}, Persisted{PromiseLost: true, LostNonce: 3})
	r.Step(Message{Type: MsgPromiseReport, From: 1, To: 2, Epoch: 4, Tick: 3})
	// It promises the bound to no one.
	if st := r.Status(); st.PromiseLost || st.Hard != (HardState{Promised: 4}) {
		t.Fatalf("after its peer's report: %+v", st)
	}
}

// TransferTo: asking again for the transfer in progress changes nothing,
// and TIMEOUT_NOW goes once.
func TestTransferAskedTwiceSendsOneTimeoutNow(t *testing.T) {
	c, _ := transferCluster(t, Mutations{}, nil)
	n := 0
	c.drop = func(m Message) bool {
		if m.Type == MsgTimeoutNow {
			n++
			return true // the target never campaigns
		}
		return false
	}
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	c.settle()
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatalf("asking again for the same target: %v", err)
	}
	c.tick(3) // more FLUSHED from n2
	if st := c.rs[1].Status(); n != 1 || st.TransferTo != 2 {
		t.Fatalf("%d TIMEOUT_NOW, transfer to %d", n, st.TransferTo)
	}
}

// stepTimeoutNow: only the leader it follows, in its epoch, makes a
// follower campaign.
func TestTimeoutNowFromAnotherOrAnOlderLeaderIsIgnored(t *testing.T) {
	r := follower2(t, Persisted{})
	r.Step(Message{Type: MsgTimeoutNow, From: 3, To: 2, Epoch: 1})
	if st := r.Status(); st.Role != Follower || st.Hard.Promised != 1 {
		t.Fatalf("after a TIMEOUT_NOW from n3: %+v", st)
	}
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 3, PrevSeq: 4, PrevEpoch: 1})
	r.Advance(r.Ready())
	r.Step(Message{Type: MsgTimeoutNow, From: 1, To: 2, Epoch: 1})
	if st := r.Status(); st.Role != Follower || st.Hard.Promised != 3 {
		t.Fatalf("after its leader's TIMEOUT_NOW of an older epoch: %+v", st)
	}
	r.Step(Message{Type: MsgTimeoutNow, From: 1, To: 2, Epoch: 3})
	if st := r.Status(); st.Role != Candidate {
		t.Fatalf("after its leader's TIMEOUT_NOW: %+v", st)
	}
}

// tickTransfer's `!r.readOnly`: a read-only leader wants no transfer
// under ReleaseBeforeTransfer.
func TestReadOnlyLeaderWantsNoTransfer(t *testing.T) {
	c := newClusterWith(t, 3, SyncAll, func(cfg *Config) {
		rebalanceConfig(cfg)
		cfg.ReleaseBeforeTransfer = true
	})
	c.elect(2)
	c.propose(2, "a")
	c.cut[3] = true // under sync_all the leader is read-only; n1 keeps up
	readOnly := 0
	for range 80 {
		c.tick(1)
		st := c.rs[2].Status()
		if st.ReadOnly {
			readOnly++
		}
		if st.ReadOnly && st.TransferWanted != 0 {
			t.Fatalf("read-only leader wants a transfer: %+v", st)
		}
	}
	if readOnly < 60 {
		t.Fatalf("setup: read-only for %d ticks", readOnly)
	}
}

// failingStore fails the one operation named by fail.
type failingStore struct {
	testStore
	fail string
}

var errStore = errors.New("store failed")

func (s failingStore) InstallSnapshot(m SnapshotMeta) error {
	if s.fail == "snapshot" {
		return errStore
	}
	return s.testStore.InstallSnapshot(m)
}

func (s failingStore) SetHardState(h HardState) error {
	if s.fail == "hard" {
		return errStore
	}
	return s.testStore.SetHardState(h)
}

func (s failingStore) TruncateAfter(seq uint64) error {
	if s.fail == "truncate" {
		return errStore
	}
	return s.testStore.TruncateAfter(seq)
}

func (s failingStore) Append(e []Entry) error {
	if s.fail == "append" {
		return errStore
	}
	return s.testStore.Append(e)
}

func (s failingStore) Sync() error {
	if s.fail == "sync" {
		return errStore
	}
	return s.testStore.Sync()
}

func (s failingStore) Entries(first, last uint64) ([]Entry, error) {
	if s.fail == "entries" {
		return nil, errStore
	}
	return s.testStore.Entries(first, last)
}

// Executor: a store error stops the Ready where it happened — nothing
// after it is written or sent, Advance is not called — and Run returns it.
func TestExecutorStopsAtAStoreError(t *testing.T) {
	setups := map[string]func(c *cluster) NodeID{
		// n2 takes a snapshot, a promise, a truncation and entries in one Ready.
		"follower": func(c *cluster) NodeID {
			r := c.rs[2]
			r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 2, PrevSeq: 2, PrevEpoch: 1, Entries: []Entry{{Seq: 3, Epoch: 2}}})
			return 2
		},
		// n1 leads and must read entries for a lagging n3.
		"leader": func(c *cluster) NodeID {
			c.rs[1].next[c.rs[1].peerIndex(3)] = 2
			c.rs[1].dirty[c.rs[1].peerIndex(3)] = true
			return 1
		},
	}
	for _, tc := range []struct{ setup, fail string }{
		{"follower", "hard"}, {"follower", "truncate"}, {"follower", "append"}, {"follower", "sync"}, {"leader", "entries"},
	} {
		c := newCluster(t, 3, SyncQuorum)
		c.elect(1)
		c.propose(1, "a")
		c.propose(1, "b") // n2's log 1..3 of epoch 1, committed to 2
		c.queue = nil
		id := setups[tc.setup](c)
		r := c.rs[id]
		before := r.Status()
		x := &Executor{Store: failingStore{testStore{c, id}, tc.fail}, Send: func(m Message) { c.queue = append(c.queue, m) }}
		_, err := x.Run(r)
		if !errors.Is(err, errStore) {
			t.Fatalf("%s, %s fails: Run returned %v", tc.setup, tc.fail, err)
		}
		if len(c.queue) != 0 {
			t.Fatalf("%s, %s fails: sent %v", tc.setup, tc.fail, c.queue)
		}
		if tc.setup == "follower" && r.Status().Durable != min(before.Durable, 2) {
			t.Fatalf("%s, %s fails: durable %d (was %d): Advance ran", tc.setup, tc.fail, r.Status().Durable, before.Durable)
		}
		s := c.stores[id]
		switch tc.fail {
		case "hard":
			if s.hard.Promised != 1 || len(s.log) != 3 || len(s.unsynced) != 0 {
				t.Fatalf("hard fails: store %+v", s)
			}
		case "truncate":
			if len(s.log) != 3 || len(s.unsynced) != 0 {
				t.Fatalf("truncate fails: the entries were written: %+v", s)
			}
		}
	}
}

// Executor.Begin with a snapshot: a failed install writes nothing after it.
func TestExecutorStopsAtAFailedInstall(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	r := c.rs[3]
	r.Step(snapshotTo(2, 3, 5, 9, 4, 9))
	x := &Executor{Store: failingStore{testStore{c, 3}, "snapshot"}, Send: func(m Message) { c.queue = append(c.queue, m) }}
	c.queue = nil
	if _, err := x.Begin(r); !errors.Is(err, errStore) {
		t.Fatalf("Begin: %v", err)
	}
	if s := c.stores[3]; s.hard.Promised != 1 || len(c.queue) != 0 {
		t.Fatalf("after a failed install: hard %+v, sent %v", s.hard, c.queue)
	}
	// The install that succeeds goes on to the hard state.
	if _, err := c.executor(3).Run(r); err != nil {
		t.Fatal(err)
	}
	if s := c.stores[3]; s.snapSeq != 9 || s.hard.Promised != 5 {
		t.Fatalf("after the install: snapshot at %d, hard %+v", s.snapSeq, s.hard)
	}
}

// stepPromiseReport's `r.unknown[i]`: a PROMISE_UNKNOWN repeated by a
// peer that said so already clears no report heard since.
func TestRepeatedUnknownClearsNoLaterReport(t *testing.T) {
	r, _ := New(Config{ID: 5, Replicas: []NodeID{1, 2, 3, 4, 5}, ElectionTicks: 10, Seed: 5}, Persisted{PromiseLost: true, LostNonce: 2})
	r.Step(Message{Type: MsgPromiseUnknown, From: 4, To: 5, Tick: 2})
	r.Step(Message{Type: MsgPromiseReport, From: 1, To: 5, Epoch: 3, Tick: 2})
	r.Step(Message{Type: MsgPromiseUnknown, From: 4, To: 5, Tick: 2}) // a duplicate
	r.Step(Message{Type: MsgPromiseReport, From: 2, To: 5, Epoch: 1, Tick: 2})
	r.Step(Message{Type: MsgPromiseReport, From: 3, To: 5, Epoch: 1, Tick: 2})
	if st := r.Status(); st.PromiseLost || st.Hard.Promised != 3 {
		t.Fatalf("after every peer answered: %+v", st)
	}
}

// chasing is a 3-replica group led by n1 (AppendEntriesMax 2, ChaseTicks
// 3) whose n3 is cut off and lag entries behind, no tick run since.
func chasing(t *testing.T, lag int) (*cluster, uint64) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) {
		cfg.AppendEntriesMax, cfg.ChaseTicks, cfg.ReservationTicks, cfg.ReservationEntriesMax = 2, 3, 5, 3
	})
	c.elect(1)
	c.propose(1, "a")
	c.tick(1) // n3 in sync: its chase window starts afresh
	c.cut[3] = true
	for i := range lag {
		c.propose(1, fmt.Sprint(i))
	}
	return c, c.rs[1].Status().Hard.Promised
}

// watchChase: a follower whose lag stays put is revoked at the end of its
// second ChaseTicks window (the first only measures), and reported
// NeedsRebuild; one whose lag shrinks window after window, or that is
// within one Append of the leader, keeps its reservation.
func TestTailChaseRevokesOnlyALagThatDoesNotShrink(t *testing.T) {
	c, _ := chasing(t, 10)
	for tick := 1; tick <= 6; tick++ {
		c.tick(1)
		if got, want := c.rs[1].revoked[2], tick == 6; got != want {
			t.Fatalf("a stuck follower after %d ticks: revoked %v", tick, got)
		}
	}
	if st := c.peerState(1, 3); st != NeedsRebuild {
		t.Fatalf("a revoked follower is %v", st)
	}

	c, e := chasing(t, 10)
	match := c.peerMatch(1, 3)
	for range 12 {
		match++
		c.rs[1].Step(Message{Type: MsgAppendAck, From: 3, To: 1, Epoch: e, FlushedSeq: match})
		c.tick(1)
		if c.rs[1].revoked[2] {
			t.Fatalf("a follower catching up was revoked at match %d", match)
		}
	}

	c, _ = chasing(t, 2)
	c.tick(12)
	if c.rs[1].revoked[2] {
		t.Fatal("a follower one Append behind was revoked")
	}
}

// ChaseFromABaseline: a follower that was in sync one record behind (a lag
// within one Append) and then falls behind gets the same two windows as
// one that was level: its in-sync lag is no baseline for the first.
func TestTailChaseFirstWindowOnlyMeasuresAfterAnInSyncLag(t *testing.T) {
	c, _ := chasing(t, 1)
	c.tick(1) // n3 in sync, one record behind
	if c.peerMatch(1, 3) != c.rs[1].last-1 {
		t.Fatalf("n3 match %d, leader's last %d: want one behind", c.peerMatch(1, 3), c.rs[1].last)
	}
	for i := range 10 {
		c.propose(1, fmt.Sprint("b", i))
	}
	for tick := 1; tick <= 6; tick++ {
		c.tick(1)
		if got, want := c.rs[1].revoked[2], tick == 6; got != want {
			t.Fatalf("a stuck follower after %d ticks: revoked %v", tick, got)
		}
	}
}

// RetainFloor: a follower pins the leader's log while heard within
// ReservationTicks and at most ReservationEntriesMax behind — both
// bounds included.
func TestReservationBoundsAreInclusive(t *testing.T) {
	c, _ := chasing(t, 3)
	match := c.peerMatch(1, 3)
	for tick := 1; tick <= 6; tick++ {
		c.tick(1)
		floor := c.rs[1].RetainFloor()
		if pinned := floor == match; pinned != (tick <= 5) {
			t.Fatalf("after %d silent ticks (reservation 5): floor %d, n3 at %d", tick, floor, match)
		}
	}
	c, _ = chasing(t, 4)
	if floor, match := c.rs[1].RetainFloor(), c.peerMatch(1, 3); floor == match {
		t.Fatalf("a follower 4 behind (bound 3) pins the log at %d", floor)
	}
}

// New: a replica counts its ticks from 1 (a Message's Tick 0 is none).
func TestTicksStartAtOne(t *testing.T) {
	r, err := New(Config{ID: 1, Replicas: []NodeID{1, 2, 3}}, Persisted{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Ticks(); got != 1 {
		t.Fatalf("Ticks() = %d at New", got)
	}
}

// stepAppend's snapshot skip matches the first entry kept at the seq
// before it, with that seq's own epoch (the snapshot point's here).
func TestAppendBelowTheSnapshotMatchesAtTheSnapshotPoint(t *testing.T) {
	r := follower2(t, PersistedFrom(HardState{Promised: 2, PromisedTo: 1},
		[]Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1}, {Seq: 3, Epoch: 1}, {Seq: 4, Epoch: 2}}))
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 2, PrevSeq: 4, PrevEpoch: 2, CommitSeq: 4})
	r.Advance(r.Ready())
	if got := r.CompactTo(3); got != 3 {
		t.Fatalf("compacted to %d", got)
	}
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 2, PrevSeq: 1, PrevEpoch: 1, CommitSeq: 4,
		Entries: []Entry{{Seq: 2, Epoch: 1}, {Seq: 3, Epoch: 1}, {Seq: 4, Epoch: 2}, {Seq: 5, Epoch: 2}}})
	rd := r.Ready()
	if len(rd.Messages) != 1 || rd.Messages[0].Reject != RejectNone || rd.Messages[0].FlushedSeq != 5 || len(rd.Entries) != 1 {
		t.Fatalf("Ready %+v", rd)
	}
}

// wellFormed's seq-space bound: an Append that ends at the last seq but
// one is well formed.
func TestAppendAtTheEndOfTheSeqSpace(t *testing.T) {
	top := ^uint64(0) - 2
	r := follower2(t, PersistedFromSnapshot(HardState{Promised: 1, PromisedTo: 1}, top, 1, nil))
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: 1, PrevSeq: top, PrevEpoch: 1, Entries: []Entry{{Seq: top + 1, Epoch: 1}}})
	rd := r.Ready()
	if len(rd.Messages) != 1 || rd.Messages[0].FlushedSeq != top+1 {
		t.Fatalf("Ready %+v", rd)
	}
}

// stepAppendAck's mismatch step: the next Append to the peer starts after
// its hint, or one entry back when the hint is no lower.
func TestMismatchMovesTheNextAppendToTheHint(t *testing.T) {
	c, e := settled3(t)
	for i := range 6 {
		c.propose(1, fmt.Sprint(i))
	}
	r := c.rs[1]
	last := r.Status().Last
	for _, tc := range []struct{ next, hint, prev uint64 }{{last + 1, 2, 2}, {5, 10, 3}} {
		i := r.peerIndex(2)
		r.next[i] = tc.next
		r.Step(Message{Type: MsgAppendAck, From: 2, To: 1, Epoch: e, Reject: RejectMismatch, HintSeq: tc.hint})
		rd := r.Ready()
		var prev []uint64
		for _, m := range append(rd.Early, rd.Messages...) {
			if m.Type == MsgAppend && m.To == 2 {
				prev = append(prev, m.PrevSeq)
			}
		}
		if !slices.Equal(prev, []uint64{tc.prev}) {
			t.Fatalf("next %d, hint %d: Appends to n2 after prevs %v, want %d", tc.next, tc.hint, prev, tc.prev)
		}
		c.executor(1).Finish(r, rd)
		c.queue = nil
	}
}

// appendFor: after a SNAPSHOT, the peer's next Append goes on from the
// snapshot point — neither a second SNAPSHOT nor a gap after it.
func TestAppendAfterASnapshotGoesOnFromItsPoint(t *testing.T) {
	c, _ := settled3(t)
	c.cut[3] = true
	for i := range 5 {
		c.propose(1, fmt.Sprint(i))
	}
	r := c.rs[1]
	snap := r.CompactTo(r.Status().CommitSeq) // past n3's match: its reservation ignored
	s := c.stores[1]
	s.snapSeq, s.snapEp = snap, s.log[snap-1].Epoch
	if c.peerMatch(1, 3) >= snap {
		t.Fatalf("setup: snapshot at %d, n3 at %d", snap, c.peerMatch(1, 3))
	}
	i := r.peerIndex(3)
	r.next[i] = 1
	var sent []Message
	for range 2 {
		r.dirty[i] = true
		rd := r.Ready()
		for _, m := range append(rd.Early, rd.Messages...) {
			if m.To == 3 {
				sent = append(sent, m)
			}
		}
		if err := c.executor(1).Finish(r, rd); err != nil {
			t.Fatal(err)
		}
		c.queue = nil
	}
	if len(sent) != 2 || sent[0].Type != MsgSnapshot || sent[1].Type != MsgAppend || sent[1].PrevSeq != snap {
		t.Fatalf("to n3: %v, want a SNAPSHOT at %d then an Append after it", sent, snap)
	}
}

// TransferTo's read-only case: a leader that lost its quorum refuses a
// hand-off with ErrQuorumLost.
func TestReadOnlyLeaderRefusesATransfer(t *testing.T) {
	c, _ := settled3(t)
	c.cut[2], c.cut[3] = true, true
	c.tick(c.rs[1].cfg.AckTimeoutTicks + 1)
	if !c.rs[1].Status().ReadOnly {
		t.Fatal("setup: not read-only")
	}
	if err := c.rs[1].TransferTo(2); !errors.Is(err, ErrQuorumLost) {
		t.Fatalf("read-only leader's TransferTo: %v", err)
	}
	if st := c.rs[1].Status(); st.TransferTo != 0 {
		t.Fatalf("read-only leader transfers: %+v", st)
	}
}
