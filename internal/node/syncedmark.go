package node

// A log's synced mark: the file "synced" beside a log with no other
// replica — a single node's partition or ack ledger, a cluster's member
// alone — holds a seq the log had synced. It widens the point the log
// must hold when it opens (storage.Options.DurableThrough,
// DurableTailNotTorn) over an idle tail. The last batches of the active
// segment have no later batch to prove them durable by its synced-through
// seq, so a bit flip there cannot be told from a torn write; a partition's
// dedup snapshot covers them after a clean stop, but after a crash only
// as far as its last write (every 64 MiB of records), and a ledger had
// nothing. The mark is written once the log took nothing for a whole
// period (Config.SyncedMarkMs) and at a clean close no snapshot covers: a
// flip into a marked tail is damage (DATA_CORRUPT, `nereus repair`), not
// a torn write cut with only a WARN — a partition's seqs handed out
// again, a ledger's confirmed acks forgotten. Left uncovered: the batches
// of the last period before a crash while appends ran.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// syncedMarkFile is the mark's name in the partition's directory.
const syncedMarkFile = "synced"

// SyncedMarkMsDefault is Config.SyncedMarkMs's default.
const SyncedMarkMsDefault = 1000

// syncedMarks is a partition's mark bookkeeping, owned by its loop's
// goroutine.
type syncedMarks struct {
	// point is the highest seq the log is known to hold durably: the
	// point read at open, then each mark written.
	point uint64
	// seen is the log's last seq at the previous period's end: a period
	// that ends on the same one was idle.
	seen uint64
}

// readSyncedMark returns the seq the mark in dir holds (0 when there is
// none) and, when the file exists but cannot be read, why.
func readSyncedMark(fsys vfs.FS, dir string) (uint64, error) {
	b, err := storage.ReadFileAtomic(fsys, path.Join(dir, syncedMarkFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, nil
	case err != nil:
		return 0, err
	case len(b) != 8:
		return 0, fmt.Errorf("%w: %s: %d bytes, want 8", storage.ErrCorrupt, syncedMarkFile, len(b))
	}
	return binary.LittleEndian.Uint64(b), nil
}

// DurablePoint is the seq the log in the partition directory dir held
// durably, as a partition with no other replica reads it before it opens
// its log and as `nereus repair` reads it: the highest of its readable
// dedup snapshots' points and its synced mark (0: none). A log that ends
// below it lost durable records to damage.
func DurablePoint(fsys vfs.FS, dir string) uint64 {
	mark, _ := readSyncedMark(fsys, dir)
	return max(durablePoint(fsys, dir), mark)
}

// LedgerMarks is the synced mark of every ack ledger directory of the
// data directory dataDir (by directory; none: absent), as a group's load
// and `nereus repair` read them.
func LedgerMarks(fsys vfs.FS, dataDir string) map[string]uint64 {
	out := map[string]uint64{}
	dirs, _ := ledgerDirs(fsys, path.Join(dataDir, "groups"))
	for _, l := range dirs {
		if mark, _ := readSyncedMark(fsys, l.dir); !l.snapshot && mark > 0 {
			out[l.dir] = mark
		}
	}
	return out
}

// syncedMark reads the synced mark in dir for an open (0: none); an
// unreadable one is said, and the open goes on without it.
func (n *Node) syncedMark(dir string, attrs ...any) uint64 {
	if n.cfg.SyncedMarkMs < 0 {
		return 0
	}
	mark, err := readSyncedMark(n.cfg.Env.FS, dir)
	if err != nil {
		n.log.Warn("synced mark unreadable; the log opens without it", append(attrs, "err", err)...)
	}
	return mark
}

// markSynced writes the synced mark in dir at a period's end when the log
// took nothing during the whole period (its last seq is still the one
// seen at the previous end) and synced holds a seq the log has synced
// past the known point. It reports whether it wrote one.
func (n *Node) markSynced(m *syncedMarks, dir string, last, synced uint64, subject string, attrs ...any) bool {
	idle := last == m.seen
	m.seen = last
	return idle && n.writeSyncedMark(m, dir, synced, subject, attrs...)
}

// writeSyncedMark writes synced as the mark in dir when it is past the
// known point (a close does so without waiting for an idle period). A
// mark that cannot be written is logged under subject: the next period
// tries again.
func (n *Node) writeSyncedMark(m *syncedMarks, dir string, synced uint64, subject string, attrs ...any) bool {
	if synced <= m.point || n.cfg.SyncedMarkMs < 0 || n.cfg.Mutations.SyncedMarkSkipped {
		return false
	}
	if err := storage.WriteFileAtomic(n.cfg.Env.FS, path.Join(dir, syncedMarkFile), binary.LittleEndian.AppendUint64(nil, synced)); err != nil {
		n.logRepeatedError(subject+"/synced", "synced mark not written; a crash may cut the idle tail of this log as torn if a bit flips in it", append(attrs, "err", err)...)
		return false
	}
	m.point = synced
	return true
}

// markLog is markSynced for the partition's log.
func (p *partitionRunner) markLog(m *syncedMarks, last, synced uint64) bool {
	return p.node.markSynced(m, p.dir, last, synced, p.subject(), "topic", p.topic.cfg.Name, "partition", p.id)
}
