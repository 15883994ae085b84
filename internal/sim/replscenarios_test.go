package sim

// Targeted replica-group configurations for DESIGN §5 scenarios whose
// faults are best randomized (S5 flapping replica, S19 chain of custody,
// S20 live partition with competing writes): RunGroup's kernels, durable
// stores, network and invariant checkers, with the random fault injector
// replaced by the scenario's own schedule, and final-state checks against
// the reference (the committed prefix the checkers collected).

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/replica"
)

// Invariants the scenario runs add to the group checkers.
const (
	// UncommittedNotRevived: a value proposed in epoch e after an entry of
	// a later epoch was already visible can never commit — no majority
	// takes an epoch-e append any more, and every later lineage carries
	// the later entry, hence nothing of epoch e after it — so it must
	// never become visible nor be acknowledged.
	UncommittedNotRevived = "UncommittedNotRevived"
	// Converged: after healing, with no new writes, one leader has
	// committed its whole log, every replica holds exactly that log (the
	// committed prefix) with the same commit, and every follower is InSync.
	Converged = "Converged"
	// FlapCorruption: a replica's durable log disagrees with the committed
	// prefix at a seq it reported visible, or holds an entry of the same
	// (seq, epoch) as a committed one with other data.
	FlapCorruption = "FlapCorruption"
	// LeaderDeposed: a replica promised a newer epoch than the established
	// leader's although that leader stayed healthy and reachable from a
	// majority the whole run (an election for nothing).
	LeaderDeposed = "LeaderDeposed"
)

type scenarioRun struct {
	g      *groupSim
	doomed map[string]bool
	faults int    // faults the schedule injected
	reign  uint64 // S21: the epoch of the leader established before the first fault
}

// newScenarioRun sets up what RunGroup sets up, minus the random faults
// and with the tracking proposer.
func newScenarioRun(o GroupOptions) *scenarioRun {
	g := newGroupSim(o)
	g.startAll()
	s := &scenarioRun{g: g, doomed: map[string]bool{}}
	g.w.after(groupTickMs, g.tick)
	g.w.after(5, s.propose)
	return s
}

// propose is groupSim.propose, remembering the values that are doomed
// when proposed (see UncommittedNotRevived).
func (s *scenarioRun) propose() {
	g := s.g
	g.w.after(g.w.between(5, 40), s.propose)
	if g.nextValue >= g.opts.Proposals {
		return
	}
	var newest uint64 // the latest epoch of any visible entry
	for seq := uint64(1); seq <= g.ghost.CommittedLen(); seq++ {
		e, _ := g.ghost.Committed(seq)
		newest = max(newest, e.Epoch)
	}
	for _, n := range g.nodes {
		if !n.up {
			continue
		}
		value := fmt.Sprintf("v%d", g.nextValue)
		_, epoch, ok := g.proposeAt(n, value, false)
		if !ok {
			continue
		}
		g.nextValue++
		if epoch < newest {
			s.doomed[value] = true
			g.w.tracef("%s doomed: e%d visible", value, newest)
		}
	}
}

// leader is the live replica leading the newest epoch, nil if none.
func (s *scenarioRun) leader() *groupNode {
	var best *groupNode
	for _, n := range s.g.nodes {
		if st := n.m.Status(); n.up && st.Role == replica.Leader && (best == nil || st.Hard.Promised > best.m.Status().Hard.Promised) {
			best = n
		}
	}
	return best
}

// kill kill -9s n and restarts it from its durable store after d ms.
func (s *scenarioRun) kill(n *groupNode, d int64) {
	g := s.g
	if !n.up {
		return
	}
	commit := n.commit
	s.faults++
	g.w.tracef("n%d kill -9", n.id)
	g.crashFor(n, d)
	s.checkDurable(n, commit)
}

// checkDurable: a replica's durable log holds the committed entry at every
// seq it reported visible (through commit), and no entry that shares a
// committed entry's (seq, epoch) differs from it (one leader per epoch
// writes a seq once).
func (s *scenarioRun) checkDurable(n *groupNode, commit uint64) {
	g := s.g
	if n.m == nil {
		return // it did not reopen: already a violation
	}
	start, log, err := n.durableLog()
	if err != nil {
		g.violate(FlapCorruption, "n%d: %v", n.id, err)
		return
	}
	if st := n.m.Status(); commit > st.SnapSeq && commit >= start+uint64(len(log)) {
		g.violate(FlapCorruption, "n%d reported %d visible, its durable log ends at %d", n.id, commit, start+uint64(len(log))-1)
		return
	}
	for i, e := range log {
		seq := start + uint64(i)
		c, ok := g.ghost.Committed(seq)
		switch {
		case seq <= commit && (!ok || c != e):
			g.violate(FlapCorruption, "n%d reported %d visible, its durable log holds (e%d %q), committed (e%d %q)", n.id, seq, e.Epoch, e.Value, c.Epoch, c.Value)
			return
		case ok && c.Epoch == e.Epoch && c.Value != e.Value:
			g.violate(FlapCorruption, "n%d holds (%d, e%d) as %q, committed as %q", n.id, seq, e.Epoch, e.Value, c.Value)
			return
		}
	}
}

// finish runs the fault phase, heals (RunGroup's heal: every acked value
// committed, a new value commits), stops writes, and checks convergence
// and the doomed values.
func (s *scenarioRun) finish() GroupResult {
	g := s.g
	for g.w.events < g.opts.Steps && g.violation == nil && g.w.next() {
	}
	if g.violation == nil {
		g.heal()
	}
	if g.violation == nil {
		s.converge()
	}
	if g.violation == nil {
		for _, n := range g.nodes {
			s.checkDurable(n, n.commit)
		}
		for seq := uint64(1); seq <= g.ghost.CommittedLen() && g.violation == nil; seq++ {
			if e, _ := g.ghost.Committed(seq); s.doomed[e.Value] {
				g.violate(UncommittedNotRevived, "%s became visible at %d (e%d) though proposed after a later epoch was visible", e.Value, seq, e.Epoch)
			}
		}
		for v := range s.doomed {
			if _, ok := g.acked[v]; ok && g.violation == nil {
				g.violate(UncommittedNotRevived, "%s acknowledged though proposed after a later epoch was visible", v)
			}
		}
	}
	return g.result()
}

func (s *scenarioRun) converge() {
	g := s.g
	g.opts.Proposals = g.nextValue // no new writes
	deadline := g.w.nowMs + 30_000
	for g.violation == nil && s.converged() != "" && g.w.nowMs < deadline {
		for i := 0; i < 20 && g.w.next(); i++ {
		}
	}
	if why := s.converged(); g.violation == nil && why != "" {
		g.violate(Converged, "30s after healing: %s", why)
	}
}

// converged returns why the group is not (yet) in its expected final
// state, "" once it is.
func (s *scenarioRun) converged() string {
	g := s.g
	l := s.leader()
	if l == nil {
		return "no leader"
	}
	ls := l.m.Status()
	if ls.ReadOnly || ls.CommitSeq != ls.Last {
		return fmt.Sprintf("leader n%d read-only=%v, last %d, commit %d", l.id, ls.ReadOnly, ls.Last, ls.CommitSeq)
	}
	for _, p := range ls.Peers {
		if p.State != replica.InSync {
			return fmt.Sprintf("n%d is %v (match %d) under leader n%d", p.ID, p.State, p.Match, l.id)
		}
	}
	for _, n := range g.nodes {
		if !n.up {
			return fmt.Sprintf("n%d down", n.id)
		}
		st := n.m.Status()
		synced := n.m.ReadLog().SyncedSeq()
		if st.Last != ls.Last || st.CommitSeq != ls.CommitSeq || st.Rebuilding || synced != ls.Last {
			return fmt.Sprintf("n%d last %d commit %d synced %d, leader n%d %d/%d", n.id, st.Last, st.CommitSeq, synced, l.id, ls.Last, ls.CommitSeq)
		}
		start, log, err := n.durableLog()
		if err != nil {
			g.violate(CommittedPrefixAgreement, "n%d: %v", n.id, err)
			return "violation"
		}
		for i, e := range log {
			seq := start + uint64(i)
			if c, ok := g.ghost.Committed(seq); !ok || c != e {
				g.violate(CommittedPrefixAgreement, "n%d ends with (e%d %q) at %d, committed (e%d %q)", n.id, e.Epoch, e.Value, seq, c.Epoch, c.Value)
				return "violation"
			}
		}
	}
	return ""
}

func failScenario(t *testing.T, name string, r GroupResult) {
	t.Helper()
	t.Errorf("%s seed %d: %v\ntrace tail:\n  %s", name, r.Seed, r.Violation, strings.Join(r.Tail, "\n  "))
}

// flapping flaps the last replica: kill -9 (restarted 20-300 ms later,
// now and then only after 0.5-1.5 s: past its 400 ms reservation), cut
// off both ways, deaf (hears nothing) or mute (heard by no one), with
// short connected gaps between. The others stay healthy.
func (s *scenarioRun) flapping() {
	g := s.g
	target := g.nodes[len(g.nodes)-1]
	var flap func()
	flap = func() {
		if g.healed {
			return
		}
		d := g.w.between(20, 300)
		if g.w.chance(0.15) {
			d = g.w.between(500, 1500)
		}
		again := func() { g.w.after(g.w.between(10, 150), flap) }
		switch g.w.rng.IntN(4) {
		case 0:
			s.kill(target, d)
			g.w.after(d, again)
			return
		case 1:
			g.w.tracef("n%d cut off", target.id)
			g.setCut(target.id, true, true)
		case 2:
			g.w.tracef("n%d deaf", target.id)
			g.setCut(target.id, false, true)
		case 3:
			g.w.tracef("n%d mute", target.id)
			g.setCut(target.id, true, false)
		}
		s.faults++
		g.w.after(d, func() { g.setCut(target.id, false, false); g.w.tracef("n%d back", target.id); again() })
	}
	g.w.after(g.w.between(50, 300), flap)
}

// leaderKiller kills whoever leads, again and again (restarting it 50-600
// ms later), with 10% message loss: a chain of promotions with crashes
// between them.
func (s *scenarioRun) leaderKiller() {
	g := s.g
	g.dropP = 0.1
	var hunt func()
	hunt = func() {
		if g.healed {
			return
		}
		g.w.after(g.w.between(150, 800), hunt)
		if l := s.leader(); l != nil {
			s.kill(l, g.w.between(50, 600))
		}
	}
	g.w.after(g.w.between(150, 800), hunt)
}

// partitions splits the group again and again into a minority holding the
// current leader (which goes on accepting writes until its ack timeout)
// and a majority that elects its own leader and writes too; each
// partition lasts 200-1500 ms and heals before the next.
func (s *scenarioRun) partitions() {
	g := s.g
	var split func()
	split = func() {
		if g.healed {
			return
		}
		l := s.leader()
		if l == nil {
			g.w.after(g.w.between(50, 200), split)
			return
		}
		minority := map[replica.NodeID]bool{l.id: true}
		for len(minority) < (len(g.nodes)-1)/2 {
			minority[g.nodes[g.w.rng.IntN(len(g.nodes))].id] = true
		}
		var ids []replica.NodeID
		for _, a := range g.nodes {
			if minority[a.id] {
				ids = append(ids, a.id)
			}
			for _, b := range g.nodes {
				if minority[a.id] != minority[b.id] {
					g.cut[[2]replica.NodeID{a.id, b.id}] = true
				}
			}
		}
		s.faults++
		g.w.tracef("partition: minority %v with leader n%d", ids, l.id)
		g.w.after(g.w.between(200, 1500), func() {
			clear(g.cut)
			g.w.tracef("partition healed")
			g.w.after(g.w.between(100, 600), split)
		})
	}
	g.w.after(g.w.between(200, 600), split)
}

// isolatedFollower (S21) cuts a follower of the established leader off —
// both ways, or deaf (it hears nothing, while its own messages, pre-votes
// included, still arrive) — for 300-1200 ms, so its 100-200 ms election
// timer fires several times, then lets it back for 100-400 ms, again and
// again, with every other replica healthy throughout. Nothing justifies an
// election: from the first fault on, no replica may promise an epoch
// beyond the established leader's (LeaderDeposed, checked every tick).
func (s *scenarioRun) isolatedFollower() {
	g := s.g
	var check func()
	check = func() {
		g.w.after(groupTickMs, check)
		for _, n := range g.nodes {
			if p := n.durablePromise(); p > s.reign {
				g.violate(LeaderDeposed, "n%d promised epoch %d; the leader of epoch %d stayed healthy", n.id, p, s.reign)
			}
		}
	}
	var isolate func()
	isolate = func() {
		if g.healed {
			return
		}
		l := s.leader()
		if s.reign == 0 {
			if l == nil || l.m.CommitSeq() == 0 {
				g.w.after(50, isolate)
				return
			}
			s.reign = l.m.Status().Hard.Promised
			g.w.tracef("leader n%d of epoch %d established", l.id, s.reign)
			check()
		}
		var followers []*groupNode
		for _, n := range g.nodes {
			if l == nil || n.id != l.id {
				followers = append(followers, n)
			}
		}
		n := followers[g.w.rng.IntN(len(followers))]
		if g.w.chance(0.5) {
			g.w.tracef("n%d cut off", n.id)
			g.setCut(n.id, true, true)
		} else {
			g.w.tracef("n%d deaf", n.id)
			g.setCut(n.id, false, true)
		}
		s.faults++
		g.w.after(g.w.between(300, 1200), func() {
			g.setCut(n.id, false, false)
			g.w.tracef("n%d back", n.id)
			g.w.after(g.w.between(100, 400), isolate)
		})
	}
	g.w.after(g.w.between(100, 300), isolate)
}

type scenarioCase struct {
	name  string
	o     GroupOptions
	seeds uint64
}

type campaignStats struct{ faults, elections, acked, rebuilds, doomed int }

// runScenario runs one seed of a scenario configuration.
func runScenario(o GroupOptions, schedule func(*scenarioRun)) (GroupResult, *scenarioRun) {
	s := newScenarioRun(o)
	schedule(s)
	return s.finish(), s
}

// runCampaign runs seeds 1..c.seeds and fails on the first violation.
func runCampaign(t *testing.T, c scenarioCase, schedule func(*scenarioRun)) campaignStats {
	t.Helper()
	var st campaignStats
	seeds := c.seeds // already short: no reduction under -short
	for seed := uint64(1); seed <= seeds; seed++ {
		o := c.o
		o.Seed = seed
		r, s := runScenario(o, schedule)
		if r.Violation != nil {
			failScenario(t, c.name, r)
			t.FailNow()
		}
		st.faults, st.elections, st.acked = st.faults+s.faults, st.elections+r.Elections, st.acked+r.Acked
		st.rebuilds, st.doomed = st.rebuilds+r.Rebuilds, st.doomed+len(s.doomed)
	}
	t.Logf("%d seeds: %d faults, %d elections, %d values acked, %d snapshot rebuilds, %d doomed writes (never visible)",
		seeds, st.faults, st.elections, st.acked, st.rebuilds, st.doomed)
	return st
}

// TestS5FlappingReplicaCampaign: the flapping replica never corrupts its
// log or reports a non-committed entry (checked at every kill and by the
// group checkers), and every run ends Converged — the flapper InSync with
// exactly the committed prefix — having caught up from the log after short
// absences and rebuilt from snapshots after long ones.
func TestS5FlappingReplicaCampaign(t *testing.T) {
	for _, c := range []scenarioCase{
		// Writes go on while the replica flaps (compaction deletes only
		// sealed segments, so a long absence needs new ones behind it).
		{"R3-compacting", GroupOptions{GroupSize: 3, Compact: true, Steps: 8000, Proposals: 400}, 25},
		{"R5-compacting", GroupOptions{GroupSize: 5, Compact: true, Steps: 12000, Proposals: 300}, 10},
		{"R3-sync_all", GroupOptions{GroupSize: 3, Policy: replica.SyncAll, Steps: 8000}, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := runCampaign(t, c, (*scenarioRun).flapping)
			if st.faults < 20*int(c.seeds) {
				t.Fatalf("only %d flaps", st.faults)
			}
			if c.o.Compact && st.rebuilds == 0 {
				t.Fatal("no flap outlasted a reservation: no snapshot rebuild")
			}
		})
	}
}

// TestS19ChainOfCustodyCampaign: long chains of promotions, each after
// the leader was killed; every committed entry keeps its seq and epoch
// through all of them (CommittedPrefixAgreement on every report, and every
// replica ends with exactly the committed prefix).
func TestS19ChainOfCustodyCampaign(t *testing.T) {
	for _, c := range []scenarioCase{
		{"R3", GroupOptions{GroupSize: 3, Steps: 8000}, 25},
		{"R5-compacting", GroupOptions{GroupSize: 5, Compact: true, Steps: 8000}, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := runCampaign(t, c, (*scenarioRun).leaderKiller)
			if st.elections < 10*int(c.seeds) {
				t.Fatalf("chains too short: %d elections in %d seeds", st.elections, c.seeds)
			}
		})
	}
}

// TestS20CompetingWritesCampaign: repeated partitions with a would-be
// leader on each side, both accepting writes. The minority's writes made
// after the majority's side had an entry visible (doomed) never become
// visible or acknowledged, and every run ends Converged with committed
// prefixes agreeing throughout.
func TestS20CompetingWritesCampaign(t *testing.T) {
	for _, c := range []scenarioCase{
		{"R3", GroupOptions{GroupSize: 3, Steps: 8000}, 25},
		{"R5", GroupOptions{GroupSize: 5, Steps: 8000}, 15},
		{"R3-compacting", GroupOptions{GroupSize: 3, Compact: true, Steps: 8000}, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := runCampaign(t, c, (*scenarioRun).partitions)
			if st.doomed == 0 || st.faults < 5*int(c.seeds) {
				t.Fatalf("no competing writes: %d partitions, %d doomed writes", st.faults, st.doomed)
			}
		})
	}
}

// TestS20MutationsAreCaught: the S20 configuration catches a leader that
// commits on its own fsync (the minority would commit) and a follower that
// accepts a stale leader's APPEND (the minority's writes would overwrite
// the majority's).
func TestS20MutationsAreCaught(t *testing.T) {
	for _, c := range []struct {
		name string
		m    replica.Mutations
		want []string
	}{
		{"commit on the leader's own fsync alone", replica.Mutations{CommitOnLeaderFlushAlone: true}, []string{VisibleImpliesQuorumFlushed, UncommittedNotRevived}},
		{"accept a stale-epoch APPEND", replica.Mutations{AcceptStaleAppend: true}, []string{CommittedPrefixAgreement, KernelAssertion, VisibleImpliesQuorumFlushed, AckedNeverLost, UncommittedNotRevived}},
	} {
		t.Run(c.name, func(t *testing.T) {
			expectCaught(t, 20, c.want, func(seed uint64) *Violation {
				r, _ := runScenario(GroupOptions{Seed: seed, GroupSize: 3, Steps: 8000, Mutations: c.m}, (*scenarioRun).partitions)
				return r.Violation
			})
		})
	}
}

// TestS21IsolatedFollowerCampaign: a follower cut off (or deaf) again and
// again, each time long enough for its election timer to fire several
// times, never costs the healthy leader its office (LeaderDeposed): not
// while it is away and not as it rejoins, whatever the network delays.
// Writes go on until a few seconds in (so later absences find the
// follower's lineage as good as the others' and only the lease refuses
// its pre-votes), every run ends with a new write committed after
// healing and Converged, the follower caught up.
func TestS21IsolatedFollowerCampaign(t *testing.T) {
	for _, c := range []scenarioCase{
		{"R3", GroupOptions{GroupSize: 3, Steps: 8000, Proposals: 20}, 25},
		{"R5", GroupOptions{GroupSize: 5, Steps: 8000, Proposals: 20}, 10},
		{"R3-sync_all", GroupOptions{GroupSize: 3, Policy: replica.SyncAll, Steps: 8000, Proposals: 20}, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := runCampaign(t, c, (*scenarioRun).isolatedFollower)
			if st.faults < 3*int(c.seeds) || st.elections != int(c.seeds) {
				t.Fatalf("%d isolations, %d elections in %d seeds", st.faults, st.elections, c.seeds)
			}
		})
	}
}

// TestS21MutationIsCaught: pre-votes granted regardless of the leader's
// lease let a rejoining (or deaf) follower depose the healthy leader.
func TestS21MutationIsCaught(t *testing.T) {
	expectCaught(t, 20, []string{LeaderDeposed}, func(seed uint64) *Violation {
		r, _ := runScenario(GroupOptions{Seed: seed, GroupSize: 3, Steps: 8000, Proposals: 20,
			Mutations: replica.Mutations{PreVoteIgnoresLease: true}}, (*scenarioRun).isolatedFollower)
		return r.Violation
	})
}

// A scenario run replays bit for bit from its seed, like RunGroup.
func TestScenarioRunsAreDeterministic(t *testing.T) {
	for _, schedule := range []func(*scenarioRun){(*scenarioRun).flapping, (*scenarioRun).leaderKiller, (*scenarioRun).partitions, (*scenarioRun).isolatedFollower} {
		o := GroupOptions{Seed: 7, Compact: true, Steps: 4000}
		a, _ := runScenario(o, schedule)
		b, _ := runScenario(o, schedule)
		if a.TraceHash != b.TraceHash || a.Events != b.Events {
			t.Fatalf("seed 7 ran twice differently: %s/%d vs %s/%d", a.TraceHash, a.Events, b.TraceHash, b.Events)
		}
	}
}
