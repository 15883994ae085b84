package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
)

// TestS22UncertainGrantAtNodeLevel (S22 at node level, scripted): on
// partition 1 one follower ("lagging") is cut off, so the leader commits
// with the other follower ("damaged") alone. At a moment when everything
// the damaged follower has synced is committed and beyond what the
// lagging one holds, the damaged follower is killed -9 and a bit flips in
// the last batch on its disk: at restart nothing proves that batch was
// flushed, so storage cuts it as a torn write — committed entries the
// follower acknowledged are gone from it. Then the leader is cut off and
// the lagging follower rejoins: the two that remain both lack the lost
// entries, so neither may take office until the leader returns (the
// damaged follower's grant is uncertain and vouches for less). Every
// committed entry survives, the damaged follower reports itself
// Uncertain meanwhile, and every acknowledged record is read back.
func TestS22UncertainGrantAtNodeLevel(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		r, why := uncertainGrant(t, seed, node.Mutations{})
		if why != "" {
			t.Fatalf("seed %d: %s", seed, why)
		}
		if r.ReplicaStates["Uncertain (self)"] == 0 {
			t.Fatalf("seed %d: the damaged follower never reported itself Uncertain: %v", seed, r.ReplicaStates)
		}
	}
}

// TestS22MutationIsCaughtAtNodeLevel: with uncertain grants trusted as any
// other, the two remaining members elect a leader without the lost
// entries and rewrite committed seqs — seen as such, or first by a
// consumer: the group's acks of partition 1 are among the lost committed
// entries, so the new leader redelivers an acknowledged message.
func TestS22MutationIsCaughtAtNodeLevel(t *testing.T) {
	m := node.Mutations{Replica: replica.Mutations{TrustUncertainGrants: true}}
	for seed := uint64(1); seed <= 3; seed++ {
		_, why := uncertainGrant(t, seed, m)
		if !strings.HasPrefix(why, string(CommittedPrefixAgreement)) && !strings.HasPrefix(why, string(AckFloorNeverRedelivered)) {
			t.Fatalf("seed %d: want a %s or %s violation, got %q", seed, CommittedPrefixAgreement, AckFloorNeverRedelivered, why)
		}
		t.Logf("seed %d: %s", seed, strings.SplitN(why, "\n", 2)[0])
	}
}

// uncertainGrant runs S22 on one seed; why is the violation ("": none).
func uncertainGrant(t *testing.T, seed uint64, m node.Mutations) (r Result, why string) {
	const p = 1
	// Steps: the fault phase must outlast the staging (the producers are
	// never held up here, so events come fast), and so must the producers.
	s := newClusterSim(ClusterOptions{Seed: seed, MessagesPerProducer: 400, Steps: 200_000, Mutations: m})
	var leader, lagging, damaged *broker
	// lost: damaged's last synced seq (committed), in the batch flipped;
	// restartedLast: its log's end after the restart cut that batch.
	var lost, laggingLast, restartedLast uint64
	var flipped string
	idOf := func(b *broker) uint32 { return uint32(slices.Index(s.nodes, b) + 1) }
	var stage func()
	stage = func() {
		if s.healed {
			return
		}
		dv, dok := damaged.node.Replica(simTopic, p)
		lv, lok := lagging.node.Replica(simTopic, p)
		if !damaged.up || !dok || !lok || dv.Synced != dv.Status.Last || dv.Synced <= lv.Status.Last || s.ghosts[p].CommittedLen() < dv.Synced {
			s.w.after(1, stage) // wait for a quiet moment: all it wrote synced and committed
			return
		}
		lost, laggingLast = dv.Synced, lv.Status.Last
		// Flip a bit of seq lost's value, in the last batch on disk (the
		// log may have zero-filled space after it).
		files := segmentFiles(damaged.fs, p)
		file := files[len(files)-1]
		if e, ok := s.ghosts[p].Committed(lost); !ok || !flipValue(s, damaged, file, []byte(e.Value)) {
			t.Fatalf("seed %d: flip seq %d's value in %s", seed, lost, file)
		}
		damaged.crash()
		var restarted func()
		restarted = func() {
			if damaged.up {
				v, _ := damaged.node.Replica(simTopic, p)
				restartedLast = v.Status.Last
				return
			}
			s.w.after(1, restarted)
		}
		s.w.after(1, restarted)
		flipped = file
		s.w.tracef("scenario: flip a bit of the last synced entry of %s and kill -9 it (synced through %d, all committed) in %s; cut %s off, %s (last %d) rejoins",
			damaged.id, lost, strings.TrimPrefix(file, dataDir+"/"), leader.id, lagging.id, laggingLast)
		s.net.setCut(idOf(lagging), false, false) // first: it clears every link of lagging's
		s.net.setCut(idOf(leader), true, true)
		s.w.after(2500, func() {
			s.w.tracef("scenario: %s rejoins", leader.id)
			s.net.setCut(idOf(leader), false, false)
		})
	}
	s.w.after(400, func() {
		if leader = s.leaderOf(p); leader == nil {
			return
		}
		for _, b := range s.nodes {
			switch {
			case b == leader:
			case lagging == nil:
				lagging = b
			default:
				damaged = b
			}
		}
		s.w.tracef("scenario: cut %s off; %s (leader of partition %d) commits with %s", lagging.id, leader.id, p, damaged.id)
		s.net.setCut(idOf(lagging), true, true)
		s.w.after(200, stage)
	})
	r = s.runPhases()
	if r.Violation != nil {
		return r, fmt.Sprintf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	}
	if leader == nil || flipped == "" {
		t.Fatalf("seed %d: the scenario never staged (leader %v, flipped %q)", seed, leader != nil, flipped)
	}
	if restartedLast == 0 || restartedLast >= lost {
		t.Fatalf("seed %d: %s restarted with its log ending at %d; the flip should have cut seq %d", seed, damaged.id, restartedLast, lost)
	}
	t.Logf("seed %d: %s lost seqs %d-%d (committed) with its last batch; %s held %d; %d acked", seed, damaged.id, restartedLast+1, lost, lagging.id, laggingLast, r.Acked)
	return r, ""
}
