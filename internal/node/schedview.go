package node

import "github.com/nereus-broker/nereus/internal/sched"

// SchedShardView is what one shard's runner at this node says of its
// owner: the lifecycle, the owner epoch and each lane's runtime readiness
// (the simulator's checkers read it).
type SchedShardView struct {
	Shard     uint32
	Lifecycle sched.Lifecycle
	Epoch     uint64
	Lanes     map[string]sched.Readiness // by destination topic
}

// SchedViews returns the views of the shards this node runs a runner
// for (none before the first schedule). Manual mode only: the runners'
// state belongs to the driver's goroutine, which must be the caller.
func (n *Node) SchedViews() []SchedShardView {
	if !n.cfg.Manual {
		panic("node: SchedViews on a node that runs its own goroutines")
	}
	n.schedMu.Lock()
	runners := n.sched
	n.schedMu.Unlock()
	var out []SchedShardView
	for _, r := range runners {
		if r == nil {
			continue
		}
		v := SchedShardView{Shard: r.shard, Lifecycle: r.o.Lifecycle(), Epoch: r.o.Epoch(), Lanes: map[string]sched.Readiness{}}
		for _, t := range r.st.Lanes() {
			v.Lanes[t] = r.o.LaneReadiness(t)
		}
		out = append(out, v)
	}
	return out
}

// SchedEntry returns schedule id of shard as this node's runner applied
// it from the shard's committed records (Manual mode only, as
// SchedViews).
func (n *Node) SchedEntry(shard uint32, id uint64) (sched.Entry, bool) {
	if !n.cfg.Manual {
		panic("node: SchedEntry on a node that runs its own goroutines")
	}
	n.schedMu.Lock()
	runners := n.sched
	n.schedMu.Unlock()
	if int(shard) >= len(runners) || runners[shard] == nil {
		return sched.Entry{}, false
	}
	return runners[shard].st.Entry(id)
}
