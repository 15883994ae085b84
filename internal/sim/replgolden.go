package sim

import (
	"fmt"
	"strings"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// ReplicatedGoldenVariants are the recorded traces of one value on the
// replicated path — the leader persists it, APPENDs it, the followers
// persist it and answer FLUSHED, the leader commits it and acknowledges —
// clean, and with the leader killed (kill -9, unsynced writes lost) at
// each step of it.
var ReplicatedGoldenVariants = []string{
	"clean",
	"kill-leader-before-append",    // before the value is written on the leader
	"kill-leader-before-replicate", // durable on the leader, its APPENDs never delivered
	"kill-leader-before-commit",    // durable on every replica, no FLUSHED back yet
	"kill-leader-before-ack",       // committed on the leader, not acknowledged
}

// ReplicatedGoldenResult is a replicated golden run: its trace, the value's
// fate, and the committed prefix every replica ended with.
type ReplicatedGoldenResult struct {
	Trace     []string
	Violation *Violation
	Acked     bool     // the client got its acknowledgement for m1
	Committed []string // the committed values in seq order (install entries as "-")
	Agree     bool     // every replica committed exactly Committed
	Killed    bool     // the variant's kill happened
}

// RunReplicatedGolden runs the scripted replicated golden scenario for a
// variant: three replicas, n1 elected, the client proposes m1 at n1; after
// the variant's kill, n1 restarts 300 ms later, and once some leader
// commits the probe m2 (proposed to whichever replica leads) the run ends
// with every replica caught up. Persists, APPENDs with entries, FLUSHED
// changes, elections and commits are traced; heartbeats are not.
func RunReplicatedGolden(variant string) (ReplicatedGoldenResult, error) {
	known := false
	for _, v := range ReplicatedGoldenVariants {
		known = known || v == variant
	}
	if !known {
		return ReplicatedGoldenResult{}, fmt.Errorf("unknown replicated golden variant %q (know %s)", variant, strings.Join(ReplicatedGoldenVariants, ", "))
	}
	g := newGroupSim(GroupOptions{Seed: 1, GroupSize: 3, KeepTrace: true})
	g.traceIO, g.acks = true, map[[2]replica.NodeID]uint64{}
	res := ReplicatedGoldenResult{}
	g.w.tracef("replicated golden %s", variant)
	g.startAll()
	n1 := g.nodes[0]
	// kill kill -9s n1 from outside its processing; killNow from inside it
	// (unwinding it, as a kill mid-step does).
	kill := func(why string) {
		if res.Killed {
			return
		}
		res.Killed = true
		g.w.tracef("kill -9 n1 %s", why)
		g.crashFor(n1, 300)
	}
	switch variant {
	case "kill-leader-before-append":
		// Armed when m1 is proposed (below): the first disk write after it
		// is m1's.
	case "kill-leader-before-replicate":
		g.beforeSend = func(m replica.Message) bool {
			for _, e := range m.Entries {
				// Lost until the kill: n1 restarted may lead again and
				// send m1 in a later epoch (then delivered).
				if m.From == 1 && recordValue(e.Data) == "m1" && !res.Killed {
					g.w.after(0, func() { kill("after m1 is durable on it, its APPENDs lost") })
					return false
				}
			}
			return true
		}
	case "kill-leader-before-commit":
		g.beforeDeliver = func(m replica.Message) bool {
			if m.To == 1 && m.Type == replica.MsgAppendAck && m.FlushedSeq >= 2 && n1.commit < 2 {
				kill("before any FLUSHED of m1 reaches it")
			}
			return n1.up || m.To != 1
		}
	case "kill-leader-before-ack":
		g.beforeAck = func(n *groupNode, value string) bool {
			if n == n1 && value == "m1" && !res.Killed {
				res.Killed = true
				g.w.tracef("kill -9 n1 after committing m1, before acknowledging it")
				g.w.after(0, func() { g.crashFor(n1, 300) })
				return false
			}
			return n.up
		}
	}
	g.w.after(groupTickMs, g.tick)
	g.w.after(1, func() { g.step(n1, func() { n1.m.Campaign() }) })
	// m1 once n1 leads with its install committed.
	var proposeM1 func()
	proposeM1 = func() {
		if !n1.up || n1.m.Status().Role != replica.Leader || n1.m.CommitSeq() < 1 {
			g.w.after(1, proposeM1)
			return
		}
		if variant == "kill-leader-before-append" {
			n1.killOnDisk = func(op vfs.Op, name string) bool {
				if op == vfs.OpWrite && strings.HasSuffix(name, ".log") {
					res.Killed = true
					g.w.tracef("kill -9 n1 before writing m1")
					return true
				}
				return false
			}
		}
		g.proposeAt(n1, "m1", true)
	}
	g.w.after(1, proposeM1)
	// The probe m2, once m1 is settled: acknowledged, or the kill happened.
	probed := false
	var probe func()
	probe = func() {
		if probed {
			return
		}
		g.w.after(5, probe)
		if _, ok := g.acked["m1"]; !ok && !res.Killed {
			return
		}
		for _, n := range g.nodes {
			if n.up && n.m.Status().Role == replica.Leader && n.m.CommitSeq() >= installOf(n.m.Status()) {
				g.proposeAt(n, "m2", true)
				probed = true
				return
			}
		}
	}
	g.w.after(5, probe)
	const eventsMax = 50_000
	for g.w.events < eventsMax && g.violation == nil && g.w.next() {
		if seq, ok := g.acked["m2"]; ok && g.caughtUp(seq) {
			break
		}
	}
	if _, ok := g.acked["m2"]; !ok && g.violation == nil {
		g.violate(Liveness, "the probe m2 was never acknowledged")
	}
	_, res.Acked = g.acked["m1"]
	res.Committed, res.Agree = g.committedValues()
	g.w.tracef("end: m1 acked=%v, committed %s, replicas agree=%v", res.Acked, strings.Join(res.Committed, " "), res.Agree)
	res.Trace, res.Violation = g.w.trace.all, g.violation
	return res, nil
}

// installOf is the seq of the install entry of the epoch a leader leads.
func installOf(st replica.Status) uint64 {
	for _, e := range st.Epochs {
		if e.Epoch == st.Hard.Promised {
			return e.StartSeq
		}
	}
	return ^uint64(0)
}

// caughtUp reports whether every replica is up with a commit of at least seq.
func (g *groupSim) caughtUp(seq uint64) bool {
	for _, n := range g.nodes {
		if !n.up || n.commit < seq {
			return false
		}
	}
	return true
}

// committedValues lists the committed prefix and reports whether every
// replica's durable log holds exactly it up to its commit.
func (g *groupSim) committedValues() ([]string, bool) {
	var out []string
	for seq := uint64(1); ; seq++ {
		e, ok := g.ghost.Committed(seq)
		if !ok {
			break
		}
		v := e.Value
		if v == "" {
			v = "-"
		}
		out = append(out, v)
	}
	agree := true
	for _, n := range g.nodes {
		start, log, err := n.durableLog()
		agree = agree && err == nil && n.commit == uint64(len(out))
		for i, e := range log {
			seq := start + uint64(i)
			c, _ := g.ghost.Committed(seq)
			agree = agree && (seq > n.commit || e == c)
		}
	}
	return out, agree
}

// recordValue is the value of a replicated entry's record ("" for an
// install entry or an undecodable one).
func recordValue(data []byte) string {
	if len(data) == 0 {
		return ""
	}
	r, err := storage.DecodeRecord(data)
	if err != nil {
		return ""
	}
	return string(r.Value)
}
