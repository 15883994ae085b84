package sim

import (
	"fmt"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
)

// TestS19ChainOfCustodyAtNodeLevel (S19 at node level): partition 0's
// leader is killed -9 every 600 ms, six times, while its producer
// publishes; each kill promotes another replica (the killed node
// restarts from its disk and rejoins). Every acknowledged record keeps
// its seq and epoch through the chain of reigns — the run's
// CommittedPrefixAgreement, VisibleMonotonic and AckedNeverLost after
// every event, and every acknowledged record read back at the end — and
// the chain is long: at least six elections of partition 0, its leaders
// on more than one node. With replica.Mutations.GrantIgnoresLineage a
// replica behind the others can be promoted and the run breaks.
func TestS19ChainOfCustodyAtNodeLevel(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		r, elections, leaders, err := runLeaderKiller(seed, node.Mutations{})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if elections < 6 || leaders < 2 {
			t.Fatalf("seed %d: a short chain: %d elections of partition 0, led on %d nodes", seed, elections, leaders)
		}
		t.Logf("seed %d: %d elections of partition 0, led on %d nodes, %d acked", seed, elections, leaders, r.Acked)
	}
	expectCaught(t, 10, []string{"CommittedPrefixAgreement", "AckedNeverLost", "VisibleMonotonic", "UncommittedNotRevived"}, func(seed uint64) *Violation {
		r, _, _, _ := runLeaderKiller(seed, node.Mutations{Replica: replica.Mutations{GrantIgnoresLineage: true}})
		return r.Violation
	})
}

// runLeaderKiller kills partition 0's leader every 600 ms, six times,
// and reports the run, partition 0's elections and the nodes that led it.
func runLeaderKiller(seed uint64, m node.Mutations) (r Result, elections, leaders int, err error) {
	s := newClusterSim(ClusterOptions{Seed: seed, Producers: 1, MessagesPerProducer: 1500, Mutations: m})
	led := map[string]bool{}
	kills := 0
	var kill func()
	kill = func() {
		if kills == 6 {
			return
		}
		if b := s.leaderOf(0); b != nil {
			led[b.id] = true
			kills++
			s.w.tracef("scenario: kill -9 %s, leader of partition 0 (kill %d)", b.id, kills)
			b.crash()
		}
		s.w.after(600, kill)
	}
	s.w.after(600, kill)
	r = s.runPhases()
	if b := s.leaderOf(0); b != nil {
		led[b.id] = true
	}
	if r.Violation == nil && kills < 6 {
		err = fmt.Errorf("only %d kills before the run ended", kills)
	}
	if r.Violation != nil {
		err = fmt.Errorf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	}
	return r, s.ghosts[0].Elections(), len(led), err
}
