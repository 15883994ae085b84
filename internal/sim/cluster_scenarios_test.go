package sim

import (
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/replica"
)

// TestS3ZombieLeaderFencedAtNodeLevel (S3 at node level): the leader of
// partition 0 is cut off from its peers while its clients keep publishing
// to it. It goes on appending (it cannot commit), the others elect a new
// leader of a later epoch, which commits (its install entry at least); when the cut heals the old
// leader is fenced and follows. Nothing it appended after the cut ever
// becomes visible (those entries had no way to reach a majority), every
// acknowledged record is read back, and the invariants hold throughout.
func TestS3ZombieLeaderFencedAtNodeLevel(t *testing.T) { runCutOffLeader(t, false) }

// TestS2NonQuorumWritesNotRevivedAtNodeLevel (S2 at node level): as S3,
// but the cut-off leader is killed -9 instead of rejoining, and restarts
// from its disk, which holds the entries it appended alone: they are
// never revived.
func TestS2NonQuorumWritesNotRevivedAtNodeLevel(t *testing.T) { runCutOffLeader(t, true) }

// TestS20CompetingWritesAtNodeLevel (S20 at node level): while the cut-off
// leader takes writes from one producer, a second producer of the same
// partition finds the majority's new leader and commits there; after the
// heal the majority's writes are visible, the minority's post-cut writes
// never are, and every acknowledged record is read back.
func TestS20CompetingWritesAtNodeLevel(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		s := newClusterSim(ClusterOptions{Seed: seed, Producers: 4, MessagesPerProducer: 200})
		var zombie *broker
		var epoch, lastAtCut uint64
		var majorityAcked, duringCut int
		second := s.producers[3] // partition 0, like producers[0]
		s.w.after(800, func() {
			if zombie = s.leaderOf(0); zombie == nil {
				return
			}
			v, _ := zombie.node.Replica(simTopic, 0)
			epoch, lastAtCut = v.Status.Hard.Promised, v.Status.Last
			id := uint32(slices.Index(s.nodes, zombie) + 1)
			s.w.tracef("scenario: cut %s off its peers; %s moves to another node", zombie.id, second.name())
			s.net.setCut(id, true, true)
			if second.c != nil && second.c.b == zombie {
				second.c.breakConn("scenario: to the majority")
			}
			s.w.after(2500, func() {
				g := s.ghosts[0]
				for seq := lastAtCut + 1; seq <= g.CommittedLen(); seq++ {
					if e, ok := g.Committed(seq); ok && e.Epoch > epoch && strings.HasPrefix(e.Value, second.name()) {
						duringCut++
					}
				}
				s.net.setCut(id, false, false)
			})
		})
		r := s.runPhases()
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\ntrace tail:\n%v", seed, r.Violation, r.Tail)
		}
		if zombie == nil {
			t.Fatalf("seed %d: no leader of partition 0 at 800 ms", seed)
		}
		g := s.ghosts[0]
		for seq := lastAtCut + 1; seq <= g.CommittedLen(); seq++ {
			e, ok := g.Committed(seq)
			if ok && e.Epoch == epoch {
				t.Fatalf("seed %d: %s's entry %d of epoch %d, appended after it was cut off, became visible (%q)", seed, zombie.id, seq, epoch, e.Value)
			}
			if ok && e.Epoch > epoch && strings.HasPrefix(e.Value, second.name()) {
				majorityAcked++
			}
		}
		if duringCut == 0 {
			t.Fatalf("seed %d: the second producer committed nothing with the majority while the leader was cut off", seed)
		}
		t.Logf("seed %d: %s cut off in epoch %d at last %d; %d of %s's writes committed with the majority during the cut, %d in all", seed, zombie.id, epoch, lastAtCut, duringCut, second.name(), majorityAcked)
	}
}

// runCutOffLeader cuts partition 0's leader off its peers for 2.5 s while
// its clients publish to it; then it rejoins, or (crash) is killed -9 and
// restarts.
func runCutOffLeader(t *testing.T, crash bool) {
	for seed := uint64(1); seed <= 5; seed++ {
		s := newClusterSim(ClusterOptions{Seed: seed, MessagesPerProducer: 200})
		var zombie *broker
		var zombieID uint32
		var epoch, lastAtCut, lastDuringCut uint64
		var newerCommitted bool
		var watch func()
		watch = func() {
			if zombie == nil || s.healed {
				return
			}
			s.w.after(10, watch)
			if v, ok := zombie.node.Replica(simTopic, 0); ok && zombie.up && v.Status.Hard.Promised == epoch {
				lastDuringCut = max(lastDuringCut, v.Status.Last)
			}
			for _, b := range s.nodes {
				if v, ok := b.node.Replica(simTopic, 0); b != zombie && b.up && ok && v.Status.Role == replica.Leader &&
					v.Status.Hard.Promised > epoch && installOf(v.Status) <= v.Status.CommitSeq {
					newerCommitted = true
				}
			}
		}
		s.w.after(800, func() {
			zombie = s.leaderOf(0)
			if zombie == nil {
				return
			}
			v, _ := zombie.node.Replica(simTopic, 0)
			epoch, lastAtCut = v.Status.Hard.Promised, v.Status.Last
			zombieID = uint32(slices.Index(s.nodes, zombie) + 1)
			s.w.tracef("scenario: cut %s (leader of partition 0, epoch %d, last %d) off its peers", zombie.id, epoch, lastAtCut)
			s.net.setCut(zombieID, true, true)
			watch()
			s.w.after(2500, func() {
				if crash {
					s.w.tracef("scenario: kill -9 %s", zombie.id)
					zombie.crash() // it restarts from its disk
				}
				s.net.setCut(zombieID, false, false)
				s.w.tracef("scenario: %s rejoins", zombie.id)
			})
		})
		r := s.runPhases()
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\ntrace tail:\n%v", seed, r.Violation, r.Tail)
		}
		switch {
		case zombie == nil:
			t.Fatalf("seed %d: no leader of partition 0 at 800 ms", seed)
		case lastDuringCut <= lastAtCut:
			t.Fatalf("seed %d: the cut-off leader appended nothing while cut off (last %d)", seed, lastAtCut)
		case !newerCommitted:
			t.Fatalf("seed %d: no leader of a later epoch committed while %s was cut off", seed, zombie.id)
		}
		g := s.ghosts[0]
		for seq := lastAtCut + 1; seq <= g.CommittedLen(); seq++ {
			if e, ok := g.Committed(seq); ok && e.Epoch == epoch {
				t.Fatalf("seed %d: %s's entry %d of epoch %d, appended after it was cut off, became visible (%q)", seed, zombie.id, seq, epoch, e.Value)
			}
		}
		t.Logf("seed %d: %s cut off in epoch %d at last %d, appended through %d; a later leader committed; %d acked", seed, zombie.id, epoch, lastAtCut, lastDuringCut, r.Acked)
	}
}
