package sim

import (
	"bytes"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
)

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
		dir := path.Join(dataDir, "topics", simTopic, fmt.Sprint(p))
		names, _ := coord.fs.List(dir)
		names = slices.DeleteFunc(names, func(n string) bool { return !strings.HasSuffix(n, ".log") })
		slices.Sort(names)
		file := path.Join(dir, names[len(names)-1])
		durable, err := coord.fs.DurableBytes(file)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		// Flip a bit in the value of each of the last 20 synced, committed
		// records still in the active segment.
		for seq := v.Synced; seq > v.Synced-20; seq-- {
			e, ok := s.ghosts[p].Committed(seq)
			at := bytes.LastIndex(durable, []byte(e.Value))
			if !ok || at < 0 {
				break
			}
			s.flipped[coord.id] = true // as flipMinorityBit: the checker counts a damaged disk's holdings
			if err := coord.fs.FlipBit(file, int64(at), 0); err != nil {
				t.Fatalf("seed %d: flip seq %d: %v", seed, seq, err)
			}
			first = seq
			if last == 0 {
				last = seq
			}
		}
		s.w.tracef("scenario: flip a bit in each of seqs %d-%d of %s's copy of partition %d; break every consumer connection", first, last, coord.id, p)
		for _, c := range s.consumers {
			if c.c != nil && c.c.open {
				c.c.breakConn("scenario")
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
