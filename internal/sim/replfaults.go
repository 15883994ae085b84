package sim

// The replica-group simulator's faults and its healing.

import "github.com/nereus-broker/nereus/internal/replica"

func (g *groupSim) fault() {
	if g.healed {
		return
	}
	g.w.after(g.w.between(50, 500), g.fault)
	n := g.nodes[g.w.rng.IntN(len(g.nodes))]
	kinds := 5
	if g.opts.DiskFaults {
		kinds++
	}
	if g.opts.ClockFaults {
		kinds += 2
	}
	kind := g.w.rng.IntN(kinds)
	if kind >= 5 && !g.opts.DiskFaults {
		kind++ // no disk fault: the clock faults follow
	}
	switch kind {
	case 0: // kill -9 and restart from the durable store
		if n.up {
			g.w.tracef("n%d kill -9", n.id)
			g.crash(n)
		}
	case 1: // isolate a node both ways
		g.w.tracef("partition n%d away", n.id)
		g.setCut(n.id, true, true)
		g.w.after(g.w.between(100, 1500), func() { g.setCut(n.id, false, false); g.w.tracef("heal n%d", n.id) })
	case 2: // one-way: n hears nothing
		g.w.tracef("one-way: n%d deaf", n.id)
		g.setCut(n.id, false, true)
		g.w.after(g.w.between(100, 1500), func() { g.setCut(n.id, false, false); g.w.tracef("heal n%d", n.id) })
	case 3:
		g.dropP = 0.3
		g.w.tracef("network drops 30%%")
		g.w.after(g.w.between(50, 500), func() { g.dropP = 0; g.w.tracef("network drops off") })
	case 4:
		g.dupP = 0.3
		g.w.tracef("network duplicates 30%%")
		g.w.after(g.w.between(50, 500), func() { g.dupP = 0; g.w.tracef("network duplicates off") })
	case 5: // its disk fails for a while: a write or fsync fails, or it dies just before one
		if n.up && !n.diskFailing {
			n.diskFailing = true
			g.w.tracef("n%d disk failing", n.id)
			g.w.after(g.w.between(100, 1500), func() {
				if n.diskFailing {
					n.diskFailing = false
					g.w.tracef("n%d disk healthy", n.id)
				}
			})
		}
	case 6: // the process stalls (VM pause, SIGSTOP), then resumes
		if n.up && !n.paused(g.w.nowMs) {
			n.pausedUntil = g.w.nowMs + g.w.between(100, 1500)
			g.w.tracef("n%d stalls until %d", n.id, n.pausedUntil-epochMs)
			g.stalls++
		}
	case 7: // its clock runs fast: timers fire early
		if n.up && n.tickRate <= 1 {
			n.tickRate = 2 + g.w.rng.IntN(3)
			g.w.tracef("n%d clock runs %dx fast", n.id, n.tickRate)
			g.fastClocks++
			d := g.w.between(100, 1500)
			g.clockSkewedUntilMs = max(g.clockSkewedUntilMs, g.w.nowMs+d+2*2*groupElectionTicks*groupTickMs)
			g.w.after(d, func() {
				if n.tickRate > 1 {
					n.tickRate = 0
					g.w.tracef("n%d clock back to normal", n.id)
				}
			})
		}
	}
}

// setCut cuts (or restores) the links from and/or to a node.
func (g *groupSim) setCut(id replica.NodeID, from, to bool) {
	for _, o := range g.nodes {
		if o.id == id {
			continue
		}
		g.cut[[2]replica.NodeID{id, o.id}] = from
		g.cut[[2]replica.NodeID{o.id, id}] = to
	}
}

// heal stops faults, restarts everyone, and requires a leader to commit a
// final value and every acknowledged value to be in the committed prefix.
func (g *groupSim) heal() {
	g.healed = true
	clear(g.cut)
	g.dropP, g.dupP = 0, 0
	for _, n := range g.nodes {
		n.diskFailing = false
		if !n.up {
			g.start(n)
		}
	}
	g.w.tracef("heal: faults off")
	// New values keep coming; one of them must commit (a value proposed
	// to a leader that loses office before committing it is not enough).
	g.opts.Proposals = g.nextValue + 1000
	deadline := g.w.nowMs + 60_000
	for g.violation == nil && g.w.nowMs < deadline && !g.healAcked && g.w.next() {
	}
	if g.violation != nil {
		return
	}
	if !g.healAcked {
		for _, n := range g.nodes {
			st := n.m.Status()
			g.w.tracef("n%d %s promised=%+v leader=%d last=%d durable=%d commit=%d readOnly=%v", n.id, st.Role, st.Hard, st.Leader, st.Last, st.Durable, st.CommitSeq, st.ReadOnly)
		}
		g.violate(Liveness, "no value committed within 60s after healing")
		return
	}
	for value, seq := range g.acked {
		e, ok := g.ghost.Committed(seq)
		if !ok || e.Value != value {
			g.violate(AckedNeverLost, "%s acked at %d, committed prefix has %q", value, seq, e.Value)
			return
		}
	}
}
