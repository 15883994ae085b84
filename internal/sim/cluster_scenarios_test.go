package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/node"
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
			s.w.tracef("scenario: cut %s off its peers", zombie.id)
			s.net.setCut(id, true, true)
			// Once the majority leads partition 0 and __meta (a producer's
			// first request, DECLARE, goes to __meta's leader: forwarded to
			// the cut-off one, it waited out its 2 s deadline, most of the
			// cut, on seed 4), the second producer moves there.
			var move func()
			move = func() {
				if !s.ledOutside(zombie, simTopic) || !s.ledOutside(zombie, meta.MetaTopic) {
					s.w.after(10, move)
					return
				}
				s.w.tracef("scenario: %s moves to another node", second.name())
				if second.c != nil && second.c.b == zombie {
					second.c.breakConn("scenario: to the majority")
				}
			}
			move()
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

// ledOutside reports whether an up node other than z leads partition 0 of
// topic in its own view.
func (s *sim) ledOutside(z *broker, topic string) bool {
	for _, b := range s.nodes {
		if b == z || !b.up {
			continue
		}
		if v, ok := b.node.Replica(topic, 0); ok && v.Status.Role == replica.Leader {
			return true
		}
	}
	return false
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
			if !zombie.up {
				return // (a crashed node has no state to read)
			}
			if v, ok := zombie.node.Replica(simTopic, 0); ok && v.Status.Hard.Promised == epoch {
				lastDuringCut = max(lastDuringCut, v.Status.Last)
			}
			for _, b := range s.nodes {
				if b == zombie || !b.up {
					continue
				}
				if v, ok := b.node.Replica(simTopic, 0); ok && v.Status.Role == replica.Leader &&
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

// TestS12BestLineageWinsAtNodeLevel (S12 at node level): partition 1's
// leader is cut off while its producer keeps writing to it, so it appends
// entries alone (its epoch e, up to seq H). The other two elect a leader
// of a later epoch, which commits its install entry below H. That leader
// is then killed -9 and the cut heals at once: the old leader holds the
// highest seq, the remaining follower the best lineage (a later last
// epoch). The group must follow the lineage, not the seq: the old
// leader's entries of epoch e after the cut are truncated and never
// visible, the later epoch's committed entries stay (the invariants run
// after every event), and every acknowledged record is read back.
func TestS12BestLineageWinsAtNodeLevel(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		if why := bestLineageWins(t, seed, node.Mutations{}); why != "" {
			t.Fatalf("seed %d: %s", seed, why)
		}
	}
}

// bestLineageWins runs S12 on one seed and returns how it went wrong ("").
func bestLineageWins(t *testing.T, seed uint64, m node.Mutations) string {
	{
		s := newClusterSim(ClusterOptions{Seed: seed, MessagesPerProducer: 200, Mutations: m})
		var zombie, successor *broker
		var zombieID uint32
		var epoch, lastAtCut uint64
		var zombieLast, followerLast, followerEpoch uint64
		var stage func()
		stage = func() {
			if s.healed || successor != nil {
				return
			}
			for _, b := range s.nodes {
				if v, ok := b.node.Replica(simTopic, 1); b != zombie && b.up && ok && v.Status.Role == replica.Leader &&
					v.Status.Hard.Promised > epoch && installOf(v.Status) <= v.Status.CommitSeq {
					successor = b
				}
			}
			if successor == nil {
				s.w.after(5, stage)
				return
			}
			zv, _ := zombie.node.Replica(simTopic, 1)
			zombieLast = zv.Status.Last
			for _, b := range s.nodes {
				if v, ok := b.node.Replica(simTopic, 1); b != zombie && b != successor && ok {
					followerLast, followerEpoch = v.Status.Last, v.Status.Epochs[len(v.Status.Epochs)-1].Epoch
				}
			}
			s.w.tracef("scenario: kill -9 %s (leader of partition 1 in a later epoch); %s (last %d, epoch %d) rejoins; the third holds last %d of epoch %d",
				successor.id, zombie.id, zombieLast, epoch, followerLast, followerEpoch)
			successor.crash()
			s.net.setCut(zombieID, false, false)
		}
		s.w.after(800, func() {
			if zombie = s.leaderOf(1); zombie == nil {
				return
			}
			v, _ := zombie.node.Replica(simTopic, 1)
			epoch, lastAtCut = v.Status.Hard.Promised, v.Status.Last
			zombieID = uint32(slices.Index(s.nodes, zombie) + 1)
			s.w.tracef("scenario: cut %s (leader of partition 1, epoch %d, last %d) off its peers", zombie.id, epoch, lastAtCut)
			s.net.setCut(zombieID, true, true)
			s.w.after(300, stage)
		})
		r := s.runPhases()
		if r.Violation != nil {
			return fmt.Sprintf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
		}
		if zombie == nil || successor == nil {
			t.Fatalf("seed %d: the scenario never staged (old leader %v, successor %v)", seed, zombie != nil, successor != nil)
		}
		if zombieLast <= followerLast || followerEpoch <= epoch {
			t.Fatalf("seed %d: at the heal %s held last %d of epoch %d, the follower last %d of epoch %d: not S12", seed, zombie.id, zombieLast, epoch, followerLast, followerEpoch)
		}
		g := s.ghosts[1]
		for seq := lastAtCut + 1; seq <= g.CommittedLen(); seq++ {
			if e, ok := g.Committed(seq); ok && e.Epoch == epoch {
				return fmt.Sprintf("%s's entry %d of epoch %d, appended after it was cut off, became visible (%q)", zombie.id, seq, epoch, e.Value)
			}
		}
		t.Logf("seed %d: at the heal %s held last %d of epoch %d, the follower last %d of epoch %d; %d acked",
			seed, zombie.id, zombieLast, epoch, followerLast, followerEpoch, r.Acked)
	}
	return ""
}

// TestS12MutationIsCaught: with PREPARE grants ignoring lineage the old
// leader's higher seq can win over the later epoch's committed entries.
func TestS12MutationIsCaught(t *testing.T) {
	caught := 0
	for seed := uint64(1); seed <= 5; seed++ {
		if why := bestLineageWins(t, seed, node.Mutations{Replica: replica.Mutations{GrantIgnoresLineage: true}}); why != "" {
			caught++
			t.Logf("seed %d: %s", seed, strings.SplitN(why, "\n", 2)[0])
		}
	}
	if caught == 0 {
		t.Fatal("grants ignoring lineage went unnoticed on every seed")
	}
}
