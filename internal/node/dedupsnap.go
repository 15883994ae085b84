package node

// A partition's dedup snapshot (partition.Snapshot): its derived state as
// of one applied entry, kept in the file "dedup" beside its log, so that a
// restart applies only the entries after it instead of reading the whole
// retained log, payloads included. The file is derived: a missing, stale,
// damaged or unusable one only means the restart replays from the log's
// start, as before it existed — except on a single node after retention,
// which is why a single node keeps a copy ("dedup.copy").

import (
	"errors"
	"io/fs"
	"path"

	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// dedupSnapshotFile is the snapshot's name in the partition's directory.
// dedupSnapshotCopyFile is its second copy, which a single node's
// partition keeps (dedupSnapshots.keepCopy).
const (
	dedupSnapshotFile     = "dedup"
	dedupSnapshotCopyFile = dedupSnapshotFile + storage.CopySuffix
)

// DedupSnapshotBytesDefault is Config.DedupSnapshotBytes's default.
const DedupSnapshotBytesDefault = 64 << 20

// dedupSnapshots is a partition's snapshot bookkeeping, owned by its
// loop's goroutine.
type dedupSnapshots struct {
	// bytes counts the record bytes applied (appended, on a single node)
	// since the last snapshot; at Config.DedupSnapshotBytes the next one
	// is written.
	bytes int64
	// applied is the entry the last snapshot written or loaded stands
	// for: a close writes one only past it.
	applied uint64
	// epoch is the epoch of the last entry applied (replicated partitions;
	// 0: unknown, after the log's start moved).
	epoch uint64
	// tooLarge: the last snapshot was not written because the table
	// encodes to more than partition.SnapshotBytesMax.
	tooLarge bool
	// keepCopy: every snapshot is written twice, the copy after the
	// first (DedupSnapshotKeptTwice). A single node's dedup across
	// retention rests on the snapshot alone (a replicated log re-states
	// its producers in dedup carries): a bit flip in one file must not
	// forget the producers whose every record retention deleted.
	keepCopy bool
	buf      []byte
}

// durablePoint is the highest point of the single node's readable dedup
// snapshot files in dir (0: none): a snapshot stands only for synced
// records, so the log held every seq up to it durably, and a log that
// ends below it lost them to damage — not to a torn write
// (storage.Options.DurableThrough, DurableTailNotTorn).
func durablePoint(fsys vfs.FS, dir string) uint64 {
	var point uint64
	for _, name := range []string{dedupSnapshotFile, dedupSnapshotCopyFile} {
		if b, err := storage.ReadFileAtomic(fsys, path.Join(dir, name)); err == nil {
			if p, err := partition.SnapshotPoint(b); err == nil {
				point = max(point, p)
			}
		}
	}
	return point
}

// loadDedupSnapshot reads the partition's snapshot, or its copy when the
// snapshot is missing, unreadable or unusable, and checks it against lg
// (partition.SnapshotUsable); nil when there is none it can use. Only an
// unreadable or inconsistent file is worth a warning.
func (p *partitionRunner) loadDedupSnapshot(lg *storage.Log) *partition.Snapshot {
	if p.node.cfg.DedupSnapshotBytes < 0 {
		return nil
	}
	for _, name := range []string{dedupSnapshotFile, dedupSnapshotCopyFile} {
		if s := p.loadDedupSnapshotFile(lg, name); s != nil {
			return s
		}
	}
	return nil
}

// loadDedupSnapshotFile reads the snapshot in the file name of the
// partition's directory and checks it against lg; nil when it is missing
// or cannot be used.
func (p *partitionRunner) loadDedupSnapshotFile(lg *storage.Log, name string) *partition.Snapshot {
	cfg := &p.node.cfg
	b, err := storage.ReadFileAtomic(cfg.Env.FS, path.Join(p.dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var s *partition.Snapshot
	if err == nil {
		s, err = partition.DecodeSnapshot(b, cfg.Dedup)
	}
	if err != nil {
		p.node.log.Warn("dedup snapshot unreadable; trying its copy, else replaying the partition's log", "topic", p.topic.cfg.Name, "partition", p.id, "file", name, "err", err)
		return nil
	}
	// The epoch of the entry at the snapshot's point, from the batch
	// headers (a read of the entry would read its whole batch).
	// A repair's gap is no reason to refuse it: the repair rewrote it
	// without the seqs it dropped (forgetDedupSnapshot).
	var epochAt uint64
	inLog := s.Applied >= lg.StartSeq() && s.Applied < lg.NextSeq()
	if inLog {
		var err error
		epochAt, err = lg.EpochAt(s.Applied)
		inLog = err == nil
	}
	if cfg.Mutations.DedupSnapshotUnchecked || partition.SnapshotUsable(s, lg.StartSeq(), epochAt, inLog) {
		return s
	}
	p.node.log.Info("dedup snapshot does not match the partition's log; trying its copy, else replaying the log", "topic", p.topic.cfg.Name, "partition", p.id,
		"file", name, "snapshot_seq", s.Applied, "snapshot_epoch", s.Epoch, "log_start", lg.StartSeq(), "log_next", lg.NextSeq())
	return nil
}

// dueDedupSnapshot counts n more record bytes applied and reports whether
// a snapshot is due.
func (p *partitionRunner) dueDedupSnapshot(d *dedupSnapshots, n int64) bool {
	d.bytes += n
	limit := p.node.cfg.DedupSnapshotBytes
	return limit > 0 && d.bytes >= limit
}

// saveDedupSnapshot writes what encode appends as the partition's
// snapshot of applied, then its copy when d.keepCopy; d.applied moves
// only once every file was written, so it is the point of the older one
// (retention deletes nothing past it). A failure is logged: the restart
// replays more.
func (p *partitionRunner) saveDedupSnapshot(d *dedupSnapshots, applied uint64, encode func([]byte) ([]byte, error)) {
	if p.node.cfg.DedupSnapshotBytes < 0 || applied == 0 {
		return
	}
	d.bytes = 0
	b, err := encode(d.buf[:0])
	d.tooLarge = errors.Is(err, partition.ErrSnapshotTooLarge)
	if err == nil {
		d.buf = b[:0]
		if len(d.buf) > 1<<20 {
			d.buf = nil // a large table's buffer is not kept between snapshots
		}
		write := storage.WriteFileAtomic
		if d.keepCopy && !p.node.cfg.Mutations.DedupSnapshotOnce {
			write = storage.WriteFileTwice // the snapshot, then dedupSnapshotCopyFile
		}
		err = write(p.node.cfg.Env.FS, path.Join(p.dir, dedupSnapshotFile), b)
	}
	if err != nil {
		p.node.logRepeatedError(p.subject()+"/dedup", "dedup snapshot not written; a restart replays the log from further back", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
		return
	}
	d.applied = applied
}
