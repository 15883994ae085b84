// Package replog is the shell around the replication kernel for one member
// of one replica group. Member is the single-threaded shell: it carries out
// the kernel's Readys with the shared executor (replica.Executor) against a
// storage.Log and an atomic hard-state file, sends messages through a
// caller-supplied function, and completes proposals when the kernel knows
// their outcome; its driver steps it. Log is the production driver: one
// goroutine, inbound and proposal queues, and tickers from the clock. The
// node wires it to the peer transport; the simulator steps Members itself.
//
// Entries are storage records: a proposal is a record, carried between
// members in its storage encoding, and the member's log holds it as is, so
// a replicated partition's log reads like a single node's. The install
// entry that opens each epoch is a control record (IsControl): readers
// skip it.
package replog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// Config configures one member.
type Config struct {
	ID      replica.NodeID
	Members []replica.NodeID
	Policy  replica.AckPolicy
	Dir     string
	FS      vfs.FS
	// Send delivers a kernel message to another member; it must not block
	// (drop instead: the protocol retries).
	Send   func(m replica.Message)
	Logger *slog.Logger
	// Tick is the kernel's logical tick (default 10 ms); elections time out
	// after ElectionTicks ticks and an idle leader heartbeats every
	// HeartbeatTicks (0: the kernel's defaults).
	Tick           time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	Seed           uint64
	// PreferredLeader is the member that should lead this group while it
	// is healthy (0: none): a leader that is not it hands leadership to
	// it once it has kept up for a while (replica.Config.PreferredLeader,
	// with the kernel's defaults for how long and how often).
	PreferredLeader replica.NodeID
	// ReleaseBeforeTransfer: a rebalancing hand-off waits until the
	// caller calls TransferTo (replica.Config.ReleaseBeforeTransfer;
	// Status.TransferWanted names the target).
	ReleaseBeforeTransfer bool
	// ProposeQueueMax bounds queued proposals (default 4096; Log only).
	ProposeQueueMax int
	// Storage configures the member's log (sizes, bounds).
	Storage storage.Options
	// AppendReadBytesMax bounds one read of the log for an APPEND to a
	// follower (default 4 MiB): a read that reaches it sends fewer entries
	// than the kernel asked for (replica.Replica.AppendShort). The
	// simulator sets it tiny to make every catch-up read stop short.
	AppendReadBytesMax int
	// Notify, when set, is called on the member's goroutine whenever the
	// commit point, the role, the epoch, the leader, the read-only mode or
	// the log's start changed. It must not block.
	Notify func()
	// Compaction: when Storage sets a retention, every CompactEvery
	// (default 1 s) the member deletes the log segments retention lets go
	// of — never past what the kernel must keep (committed, flushed, and
	// what a follower inside its reservation still needs), nor past
	// CompactLimit when set (what the caller has not consumed yet).
	CompactEvery time.Duration
	CompactLimit func() uint64
	// Retention, when set, is the retention now (age in ms, bytes): each
	// compaction pass gives it to the log first, so a topic's retention
	// may change while it runs (storage.Log.SetRetention). Unset, the
	// log keeps Storage's.
	Retention func() (ageMs, bytes int64)
	// Clock is the member's time: the retention clock, and the tickers of
	// the production driver (Log); a Manual Log ticks by its NowMs.
	// Required.
	Clock env.Clock
	// Reservation is how long a leader keeps the log a silent follower
	// still needs (default 30 s); a follower away longer may have to
	// rebuild from a snapshot.
	Reservation time.Duration
	// ChaseWindow is the tail-chase watch's window (replica.Config.
	// ChaseTicks; 0: the reservation).
	ChaseWindow time.Duration
	// Manual makes Open start no goroutine: the driver (a simulated node)
	// calls Pump on its own goroutine, and ticks and compactions follow
	// the Clock's NowMs.
	Manual bool
	// ObserveSync, when set, is told how long each fsync of the member's
	// log took; ObserveCommit, how long each of its proposals took from
	// the member taking it to its commit (replication: the leader's write,
	// the quorum's fsyncs and FLUSHED). By the Clock's NowNanos; both run
	// on the member's goroutine and must not block (metrics).
	ObserveSync, ObserveCommit func(time.Duration)
	// BeforeDrop, when set, is told what the running member holds (its
	// kernel's view and its log's synced seq) just before it looks for
	// damage to drop (restartDamaged), on its goroutine: it may have
	// flushed entries since anyone last looked. The simulator's checker
	// counts them as held (VisibleImpliesQuorumFlushed).
	BeforeDrop func(st replica.Status, synced uint64)
	// Mutations and SendBeforePersist deliberately break the kernel and the
	// executor, so tests can prove the simulator catches each. Never set
	// outside tests.
	Mutations         replica.Mutations
	SendBeforePersist bool
}

func (cfg *Config) setDefaults() {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tick == 0 {
		cfg.Tick = 10 * time.Millisecond
	}
	if cfg.ProposeQueueMax == 0 {
		cfg.ProposeQueueMax = 4096
	}
	if cfg.CompactEvery == 0 {
		cfg.CompactEvery = time.Second
	}
	if cfg.Reservation == 0 {
		cfg.Reservation = 30 * time.Second
	}
}

// Errors.
var (
	ErrClosed = errors.New("replog: closed")
	// ErrLost: the entry was proposed but a new leader's lineage replaced it.
	ErrLost = errors.New("replog: entry lost to a leader change")
	// ErrBusy: a Manual log's proposal queue is full while it is being
	// pumped (a production Log blocks instead).
	ErrBusy = errors.New("replog: proposal queue full")
)

// Proposal is the outcome of one Propose, available once Done is closed.
type Proposal struct {
	Done       chan struct{}
	Seq, Epoch uint64
	Err        error
	data       []byte
	onDone     func(seq, epoch uint64, err error)
	// onTagged, when set, is reported to instead of onDone, with tag: a
	// Batch's proposals share one func.
	onTagged func(tag Tag, seq, epoch uint64, err error)
	tag      Tag
	// takenNanos: when the member took it (Config.ObserveCommit).
	takenNanos int64
	// next chains the proposals of one Batch, which travel as one.
	next *Proposal
}

// Tag is what the proposer says about a proposal in a Batch, handed back
// with its outcome: it tells the proposals apart in their shared
// completion func.
type Tag [3]uint64

// ControlHeader marks a control record (an epoch's install entry); the
// broker refuses client records that carry it.
const ControlHeader = "nereus-control"

var installRecord = storage.Record{Headers: []storage.Header{{Key: ControlHeader, Value: []byte("install")}}}

// sealRecord is what a leader proposes once it sealed its active segment
// because every record in it expired (storage.Log.SealExpired, in
// Compact): each replica seals its own active segment before it appends
// it (memberStore.Append). What the leader writes after its seal — a dedup
// carry, a group's checkpoint, records compaction must keep — then starts
// a segment on every replica, and the expired records before it can go
// everywhere (IdleLogExpires). A follower that took such a record into
// the segment of the expired ones could never delete that segment while
// its partition stayed idle.
var sealRecord = storage.Record{Headers: []storage.Header{{Key: ControlHeader, Value: []byte("seal")}}}

func isSeal(r *storage.Record) bool {
	return len(r.Headers) == 1 && r.Headers[0].Key == ControlHeader && string(r.Headers[0].Value) == "seal" &&
		len(r.Key) == 0 && len(r.Value) == 0
}

// IsControl reports whether a record in a replicated log is a control
// record (an install entry, or a record of derived state such as a group's
// acks), not a message: consumers skip it. Its first header is
// ControlHeader, whose value names the kind.
func IsControl(r *storage.Record) bool {
	return len(r.Headers) > 0 && r.Headers[0].Key == ControlHeader
}

func isInstall(r *storage.Record) bool {
	return len(r.Headers) == 1 && r.Headers[0].Key == ControlHeader && string(r.Headers[0].Value) == "install" &&
		len(r.Key) == 0 && len(r.Value) == 0
}

// Log is the production driver of one Member: its goroutine owns the
// member and steps it with inbound messages, proposals and ticks.
type Log struct {
	m        *Member
	in       chan replica.Message
	prop     chan *Proposal
	campaign chan struct{}       // capacity 1: Campaign asked for an election
	transfer chan replica.NodeID // capacity 1: TransferTo asked for a hand-off
	done     chan struct{}
	wg       sync.WaitGroup
	dropped  atomic.Uint64
	// damaged (capacity 1) tells run that damage was found in the log
	// while the member runs (Damaged); damagedAt is the seq of a read that
	// failed on damage nobody located (DamagedAt; 0: none).
	damaged   chan struct{}
	damagedAt atomic.Uint64
	// The tick timer (run's goroutine only): the clock reading of the
	// last tick stepped, the pending timer (nil: none) and when it fires;
	// wake (capacity 1) is its signal.
	tickedAt, wakeAt int64
	timer            env.Timer
	wake             chan struct{}

	// Manual mode (Pump): the driver's goroutine owns everything; the
	// times of the last tick and compaction, and whether a Pump is running.
	manual                    bool
	lastTickMs, lastCompactMs int64
	pumping, closed           bool
	failed                    bool // it could not persist: recovering (pumpFailed) since failedAtMs
	failedAtMs                int64
	heldUntilMs               int64 // HoldUp
}

// notice is the part of the kernel's view whose changes Notify reports.
type notice struct {
	role            replica.Role
	epoch, commit   uint64
	start           uint64 // the log's first seq
	leader          replica.NodeID
	readOnly, valid bool
}

const hardStateFile = "hardstate"

// Open restores a member from its directory and starts its goroutine
// (none in Manual mode).
func Open(cfg Config) (*Log, error) {
	m, err := OpenMember(cfg)
	if err != nil {
		return nil, err
	}
	l := &Log{m: m, in: make(chan replica.Message, 4096), campaign: make(chan struct{}, 1), transfer: make(chan replica.NodeID, 1),
		prop: make(chan *Proposal, m.cfg.ProposeQueueMax), done: make(chan struct{}), damaged: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		manual: cfg.Manual}
	if l.manual {
		l.lastTickMs = monotonicMs(cfg.Clock)
		l.lastCompactMs = l.lastTickMs
		return l, nil
	}
	l.wg.Add(1)
	go l.run()
	return l, nil
}

// Pump runs what a Manual log has queued — inbound messages, proposals, a
// campaign, damage — and the ticks and compaction its clock says are due,
// then carries out the kernel's Readys, all on the caller's goroutine. It
// reports whether anything ran; its only error is ErrClosed. A member
// that cannot persist claims nothing and restarts in place every
// recoverEveryTicks ticks, as the production goroutine does.
func (l *Log) Pump() (bool, error) {
	if !l.manual {
		panic("replog: Pump on a Log that runs its own goroutine")
	}
	select {
	case <-l.done:
		return false, ErrClosed
	default:
	}
	m, ran := l.m, false
	now := monotonicMs(m.cfg.Clock)
	if now < l.heldUntilMs {
		return false, nil
	}
	l.pumping = true
	defer func() { l.pumping = false }()
	if l.failed {
		return l.pumpFailed(now), nil
	}
	tick := m.cfg.Tick.Milliseconds()
	for ; now-l.lastTickMs >= tick; l.lastTickMs += tick {
		m.Tick((l.lastTickMs + tick) * int64(time.Millisecond))
		ran = true
	}
	if now-l.lastCompactMs >= m.cfg.CompactEvery.Milliseconds() {
		l.lastCompactMs = now
		if err := m.Compact(); err != nil {
			return true, l.fail(fmt.Errorf("replog: compaction failed: %w", err), now)
		}
	}
	// In a fixed order (a select among several ready channels picks at
	// random, and a simulated run must replay bit for bit): damage, a
	// campaign, messages in arrival order, then proposals.
	select {
	case <-l.damaged:
		ran = true
		if _, err := m.damaged(l.damagedAt.Swap(0)); err != nil {
			return true, l.fail(fmt.Errorf("replog: cannot drop a damaged range: %w", err), now)
		}
	default:
	}
	select {
	case <-l.campaign:
		ran = true
		m.Campaign()
	default:
	}
	select {
	case id := <-l.transfer:
		ran = true
		m.transferTo(id)
	default:
	}
	for drained := false; !drained; {
		select {
		case msg := <-l.in:
			ran = true
			m.Step(msg)
		default:
			drained = true
		}
	}
	for drained := false; !drained; {
		select {
		case p := <-l.prop:
			ran = true
			m.proposeChain(p)
		default:
			drained = true
		}
	}
	if err := m.Handle(); err != nil {
		return true, l.fail(err, now)
	}
	return ran, nil
}

// HoldUp makes a Manual log's Pump do nothing until its monotonic clock
// (env.Clock.NowNanos, in ms) reads untilMs: the simulator's model of a
// member goroutine stuck in a system call (a hung fsync) while the rest
// of its node runs. What it published stands still meanwhile; messages
// and proposals wait in its queues.
func (l *Log) HoldUp(untilMs int64) {
	if !l.manual {
		panic("replog: HoldUp on a Log that runs its own goroutine")
	}
	l.heldUntilMs = untilMs
}

// monotonicMs is the clock a Manual log ticks on, in ms: the monotonic
// one, as the production goroutine's tick grid (a wall-clock jump moves
// no tick).
func monotonicMs(c env.Clock) int64 { return c.NowNanos() / int64(time.Millisecond) }

// fail starts a Manual log's recoverLoop: it cannot persist (a write, an
// fsync, a compaction or dropping a damaged range failed).
func (l *Log) fail(err error, nowMs int64) error {
	l.m.cfg.Logger.Error("replog: cannot persist; restarting the member in place", "member", l.m.cfg.ID, "dir", l.m.cfg.Dir, "err", err)
	l.failed, l.failedAtMs = true, nowMs
	l.m.publishStopped()
	return nil
}

// pumpFailed is recoverLoop for a Manual log.
func (l *Log) pumpFailed(nowMs int64) bool {
	ran := false
	for drained := false; !drained; {
		select {
		case p := <-l.prop:
			finishChain(p, ErrRestarted)
			ran = true
		case <-l.in:
			ran = true
		default:
			drained = true
		}
	}
	if nowMs-l.failedAtMs < recoverEveryTicks*l.m.cfg.Tick.Milliseconds() {
		return ran
	}
	if err := l.m.Recover(); err != nil {
		l.m.recoverFailed(err)
		l.failedAtMs = nowMs // retry later
		return ran
	}
	l.failed, l.lastTickMs = false, nowMs
	return true
}

// errHardStateDamaged: the hard state file cannot be read back (it also
// matches storage.ErrCorrupt).
var errHardStateDamaged = errors.New("replog: damaged hard state")

// readHardState reads the hard state file: none is the zero state; one
// that fails its checksum or has the wrong size is errHardStateDamaged.
func readHardState(fsys vfs.FS, dir string) (replica.HardState, error) {
	b, err := storage.ReadFileAtomic(fsys, path.Join(dir, hardStateFile))
	switch {
	case err == nil && len(b) == 12:
		return replica.HardState{Promised: binary.BigEndian.Uint64(b), PromisedTo: replica.NodeID(binary.BigEndian.Uint32(b[8:]))}, nil
	case err == nil:
		return replica.HardState{}, fmt.Errorf("%w (%w): %d bytes", errHardStateDamaged, storage.ErrCorrupt, len(b))
	case errors.Is(err, storage.ErrCorrupt):
		return replica.HardState{}, fmt.Errorf("%w: %w", errHardStateDamaged, err)
	case errors.Is(err, fs.ErrNotExist):
		return replica.HardState{}, nil
	}
	return replica.HardState{}, fmt.Errorf("replog: read hard state: %w", err)
}

// loadPersisted reads the hard state and the snapshot point, finishes an
// interrupted snapshot install, and derives the log's epoch boundaries.
// Under the promise-lost mark a damaged hard state is no error: the
// kernel recovers the promise (replica.Persisted.PromiseLost).
func loadPersisted(fsys vfs.FS, dir string, lg *storage.Log) (replica.Persisted, error) {
	var p replica.Persisted
	lost, nonce, err := readPromiseLost(fsys, dir)
	if err != nil {
		return p, err
	}
	p.PromiseLost, p.LostNonce = lost, nonce
	p.Hard, err = readHardState(fsys, dir)
	switch {
	case lost && errors.Is(err, errHardStateDamaged):
		// Left at zero: the kernel starts from its log's last epoch.
	case err != nil:
		return p, err
	}
	snap, err := readSnapshotPoint(fsys, dir)
	if err != nil {
		return p, err
	}
	if snap.installing {
		// A crash interrupted an install: finish it (the log becomes
		// empty after the snapshot point), then record it done.
		if err := lg.Reset(snap.seq + 1); err != nil {
			return p, fmt.Errorf("replog: finish snapshot install at %d: %w", snap.seq, err)
		}
		snap.installing = false
		if err := writeSnapshotPoint(fsys, dir, snap); err != nil {
			return p, err
		}
	}
	if start := lg.StartSeq(); start > snap.seq+1 {
		return p, fmt.Errorf("replog: log starts at %d, after its snapshot point %d", start, snap.seq)
	}
	if last := lg.NextSeq() - 1; last < snap.seq {
		return p, fmt.Errorf("replog: log ends at %d, before its snapshot point %d", last, snap.seq)
	}
	p.SnapSeq, p.SnapEpoch = snap.seq, snap.epoch
	if snap.seq > 0 {
		p.Epochs = append(p.Epochs, replica.EpochStart{Epoch: snap.epoch, StartSeq: snap.seq})
	}
	// The epoch boundaries after the snapshot point come from the batch
	// headers: a restart reads no record (a partition's derived state
	// comes from its own snapshot, node/dedupsnap.go).
	if from := max(lg.StartSeq(), snap.seq+1); from < lg.NextSeq() {
		starts, err := lg.EpochStarts(from)
		if err != nil {
			return p, fmt.Errorf("replog: scan log: %w", err)
		}
		for _, e := range starts {
			if len(p.Epochs) == 0 || p.Epochs[len(p.Epochs)-1].Epoch != e.Epoch {
				p.Epochs = append(p.Epochs, replica.EpochStart{Epoch: e.Epoch, StartSeq: e.Seq})
			}
		}
	}
	p.Last = lg.NextSeq() - 1
	return p, nil
}

// Step hands a message from another member to the kernel (non-blocking;
// dropped, and counted, when the inbound queue is full).
func (l *Log) Step(m replica.Message) {
	select {
	case l.in <- m:
	default:
		l.dropped.Add(1)
	}
}

// Dropped is how many inbound messages a full queue has dropped.
func (l *Log) Dropped() uint64 { return l.dropped.Load() }

// Propose appends rec if this member leads; the proposal completes when
// the entry commits, or fails (replica.ErrNotLeader, replica.ErrQuorumLost,
// ErrLost, ErrClosed). It blocks while the proposal queue is full.
func (l *Log) Propose(rec storage.Record) *Proposal {
	p := NewProposal(rec)
	l.enqueue(p)
	return p
}

// ProposeFunc is Propose with a completion callback instead of Done: done
// runs exactly once, on the member's goroutine (or the caller's when the
// member is closed), and must not block.
func (l *Log) ProposeFunc(rec storage.Record, done func(seq, epoch uint64, err error)) {
	l.enqueue(NewProposalFunc(rec, done))
}

// enqueue hands p, and the proposals chained after it, to the member.
func (l *Log) enqueue(p *Proposal) {
	if l.manual {
		// One goroutine: never block. A full queue is emptied by a Pump,
		// unless one is running (the caller is inside it).
		for tries := 0; ; tries++ {
			select { // on its own: with room in prop too, a select would pick at random
			case <-l.done:
				finishChain(p, ErrClosed)
				return
			default:
			}
			select {
			case l.prop <- p:
				return
			default:
			}
			if tries > 0 || l.pumping {
				finishChain(p, ErrBusy)
				return
			}
			l.Pump()
		}
	}
	select {
	case l.prop <- p:
	case <-l.done:
		finishChain(p, ErrClosed)
	}
}

// NewProposal is a proposal of rec whose outcome closes Done.
func NewProposal(rec storage.Record) *Proposal {
	return &Proposal{Done: make(chan struct{}), data: storage.EncodeRecord(&rec)}
}

// unlink detaches p from its chain and returns the proposal after it.
func (p *Proposal) unlink() *Proposal {
	next := p.next
	p.next = nil
	return next
}

// finishChain finishes p and every proposal chained after it with err.
func finishChain(p *Proposal, err error) {
	for p != nil {
		next := p.unlink()
		p.finish(err)
		p = next
	}
}

// proposeChain proposes p and every proposal chained after it, in order.
func (m *Member) proposeChain(p *Proposal) {
	for p != nil {
		next := p.unlink()
		m.Propose(p)
		p = next
	}
}

// Batch gathers proposals that reach the member in one hand-off
// (Log.ProposeBatch), in order. Their records are encoded into shared
// slabs and their Proposals allocated in blocks, so that a batch costs a
// few allocations instead of two a record. A Batch is reused: what
// ProposeBatch sent is never written again.
type Batch struct {
	head, tail *Proposal
	props      []Proposal // room for the next proposals
	slab       []byte     // room for the next encodings
}

// Sizes of a Batch's blocks; a record larger than a slab gets its own.
const (
	batchPropsBlock = 64
	batchSlabBytes  = 64 << 10
)

// Add appends a proposal of rec whose outcome goes to done with tag.
func (b *Batch) Add(rec *storage.Record, tag Tag, done func(tag Tag, seq, epoch uint64, err error)) {
	if len(b.props) == cap(b.props) {
		b.props = make([]Proposal, 0, batchPropsBlock)
	}
	b.props = append(b.props, Proposal{onTagged: done, tag: tag})
	p := &b.props[len(b.props)-1]
	n := storage.RecordBytes(rec)
	if n > cap(b.slab)-len(b.slab) {
		b.slab = make([]byte, 0, max(n, batchSlabBytes))
	}
	start := len(b.slab)
	b.slab = storage.AppendRecord(b.slab, rec)
	p.data = b.slab[start:len(b.slab):len(b.slab)] // capped: an append to it never reaches the next record
	if b.tail == nil {
		b.head = p
	} else {
		b.tail.next = p
	}
	b.tail = p
}

// ProposeBatch sends b's proposals to the member in one hand-off, as
// ProposeFunc would each, in order, and empties b. It blocks while the
// proposal queue is full.
func (l *Log) ProposeBatch(b *Batch) {
	if b.head == nil {
		return
	}
	head := b.head
	b.head, b.tail = nil, nil
	l.enqueue(head)
}

// NewProposalFunc is a proposal of rec whose outcome is reported to done.
func NewProposalFunc(rec storage.Record, done func(seq, epoch uint64, err error)) *Proposal {
	return &Proposal{data: storage.EncodeRecord(&rec), onDone: done}
}

func (p *Proposal) finish(err error) {
	p.Err = err
	if p.onTagged != nil {
		p.onTagged(p.tag, p.Seq, p.Epoch, err)
		return
	}
	if p.onDone != nil {
		p.onDone(p.Seq, p.Epoch, err)
		return
	}
	close(p.Done)
}

// ReadLog is the member's log for concurrent readers (storage.Log.Read);
// entries above CommitSeq may still be truncated. Never write to it.
func (l *Log) ReadLog() *storage.Log { return l.m.ReadLog() }

// StuckOnDamage is the damage a member alone found restarting in place,
// which keeps it down until a repair (nil: none).
func (l *Log) StuckOnDamage() *storage.Damage { return l.m.stuck.Load() }

// Campaign asks the member to start an election now rather than after its
// election timeout (a new group's first leader; a leader hand-off). The
// kernel ignores it when this member leads or is rebuilding.
func (l *Log) Campaign() {
	select {
	case l.campaign <- struct{}{}:
	default:
	}
}

// TransferTo asks the member to hand leadership to member id (the
// kernel's TransferTo): under ReleaseBeforeTransfer, what the shell calls
// once it released what acts under the lease. The kernel ignores it when
// this member no longer leads; a second request before the member ran
// the first is dropped.
func (l *Log) TransferTo(id replica.NodeID) {
	select {
	case l.transfer <- id:
	default:
	}
}

// Status is the kernel's latest view.
func (l *Log) Status() replica.Status { return l.m.Status() }

// LeaseUntil is the clock reading (nanoseconds) at which the lease of the
// latest Status ends (0: none); see Member.LeaseUntil.
func (l *Log) LeaseUntil() int64 { return l.m.LeaseUntil() }

// HoldsLease reports whether this member leads with a lease that has not
// run out on its clock (Member.HoldsLease).
func (l *Log) HoldsLease() bool { return l.m.HoldsLease() }

// LeaseLeft is how long the lease of the latest Status runs on from now
// (Member.LeaseLeft).
func (l *Log) LeaseLeft() time.Duration { return l.m.LeaseLeft() }

// Tick is the kernel's logical tick (Config.Tick).
func (l *Log) Tick() time.Duration { return l.m.cfg.Tick }

// CommitSeq is the last entry known committed (visible).
func (l *Log) CommitSeq() uint64 { return l.m.CommitSeq() }

// Installs is how many snapshot installs this member has done.
func (l *Log) Installs() uint64 { return l.m.Installs() }

// Read returns committed entries from fromSeq on.
func (l *Log) Read(fromSeq uint64, max int) ([]storage.Entry, error) { return l.m.Read(fromSeq, max) }

// Close stops the member; pending proposals fail with ErrClosed.
func (l *Log) Close() error {
	select {
	case <-l.done:
		if l.manual && !l.closed {
			l.closed = true
			return l.m.Close() // stopped after a failure: the log is still open
		}
		return nil
	default:
	}
	l.closed = true
	close(l.done)
	l.wg.Wait()
	if l.manual {
		for {
			select {
			case p := <-l.prop:
				finishChain(p, ErrClosed)
				continue
			default:
			}
			break
		}
	}
	return l.m.Close()
}

// Damaged tells a running member that its log has damage (the node's
// scrubber found it with storage.Log.Verify, which records it in the
// log). The member then drops the damaged range like a member that finds
// it at open, without a process restart. Safe to call from any goroutine.
func (l *Log) Damaged() {
	select {
	case l.damaged <- struct{}{}:
	default:
	}
}

// DamagedAt tells a running member that a read of seq failed on damage
// no check had located (a batch that went bad after it was verified,
// say in the active segment, which the scrubber never reads). A member
// of a larger group drops its damage as after Damaged; a member alone,
// which has nothing to rebuild from, verifies the segment holding seq on
// its own goroutine (which alone appends: storage.Log.VerifyAt), so the
// damage is recorded and later reads name it (DamageNeverSilent). Safe
// to call from any goroutine.
func (l *Log) DamagedAt(seq uint64) {
	l.damagedAt.CompareAndSwap(0, seq)
	l.Damaged()
}

func (l *Log) run() {
	defer l.wg.Done()
	m := l.m
	l.startTicks()
	compact := m.cfg.Clock.NewTicker(m.cfg.CompactEvery)
	defer compact.Stop()
	defer func() {
		if l.timer != nil {
			l.timer.Stop()
		}
		for {
			select {
			case p := <-l.prop:
				finishChain(p, ErrClosed)
			default:
				return
			}
		}
	}()
	for {
		l.armTicks()
		select {
		case <-l.done:
			return
		case <-l.wake:
			if m.cfg.Clock.NowNanos() >= l.wakeAt {
				l.timer = nil // this wake is the pending timer's, not a stopped one's
			}
			// What arrived before the due tick is stepped before it.
			l.stepTicks(false)
			l.stepQueued()
			l.stepTicks(true)
		case <-compact.C():
			l.stepTicks(false)
			if err := m.Compact(); err != nil {
				m.cfg.Logger.Error("replog: compaction failed; restarting the member in place", "member", m.cfg.ID, "dir", m.cfg.Dir, "err", err)
				if !l.recoverLoop() {
					return
				}
			}
		case <-l.campaign:
			l.stepTicks(false)
			m.Campaign()
		case id := <-l.transfer:
			l.stepTicks(false)
			m.transferTo(id)
		case <-l.damaged:
			restarted, err := m.damaged(l.damagedAt.Swap(0))
			if err != nil {
				// The range may be half dropped (its mark is on disk): a
				// restart in place finishes it from what is durable.
				m.cfg.Logger.Error("replog: cannot drop a damaged range; restarting the member in place", "member", m.cfg.ID, "dir", m.cfg.Dir, "err", err)
				if !l.recoverLoop() {
					return
				}
			} else if restarted {
				l.startTicks() // a new kernel: its time starts now
			}
		case msg := <-l.in:
			l.stepTicks(false)
			m.Step(msg)
			l.stepQueued()
		case p := <-l.prop:
			l.stepTicks(false)
			// The answers that came in meanwhile go first, in Readys of
			// their own: the commit their FLUSHED allow is then
			// published before this batch's fsync, not after it.
			if l.stepQueued() && !l.handle() {
				return
			}
			m.proposeChain(p)
		drainProp:
			for i := 0; i < 4096; i++ {
				select {
				case p := <-l.prop:
					m.proposeChain(p)
				default:
					break drainProp
				}
			}
		}
		if !l.handle() {
			return
		}
	}
}

// startTicks starts counting ticks from the last tick boundary. The
// boundaries are the multiples of the tick on the clock, the same for
// every member of the process: their timers fire together, and one wake
// of the runtime serves them all rather than one each.
func (l *Log) startTicks() {
	now := l.m.cfg.Clock.NowNanos()
	l.tickedAt = now - now%int64(l.m.cfg.Tick)
}

// stepTicks steps the kernel's ticks that passed since the last one it
// stepped (QuietTicks). Between wakes of the tick timer it steps only
// those before the kernel's next due tick: the due tick is the timer's,
// which steps the messages that arrived before it first. A goroutine held
// up past its due tick steps that tick once, and the ticks after it are
// dropped, as a time.Ticker drops the ticks a slow receiver missed.
func (l *Log) stepTicks(onWake bool) {
	tick := int64(l.m.cfg.Tick)
	n := (l.m.cfg.Clock.NowNanos() - l.tickedAt) / tick
	if n <= 0 {
		return
	}
	from := l.tickedAt
	boundary := from + n*tick // the last tick boundary passed
	due := int64(l.m.NextTickDue())
	step := min(n, due)
	l.tickedAt = boundary
	if !onWake {
		step = min(n, due-1)
		if n >= due {
			l.tickedAt = boundary - tick // the due tick, left for the wake
		}
	}
	for i := range step {
		// A dropped stretch ends at the last tick stepped: it began at the
		// last boundary passed.
		at := from + (i+1)*tick
		if i == step-1 && onWake {
			at = l.tickedAt
		}
		l.m.Tick(at)
	}
}

// armTicks makes sure the tick timer wakes the goroutine by the kernel's
// next due tick: an idle follower sleeps until its election timer would
// run out (or its leader's heartbeat wakes it) instead of waking every
// tick. A timer already due sooner is kept: it wakes early, the ticks
// that passed are stepped, and the timer is armed again.
func (l *Log) armTicks() {
	at := l.tickedAt + int64(l.m.NextTickDue())*int64(l.m.cfg.Tick)
	if l.timer != nil && l.wakeAt <= at {
		return
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	clock := l.m.cfg.Clock
	l.wakeAt = at
	l.timer = clock.AfterFunc(time.Duration(at-clock.NowNanos()), l.fire)
}

// fire is the tick timer's callback.
func (l *Log) fire() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// stepQueued steps the messages already queued (a bounded number), and
// reports whether there were any.
func (l *Log) stepQueued() bool {
	for i := 0; i < 1024; i++ {
		select {
		case msg := <-l.in:
			l.m.Step(msg)
		default:
			return i > 0
		}
	}
	return true
}

// handle carries out the member's Readys; a member that cannot persist
// restarts in place (recoverLoop). False: the Log closed meanwhile.
func (l *Log) handle() bool {
	m := l.m
	if err := m.Handle(); err != nil {
		m.cfg.Logger.Error("replog: cannot persist; restarting the member in place", "member", m.cfg.ID, "dir", m.cfg.Dir, "err", err)
		return l.recoverLoop()
	}
	return true
}

// recoverLoop runs while the member cannot persist: it claims nothing
// (publishStopped), answers proposals with ErrRestarted, drops inbound
// messages, and tries Member.Recover every recoverEveryTicks ticks until
// it succeeds (true) or the Log closes (false).
func (l *Log) recoverLoop() bool {
	m := l.m
	m.publishStopped()
	retry := m.cfg.Clock.NewTicker(recoverEveryTicks * m.cfg.Tick)
	defer retry.Stop()
	for {
		select {
		case <-l.done:
			return false
		case p := <-l.prop:
			finishChain(p, ErrRestarted)
		case <-l.in:
		case <-retry.C():
			if err := m.Recover(); err != nil {
				m.cfg.Logger.Error("replog: member still cannot restart; will retry", "member", m.cfg.ID, "dir", m.cfg.Dir, "err", err)
				m.recoverFailed(err)
				continue
			}
			l.startTicks() // a new kernel: its time starts now
			return true
		}
	}
}

// recoverEveryTicks paces the restarts of a member whose disk fails.
const recoverEveryTicks = 10

// epochAt is the epoch the entry at seq was written in, by the log's
// epoch boundaries (ascending).
func epochAt(epochs []replica.EpochStart, seq uint64) uint64 {
	var e uint64
	for _, b := range epochs {
		if b.StartSeq > seq {
			break
		}
		e = b.Epoch
	}
	return e
}
