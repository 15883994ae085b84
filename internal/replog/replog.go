// Package replog is the shell around the replication kernel for one member
// of one replica group: it persists the kernel's Ready to a storage.Log and
// an atomic hard-state file, sends its messages through a caller-supplied
// function, drives its ticks from a real clock, and completes proposals
// when they commit. The node wires it to the peer transport; tests wire
// several members directly.
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
	// after ElectionTicks ticks (default 15).
	Tick          time.Duration
	ElectionTicks int
	Seed          uint64
	// ProposeQueueMax bounds queued proposals (default 4096).
	ProposeQueueMax int
	// Storage configures the member's log (sizes, bounds).
	Storage storage.Options
	// Notify, when set, is called on the member's goroutine whenever the
	// commit point, the role, the epoch, the leader, the read-only mode or
	// the log's start changed. It must not block.
	Notify func()
	// Compaction: when Storage sets a retention, every CompactEvery
	// (default 1 s) the member deletes the log segments retention lets go
	// of — never past what the kernel must keep (committed, flushed, and
	// what a follower inside its reservation still needs), nor past
	// CompactLimit when set (what the caller has not consumed yet). NowMs
	// is the retention clock (default the wall clock).
	CompactEvery time.Duration
	CompactLimit func() uint64
	NowMs        func() int64
	// Reservation is how long a leader keeps the log a silent follower
	// still needs (default 30 s); a follower away longer may have to
	// rebuild from a snapshot.
	Reservation time.Duration
}

// Errors.
var (
	ErrClosed = errors.New("replog: closed")
	// ErrLost: the entry was proposed but a new leader's lineage replaced it.
	ErrLost = errors.New("replog: entry lost to a leader change")
)

// Proposal is the outcome of one Propose, available once Done is closed.
type Proposal struct {
	Done       chan struct{}
	Seq, Epoch uint64
	Err        error
	data       []byte
	onDone     func(seq, epoch uint64, err error)
}

// ControlHeader marks a control record (an epoch's install entry); the
// broker refuses client records that carry it.
const ControlHeader = "nereus-control"

var installRecord = storage.Record{Headers: []storage.Header{{Key: ControlHeader, Value: []byte("install")}}}

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

// Log is one member. Its goroutine owns the kernel and the storage writer.
type Log struct {
	cfg      Config
	log      *storage.Log
	k        *replica.Replica
	in       chan replica.Message
	prop     chan *Proposal
	campaign chan struct{} // capacity 1: Campaign asked for an election
	done     chan struct{}
	wg       sync.WaitGroup

	pending []*Proposal // proposed by this member, awaiting commit (run-owned)

	status    atomic.Pointer[replica.Status]
	commitSeq atomic.Uint64
	dropped   atomic.Uint64
	installs  atomic.Uint64
	notified  notice // what Notify last reported (run-owned)
	// rebuildingMarked: the rebuilding mark (rebuildingFile) is on disk;
	// run removes it once the kernel says the member is whole (run-owned).
	rebuildingMarked bool
	// damaged (capacity 1) tells run that damage was found in the log
	// while the member runs (Damaged).
	damaged chan struct{}
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

// Open restores a member from its directory and starts it.
func Open(cfg Config) (*Log, error) {
	if cfg.FS == nil || cfg.Send == nil || cfg.Dir == "" {
		return nil, errors.New("replog: FS, Send and Dir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tick == 0 {
		cfg.Tick = 10 * time.Millisecond
	}
	if cfg.ElectionTicks == 0 {
		cfg.ElectionTicks = 15
	}
	if cfg.ProposeQueueMax == 0 {
		cfg.ProposeQueueMax = 4096
	}
	if cfg.CompactEvery == 0 {
		cfg.CompactEvery = time.Second
	}
	if cfg.NowMs == nil {
		cfg.NowMs = func() int64 { return time.Now().UnixMilli() }
	}
	if cfg.Reservation == 0 {
		cfg.Reservation = 30 * time.Second
	}
	lg, err := storage.Open(cfg.FS, cfg.Dir, cfg.Storage)
	if err != nil {
		return nil, err
	}
	p, err := loadPersisted(cfg.FS, cfg.Dir, lg)
	// A damaged member rebuilds from a healthy one; a member alone has
	// none, so it refuses to open (its data cannot be recovered here).
	canRebuild := len(cfg.Members) > 1
	if canRebuild && errors.Is(err, errSnapshotPointDamaged) {
		if err = resetDamagedMember(cfg.FS, cfg.Dir, lg, err, cfg.Logger); err == nil {
			p, err = loadPersisted(cfg.FS, cfg.Dir, lg)
		}
	}
	if canRebuild && errors.Is(err, storage.ErrCorrupt) {
		quarantined, qerr := quarantineDamage(cfg.FS, cfg.Dir, lg, cfg.Logger)
		switch {
		case qerr != nil:
			err = qerr
		case quarantined:
			p, err = loadPersisted(cfg.FS, cfg.Dir, lg)
		}
	}
	marked := false
	if err == nil {
		marked, err = isRebuilding(cfg.FS, cfg.Dir)
		p.Rebuilding = p.Rebuilding || marked
	}
	if err != nil {
		lg.Close()
		return nil, err
	}
	k, err := replica.New(kernelConfig(cfg), p)
	if err != nil {
		lg.Close()
		return nil, err
	}
	l := &Log{cfg: cfg, log: lg, k: k, in: make(chan replica.Message, 4096), campaign: make(chan struct{}, 1),
		prop: make(chan *Proposal, cfg.ProposeQueueMax), done: make(chan struct{}), rebuildingMarked: marked,
		damaged: make(chan struct{}, 1)}
	l.publishStatus()
	l.wg.Add(1)
	go l.run()
	return l, nil
}

// kernelConfig is the replication kernel's configuration for a member.
func kernelConfig(cfg Config) replica.Config {
	return replica.Config{ID: cfg.ID, Replicas: cfg.Members, Policy: cfg.Policy,
		ElectionTicks: cfg.ElectionTicks, Seed: cfg.Seed,
		ReservationTicks: max(int(cfg.Reservation/cfg.Tick), 4*cfg.ElectionTicks)}
}

// loadPersisted reads the hard state and the snapshot point, finishes an
// interrupted snapshot install, and derives the log's epoch boundaries.
func loadPersisted(fsys vfs.FS, dir string, lg *storage.Log) (replica.Persisted, error) {
	var p replica.Persisted
	b, err := storage.ReadFileAtomic(fsys, path.Join(dir, hardStateFile))
	switch {
	case err == nil && len(b) == 12:
		p.Hard = replica.HardState{Promised: binary.BigEndian.Uint64(b), PromisedTo: replica.NodeID(binary.BigEndian.Uint32(b[8:]))}
	case err == nil:
		return p, fmt.Errorf("replog: hard state of %d bytes", len(b))
	case !errors.Is(err, fs.ErrNotExist):
		return p, fmt.Errorf("replog: read hard state: %w", err)
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
	// The epoch boundaries after the snapshot point come from the entries'
	// epochs. (A scan: fine for now; an index belongs with checkpoints.)
	for from := max(lg.StartSeq(), snap.seq+1); from < lg.NextSeq(); {
		entries, err := lg.Read(from, 4096, 16<<20)
		if err != nil {
			return p, fmt.Errorf("replog: scan log: %w", err)
		}
		for _, e := range entries {
			if len(p.Epochs) == 0 || p.Epochs[len(p.Epochs)-1].Epoch != e.Epoch {
				p.Epochs = append(p.Epochs, replica.EpochStart{Epoch: e.Epoch, StartSeq: e.Seq})
			}
		}
		from = entries[len(entries)-1].Seq + 1
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
	p := &Proposal{Done: make(chan struct{}), data: storage.AppendRecord(nil, &rec)}
	l.enqueue(p)
	return p
}

// ProposeFunc is Propose with a completion callback instead of Done: done
// runs exactly once, on the member's goroutine (or the caller's when the
// member is closed), and must not block.
func (l *Log) ProposeFunc(rec storage.Record, done func(seq, epoch uint64, err error)) {
	l.enqueue(&Proposal{data: storage.AppendRecord(nil, &rec), onDone: done})
}

func (l *Log) enqueue(p *Proposal) {
	select {
	case l.prop <- p:
	case <-l.done:
		p.finish(ErrClosed)
	}
}

// ReadLog is the member's log for concurrent readers (storage.Log.Read);
// entries above CommitSeq may still be truncated. Never write to it.
func (l *Log) ReadLog() *storage.Log { return l.log }

// Campaign asks the member to start an election now rather than after its
// election timeout (a new group's first leader; a leader hand-off). The
// kernel ignores it when this member leads or is rebuilding.
func (l *Log) Campaign() {
	select {
	case l.campaign <- struct{}{}:
	default:
	}
}

// Status is the kernel's latest view.
func (l *Log) Status() replica.Status { return *l.status.Load() }

// CommitSeq is the last entry known committed (visible).
func (l *Log) CommitSeq() uint64 { return l.commitSeq.Load() }

// Read returns committed entries from fromSeq on.
func (l *Log) Read(fromSeq uint64, max int) ([]storage.Entry, error) {
	commit := l.commitSeq.Load()
	if fromSeq > commit {
		return nil, nil
	}
	entries, err := l.log.Read(fromSeq, min(max, int(commit-fromSeq+1)), 16<<20)
	for i, e := range entries {
		if e.Seq > commit {
			return entries[:i], err
		}
	}
	return entries, err
}

// Close stops the member; pending proposals fail with ErrClosed.
func (l *Log) Close() error {
	select {
	case <-l.done:
		return nil
	default:
	}
	close(l.done)
	l.wg.Wait()
	return l.log.Close()
}

func (l *Log) run() {
	defer l.wg.Done()
	ticker := time.NewTicker(l.cfg.Tick)
	defer ticker.Stop()
	compact := time.NewTicker(l.cfg.CompactEvery)
	defer compact.Stop()
	defer func() {
		for _, p := range l.pending {
			p.finish(ErrClosed)
		}
		for {
			select {
			case p := <-l.prop:
				p.finish(ErrClosed)
			default:
				return
			}
		}
	}()
	for {
		select {
		case <-l.done:
			return
		case <-ticker.C:
			l.k.Tick()
		case <-compact.C:
			if err := l.compact(); err != nil {
				l.cfg.Logger.Error("replog: compaction failed; stopping member", "member", l.cfg.ID, "dir", l.cfg.Dir, "err", err)
				return
			}
		case <-l.campaign:
			l.k.Campaign()
		case <-l.damaged:
			if _, err := l.restartDamaged(); err != nil {
				l.cfg.Logger.Error("replog: cannot drop a damaged range; stopping member", "member", l.cfg.ID, "dir", l.cfg.Dir, "err", err)
				return
			}
		case m := <-l.in:
			l.k.Step(m)
		drainIn:
			for i := 0; i < 1024; i++ {
				select {
				case m := <-l.in:
					l.k.Step(m)
				default:
					break drainIn
				}
			}
		case p := <-l.prop:
			l.propose(p)
		drainProp:
			for i := 0; i < 4096; i++ {
				select {
				case p := <-l.prop:
					l.propose(p)
				default:
					break drainProp
				}
			}
		}
		if err := l.handleReady(); errors.Is(err, errDamagedRead) {
			// Reading entries for a follower found damage: drop it and
			// rebuild, as after a restart (the unfinished Ready is lost,
			// as in a crash).
			if restarted, rerr := l.restartDamaged(); rerr != nil || !restarted {
				l.cfg.Logger.Error("replog: damaged log; stopping member", "member", l.cfg.ID, "dir", l.cfg.Dir, "err", errors.Join(err, rerr))
				return
			}
		} else if err != nil {
			l.cfg.Logger.Error("replog: cannot persist; stopping member", "member", l.cfg.ID, "err", err)
			return
		}
		if l.rebuildingMarked && !l.k.Status().Rebuilding {
			if err := l.clearRebuilding(); err != nil {
				l.cfg.Logger.Error("replog: cannot clear the rebuilding mark; stopping member", "member", l.cfg.ID, "err", err)
				return
			}
		}
	}
}

// clearRebuilding removes the rebuilding mark once the member is whole
// (it holds everything its leader committed), durably.
func (l *Log) clearRebuilding() error {
	if err := l.cfg.FS.Remove(path.Join(l.cfg.Dir, rebuildingFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := l.cfg.FS.SyncDir(l.cfg.Dir); err != nil {
		return err
	}
	l.rebuildingMarked = false
	l.cfg.Logger.Info("replog: whole again after dropping a damaged range", "member", l.cfg.ID, "dir", l.cfg.Dir)
	return nil
}

func (l *Log) propose(p *Proposal) {
	seq, epoch, err := l.k.Propose(p.data)
	if err != nil {
		p.finish(err)
		return
	}
	p.Seq, p.Epoch = seq, epoch
	l.pending = append(l.pending, p)
}

func (p *Proposal) finish(err error) {
	p.Err = err
	if p.onDone != nil {
		p.onDone(p.Seq, p.Epoch, err)
		return
	}
	close(p.Done)
}

// handleReady carries out the kernel's Ready: hard state, truncation and
// entries made durable first, then messages sent (the ordering rule), then
// Advance and completion of committed proposals.
func (l *Log) handleReady() error {
	var err error
	for l.k.HasReady() {
		rd := l.k.Ready()
		if rd.Snapshot != nil {
			if err := l.installSnapshot(*rd.Snapshot); err != nil {
				return err
			}
		}
		if rd.HardState != nil {
			var b [12]byte
			binary.BigEndian.PutUint64(b[:], rd.HardState.Promised)
			binary.BigEndian.PutUint32(b[8:], uint32(rd.HardState.PromisedTo))
			if err := storage.WriteFileAtomic(l.cfg.FS, path.Join(l.cfg.Dir, hardStateFile), b[:]); err != nil {
				return err
			}
		}
		if rd.Truncate {
			if err := l.log.TruncateAfter(rd.TruncateAfter); err != nil {
				return err
			}
		}
		for i := 0; i < len(rd.Entries); {
			j := i
			var recs []storage.Record
			for ; j < len(rd.Entries) && rd.Entries[j].Epoch == rd.Entries[i].Epoch; j++ {
				rec := installRecord
				if data := rd.Entries[j].Data; len(data) > 0 {
					var err error
					if rec, err = storage.DecodeRecord(data); err != nil {
						return fmt.Errorf("replog: entry %d: %w", rd.Entries[j].Seq, err)
					}
				}
				recs = append(recs, rec)
			}
			first, err := l.log.Append(rd.Entries[i].Epoch, recs)
			if err != nil {
				return err
			}
			if first != rd.Entries[i].Seq {
				return fmt.Errorf("replog: storage put seq %d where the kernel expects %d", first, rd.Entries[i].Seq)
			}
			i = j
		}
		// A leader's Appends go out before its own fsync: followers then
		// flush in parallel with it. That is safe because the kernel counts
		// the leader's own entries only once Advance reports them durable
		// (Raft §10.2.1). Everything else waits for durability (the
		// ordering rule on replica.Ready): promises, truncations, acks.
		early := rd.HardState == nil && !rd.Truncate // Appends come from leaders only
		if early {
			if err := l.send(rd, replica.MsgAppend); err != nil {
				return err
			}
		}
		if rd.Truncate || len(rd.Entries) > 0 {
			if err := l.log.Sync(); err != nil {
				return err
			}
		}
		if early {
			err = l.send(rd, otherThanAppend)
		} else {
			err = l.send(rd, anyMessage)
		}
		if err != nil {
			return err
		}
		l.k.Advance(rd)
		if rd.CommitSeq > 0 {
			l.commitSeq.Store(rd.CommitSeq)
			l.completeCommitted(rd.CommitSeq)
		}
	}
	l.publishStatus()
	return nil
}

// Message filters for send.
const (
	anyMessage      replica.MsgType = 0
	otherThanAppend replica.MsgType = 255
)

// send sends the Ready's messages of type only (anyMessage: all;
// otherThanAppend: all but Appends), attaching entry data to Appends: from
// the Ready itself when it holds the range (a leader's fresh proposals, no
// read or re-encoding), else from the log.
func (l *Log) send(rd replica.Ready, only replica.MsgType) error {
	for _, m := range rd.Messages {
		switch {
		case only == anyMessage:
		case only == otherThanAppend && m.Type == replica.MsgAppend:
			continue
		case only != otherThanAppend && m.Type != only:
			continue
		}
		if m.Type == replica.MsgAppend && m.FirstSeq != 0 {
			if err := l.attachEntries(&m, rd.Entries); err != nil {
				return err
			}
		}
		l.cfg.Send(m)
	}
	return nil
}

func (l *Log) attachEntries(m *replica.Message, fresh []replica.Entry) error {
	if n := len(fresh); n > 0 && m.FirstSeq >= fresh[0].Seq && m.LastSeqSent <= fresh[n-1].Seq {
		m.Entries = fresh[m.FirstSeq-fresh[0].Seq : m.LastSeqSent-fresh[0].Seq+1]
		return nil
	}
	entries, err := l.log.Read(m.FirstSeq, int(m.LastSeqSent-m.FirstSeq+1), 4<<20)
	if errors.Is(err, storage.ErrCorrupt) {
		return fmt.Errorf("%w: %w", errDamagedRead, err)
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		var data []byte // an install entry travels empty
		if !isInstall(&e.Record) {
			data = storage.AppendRecord(nil, &e.Record)
		}
		m.Entries = append(m.Entries, replica.Entry{Seq: e.Seq, Epoch: e.Epoch, Data: data})
	}
	if len(m.Entries) > 0 {
		m.LastSeqSent = m.Entries[len(m.Entries)-1].Seq
	}
	return nil
}

// completeCommitted finishes proposals up to commit: committed if the
// entry at their seq is still theirs (written in their epoch, by the
// kernel's epoch boundaries), otherwise lost to another lineage.
func (l *Log) completeCommitted(commit uint64) {
	if len(l.pending) == 0 || l.pending[0].Seq > commit {
		return
	}
	epochs := l.k.Status().Epochs
	kept := l.pending[:0]
	for _, p := range l.pending {
		if p.Seq > commit {
			kept = append(kept, p)
			continue
		}
		if epochAt(epochs, p.Seq) == p.Epoch {
			p.finish(nil)
		} else {
			p.finish(ErrLost)
		}
	}
	clear(l.pending[len(kept):])
	l.pending = kept
}

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

func (l *Log) publishStatus() {
	st := l.k.Status()
	l.status.Store(&st)
	if l.cfg.Notify == nil {
		return
	}
	n := notice{role: st.Role, epoch: st.Hard.Promised, commit: l.commitSeq.Load(), leader: st.Leader, readOnly: st.ReadOnly,
		start: l.log.StartSeq(), valid: true}
	if n != l.notified {
		l.notified = n
		l.cfg.Notify()
	}
}
