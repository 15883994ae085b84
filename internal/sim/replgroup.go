package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// GroupOptions configure a replica-group run: one partition's replica
// group on GroupSize simulated nodes, each the real replog shell
// (replog.Member: the kernel, the shared Ready executor, storage.Log and
// state files) over its own crashable MemFS, and a network that drops,
// duplicates, delays and partitions.
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
	// a write or fsync may fail (the member stops, and the process
	// restarts), or the process is killed -9 just before one, in the
	// middle of carrying out a Ready — possibly after a leader's early
	// APPENDs went out — losing what was not synced, the last write
	// possibly torn.
	DiskFaults bool
	// ClockFaults (with Faults): a replica's clock runs fast for a while
	// (its timers fire 2-4x early), or the whole process stalls (no ticks,
	// no messages handled, no requests taken) and resumes where it left
	// off, as after a VM pause or SIGSTOP.
	ClockFaults bool
	// Compact gives the members a small segment size and retention, and
	// runs their compaction often (Member.Compact: as far as the kernel's
	// RetainFloor allows), so lagging followers rebuild from snapshots.
	Compact bool
	// ShortReads makes every member's read of its log for an APPEND stop
	// after groupShortReadBytes (replog.Config.AppendReadBytesMax): a
	// catch-up sends a few entries at a time, fewer than the kernel asked
	// for, and the kernel must go on from what was sent (AppendShort).
	ShortReads bool
	Mutations  replica.Mutations
	// SendBeforePersist is a deliberate executor bug for tests
	// (replica.Executor.SendBeforePersist): every message of a Ready
	// (FLUSHED and promises included) goes out before its writes are
	// durable.
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
	return fmt.Sprintf("go run ./cmd/nereus sim --replicas %d --policy %s --faults %s --compact=%v --short-reads=%v --disk-faults=%v --clock-faults=%v --steps %d --seed %d",
		o.GroupSize, policy, faults, o.Compact, o.ShortReads, o.DiskFaults, o.ClockFaults, o.Steps, o.Seed)
}

// Invariants of the replication kernel (DESIGN §4).
const (
	OneLeaderPerEpoch           = invariant.OneLeaderPerEpoch
	InstallNeedsQuorumPromise   = invariant.InstallNeedsQuorumPromise
	CommittedPrefixAgreement    = invariant.CommittedPrefixAgreement
	VisibleImpliesQuorumFlushed = invariant.VisibleImpliesQuorumFlushed
)

const groupTickMs = 10

// groupShortReadBytes bounds a member's read for an APPEND under
// GroupOptions.ShortReads: a campaign's values are a few bytes, their
// records a few dozen, so a read holds one to three of them.
const groupShortReadBytes = 96

// groupElectionTicks is each member's ElectionTicks.
const groupElectionTicks = 10

// RecoveryFails: a member cannot reopen from what a crash left on its disk
// (no bit flips are injected here, so every crash state must recover).
const RecoveryFails = "RecoveryFails"

// groupDir is every member's directory on its own MemFS.
const groupDir = "/r"

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// groupNode is one simulated replica process: the real replog member over
// its own MemFS, which survives the process's crashes.
type groupNode struct {
	id replica.NodeID
	fs *vfs.MemFS
	// m is the member of the current incarnation. While the node is down
	// it is already reopened from what the crash left (recovery ran), so
	// the checkers read its durable state, but nothing steps it.
	m           *replog.Member
	up          bool
	incarnation int
	commit      uint64 // last commit this incarnation reported
	leading     uint64 // epoch it was last seen leading (checker bookkeeping)
	installs    uint64 // snapshot installs this incarnation, as last seen
	shortReads  uint64 // its catch-up reads cut short, as last seen

	// Faults in force (DiskFaults, ClockFaults), and a scripted kill point
	// (golden runs): kill -9 just before the disk operation it accepts.
	diskFailing bool
	killOnDisk  func(op vfs.Op, name string) bool
	pausedUntil int64 // world ms: stalled until then
	tickRate    int   // ticks per world tick (0 or 1: normal)
}

func (n *groupNode) paused(nowMs int64) bool { return nowMs < n.pausedUntil }

// durablePromise is the promise n's hard-state file holds. Checkers read
// it between steps, when no write is in progress: what the file holds then
// is durable (the member writes it atomically, synced).
func (n *groupNode) durablePromise() uint64 {
	return hardStatePromise(n.fs, path.Join(groupDir, "hardstate"))
}

// hardStatePromise is the promise a replog member's hard-state file holds
// (0: none, or unreadable).
func hardStatePromise(fsys vfs.FS, file string) uint64 {
	data, err := storage.ReadFileAtomic(fsys, file)
	if err != nil || len(data) != 12 {
		return 0
	}
	return binary.BigEndian.Uint64(data)
}

// holds reports whether n's disk durably holds the entry (seq, epoch), or
// compacted it into its snapshot point (only committed entries are).
func (n *groupNode) holds(seq, epoch uint64) bool {
	st := n.m.Status()
	switch {
	case seq <= st.SnapSeq:
		return true
	case seq > n.m.ReadLog().SyncedSeq():
		return false
	}
	return epochOf(st, seq) == epoch
}

// epochOf is the epoch of the entry at seq by the kernel's epoch boundaries.
func epochOf(st replica.Status, seq uint64) uint64 {
	var e uint64
	for _, b := range st.Epochs {
		if b.StartSeq > seq {
			break
		}
		e = b.Epoch
	}
	return e
}

type proposal struct {
	value       string
	node        replica.NodeID
	incarnation int
	seq, epoch  uint64
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
	ghost     *invariant.Group  // the leaders and the committed prefix
	violation *Violation
	rebuilds  int
	compacts  int
	// shortReads counts the members' catch-up reads that stopped short
	// of what an APPEND asked for (ShortReads).
	shortReads int
	ticks      int
	// Disk and clock faults that struck.
	midWrite, stalls, fastClocks int
	// clockSkewedUntilMs: until then a clock ran fast lately (checkLeases).
	clockSkewedUntilMs int64

	// Golden runs (replgolden.go): traceIO traces disk writes, sends (but
	// heartbeats and repeated FLUSHED, tracked in acks) and commits; the
	// hooks drop or kill at scripted points (nil: never).
	traceIO       bool
	acks          map[[2]replica.NodeID]uint64
	beforeSend    func(m replica.Message) bool          // false: dropped
	beforeDeliver func(m replica.Message) bool          // false: dropped
	beforeAck     func(n *groupNode, value string) bool // false: n died
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
	// ShortReads counts the catch-up reads that stopped short
	// (GroupOptions.ShortReads).
	ShortReads int
	// MidWriteDeaths, Stalls and FastClocks count the disk and clock
	// faults that struck.
	MidWriteDeaths, Stalls, FastClocks int
}

// newGroupSim builds a group of opts.GroupSize replicas, not started yet,
// with no events scheduled.
func newGroupSim(opts GroupOptions) *groupSim {
	opts.setDefaults()
	g := &groupSim{opts: opts, w: newWorld(opts.Seed, opts.KeepTrace), cut: map[[2]replica.NodeID]bool{},
		acked: map[string]uint64{}, ghost: invariant.NewGroup(opts.GroupSize, opts.Policy == replica.SyncAll)}
	for i := 1; i <= opts.GroupSize; i++ {
		n := &groupNode{id: replica.NodeID(i), fs: vfs.NewMem()}
		n.fs.SetInjector(g.injector(n))
		g.nodes = append(g.nodes, n)
	}
	return g
}

func (g *groupSim) startAll() {
	for _, n := range g.nodes {
		g.start(n)
	}
}

// RunGroup runs one replica group's members for a seed.
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
	return g.result()
}

func (g *groupSim) result() GroupResult {
	return GroupResult{Seed: g.opts.Seed, Events: g.w.events, TraceHash: g.w.trace.sum(), Trace: g.w.trace.all,
		Tail: g.w.trace.lastLines(), Violation: g.violation, Acked: len(g.acked), Elections: g.ghost.Elections(),
		Rebuilds: g.rebuilds, Compacts: g.compacts, ShortReads: g.shortReads, MidWriteDeaths: g.midWrite, Stalls: g.stalls, FastClocks: g.fastClocks}
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

// open reopens n's member from its disk (recovery), as a new incarnation
// that is not up yet. It reports false (after recording a violation) when
// the disk does not recover.
func (g *groupSim) open(n *groupNode) bool {
	cfg := replog.Config{ID: n.id, Members: g.ids(), Policy: g.opts.Policy, Dir: groupDir, FS: n.fs, Logger: discardLogger,
		Tick: groupTickMs * time.Millisecond, ElectionTicks: groupElectionTicks, Reservation: 400 * time.Millisecond, Seed: g.opts.Seed*31 + uint64(g.ghost.Elections()) + uint64(g.w.events), Send: g.sender(n),
		Clock: brokerClock{g.w}, Mutations: g.opts.Mutations, SendBeforePersist: g.opts.SendBeforePersist}
	if g.opts.Compact {
		// A few entries a segment; retention keeps about one.
		cfg.Storage = storage.Options{SegmentBytesMax: 512, RetentionBytes: 512}
	}
	if g.opts.ShortReads {
		cfg.AppendReadBytesMax = groupShortReadBytes
	}
	m, err := replog.OpenMember(cfg)
	if err != nil {
		g.violate(RecoveryFails, "n%d cannot reopen after a crash: %v", n.id, err)
		return false
	}
	n.m, n.incarnation, n.commit, n.installs, n.shortReads = m, n.incarnation+1, 0, 0, 0
	return true
}

// start brings n up: opened from its disk unless a crash already reopened
// it.
func (g *groupSim) start(n *groupNode) {
	if n.up || (n.m == nil && !g.open(n)) {
		return
	}
	n.up = true
	n.diskFailing, n.pausedUntil, n.tickRate = false, 0, 0
	st := n.m.Status()
	g.w.tracef("n%d up promised=%d last=%d", n.id, st.Hard.Promised, st.Last)
}

func (g *groupSim) node(id replica.NodeID) *groupNode { return g.nodes[id-1] }

// step runs fn on n's member, then carries out what it produced
// (Member.Handle) and checks the result. A kill point inside is a kill -9;
// a failed write or fsync stops the member, and the process restarts
// (production logs it and stops the member); a kernel panic is a
// violation.
func (g *groupSim) step(n *groupNode, fn func()) {
	g.stepErr(n, func() error {
		if fn != nil {
			fn()
		}
		return nil
	})
}

// stepErr is step for an fn that can fail like Handle (a failed write or
// fsync): the member stops, and the process restarts.
func (g *groupSim) stepErr(n *groupNode, fn func() error) {
	if !n.up {
		return
	}
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				if k, ok := p.(killSignal); ok {
					g.w.tracef("n%d kill -9 at %s", n.id, k.at)
					g.crash(n)
					return
				}
				g.violate(KernelAssertion, "n%d: %v", n.id, p)
			}
		}()
		if err = fn(); err == nil {
			err = n.m.Handle()
		}
	}()
	if !n.up || g.violation != nil {
		return
	}
	if err != nil {
		g.w.tracef("n%d stops: %v", n.id, err)
		g.crash(n)
		return
	}
	g.observe(n)
}

// sender is n's replog Send: it traces, applies the golden hooks and puts
// the message on the network.
func (g *groupSim) sender(n *groupNode) func(replica.Message) {
	return func(m replica.Message) {
		if !n.up {
			return
		}
		if len(m.Entries) > 0 {
			m.Entries = slices.Clone(m.Entries)
		}
		if g.beforeSend != nil && !g.beforeSend(m) {
			g.w.tracef("lost %s", m)
			return
		}
		if g.traceIO && g.notable(m) {
			g.w.tracef("send %s", m)
		}
		g.transmit(m)
	}
}

// injector is n's disk: disk tracing (golden runs), scripted kill points,
// and a failing disk's kills and fsync errors. It runs under the MemFS
// lock, on the simulator's goroutine.
func (g *groupSim) injector(n *groupNode) vfs.Injector {
	return func(op vfs.Op, name string) error {
		rel := strings.TrimPrefix(name, groupDir+"/")
		if g.traceIO && (op == vfs.OpWrite || op == vfs.OpSync || op == vfs.OpTruncate || op == vfs.OpRename) {
			g.w.tracef("n%d disk %s %s", n.id, op, rel)
		}
		if n.killOnDisk != nil && n.killOnDisk(op, rel) {
			n.killOnDisk = nil
			panic(killSignal{at: fmt.Sprintf("disk %s %s", op, rel)})
		}
		if !n.diskFailing || !n.up || (op != vfs.OpWrite && op != vfs.OpSync) || !g.w.chance(0.2) {
			return nil
		}
		g.midWrite++
		if g.w.chance(0.5) {
			g.w.tracef("n%d fault fsync/write error %s %s", n.id, op, rel)
			return errInjectedFsync
		}
		panic(killSignal{at: fmt.Sprintf("failing disk, before %s %s", op, rel)})
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
		g.step(to, func() { to.m.Step(m) })
	}
}

// observe checks a node's state after it handled an event: leadership,
// installs and newly visible entries.
func (g *groupSim) observe(n *groupNode) {
	g.checkLeases()
	st := n.m.Status()
	if st.Anomalies > 0 {
		g.violate(KernelAssertion, "n%d refused %d impossible messages (a second leader of an epoch, or a rewrite of a committed entry)", n.id, st.Anomalies)
	}
	if reads := n.m.ShortReads(); reads > n.shortReads {
		g.shortReads += int(reads - n.shortReads)
		n.shortReads = reads
	}
	if installs := n.m.Installs(); installs > n.installs {
		g.rebuilds += int(installs - n.installs)
		n.installs = installs
		g.w.tracef("n%d rebuilt from snapshot at %d", n.id, st.SnapSeq)
	}
	if st.Role == replica.Leader && n.leading != st.Hard.Promised {
		e := st.Hard.Promised
		n.leading = e
		g.w.tracef("n%d leads epoch %d (last %d)", n.id, e, st.Last)
		promised := 0
		for _, o := range g.nodes {
			if o.durablePromise() >= e {
				promised++
			}
		}
		if v := g.ghost.TookOffice(uint32(n.id), e, promised); v != nil {
			g.violate(v.Invariant, "%s", v.Detail)
		}
	}
	newCommit := n.m.CommitSeq()
	if newCommit <= n.commit {
		return
	}
	from := n.commit + 1
	if st.SnapSeq >= from {
		// Made visible by a snapshot install: only a committed prefix
		// can be one.
		if _, ok := g.ghost.Committed(st.SnapSeq); !ok {
			g.violate(VisibleImpliesQuorumFlushed, "n%d installed a snapshot at %d, past anything ever committed", n.id, st.SnapSeq)
			return
		}
		from = st.SnapSeq + 1
	}
	if synced := n.m.ReadLog().SyncedSeq(); newCommit > synced {
		g.violate(VisibleImpliesQuorumFlushed, "n%d made %d visible before holding it durably (synced through %d)", n.id, newCommit, synced)
		return
	}
	var entries []storage.Entry
	if from <= newCommit {
		var err error
		if entries, err = n.m.Read(from, int(newCommit-from+1)); err != nil || len(entries) != int(newCommit-from+1) {
			g.violate(VisibleImpliesQuorumFlushed, "n%d made %d..%d visible but reads %d entries: %v", n.id, from, newCommit, len(entries), err)
			return
		}
	}
	for _, e := range entries {
		holders := 0
		for _, o := range g.nodes {
			if o.holds(e.Seq, e.Epoch) {
				holders++
			}
		}
		if v := g.ghost.Visible(uint32(n.id), e.Seq, ghostEntry(e), holders); v != nil {
			g.violate(v.Invariant, "%s", v.Detail)
			return
		}
	}
	n.commit = newCommit
	if g.traceIO {
		g.w.tracef("n%d commit %d", n.id, newCommit)
	}
}

func (g *groupSim) tick() {
	g.w.after(groupTickMs, g.tick)
	g.ticks++
	for _, n := range g.nodes {
		if n.up && !n.paused(g.w.nowMs) {
			for range max(n.tickRate, 1) {
				g.step(n, func() { g.tickMember(n) })
			}
			if g.opts.Compact && g.ticks%20 == 0 {
				g.compact(n)
			}
		}
	}
}

// tickMember ticks n's member and checks QuietTicks: a tick before the
// kernel's NextTickDue changes neither its Ready nor its Status.
func (g *groupSim) tickMember(n *groupNode) {
	due := n.m.NextTickDue()
	before, readyBefore := n.m.KernelView()
	n.m.Tick(brokerClock{g.w}.NowNanos())
	if due <= 1 {
		return
	}
	after, ready := n.m.KernelView()
	if ready && !readyBefore || !reflect.DeepEqual(before, after) {
		g.violate(QuietTicks, "n%d: a tick %d before its next due tick changed the kernel (work for Handle %v→%v; status %+v → %+v)", n.id, due-1, readyBefore, ready, before, after)
	}
}

// checkLeases checks LeaseOnTheClock: while a member's published lease
// has not run out on the clock, no other member leads a later epoch. A
// stalled member skips its ticks (the production shell drops those a
// held-up goroutine missed) and its published status stands still; only
// the lease's end on the clock says it ran out. Not checked within two
// election timeouts of a clock running fast: a follower whose timers run
// more than twice as fast as its leader's is outside what the lease's
// margin covers (replica.leaseStart).
func (g *groupSim) checkLeases() {
	if g.w.nowMs < g.clockSkewedUntilMs {
		return
	}
	now := brokerClock{g.w}.NowNanos()
	for _, n := range g.nodes {
		if !n.up || n.m.LeaseUntil() <= now {
			continue
		}
		e := n.m.Status().Hard.Promised
		for _, o := range g.nodes {
			if st := o.m.Status(); o != n && o.up && st.Role == replica.Leader && st.Hard.Promised > e {
				g.violate(LeaseOnTheClock, "n%d leads epoch %d while n%d's lease of epoch %d runs %d ms more", o.id, st.Hard.Promised, n.id, e, (n.m.LeaseUntil()-now)/int64(time.Millisecond))
				return
			}
		}
	}
}

// LeaseOnTheClock: while a member's published lease has not run out on
// its clock (replog.Member.LeaseUntil), no other member leads a later
// epoch — whatever ticks its driver skipped.
const LeaseOnTheClock = "LeaseOnTheClock"

// QuietTicks: a tick the kernel said was not due (NextTickDue) changes
// nothing a shell acts on or publishes — the production shell (replog.Log)
// sleeps through such ticks and steps them only when it wakes.
const QuietTicks = "QuietTicks"

// compact runs the member's compaction (retention, within the kernel's
// RetainFloor) and checks that its snapshot point is a committed entry.
func (g *groupSim) compact(n *groupNode) {
	before := n.m.Status().SnapSeq
	g.stepErr(n, n.m.Compact)
	if !n.up || g.violation != nil {
		return
	}
	st := n.m.Status()
	if st.SnapSeq <= before {
		return
	}
	if c, ok := g.ghost.Committed(st.SnapSeq); !ok || c.Epoch != epochOf(st, st.SnapSeq) {
		g.violate(CommittedPrefixAgreement, "n%d compacts to %d, which is not the committed entry there", n.id, st.SnapSeq)
		return
	}
	g.compacts++
}

// KernelAssertion reports a kernel that failed one of its own assertions
// (for example, asked to truncate a committed entry).
const KernelAssertion = "KernelAssertion"

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
		if _, _, ok := g.proposeAt(n, value, false); ok {
			g.nextValue++
		}
	}
}

// proposeAt proposes value at n as a client would, reporting its seq and
// epoch, or false when n refused it (it does not lead). Its answer comes
// later (answered); traced marks a golden run's client.
func (g *groupSim) proposeAt(n *groupNode, value string, traced bool) (seq, epoch uint64, ok bool) {
	// The answer may come within the step itself (a group of one commits
	// at once), before the proposal is on the books: held until then.
	type answer struct {
		seq uint64
		err error
	}
	proposing, inc := true, n.incarnation
	var early *answer
	p := replog.NewProposalFunc(storage.Record{Value: []byte(value)}, func(seq, epoch uint64, err error) {
		if proposing {
			early = &answer{seq, err}
			return
		}
		g.answered(n, inc, value, seq, err)
	})
	g.step(n, func() { n.m.Propose(p) })
	proposing = false
	if !n.up {
		g.w.tracef("n%d died taking %s", n.id, value)
		return 0, 0, false
	}
	if p.Seq == 0 { // refused: it does not lead
		if traced && early != nil {
			g.w.tracef("n%d refuses %s: %v", n.id, value, early.err)
		}
		return 0, 0, false
	}
	if traced {
		g.w.tracef("client -> n%d %s: at %d (e%d)", n.id, value, p.Seq, p.Epoch)
	} else {
		g.w.tracef("n%d proposes %s at %d (e%d)", n.id, value, p.Seq, p.Epoch)
	}
	g.pending = append(g.pending, proposal{value: value, node: n.id, incarnation: inc, seq: p.Seq, epoch: p.Epoch})
	if early != nil {
		g.answered(n, inc, value, early.seq, early.err)
	}
	return p.Seq, p.Epoch, true
}

// answered takes a member's answer to a proposal: acknowledged once it
// committed in its epoch, or lost to another lineage. An answer from an
// incarnation that has since died is never given.
func (g *groupSim) answered(n *groupNode, inc int, value string, seq uint64, err error) {
	i := slices.IndexFunc(g.pending, func(p proposal) bool { return p.value == value && p.node == n.id && p.incarnation == inc })
	if i < 0 || n.incarnation != inc || !n.up {
		return
	}
	g.pending = slices.Delete(g.pending, i, i+1)
	switch {
	case errors.Is(err, replog.ErrLost):
		g.w.tracef("n%d: %s lost to another lineage", n.id, value)
	case err != nil:
		g.w.tracef("n%d: %s failed: %v", n.id, value, err)
	case g.beforeAck != nil && !g.beforeAck(n, value):
	default:
		g.acked[value] = seq
		g.healAcked = g.healAcked || g.healed
		g.w.tracef("ack %s at %d", value, seq)
	}
}

// crash kill -9s n (unsynced writes lost, the last maybe torn) and
// restarts it 20-600 ms later.
func (g *groupSim) crash(n *groupNode) {
	g.crashFor(n, g.w.between(20, 600))
}

// crashFor kill -9s n and restarts it after delayMs (< 0: never by
// itself). The member is reopened from the crashed disk at once, so the
// checkers see what it durably holds; the requests it had not answered
// die with it (their clients retry elsewhere).
func (g *groupSim) crashFor(n *groupNode, delayMs int64) {
	if !n.up {
		return
	}
	n.up, n.m = false, nil
	g.pending = slices.DeleteFunc(g.pending, func(p proposal) bool { return p.node == n.id })
	n.fs.Crash(g.w.rng)
	if !g.open(n) {
		return
	}
	if delayMs >= 0 {
		g.w.after(delayMs, func() { g.start(n); g.step(n, nil) })
	}
}

// durableLog is n's log as its disk holds it durably (for a node that is
// down, what it reopened with): (epoch, value) from its log start through
// its synced seq.
func (n *groupNode) durableLog() (start uint64, entries []invariant.Entry, err error) {
	lg := n.m.ReadLog()
	start, end := lg.StartSeq(), lg.SyncedSeq()
	for from := start; from <= end; {
		read, err := lg.Read(from, int(end-from+1), 16<<20)
		if err != nil || len(read) == 0 {
			return start, entries, fmt.Errorf("read %d..%d: %d entries, %v", from, end, len(read), err)
		}
		for _, e := range read {
			entries = append(entries, ghostEntry(e))
		}
		from = read[len(read)-1].Seq + 1
	}
	return start, entries, nil
}

// ghostEntry is a log entry as the invariants compare it.
func ghostEntry(e storage.Entry) invariant.Entry {
	c := invariant.Entry{Epoch: e.Epoch}
	if !replog.IsControl(&e.Record) {
		c.Value = string(e.Record.Value)
	}
	return c
}
