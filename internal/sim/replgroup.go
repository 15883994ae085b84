package sim

import (
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/replica"
)

// GroupOptions configure a replica-group run: the replication kernel of one
// partition on GroupSize simulated nodes, with durable stores that survive
// crashes and a network that drops, duplicates, delays and partitions.
type GroupOptions struct {
	Seed      uint64
	Steps     int // events in the fault phase
	GroupSize int // replicas (default 3)
	Policy    replica.AckPolicy
	Proposals int // values clients try to commit
	// Faults: crashes, symmetric and one-way partitions, message loss and
	// duplication.
	Faults bool
	// DiskFaults (with Faults): for a while a replica's disk is failing:
	// it dies in the middle of carrying out a Ready (an fsync failed, or
	// kill -9 mid-write) with only a prefix of the Ready's writes durable —
	// after a leader's early APPENDs went out, as the replog shell sends
	// them before its own fsync.
	DiskFaults bool
	// ClockFaults (with Faults): a replica's clock runs fast for a while
	// (its timers fire 2-4x early), or the whole process stalls (no ticks,
	// no messages handled, no requests taken) and resumes where it left
	// off, as after a VM pause or SIGSTOP.
	ClockFaults bool
	// Compact makes nodes compact their logs into snapshots as far as
	// RetainFloor allows, so lagging followers rebuild from snapshots.
	Compact   bool
	Mutations replica.Mutations
	// SendBeforePersist is a deliberate shell bug for tests: every message
	// of a Ready (FLUSHED and promises included) goes out before its writes
	// are durable.
	SendBeforePersist bool
	KeepTrace         bool
}

func (o *GroupOptions) setDefaults() {
	if o.Steps == 0 {
		o.Steps = 20_000
	}
	if o.GroupSize == 0 {
		o.GroupSize = 3
	}
	if o.Proposals == 0 {
		o.Proposals = 60
	}
}

// GroupReproduce is the command that runs o again.
func GroupReproduce(o GroupOptions) string {
	o.setDefaults()
	policy := "quorum"
	if o.Policy == replica.SyncAll {
		policy = "all"
	}
	faults := "all"
	if !o.Faults {
		faults = "none"
	}
	return fmt.Sprintf("go run ./cmd/nereus sim --replicas %d --policy %s --faults %s --compact=%v --disk-faults=%v --clock-faults=%v --steps %d --seed %d",
		o.GroupSize, policy, faults, o.Compact, o.DiskFaults, o.ClockFaults, o.Steps, o.Seed)
}

// Invariants of the replication kernel (DESIGN §4).
const (
	OneLeaderPerEpoch           = "OneLeaderPerEpoch"
	InstallNeedsQuorumPromise   = "InstallNeedsQuorumPromise"
	CommittedPrefixAgreement    = "CommittedPrefixAgreement"
	VisibleImpliesQuorumFlushed = "VisibleImpliesQuorumFlushed"
)

const groupTickMs = 10

// groupNode is one simulated replica process: the kernel plus its durable
// store (promise and log), which survives crashes.
type groupNode struct {
	id      replica.NodeID
	k       *replica.Replica
	up      bool
	hard    replica.HardState
	log     []replica.Entry // durable entries; log[i].Seq == i+1 (up to snapSeq: compacted, kept for checks only)
	snapSeq uint64          // compacted into a snapshot up to here
	snapEp  uint64
	commit  uint64 // last commit this incarnation reported
	leading uint64 // epoch it was last seen leading (checker bookkeeping)

	// Faults in force (DiskFaults, ClockFaults).
	diskFailing bool  // the next Ready may die midway
	pausedUntil int64 // world ms: stalled until then
	tickRate    int   // ticks per world tick (0 or 1: normal)
}

func (n *groupNode) paused(nowMs int64) bool { return nowMs < n.pausedUntil }

func (n *groupNode) persisted() replica.Persisted {
	return replica.PersistedFromSnapshot(n.hard, n.snapSeq, n.snapEp, n.log[n.snapSeq:])
}

type proposal struct {
	value      string
	node       replica.NodeID
	seq, epoch uint64
}

type groupSim struct {
	opts      GroupOptions
	w         *World
	nodes     []*groupNode
	cut       map[[2]replica.NodeID]bool // directed links that drop everything
	dropP     float64
	dupP      float64
	healed    bool
	healAcked bool // a value proposed after healing was acknowledged
	nextValue int
	pending   []proposal
	acked     map[string]uint64 // value → committed seq
	committed map[uint64]replica.Entry
	leaders   map[uint64]replica.NodeID
	violation *Violation
	rebuilds  int
	compacts  int
	ticks     int
	// Disk and clock faults that struck.
	midWrite, stalls, fastClocks int

	// Golden runs (replgolden.go): traceIO traces persists, sends (but
	// heartbeats and repeated FLUSHED, tracked in acks) and commits; the
	// hooks kill or drop at scripted points (nil: never).
	traceIO       bool
	acks          map[[2]replica.NodeID]uint64
	beforeReady   func(n *groupNode, rd *replica.Ready) bool // false: n died
	beforeSend    func(m replica.Message) bool               // false: dropped
	beforeDeliver func(m replica.Message) bool               // false: dropped
	beforeAck     func(n *groupNode, value string) bool      // false: n died
}

// GroupResult is the outcome of a replica-group run.
type GroupResult struct {
	Seed      uint64
	Events    int
	TraceHash string
	Trace     []string
	Tail      []string
	Violation *Violation
	Acked     int
	Elections int
	Rebuilds  int // snapshot installs
	Compacts  int
	// MidWriteDeaths, Stalls and FastClocks count the disk and clock
	// faults that struck.
	MidWriteDeaths, Stalls, FastClocks int
}

// newGroupSim builds a group of opts.GroupSize replicas, not started yet,
// with no events scheduled.
func newGroupSim(opts GroupOptions) *groupSim {
	opts.setDefaults()
	g := &groupSim{opts: opts, w: newWorld(opts.Seed, opts.KeepTrace), cut: map[[2]replica.NodeID]bool{},
		acked: map[string]uint64{}, committed: map[uint64]replica.Entry{}, leaders: map[uint64]replica.NodeID{}}
	for i := 1; i <= opts.GroupSize; i++ {
		g.nodes = append(g.nodes, &groupNode{id: replica.NodeID(i)})
	}
	return g
}

func (g *groupSim) startAll() {
	for _, n := range g.nodes {
		g.start(n)
	}
}

// RunGroup runs the replication kernel of one replica group for a seed.
func RunGroup(opts GroupOptions) GroupResult {
	g := newGroupSim(opts)
	g.startAll()
	opts = g.opts
	g.w.after(groupTickMs, g.tick)
	g.w.after(5, g.propose)
	if opts.Faults {
		g.w.after(g.w.between(50, 500), g.fault)
	}
	for g.w.events < opts.Steps && g.violation == nil && g.w.next() {
	}
	if g.violation == nil {
		g.heal()
	}
	res := GroupResult{Seed: opts.Seed, Events: g.w.events, TraceHash: g.w.trace.sum(), Trace: g.w.trace.all,
		Tail: g.w.trace.lastLines(), Violation: g.violation, Acked: len(g.acked), Elections: len(g.leaders),
		Rebuilds: g.rebuilds, Compacts: g.compacts, MidWriteDeaths: g.midWrite, Stalls: g.stalls, FastClocks: g.fastClocks}
	return res
}

func (g *groupSim) violate(inv, format string, args ...any) {
	if g.violation == nil {
		g.violation = &Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...), AtMs: g.w.nowMs - epochMs, Event: g.w.events}
		g.w.tracef("VIOLATION %s", g.violation)
	}
}

func (g *groupSim) ids() []replica.NodeID {
	out := make([]replica.NodeID, len(g.nodes))
	for i, n := range g.nodes {
		out[i] = n.id
	}
	return out
}

func (g *groupSim) quorum() int { return len(g.nodes)/2 + 1 }

func (g *groupSim) start(n *groupNode) {
	k, err := replica.New(replica.Config{ID: n.id, Replicas: g.ids(), Policy: g.opts.Policy, ElectionTicks: 10,
		Seed: g.opts.Seed*31 + uint64(len(g.leaders)) + uint64(g.w.events), Mutations: g.opts.Mutations}, n.persisted())
	if err != nil {
		panic(err)
	}
	n.k, n.up, n.commit = k, true, 0
	n.diskFailing, n.pausedUntil, n.tickRate = false, 0, 0
	g.w.tracef("n%d up promised=%d last=%d", n.id, n.hard.Promised, len(n.log))
}

func (g *groupSim) node(id replica.NodeID) *groupNode { return g.nodes[id-1] }

// process carries out a node's Ready as the replog shell does: a leader's
// APPENDs go out before its own writes are durable when the Ready has no
// promise or truncation; everything else is persisted first, then sent;
// then Advance. Under DiskFaults a failing disk may kill it midway.
func (g *groupSim) process(n *groupNode) {
	for n.up && n.k.HasReady() {
		rd := n.k.Ready()
		if g.beforeReady != nil && !g.beforeReady(n, &rd) {
			return
		}
		early, late := rd.Early, rd.Messages
		if g.opts.SendBeforePersist {
			early, late = append(slices.Clone(early), late...), nil
		}
		if !g.send(n, rd, early) || !g.persist(n, rd) || !g.send(n, rd, late) {
			return
		}
		n.k.Advance(rd)
		g.observe(n, rd.CommitSeq)
	}
}

// persist makes a Ready's writes durable in the shell's order: snapshot,
// promise, truncation, entries. Under a failing disk it may die after any
// prefix of them; it then reports false (the node is down).
func (g *groupSim) persist(n *groupNode, rd replica.Ready) bool {
	writes := len(rd.Entries)
	if rd.Snapshot != nil {
		writes++
	}
	if rd.HardState != nil {
		writes++
	}
	if rd.Truncate {
		writes++
	}
	durable := writes
	if n.diskFailing && writes > 0 && g.w.chance(0.3) {
		durable = g.w.rng.IntN(writes + 1)
	}
	done := 0
	step := func() bool { done++; return done <= durable }
	if rd.Snapshot != nil && step() {
		// Rebuild: the snapshot's content is the committed prefix.
		if uint64(len(g.committed)) < rd.Snapshot.Seq {
			g.violate(VisibleImpliesQuorumFlushed, "n%d told to install a snapshot at %d, only %d entries ever committed", n.id, rd.Snapshot.Seq, len(g.committed))
			return false
		}
		n.log = n.log[:0]
		for seq := uint64(1); seq <= rd.Snapshot.Seq; seq++ {
			n.log = append(n.log, g.committed[seq])
		}
		n.snapSeq, n.snapEp = rd.Snapshot.Seq, rd.Snapshot.Epoch
		g.rebuilds++
		g.w.tracef("n%d rebuilt from snapshot at %d", n.id, rd.Snapshot.Seq)
	}
	if rd.HardState != nil && step() {
		n.hard = *rd.HardState
	}
	if rd.Truncate && step() {
		n.log = n.log[:rd.TruncateAfter]
	}
	for _, e := range rd.Entries {
		if !step() {
			break
		}
		if e.Seq != uint64(len(n.log))+1 {
			panic(fmt.Sprintf("n%d persists seq %d after %d", n.id, e.Seq, len(n.log)))
		}
		n.log = append(n.log, replica.Entry{Seq: e.Seq, Epoch: e.Epoch, Data: slices.Clone(e.Data)})
	}
	if g.traceIO {
		g.tracePersist(n, rd)
	}
	if durable < writes {
		g.w.tracef("n%d dies mid-write: %d of %d writes durable", n.id, durable, writes)
		g.midWrite++
		g.crash(n)
		return false
	}
	return true
}

// send transmits msgs (the Ready's Early ones, or the rest), attaching
// entries to APPENDs from the durable log or, sent early, from the Ready
// itself. It reports false
// (after recording a violation) on an APPEND of compacted entries.
func (g *groupSim) send(n *groupNode, rd replica.Ready, msgs []replica.Message) bool {
	for _, m := range msgs {
		if m.Type == replica.MsgAppend && m.FirstSeq != 0 {
			if m.FirstSeq <= n.snapSeq {
				g.violate(KernelAssertion, "n%d sends entries from %d, compacted up to %d", n.id, m.FirstSeq, n.snapSeq)
				return false
			}
			for seq := m.FirstSeq; seq <= m.LastSeqSent; seq++ {
				var e replica.Entry
				if seq <= uint64(len(n.log)) {
					e = n.log[seq-1]
				} else { // sent early: not durable yet, in the Ready
					e = rd.Entries[seq-rd.Entries[0].Seq]
				}
				m.Entries = append(m.Entries, replica.Entry{Seq: e.Seq, Epoch: e.Epoch, Data: slices.Clone(e.Data)})
			}
		}
		if g.beforeSend != nil && !g.beforeSend(m) {
			g.w.tracef("lost %s", m)
			continue
		}
		if g.traceIO && g.notable(m) {
			g.w.tracef("send %s", m)
		}
		g.transmit(m)
	}
	return true
}

// tracePersist traces what a Ready made durable (golden runs).
func (g *groupSim) tracePersist(n *groupNode, rd replica.Ready) {
	if rd.HardState != nil {
		g.w.tracef("n%d persist promise e%d to n%d", n.id, rd.HardState.Promised, rd.HardState.PromisedTo)
	}
	if rd.Truncate {
		g.w.tracef("n%d persist truncation after %d", n.id, rd.TruncateAfter)
	}
	for _, e := range rd.Entries {
		v := string(e.Data)
		if v == "" {
			v = "install"
		}
		g.w.tracef("n%d persist %d (e%d) %s", n.id, e.Seq, e.Epoch, v)
	}
}

// notable reports whether a message belongs in a golden trace: not a
// heartbeat, nor a FLUSHED that repeats the last one between the same pair.
func (g *groupSim) notable(m replica.Message) bool {
	switch {
	case m.Type == replica.MsgAppend:
		return m.FirstSeq != 0
	case m.Type == replica.MsgAppendAck && m.Reject == replica.RejectNone:
		pair := [2]replica.NodeID{m.From, m.To}
		if g.acks[pair] == m.FlushedSeq {
			return false
		}
		g.acks[pair] = m.FlushedSeq
	}
	return true
}

func (g *groupSim) transmit(m replica.Message) {
	if g.cut[[2]replica.NodeID{m.From, m.To}] || g.w.chance(g.dropP) {
		return
	}
	copies := 1
	if g.w.chance(g.dupP) {
		copies = 2
	}
	for c := 0; c < copies; c++ {
		g.w.after(g.w.between(1, 15), func() { g.deliver(m) })
	}
}

// deliver hands a message to its (running) receiver; a stalled one takes
// it when it resumes.
func (g *groupSim) deliver(m replica.Message) {
	to := g.node(m.To)
	switch {
	case !to.up:
	case to.paused(g.w.nowMs):
		g.w.after(to.pausedUntil-g.w.nowMs, func() { g.deliver(m) })
	case g.beforeDeliver != nil && !g.beforeDeliver(m):
		g.w.tracef("lost %s", m)
	default:
		g.guard(func() { to.k.Step(m); g.process(to) })
	}
}

// observe checks a node's state after its Ready: leadership, installs and
// newly visible entries.
func (g *groupSim) observe(n *groupNode, newCommit uint64) {
	st := n.k.Status()
	if st.Anomalies > 0 {
		g.violate(KernelAssertion, "n%d refused %d impossible messages (a second leader of an epoch, or a rewrite of a committed entry)", n.id, st.Anomalies)
	}
	if st.Role == replica.Leader && n.leading != st.Hard.Promised {
		e := st.Hard.Promised
		n.leading = e
		g.w.tracef("n%d leads epoch %d (last %d)", n.id, e, st.Last)
		if other, ok := g.leaders[e]; ok && other != n.id {
			g.violate(OneLeaderPerEpoch, "epoch %d led by n%d and n%d", e, other, n.id)
		}
		g.leaders[e] = n.id
		promised := 0
		for _, o := range g.nodes {
			if o.hard.Promised >= e {
				promised++
			}
		}
		if promised < g.quorum() {
			g.violate(InstallNeedsQuorumPromise, "n%d installed epoch %d with %d durable promises of %d needed", n.id, e, promised, g.quorum())
		}
	}
	if newCommit <= n.commit {
		return
	}
	need := g.quorum()
	if g.opts.Policy == replica.SyncAll {
		need = len(g.nodes)
	}
	for seq := n.commit + 1; seq <= newCommit; seq++ {
		if seq > uint64(len(n.log)) {
			g.violate(VisibleImpliesQuorumFlushed, "n%d made %d visible before holding it durably (log ends %d)", n.id, seq, len(n.log))
			return
		}
		e := n.log[seq-1]
		if prev, ok := g.committed[seq]; ok && (prev.Epoch != e.Epoch || string(prev.Data) != string(e.Data)) {
			g.violate(CommittedPrefixAgreement, "seq %d visible as (e%d %q) on n%d, earlier as (e%d %q)", seq, e.Epoch, e.Data, n.id, prev.Epoch, prev.Data)
			return
		}
		g.committed[seq] = e
		holders := 0
		for _, o := range g.nodes {
			if uint64(len(o.log)) >= seq && o.log[seq-1].Epoch == e.Epoch {
				holders++
			}
		}
		if holders < need {
			g.violate(VisibleImpliesQuorumFlushed, "seq %d (e%d) visible on n%d but durable on %d replicas, need %d", seq, e.Epoch, n.id, holders, need)
			return
		}
	}
	n.commit = newCommit
	if g.traceIO {
		g.w.tracef("n%d commit %d", n.id, newCommit)
	}
	// Answer proposals this node made that are now visible in its epoch.
	kept := g.pending[:0]
	for _, p := range g.pending {
		if p.node == n.id && p.seq <= newCommit {
			if g.beforeAck != nil && !g.beforeAck(n, p.value) {
				continue // died before answering
			}
			if n.log[p.seq-1].Epoch == p.epoch && string(n.log[p.seq-1].Data) == p.value {
				g.acked[p.value] = p.seq
				g.healAcked = g.healAcked || g.healed
				g.w.tracef("ack %s at %d", p.value, p.seq)
			}
			continue
		}
		kept = append(kept, p)
	}
	g.pending = kept
}

func (g *groupSim) tick() {
	g.w.after(groupTickMs, g.tick)
	g.ticks++
	for _, n := range g.nodes {
		if n.up && !n.paused(g.w.nowMs) {
			for range max(n.tickRate, 1) {
				g.guard(func() { n.k.Tick(); g.process(n) })
			}
			if g.opts.Compact && g.ticks%20 == 0 {
				g.compact(n)
			}
		}
	}
}

// compact replaces a node's log prefix with a snapshot as far as the
// kernel allows (committed, durable, and not past a reservation).
func (g *groupSim) compact(n *groupNode) {
	floor := n.k.RetainFloor()
	if floor <= n.snapSeq+4 {
		return
	}
	at := n.k.CompactTo(floor)
	if at <= n.snapSeq {
		return
	}
	if at > uint64(len(n.log)) {
		g.violate(KernelAssertion, "n%d allowed to compact to %d past its log end %d", n.id, at, len(n.log))
		return
	}
	if e, ok := g.committed[at]; !ok || e.Epoch != n.log[at-1].Epoch {
		g.violate(CommittedPrefixAgreement, "n%d compacts to %d, which is not the committed entry there", n.id, at)
		return
	}
	n.snapSeq, n.snapEp = at, n.log[at-1].Epoch
	g.compacts++
}

// KernelAssertion reports a kernel that failed one of its own assertions
// (for example, asked to truncate a committed entry).
const KernelAssertion = "KernelAssertion"

// guard turns a kernel assertion (a panic) into a violation, so a broken
// guard shows up as a failing seed with its trace rather than a crash.
func (g *groupSim) guard(fn func()) {
	defer func() {
		if p := recover(); p != nil {
			g.violate(KernelAssertion, "%v", p)
		}
	}()
	fn()
}

// propose offers the next value to every node that believes it leads.
func (g *groupSim) propose() {
	g.w.after(g.w.between(5, 40), g.propose)
	if g.nextValue >= g.opts.Proposals {
		return
	}
	for _, n := range g.nodes {
		if !n.up || n.paused(g.w.nowMs) {
			continue
		}
		value := fmt.Sprintf("v%d", g.nextValue)
		seq, epoch, err := n.k.Propose([]byte(value))
		if err != nil {
			continue
		}
		g.nextValue++
		g.w.tracef("n%d proposes %s at %d (e%d)", n.id, value, seq, epoch)
		g.pending = append(g.pending, proposal{value: value, node: n.id, seq: seq, epoch: epoch})
		g.guard(func() { g.process(n) })
	}
}

// crash stops a node where it is; it restarts from its durable store.
func (g *groupSim) crash(n *groupNode) {
	g.down(n)
	g.w.after(g.w.between(20, 600), func() { g.start(n); g.guard(func() { g.process(n) }) })
}

// down stops a node. The requests it had not answered die with it: a later
// incarnation never acknowledges them (their clients retry elsewhere).
func (g *groupSim) down(n *groupNode) {
	n.up = false
	g.pending = slices.DeleteFunc(g.pending, func(p proposal) bool { return p.node == n.id })
}

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
	case 5: // its disk fails for a while: it may die mid-write
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
			g.w.after(g.w.between(100, 1500), func() {
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
			st := n.k.Status()
			g.w.tracef("n%d %s promised=%+v leader=%d last=%d durable=%d commit=%d readOnly=%v", n.id, st.Role, st.Hard, st.Leader, st.Last, st.Durable, st.CommitSeq, st.ReadOnly)
		}
		g.violate(Liveness, "no value committed within 60s after healing")
		return
	}
	for value, seq := range g.acked {
		e, ok := g.committed[seq]
		if !ok || string(e.Data) != value {
			g.violate(AckedNeverLost, "%s acked at %d, committed prefix has %q", value, seq, e.Data)
			return
		}
	}
}
