// Package replog is the shell around the replication kernel for one member
// of one replica group: it persists the kernel's Ready to a storage.Log and
// an atomic hard-state file, sends its messages through a caller-supplied
// function, drives its ticks from a real clock, and completes proposals
// when they commit. The node wires it to the peer transport; tests wire
// several members directly.
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
}

// Log is one member. Its goroutine owns the kernel and the storage writer.
type Log struct {
	cfg  Config
	log  *storage.Log
	k    *replica.Replica
	in   chan replica.Message
	prop chan *Proposal
	done chan struct{}
	wg   sync.WaitGroup

	pending []*Proposal // proposed by this member, awaiting commit (run-owned)

	status    atomic.Pointer[replica.Status]
	commitSeq atomic.Uint64
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
	lg, err := storage.Open(cfg.FS, cfg.Dir, storage.Options{})
	if err != nil {
		return nil, err
	}
	p, err := loadPersisted(cfg.FS, cfg.Dir, lg)
	if err != nil {
		lg.Close()
		return nil, err
	}
	k, err := replica.New(replica.Config{ID: cfg.ID, Replicas: cfg.Members, Policy: cfg.Policy,
		ElectionTicks: cfg.ElectionTicks, Seed: cfg.Seed}, p)
	if err != nil {
		lg.Close()
		return nil, err
	}
	l := &Log{cfg: cfg, log: lg, k: k, in: make(chan replica.Message, 4096),
		prop: make(chan *Proposal, cfg.ProposeQueueMax), done: make(chan struct{})}
	l.publishStatus()
	l.wg.Add(1)
	go l.run()
	return l, nil
}

// loadPersisted reads the hard state and derives the log's epoch boundaries.
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
	// The epoch boundaries come from the entries' epochs. (A scan: fine for
	// now; a persisted boundary index belongs with snapshots.)
	for from := lg.StartSeq(); from < lg.NextSeq(); {
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
// dropped when the inbound queue is full).
func (l *Log) Step(m replica.Message) {
	select {
	case l.in <- m:
	default:
	}
}

// Propose appends data if this member leads; the proposal completes when
// the entry commits, or fails (ErrNotLeader, replica.ErrQuorumLost,
// ErrLost, ErrClosed).
func (l *Log) Propose(data []byte) *Proposal {
	p := &Proposal{Done: make(chan struct{}), data: data}
	select {
	case l.prop <- p:
	case <-l.done:
		p.Err = ErrClosed
		close(p.Done)
	}
	return p
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
		if err := l.handleReady(); err != nil {
			l.cfg.Logger.Error("replog: cannot persist; stopping member", "member", l.cfg.ID, "err", err)
			return
		}
	}
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
	close(p.Done)
}

// handleReady carries out the kernel's Ready: hard state, truncation and
// entries made durable first, then messages sent (the ordering rule), then
// Advance and completion of committed proposals.
func (l *Log) handleReady() error {
	for l.k.HasReady() {
		rd := l.k.Ready()
		if rd.Snapshot != nil {
			// Members never compact yet, so no leader sends snapshots;
			// installing one needs the snapshot transfer (not built).
			return fmt.Errorf("replog: snapshot install at %d requested, not supported yet", rd.Snapshot.Seq)
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
				recs = append(recs, storage.Record{Value: rd.Entries[j].Data})
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
		if rd.Truncate || len(rd.Entries) > 0 {
			if err := l.log.Sync(); err != nil {
				return err
			}
		}
		for _, m := range rd.Messages {
			if m.Type == replica.MsgAppend && m.FirstSeq != 0 {
				entries, err := l.log.Read(m.FirstSeq, int(m.LastSeqSent-m.FirstSeq+1), 4<<20)
				if err != nil {
					return err
				}
				for _, e := range entries {
					m.Entries = append(m.Entries, replica.Entry{Seq: e.Seq, Epoch: e.Epoch, Data: e.Record.Value})
				}
				if len(m.Entries) > 0 {
					m.LastSeqSent = m.Entries[len(m.Entries)-1].Seq
				}
			}
			l.cfg.Send(m)
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

// completeCommitted finishes proposals up to commit: committed if the
// entry at their seq is still theirs (same epoch), otherwise lost.
func (l *Log) completeCommitted(commit uint64) {
	kept := l.pending[:0]
	for _, p := range l.pending {
		if p.Seq > commit {
			kept = append(kept, p)
			continue
		}
		entries, err := l.log.Read(p.Seq, 1, 1)
		switch {
		case err != nil:
			p.finish(err)
		case len(entries) == 1 && entries[0].Epoch == p.Epoch:
			p.finish(nil)
		default:
			p.finish(ErrLost)
		}
	}
	l.pending = kept
}

func (l *Log) publishStatus() {
	st := l.k.Status()
	l.status.Store(&st)
}
