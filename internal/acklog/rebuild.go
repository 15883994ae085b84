package acklog

import (
	"encoding/binary"
	"fmt"

	"github.com/nereus-broker/nereus/internal/delivery"
)

// Rebuild folds one group's committed records, in log order, into its
// cursors: a new leader starts from the group's latest checkpoint (or a
// carry of it) and replays the ack and count records after it. Records of
// other groups are not fed to it.
type Rebuild struct {
	fresh       func() ([]*delivery.Cursor, error)
	overhead    int64
	cursors     []*delivery.Cursor
	recordBytes int64
	fence       uint64
	last        uint64 // the seq of the latest record taken (CarryHolds)
}

// NewRebuild starts a rebuild from fresh cursors (the partitions' start,
// no ack); fresh is called again at every checkpoint. recordOverheadBytes
// is the storage framing counted per record toward the checkpoint
// threshold (Config.RecordOverheadBytes).
func NewRebuild(fresh func() ([]*delivery.Cursor, error), recordOverheadBytes int64) (*Rebuild, error) {
	r := &Rebuild{fresh: fresh, overhead: recordOverheadBytes}
	cursors, err := fresh()
	if err != nil {
		return nil, err
	}
	r.cursors = cursors
	return r, nil
}

// Checkpoint starts over from the content of the checkpoint record at seq.
func (r *Rebuild) Checkpoint(seq uint64, cp Checkpoint) error {
	r.last = seq
	cursors, err := r.fresh()
	if err != nil {
		return err
	}
	for i, c := range cursors {
		if err := cp.Restore(i, c); err != nil {
			return fmt.Errorf("partition %d: %w", i, err)
		}
	}
	r.cursors, r.recordBytes = cursors, 0
	r.fence = max(r.fence, cp.Fence) // fences only rise
	return nil
}

// Carry starts over from the carry at seq, folded up to base, when it
// holds (CarryHolds; as Needs judges it): taken reports that it did. A
// carry that does not hold is no record of the group.
func (r *Rebuild) Carry(seq, base uint64, cp Checkpoint) (taken bool, err error) {
	if !CarryHolds(r.last, base) {
		return false, nil
	}
	return true, r.Checkpoint(seq, cp)
}

// Record applies the ack, count or fence record at seq.
func (r *Rebuild) Record(seq uint64, kind Kind, value []byte) error {
	r.last = seq
	replay := ReplayAcks
	switch kind {
	case KindAck:
	case KindCount:
		replay = ReplayCounts
	case KindFence:
		if len(value) != FenceEntryBytes {
			return fmt.Errorf("fence record has %d bytes", len(value))
		}
		r.recordBytes += r.overhead + int64(len(value))
		r.fence = max(r.fence, binary.BigEndian.Uint64(value))
		return nil
	default:
		return fmt.Errorf("acklog: Record of a %v record", kind)
	}
	r.recordBytes += r.overhead + int64(len(value))
	return replay(r.cursors, value)
}

// Cursors are the rebuilt cursors.
func (r *Rebuild) Cursors() []*delivery.Cursor { return r.cursors }

// Fence is the highest fence in the records and checkpoints rebuilt from.
func (r *Rebuild) Fence() uint64 { return r.fence }

// RecordBytes is the size of the records after the latest checkpoint (what
// counts toward the next one): New takes it.
func (r *Rebuild) RecordBytes() int64 { return r.recordBytes }
