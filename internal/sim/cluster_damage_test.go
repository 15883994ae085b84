package sim

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
)

// flipValue flips a bit of value's last copy in file on node b (media
// damage: current and durable content) and marks b damaged for the
// checker, as flipMinorityBit does. It reports false when the file's
// durable content does not hold value.
func flipValue(s *sim, b *broker, file string, value []byte) bool {
	durable, err := b.fs.DurableBytes(file)
	at := bytes.LastIndex(durable, value)
	if err != nil || len(value) == 0 || at < 0 {
		return false
	}
	s.flipped[b.id] = true // the checker counts a damaged disk's holdings
	return b.fs.FlipBit(file, int64(at), 0) == nil
}

// TestCoordinatorReadDamageIsRebuiltAtNodeLevel (scripted; the bug of soak
// seeds 30078 and 30161): while the cluster runs, bits flip in the
// coordinator's (partition 0's leader's) copy of partition 1's newest
// committed records, and every consumer connection breaks, so the
// group's unacknowledged messages must be read again from that copy to be
// redelivered. The read finds the damage; the member must drop the range
// and be made whole from a healthy replica (it reports Rebuilding), and
// every acknowledged message is still consumed — a group that kept
// retrying the damaged read would hold those messages in flight for good
// and fail liveness.
func TestCoordinatorReadDamageIsRebuiltAtNodeLevel(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		if why := coordinatorReadDamage(t, seed, node.Mutations{}); why != "" {
			t.Fatalf("seed %d: %s", seed, why)
		}
	}
}

// coordinatorReadDamage runs the scenario on one seed; why is what went
// wrong ("": nothing).
func coordinatorReadDamage(t *testing.T, seed uint64, m node.Mutations) (why string) {
	const p = 1
	s := newClusterSim(ClusterOptions{Seed: seed, MessagesPerProducer: 400, Steps: 200_000, Mutations: m})
	var coord *broker
	var first, last uint64 // the seqs flipped
	rebuilt := false
	var watch func()
	watch = func() {
		if coord.up {
			if v, ok := coord.node.Replica(simTopic, p); ok && v.Status.Rebuilding {
				rebuilt = true
				return
			}
		}
		s.w.after(1, watch)
	}
	var stage func()
	stage = func() {
		if s.healed {
			return
		}
		v, ok := coord.node.Replica(simTopic, p)
		if !ok || v.Synced < 20 || s.ghosts[p].CommittedLen() < v.Synced {
			s.w.after(1, stage)
			return
		}
		files := segmentFiles(coord.fs, p)
		file := files[len(files)-1]
		// Flip a bit in the value of each of the last 20 synced, committed
		// records still in the active segment.
		for seq := v.Synced; seq > v.Synced-20; seq-- {
			e, ok := s.ghosts[p].Committed(seq)
			if !ok || !flipValue(s, coord, file, []byte(e.Value)) {
				break
			}
			first = seq
			if last == 0 {
				last = seq
			}
		}
		s.w.tracef("scenario: flip a bit in each of seqs %d-%d of %s's copy of partition %d; break every consumer connection", first, last, coord.id, p)
		for _, c := range s.consumers {
			for _, cn := range c.conns() {
				cn.breakConn("scenario")
			}
		}
		watch()
	}
	s.w.after(400, func() {
		if coord = s.leaderOf(0); coord != nil {
			stage()
		}
	})
	r := s.runPhases()
	if r.Violation != nil {
		return fmt.Sprintf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	}
	if coord == nil || last == 0 {
		t.Fatalf("seed %d: the scenario never staged", seed)
	}
	if !rebuilt {
		return fmt.Sprintf("%s never dropped and rebuilt its damaged copy of seqs %d-%d", coord.id, first, last)
	}
	t.Logf("seed %d: %s's copy of partition %d seqs %d-%d flipped; it rebuilt them; %d acked, %d deliveries", seed, coord.id, p, first, last, r.Acked, r.Deliveries)
	return ""
}

// TestApplierDamageIsRebuiltAtNodeLevel (scripted; the bug of regression
// seed 8): a sync_all topic whose logs roll 1 KiB segments. Partition 1's
// leader is killed -9 and restarted; right after it opened its log (which
// verified it), a bit flips in a committed record of a sealed segment.
// Its applier then reads the committed records back from the log (a
// restarted member's entry cache is empty) and meets the damage: the
// member must drop the range and be made whole from a healthy replica (it
// reports Rebuilding). An applier that only retried the read would hold
// that replica's applied position — and, on a sync_all leader, every
// PUB_OK — for good.
func TestApplierDamageIsRebuiltAtNodeLevel(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		if why := applierDamage(t, seed); why != "" {
			t.Fatalf("seed %d: %s", seed, why)
		}
	}
}

func applierDamage(t *testing.T, seed uint64) (why string) {
	const p = 1
	s := newClusterSim(ClusterOptions{Seed: seed, MessagesPerProducer: 400, Steps: 200_000, SyncAll: true,
		Retention: ClusterRetention{SegmentBytesMax: 1024}})
	var victim *broker
	var flippedSeq uint64
	var flippedAt, rebuiltAt int64
	var watch func()
	watch = func() {
		if victim.up {
			if v, ok := victim.node.Replica(simTopic, p); ok && v.Status.Rebuilding {
				rebuiltAt = s.w.nowMs
				return
			}
		}
		s.w.after(1, watch)
	}
	restart := func() {
		victim.stopRestarts = false
		victim.start()
		if !victim.up {
			t.Fatalf("seed %d: %s did not restart", seed, victim.id)
		}
		files := segmentFiles(victim.fs, p)
		file := files[len(files)-3] // sealed
		g := s.ghosts[p]
		for seq := g.CommittedLen(); seq > 0 && flippedSeq == 0; seq-- {
			if e, ok := g.Committed(seq); ok && flipValue(s, victim, file, []byte(e.Value)) {
				flippedSeq, flippedAt = seq, s.w.nowMs
			}
		}
		s.w.tracef("scenario: %s restarted; flip a bit of committed seq %d in its sealed %s", victim.id, flippedSeq, strings.TrimPrefix(file, dataDir+"/"))
		watch()
	}
	var stage func()
	stage = func() {
		if s.healed {
			return
		}
		if len(segmentFiles(victim.fs, p)) < 4 {
			s.w.after(1, stage)
			return
		}
		s.w.tracef("scenario: kill -9 %s", victim.id)
		victim.stopRestarts = true // restarted by the scenario
		victim.crash()
		s.w.after(50, restart)
	}
	s.w.after(400, func() {
		if victim = s.leaderOf(p); victim != nil {
			stage()
		}
	})
	r := s.runPhases()
	if r.Violation != nil {
		return fmt.Sprintf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	}
	if victim == nil || flippedSeq == 0 {
		t.Fatalf("seed %d: the scenario never staged", seed)
	}
	// The applier meets the damage once the leader's commit reaches the
	// restarted member: about 430 ms later on these seeds. Without its
	// report the range is dropped only at the run's final restart (2.6 s
	// later on seed 1), when opening the log finds it.
	if rebuiltAt == 0 || rebuiltAt-flippedAt > 1500 {
		return fmt.Sprintf("%s did not drop and rebuild the damaged range at seq %d within 1.5 s (flipped at %d ms, Rebuilding at %d ms)",
			victim.id, flippedSeq, flippedAt-epochMs, rebuiltAt-epochMs)
	}
	t.Logf("seed %d: %s restarted and its sealed copy of partition %d seq %d flipped; its applier found it and it was Rebuilding %d ms later; %d acked",
		seed, victim.id, p, flippedSeq, rebuiltAt-flippedAt, r.Acked)
	return ""
}
