package replog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// rebuildingFile marks a member that dropped a damaged range of its log
// and is not whole again yet. It outlives restarts: once the damaged
// entries are gone nothing else would remember that this member may lack
// entries it acknowledged as flushed, and such a member must not grant a
// promise or campaign (a candidate missing a committed entry could win
// with its vote) until its leader has made it whole.
const rebuildingFile = "rebuilding"

// quarantineDamage handles damage in a member's log at open. Damage that
// recovery could not see (a sealed segment trusted through its index) is
// first looked for by verifying the sealed segments. The member then
// records that it is rebuilding, durably, and truncates its log just
// before the first damaged range: it stops vouching for that range and
// what follows, and catches up from its leader (or a snapshot) instead.
// When that cut meets damage below the range that nobody had recorded
// (the log refuses it: storage's cutVerifiedFirst), it cuts before that
// damage instead. It reports whether it quarantined anything.
func quarantineDamage(fsys vfs.FS, dir string, lg *storage.Log, logger *slog.Logger) (bool, error) {
	if len(lg.Damage()) == 0 {
		if _, err := lg.VerifyAll(); err != nil {
			return false, fmt.Errorf("replog: verify log: %w", err)
		}
	}
	ds := lg.Damage()
	if len(ds) == 0 {
		return false, nil
	}
	d := ds[0]
	logger.Error("replog: damaged log; dropping the damaged range and what follows, rebuilding from the leader",
		"dir", dir, "file", d.Segment, "offset", d.Offset, "bytes", d.Bytes, "first_seq", d.FirstSeq, "last_seq", d.LastSeq, "cause", d.Cause)
	if err := storage.WriteFileAtomic(fsys, path.Join(dir, rebuildingFile), []byte(d.String())); err != nil {
		return false, err
	}
	for {
		err := lg.TruncateAfter(d.FirstSeq - 1)
		var lower *storage.CorruptError
		if !errors.As(err, &lower) || lower.Damage.FirstSeq >= d.FirstSeq {
			if err != nil {
				return false, fmt.Errorf("replog: drop damaged range: %w", err)
			}
			break
		}
		// The cut met damage just below the range that nobody had
		// recorded (storage's cutVerifiedFirst): drop it whole too.
		d = lower.Damage
		logger.Error("replog: damaged log; dropping the damaged range found below it too",
			"dir", dir, "file", d.Segment, "offset", d.Offset, "bytes", d.Bytes, "first_seq", d.FirstSeq, "last_seq", d.LastSeq, "cause", d.Cause)
	}
	if err := lg.Sync(); err != nil {
		return false, fmt.Errorf("replog: drop damaged range: %w", err)
	}
	return true, nil
}

// uncertainFile marks a member that cut an invalid tail off its log at
// open with nothing after it to prove it durable. A torn write looks like
// that, and so does a flushed batch that went bad since: the member may
// have acknowledged entries it no longer holds. The mark is written
// before the cut (storage.Options.BeforeTornTailCut), so a crash cannot
// forget it, and outlives restarts until a newer leader has made the
// member whole (replica.Persisted.Uncertain).
const uncertainFile = "uncertain"

// promiseLostFile marks a member of a group whose hard state went bad:
// which epochs it promised is unknown, so its kernel takes no part in the
// group until every other member reported its own promise
// (replica.Persisted.PromiseLost). The mark holds the loss's nonce, which
// tells this loss's reports from a former one's; it is written before
// anything else happens and removed once the recovered hard state is
// durable.
const promiseLostFile = "promise-lost"

// markPromiseLost writes the promise-lost mark with a fresh nonce (the
// clock's reading: a later loss reads a later one).
func markPromiseLost(cfg Config, cause error) error {
	cfg.Logger.Error("replog: damaged hard state; the epochs this member promised are unknown: it takes no part until every other member reported its promise",
		"dir", cfg.Dir, "err", cause)
	nonce := max(uint64(cfg.Clock.NowNanos()), 1)
	return storage.WriteFileAtomic(cfg.FS, path.Join(cfg.Dir, promiseLostFile), binary.BigEndian.AppendUint64(nil, nonce))
}

// readPromiseLost reads the promise-lost mark: whether it is set, and its
// nonce (0 when the mark itself is damaged: it still marks, and
// loadOrQuarantine writes it again).
func readPromiseLost(fsys vfs.FS, dir string) (lost bool, nonce uint64, err error) {
	b, err := storage.ReadFileAtomic(fsys, path.Join(dir, promiseLostFile))
	switch {
	case err == nil && len(b) == 8:
		return true, binary.BigEndian.Uint64(b), nil
	case err == nil, errors.Is(err, storage.ErrCorrupt):
		return true, 0, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, 0, nil
	}
	return false, 0, err
}

// storageOptions are the member's log options: a member of a group marks
// itself uncertain before its log cuts a torn tail, and a newer leader
// makes it whole. A member alone has no one to vouch to: when it keeps a
// torn tail's seqs (storage.Options.KeepTornSeqs) it fills them with lost
// records, as its repair does.
func storageOptions(cfg Config) storage.Options {
	opts := cfg.Storage
	opts.KeepTornSeqs = opts.KeepTornSeqs && len(cfg.Members) == 1
	if opts.KeepTornSeqs {
		opts.Filler = &lostRecord
	}
	if len(cfg.Members) > 1 {
		opts.BeforeTornTailCut = func(t storage.TornTail) error {
			cfg.Logger.Warn("replog: cutting an invalid tail that nothing proves torn; this member's votes vouch for less until a new leader has made it whole",
				"dir", cfg.Dir, "file", t.Segment, "offset", t.Offset, "bytes", t.Bytes)
			return storage.WriteFileAtomic(cfg.FS, path.Join(cfg.Dir, uncertainFile),
				fmt.Appendf(nil, "%s at %d: %d bytes", t.Segment, t.Offset, t.Bytes))
		}
	}
	return opts
}

// lostRecord fills each seq of a damaged range that RepairAlone dropped,
// and of a torn tail a member alone kept: a control record, which every
// reader skips, so the member's kernel and its partition still apply
// every seq in turn.
var lostRecord = storage.Record{Headers: []storage.Header{{Key: ControlHeader, Value: []byte("lost")}}}

// IsLost reports whether r fills a seq a repair of a member alone dropped
// (RepairAlone): what the seq held is gone. State derived from the log
// that must not lose a write in silence (a KV bucket's watchers) takes it
// as a dropped seq, not as a control record to skip.
func IsLost(r *storage.Record) bool {
	return len(r.Headers) == 1 && r.Headers[0].Key == ControlHeader && string(r.Headers[0].Value) == "lost" &&
		len(r.Key) == 0 && len(r.Value) == 0
}

// AloneRepair is what RepairAlone found in a member alone's directory and
// did (or, in a dry run, would do).
type AloneRepair struct {
	Log storage.RepairReport
	// HardStateReset: the hard state was damaged; it is rewritten as a
	// promise to the member itself of its log's last epoch (the next
	// election takes the one after). With no other member, an epoch it
	// had promised beyond that holds no entry and no answer named it.
	HardStateReset bool
	// SnapshotPointReset: the snapshot point was damaged; it is rewritten
	// as the seq before the log's start, in the epoch of the log's first
	// entry (no other member checks it against its own).
	SnapshotPointReset bool
}

// RepairAlone repairs the directory of a member alone (a group of one
// replica, self: no member holds a healthy copy, so it refuses to open
// damage), which must not be open. Each damaged range of its log becomes
// lost records, every valid record after it keeps its seq, an invalid
// tail is cut (its named seqs filled with lost records with
// opts.KeepTornSeqs) — below opts.DurableThrough (a seq the log held
// durably; 0: none known) it is a damaged range too; what the range held
// is gone. A damaged hard state or
// snapshot point is rewritten from the repaired log (AloneRepair). A
// member of a larger group needs none of it: it drops its damage and
// rebuilds from a healthy member (and must not forget its promises).
func RepairAlone(fsys vfs.FS, dir string, self replica.NodeID, opts storage.Options, dryRun bool) (AloneRepair, error) {
	var r AloneRepair
	var err error
	if r.Log, err = storage.RepairFilled(fsys, dir, opts, lostRecord, dryRun); err != nil {
		return r, err
	}
	if _, err := readHardState(fsys, dir); errors.Is(err, errHardStateDamaged) {
		r.HardStateReset = true
	}
	if _, err := readSnapshotPoint(fsys, dir); errors.Is(err, errSnapshotPointDamaged) {
		r.SnapshotPointReset = true
	}
	if dryRun || !r.HardStateReset && !r.SnapshotPointReset {
		return r, nil
	}
	lg, err := storage.Open(fsys, dir, storage.Options{})
	if err != nil {
		return r, fmt.Errorf("replog: open the repaired log: %w", err)
	}
	start, next, last := lg.StartSeq(), lg.NextSeq(), lg.LastEpoch()
	first := last
	if next > start {
		starts, err := lg.EpochStarts(start)
		if err != nil {
			lg.Close()
			return r, fmt.Errorf("replog: epochs of the repaired log: %w", err)
		}
		first = starts[0].Epoch
	}
	lg.Close()
	if r.SnapshotPointReset {
		point := snapshotPoint{}
		if start > 1 {
			point = snapshotPoint{seq: start - 1, epoch: max(first, 1)}
		}
		if err := writeSnapshotPoint(fsys, dir, point); err != nil {
			return r, err
		}
		last = max(last, point.epoch)
	}
	if r.HardStateReset {
		if err := writeHardState(fsys, dir, replica.HardState{Promised: last, PromisedTo: self}); err != nil {
			return r, err
		}
	}
	return r, nil
}

// hasMark reports whether the member's mark file name (rebuildingFile,
// uncertainFile) is set.
func hasMark(fsys vfs.FS, dir, name string) (bool, error) {
	_, err := storage.ReadFileAtomic(fsys, path.Join(dir, name))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case errors.Is(err, storage.ErrCorrupt):
		return true, nil // a damaged mark still marks
	}
	return false, err
}

// resetDamagedMember handles a damaged snapshot point: without it the
// member cannot tell where its log starts in the replicated history, so it
// records that it is rebuilding, empties its log and starts over as an
// empty member (snapshot point zero) that its leader fills again, from
// its log or a snapshot. The hard state (promises) is kept. Each step can
// be repeated after a crash.
func resetDamagedMember(fsys vfs.FS, dir string, lg *storage.Log, cause error, logger *slog.Logger) error {
	logger.Error("replog: damaged snapshot point; emptying the log, rebuilding from the leader", "dir", dir, "err", cause)
	if err := storage.WriteFileAtomic(fsys, path.Join(dir, rebuildingFile), []byte(cause.Error())); err != nil {
		return err
	}
	if err := lg.Reset(1); err != nil {
		return fmt.Errorf("replog: empty damaged member: %w", err)
	}
	return writeSnapshotPoint(fsys, dir, snapshotPoint{})
}

// ErrRestarted fails the proposals pending on a member that restarted in
// place to drop a damaged range; they may still commit through the other
// members, so a retry with the same producer identity is the safe answer.
var ErrRestarted = errors.New("replog: member restarted to drop a damaged range")

// errDamagedLog marks damage that the member's own store met in its log:
// a read for an Append that found it, or a truncation its log refused
// inside a damaged range (storage's cutOutsideDamage).
var errDamagedLog = errors.New("replog: damaged entries")

// damaged answers Damaged and DamagedAt (at: the seq a read failed on,
// 0: none): a member alone locates the damage (locateDamage), any other
// drops it and rebuilds (restartDamaged).
func (m *Member) damaged(at uint64) (bool, error) {
	if len(m.cfg.Members) < 2 {
		m.locateDamage(at)
		return false, nil
	}
	return m.restartDamaged()
}

// locateDamage verifies, for a member alone, the segment holding seq
// (storage.Log.VerifyAt), which records the damage there: reads then
// refuse those seqs by name, and the node marks the partition corrupt
// until a repair. What it finds is said, and the caller notified (the
// node's apply steps over a located range). A failed verify is said and
// changes nothing: the next failing read asks again.
func (m *Member) locateDamage(seq uint64) {
	if seq == 0 {
		return
	}
	found, err := m.log.VerifyAt(seq)
	if err != nil {
		m.cfg.Logger.Error("replog: cannot verify the segment a read failed in", "dir", m.cfg.Dir, "seq", seq, "err", err)
	}
	for _, d := range found {
		m.cfg.Logger.Error("replog: damaged log found by a read; a member alone keeps it (nothing to rebuild it from)",
			"dir", m.cfg.Dir, "file", d.Segment, "offset", d.Offset, "bytes", d.Bytes, "first_seq", d.FirstSeq, "last_seq", d.LastSeq, "cause", d.Cause)
	}
	if len(found) > 0 && m.cfg.Notify != nil {
		m.cfg.Notify()
	}
}

// restartDamaged drops the log's first damaged range (verifying the sealed
// segments when no damage is recorded yet) and restarts the member in
// place, as a process restart would: a fresh kernel from what is durable,
// rebuilding (neither campaigning nor granting) until its leader has made
// it whole. A leader thereby gives up its leadership. Pending proposals
// fail with ErrRestarted. It reports whether it restarted: a member alone
// (nothing to rebuild from) does not, nor one whose log shows no damage.
func (m *Member) restartDamaged() (bool, error) {
	if len(m.cfg.Members) < 2 {
		return false, nil
	}
	if m.cfg.BeforeDrop != nil {
		m.cfg.BeforeDrop(m.k.Status(), m.log.SyncedSeq())
	}
	quarantined, err := quarantineDamage(m.cfg.FS, m.cfg.Dir, m.log, m.cfg.Logger)
	if err != nil || !quarantined {
		return false, err
	}
	p, err := loadPersisted(m.cfg.FS, m.cfg.Dir, m.log)
	if err != nil {
		return false, err
	}
	p.Rebuilding = true
	if p.Uncertain, err = hasMark(m.cfg.FS, m.cfg.Dir, uncertainFile); err != nil {
		return false, err
	}
	k, err := replica.New(kernelConfig(m.cfg), p)
	if err != nil {
		return false, err
	}
	for _, pr := range m.pending {
		pr.finish(ErrRestarted)
	}
	m.pending = nil
	m.setKernel(k)
	m.rebuildingMarked, m.uncertainMarked, m.promiseLostMarked = true, p.Uncertain, p.PromiseLost
	m.commitSeq.Store(min(m.commitSeq.Load(), m.log.NextSeq()-1))
	m.publishStatus()
	return true, nil
}
