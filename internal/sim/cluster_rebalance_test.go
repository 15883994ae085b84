package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// TestLeadershipReturnsToThePreferredLeader (issue 16, balanced
// leadership, at node level): partition 0's preferred leader P (the first
// replica of its placement) leads it; P is killed -9 and stays down until
// another node has taken over (a failover); then it restarts. Once it has
// caught up and kept up for a while, the leader hands partition 0 back to
// it with a graceful transfer (TIMEOUT_NOW), and every node leads one
// partition again. Throughout, partition 0's idempotent producer keeps
// publishing: every acknowledged record is read back, none twice (the
// run's checkers, after every event), and the hand-off leaves partition 0
// without a writable leader for less than one election timeout of virtual
// time — against the failover's gap, which an election timeout bounds
// from below.
func TestLeadershipReturnsToThePreferredLeader(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		st, err := preferredLeaderReturns(seed, true)
		if err != "" {
			t.Fatalf("seed %d: %s", seed, err)
		}
		if st.returnedAtMs < 0 {
			t.Fatalf("seed %d: leadership never returned to %s (%s)", seed, st.preferred, st)
		}
		if st.handoffGapMs >= electionMs {
			t.Fatalf("seed %d: the hand-off left partition 0 without a writable leader for %d ms, an election timeout is %d ms (%s)", seed, st.handoffGapMs, electionMs, st)
		}
		if st.ackedDuringHandoffWindow == 0 {
			t.Fatalf("seed %d: nothing acknowledged in the 500 ms after the hand-off: the producer was not publishing through it (%s)", seed, st)
		}
		if !st.balanced {
			t.Fatalf("seed %d: leaders not balanced after the return: %v (%s)", seed, st.leaders, st)
		}
		t.Logf("seed %d: %s", seed, st)
	}
}

// TestLeadershipStaysWithoutRebalance is the same script with
// NoLeaderRebalance: leadership never returns to P, so the test above
// observes the transfer, not an accident of the run.
func TestLeadershipStaysWithoutRebalance(t *testing.T) {
	st, err := preferredLeaderReturns(1, false)
	if err != "" {
		t.Fatal(err)
	}
	if st.returnedAtMs >= 0 {
		t.Fatalf("leadership returned to %s with rebalancing off (%s)", st.preferred, st)
	}
	t.Logf("%s", st)
}

// electionMs is the cluster's election timeout (the kernel's default 30
// ticks of clusterTick).
const electionMs = 30 * int64(clusterTick/1e6)

// rebalanceRun is what one run of the script saw, in virtual ms.
type rebalanceRun struct {
	preferred                      string
	killedAtMs, failedOverAtMs     int64
	restartedAtMs, returnedAtMs    int64
	failoverGapMs, handoffGapMs    int64 // longest time without a writable leader of partition 0
	ackedDuringHandoffWindow       int
	leaders                        map[string]int // partitions led per node after the return
	balanced                       bool
	acked                          int
	notLeaderErrors, unavailErrors int
}

func (r rebalanceRun) String() string {
	return fmt.Sprintf("%s killed at %d ms, failover at %d ms (gap %d ms); restarted at %d ms; led again at %d ms (hand-off gap %d ms, %d records acked in the 500 ms after it); leaders %v; %d acked, %d NOT_LEADER and %d UNAVAILABLE answers",
		r.preferred, r.killedAtMs, r.failedOverAtMs, r.failoverGapMs, r.restartedAtMs, r.returnedAtMs, r.handoffGapMs, r.ackedDuringHandoffWindow, r.leaders, r.acked, r.notLeaderErrors, r.unavailErrors)
}

// preferredLeaderReturns runs the script on one seed; it returns what it
// saw and the run's violation ("" when none).
func preferredLeaderReturns(seed uint64, rebalance bool) (rebalanceRun, string) {
	const p = uint32(0)
	// One producer, on partition 0, still publishing when the partition
	// is handed back (about 3 s in).
	s := newClusterSim(ClusterOptions{Seed: seed, Producers: 1, MessagesPerProducer: 1000, Consumers: 1, NoLeaderRebalance: !rebalance})
	st := rebalanceRun{killedAtMs: -1, failedOverAtMs: -1, restartedAtMs: -1, returnedAtMs: -1}
	var pref *broker
	// writable: some up node leads partition 0, has taken office (its
	// install committed), is not read-only and not handing over.
	writable := func() (*broker, bool) {
		for _, b := range s.nodes {
			if !b.up {
				continue
			}
			if v, ok := b.node.Replica(simTopic, p); ok && v.Status.Role == replica.Leader && !v.Status.ReadOnly &&
				v.Status.TransferTo == 0 && v.Status.CommitSeq >= installOf(v.Status) {
				return b, true
			}
		}
		return nil, false
	}
	t0 := s.w.nowMs
	var gapFrom int64 = -1
	var lastAcks int
	done := false
	var watch func()
	watch = func() {
		if done || s.w.nowMs-t0 > 20_000 {
			return
		}
		s.w.after(1, watch)
		now := s.w.nowMs - t0
		l, ok := writable()
		switch {
		case !ok && gapFrom < 0:
			gapFrom = now
		case ok && gapFrom >= 0:
			gap := now - gapFrom
			if st.restartedAtMs < 0 {
				st.failoverGapMs = max(st.failoverGapMs, gap)
			} else {
				st.handoffGapMs = max(st.handoffGapMs, gap)
			}
			gapFrom = -1
		}
		if st.killedAtMs >= 0 && st.failedOverAtMs < 0 && ok && l != pref {
			st.failedOverAtMs = now
			s.w.tracef("scenario: %s leads partition %d after the failover; restart %s in 500 ms", l.id, p, pref.id)
			s.w.after(500, func() {
				pref.stopRestarts = false
				pref.start()
				st.restartedAtMs = s.w.nowMs - t0
			})
		}
		if st.restartedAtMs >= 0 && st.returnedAtMs < 0 && ok && l == pref {
			st.returnedAtMs = now
			s.w.tracef("scenario: %s leads partition %d again", pref.id, p)
			lastAcks = len(s.chk.acked)
			s.w.after(500, func() {
				st.ackedDuringHandoffWindow = len(s.chk.acked) - lastAcks
				st.leaders = map[string]int{}
				for q := uint32(0); q < s.opts.Partitions; q++ {
					if b := s.leaderOf(q); b != nil {
						st.leaders[b.id]++
					}
				}
				st.balanced = len(st.leaders) == len(s.nodes)
				done = true
			})
		}
	}
	s.w.after(800, func() {
		for _, b := range s.nodes {
			for _, tp := range b.node.Metadata([]string{simTopic}) {
				if pref == nil && len(tp.Partitions) > int(p) && len(tp.Partitions[p].Replicas) > 0 {
					id := tp.Partitions[p].Replicas[0].Node
					pref = s.nodes[slices.IndexFunc(s.nodes, func(n *broker) bool { return n.id == id })]
				}
			}
		}
		if pref == nil || s.leaderOf(p) != pref {
			return // checked below
		}
		st.preferred = pref.id
		st.killedAtMs = s.w.nowMs - t0
		s.w.tracef("scenario: kill -9 %s, partition %d's preferred leader, and keep it down until a failover", pref.id, p)
		pref.stopRestarts = true
		pref.crash()
		watch()
	})
	r := s.runPhases()
	st.acked = r.Acked
	st.notLeaderErrors, st.unavailErrors = r.PubErrors[wire.CodeNotLeader], r.PubErrors[wire.CodeUnavailable]
	switch {
	case r.Violation != nil:
		return st, fmt.Sprintf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	case st.killedAtMs < 0:
		return st, fmt.Sprintf("partition %d's preferred leader did not lead it at 800 ms", p)
	case st.failedOverAtMs < 0 || st.restartedAtMs < 0:
		return st, fmt.Sprintf("no failover, or no restart (%s)", st)
	}
	return st, ""
}
