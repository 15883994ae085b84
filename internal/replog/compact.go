package replog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// Compaction and snapshots.
//
// A member's log is compacted by retention: whole segments go once they
// are old or large enough and the kernel no longer needs them (RetainFloor:
// committed, flushed, and not needed by a follower inside its reservation).
// The snapshot point (seq, epoch) is the last entry compacted away; it is
// written, atomically, before the segments are deleted.
//
// A snapshot carries no state beyond its point. Everything a partition
// derives from its log (producer dedup, group cursors) is rebuilt from the
// entries kept after it, as a single node does after retention, so a
// follower that the leader's compaction left behind "rebuilds" by emptying
// its log and continuing from the leader's snapshot point. The install is
// recorded (installing) before the log is reset and completed on restart
// if a crash interrupts it.

const snapshotFile = "snapshot"

type snapshotPoint struct {
	seq, epoch uint64
	installing bool
}

// errSnapshotPointDamaged marks a snapshot point file that fails its
// checksum or holds no valid point.
var errSnapshotPointDamaged = errors.New("replog: snapshot point damaged")

func readSnapshotPoint(fsys vfs.FS, dir string) (snapshotPoint, error) {
	b, err := storage.ReadFileAtomic(fsys, path.Join(dir, snapshotFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return snapshotPoint{}, nil
	case errors.Is(err, storage.ErrCorrupt):
		return snapshotPoint{}, fmt.Errorf("%w: %w", errSnapshotPointDamaged, err)
	case err != nil:
		return snapshotPoint{}, fmt.Errorf("replog: read snapshot point: %w", err)
	case len(b) != 17 || b[16] > 1:
		return snapshotPoint{}, fmt.Errorf("%w: file of %d bytes", errSnapshotPointDamaged, len(b))
	}
	p := snapshotPoint{seq: binary.BigEndian.Uint64(b), epoch: binary.BigEndian.Uint64(b[8:]), installing: b[16] == 1}
	if (p.seq == 0) != (p.epoch == 0) {
		return snapshotPoint{}, fmt.Errorf("%w: (%d, %d) is invalid", errSnapshotPointDamaged, p.seq, p.epoch)
	}
	return p, nil
}

func writeSnapshotPoint(fsys vfs.FS, dir string, p snapshotPoint) error {
	var b [17]byte
	binary.BigEndian.PutUint64(b[:], p.seq)
	binary.BigEndian.PutUint64(b[8:], p.epoch)
	if p.installing {
		b[16] = 1
	}
	return storage.WriteFileAtomic(fsys, path.Join(dir, snapshotFile), b[:])
}

// Compact applies retention within what the kernel (and CompactLimit)
// allow. Its driver calls it every CompactEvery.
func (m *Member) Compact() error {
	if f := m.cfg.Retention; f != nil {
		if err := m.log.SetRetention(f()); err != nil {
			return err
		}
	}
	if ageMs, bytes := m.log.Retention(); ageMs == 0 && bytes == 0 {
		return nil
	}
	// An idle log's last records expire too (IdleLogExpires); the
	// leader's shell sees the sealed segment and carries what it must,
	// after a seal record that starts a segment on every replica.
	sealed, err := m.log.SealExpired(m.cfg.Clock.NowMs())
	if err != nil {
		return err
	}
	if sealed && m.k.Status().Role == replica.Leader {
		m.Propose(NewProposalFunc(sealRecord, func(_, _ uint64, _ error) {}))
	}
	limit := m.k.RetainFloor()
	if m.cfg.CompactLimit != nil {
		limit = min(limit, m.cfg.CompactLimit())
	}
	point := m.log.RetentionPoint(m.cfg.Clock.NowMs(), limit)
	if point == 0 {
		return nil
	}
	st := m.k.Status()
	if point > st.SnapSeq {
		epoch := epochAt(st.Epochs, point)
		if err := writeSnapshotPoint(m.cfg.FS, m.cfg.Dir, snapshotPoint{seq: point, epoch: epoch}); err != nil {
			return err
		}
		if got := m.k.CompactTo(point); got != point {
			return fmt.Errorf("replog: kernel compacted to %d, not %d", got, point)
		}
	}
	if _, err := m.log.DeleteThrough(point); err != nil {
		return err
	}
	m.publishStatus()
	return nil
}

// installSnapshot rebuilds this member from the leader's snapshot point:
// its log becomes empty after snap. Proposals at or below it are lost (a
// leader that became a follower; the client retries idempotently).
func (m *Member) installSnapshot(snap replica.SnapshotMeta) error {
	p := snapshotPoint{seq: snap.Seq, epoch: snap.Epoch, installing: true}
	if err := writeSnapshotPoint(m.cfg.FS, m.cfg.Dir, p); err != nil {
		return err
	}
	if err := m.log.Reset(snap.Seq + 1); err != nil {
		return err
	}
	p.installing = false
	if err := writeSnapshotPoint(m.cfg.FS, m.cfg.Dir, p); err != nil {
		return err
	}
	m.installs.Add(1)
	m.cfg.Logger.Info("replog: rebuilt from the leader's snapshot point", "dir", m.cfg.Dir, "seq", snap.Seq, "epoch", snap.Epoch)
	return nil
}
