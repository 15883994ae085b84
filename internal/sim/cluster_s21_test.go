package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
)

// TestS21IsolatedFollowerAtNodeLevel (S21 at node level): once a
// partition that takes no writes is led by its preferred leader (so no
// graceful transfer is due), a follower of it — a node that does not lead
// __meta — is cut off from its peers for 2.5 s, long enough for its
// election timer to fire several times, then from the leader alone for
// 1.5 s (the third node hears both), then rejoins; the one producer
// publishes to another partition throughout. Cut off it only pre-votes,
// persisting nothing; cut off from the leader alone its pre-votes reach
// the third node, which still holds the leader's lease and refuses them.
// The leader keeps its office and its epoch and the follower's promise
// does not move (checked every 10 ms until 1.5 s after the heal), and the
// run's invariants hold. With replica.Mutations.PreVoteIgnoresLease the
// third node grants and the follower campaigns (its promise moves) on
// seed 1.
func TestS21IsolatedFollowerAtNodeLevel(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		deposed, err := runIsolatedFollower(seed, node.Mutations{})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if deposed != "" {
			t.Fatalf("seed %d: %s", seed, deposed)
		}
	}
	for seed := uint64(1); ; seed++ {
		if seed > 10 {
			t.Fatal("PreVoteIgnoresLease: the leader kept its office on seeds 1-10")
		}
		if deposed, _ := runIsolatedFollower(seed, node.Mutations{Replica: replica.Mutations{PreVoteIgnoresLease: true}}); deposed != "" {
			t.Logf("PreVoteIgnoresLease, seed %d: %s", seed, deposed)
			return
		}
	}
}

// runIsolatedFollower runs S21 at node level: deposed says how the
// watched partition's leader lost its office or epoch, or the follower's
// promise moved (empty: neither); err is a violation of the run's
// invariants or a run that did not get where it is for.
func runIsolatedFollower(seed uint64, m node.Mutations) (deposed string, err error) {
	s := newClusterSim(ClusterOptions{Seed: seed, Producers: 1, MessagesPerProducer: 1500, Mutations: m})
	// The partition watched takes no writes (the one producer publishes
	// to partition 0), so the cut-off follower's log stays as good as the
	// others' and only the leader's lease stands between it and office.
	const quiet = 2
	var leader, cut *broker
	var epoch, promised uint64
	checks := 0
	var start func()
	start = func() {
		if leader = s.leaderOf(quiet); leader == nil || s.preferredLeaderOf(quiet) != leader.id {
			leader = nil
			s.w.after(50, start)
			return
		}
		for _, b := range s.nodes {
			if v, ok := b.node.Replica(meta.MetaTopic, 0); b != leader && b.up && ok && v.Status.Role != replica.Leader {
				cut = b
				break
			}
		}
		if cut == nil {
			return
		}
		lv, _ := leader.node.Replica(simTopic, quiet)
		cv, _ := cut.node.Replica(simTopic, quiet)
		epoch, promised = lv.Status.Hard.Promised, cv.Status.Hard.Promised
		id := uint32(slices.Index(s.nodes, cut) + 1)
		s.w.tracef("scenario: cut follower %s off its peers (partition %d led by %s in epoch %d)", cut.id, quiet, leader.id, epoch)
		s.net.setCut(id, true, true)
		lid := uint32(slices.Index(s.nodes, leader) + 1)
		s.w.after(2500, func() {
			s.w.tracef("scenario: %s is cut off from %s only", cut.id, leader.id)
			s.net.setCut(id, false, false)
			s.net.cut[[2]uint32{id, lid}], s.net.cut[[2]uint32{lid, id}] = true, true
		})
		s.w.after(4000, func() {
			s.w.tracef("scenario: %s rejoins", cut.id)
			s.net.setCut(id, false, false)
		})
		var watch func()
		watch = func() {
			if deposed != "" || checks == 550 {
				return
			}
			checks++
			lv, _ := leader.node.Replica(simTopic, quiet)
			cv, _ := cut.node.Replica(simTopic, quiet)
			switch {
			case !leader.up || lv.Status.Role != replica.Leader || lv.Status.Hard.Promised != epoch:
				deposed = fmt.Sprintf("%s no longer leads partition %d in epoch %d at check %d (role %v, promised %d)", leader.id, quiet, epoch, checks, lv.Status.Role, lv.Status.Hard.Promised)
			case cv.Status.Hard.Promised != promised:
				deposed = fmt.Sprintf("the cut-off follower %s's promise of partition %d moved from %d to %d at check %d", cut.id, quiet, promised, cv.Status.Hard.Promised, checks)
			default:
				s.w.after(10, watch)
			}
		}
		watch()
	}
	s.w.after(800, start)
	r := s.runPhases()
	switch {
	case r.Violation != nil:
		return deposed, fmt.Errorf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	case cut == nil:
		return deposed, fmt.Errorf("partition %d never led by its preferred leader with a follower outside __meta's leader", quiet)
	case deposed == "" && checks < 550:
		return deposed, fmt.Errorf("the run ended %d checks in, before 1.5 s after the heal", checks)
	}
	return deposed, nil
}

// preferredLeaderOf is the first replica of partition p's placement, as
// an up node knows it ("" when none does).
func (s *sim) preferredLeaderOf(p uint32) string {
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		for _, t := range b.node.Metadata([]string{simTopic}) {
			if int(p) < len(t.Partitions) && len(t.Partitions[p].Replicas) > 0 {
				return t.Partitions[p].Replicas[0].Node
			}
		}
	}
	return ""
}
