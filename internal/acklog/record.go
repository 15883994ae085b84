// Package acklog is the kernel of a consumer group's replicated ack log
// (DESIGN §3): in a cluster a group's acks, delivery counts and
// checkpoints of partition p are records in p's own replicated log,
// written by p's leader, which delivers p to the group. The kernel
// decides which acks need a record, holds the replies that wait for a
// record's commit (an ACK_OK only after its record committed), numbers
// generations so that a retired leader's completions answer nothing as
// durable, decides when to write a checkpoint and what it holds, tracks
// what each group still needs from the log (the compaction limit), and
// rebuilds a group's cursors from the committed log.
//
// It is a package of its own rather than part of internal/delivery:
// delivery decides for one group on one partition (which seq next, ack
// fencing, redelivery), while the ack log decides how those decisions
// become durable in a replicated log. A Log covers the cursors it is
// given; a nil cursor is a partition it does not cover. It is pure: no
// goroutines, I/O, clock or locks; the node shell
// (internal/node/replledger.go) proposes the records it returns and feeds
// it the completions.
package acklog

import (
	"encoding/binary"
	"fmt"

	"github.com/nereus-broker/nereus/internal/delivery"
)

// Key names one message of a group: a seq of one partition.
type Key struct {
	Partition uint32
	Seq       uint64
}

// Kind is the kind of a group's record in the log.
type Kind uint8

const (
	// KindAck holds acks (and dead-lettered seqs): AckEntryBytes each.
	KindAck Kind = iota + 1
	// KindCount holds delivery counts: CountEntryBytes each.
	KindCount
	// KindCheckpoint holds the group's cursors as of its place in the log.
	KindCheckpoint
	// KindFence holds an assignment epoch (FenceEntryBytes) the
	// partition's leader is about to deliver under: a later leader whose
	// view of the group is older waits (group.State.CheckPull's fence).
	KindFence
	// KindCarry is a checkpoint the partition's leader re-states at the
	// tail of the log, folded from the group's records up to a base seq
	// (CarryRecord), so that a group nobody acks for pins no more of the
	// log than its carry. It counts as the group's checkpoint only when no
	// record of the group lies between its base and itself
	// (CarryAtItsBase).
	KindCarry
)

func (k Kind) String() string {
	switch k {
	case KindAck:
		return "ack"
	case KindCount:
		return "count"
	case KindCheckpoint:
		return "checkpoint"
	case KindFence:
		return "fence"
	case KindCarry:
		return "carry"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// AckEntryBytes is one ack in an ack record: partition u32, seq u64 (big
// endian), the layout of the local ledger's ack records too.
const AckEntryBytes = 4 + 8

// CountEntryBytes is one delivery count in a count record: partition
// u32, seq u64, count u32.
const CountEntryBytes = 4 + 8 + 4

// FenceEntryBytes is a fence record's value: the epoch, u64.
const FenceEntryBytes = 8

// FenceRecord is the value of a fence record of epoch.
func FenceRecord(epoch uint64) []byte { return binary.BigEndian.AppendUint64(nil, epoch) }

// CarryBaseBytes is a carry's base (u64) ahead of its checkpoint.
const CarryBaseBytes = 8

// CarryRecord is the value of a carry of the checkpoint value cp, folded
// from the group's records up to base.
func CarryRecord(base uint64, cp []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, CarryBaseBytes+len(cp)), base), cp...)
}

// CarryOf splits a carry's value into its base and its checkpoint value
// (ok is false when it is too short to hold a base).
func CarryOf(value []byte) (base uint64, cp []byte, ok bool) {
	if len(value) < CarryBaseBytes {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(value), value[CarryBaseBytes:], true
}

// ForEachAck calls f for every ack of an ack record's value.
func ForEachAck(value []byte, f func(Key)) {
	for ; len(value) >= AckEntryBytes; value = value[AckEntryBytes:] {
		f(Key{binary.BigEndian.Uint32(value), binary.BigEndian.Uint64(value[4:])})
	}
}

// ReplayAcks applies an ack record to the cursors (partitions beyond them,
// or whose cursor is nil, are ignored: a topic never loses partitions, but
// a record is data, and a partition's own log holds only its acks).
func ReplayAcks(cursors []*delivery.Cursor, value []byte) error {
	if len(value)%AckEntryBytes != 0 {
		return fmt.Errorf("ack record has %d bytes", len(value))
	}
	ForEachAck(value, func(k Key) {
		if c := cursorAt(cursors, k.Partition); c != nil {
			c.ReplayAck(k.Seq)
		}
	})
	return nil
}

// cursorAt is cursors[partition], or nil when there is none.
func cursorAt(cursors []*delivery.Cursor, partition uint32) *delivery.Cursor {
	if int(partition) < len(cursors) {
		return cursors[partition]
	}
	return nil
}

// ReplayCounts applies a count record to the cursors.
func ReplayCounts(cursors []*delivery.Cursor, value []byte) error {
	if len(value)%CountEntryBytes != 0 {
		return fmt.Errorf("count record has %d bytes", len(value))
	}
	for ; len(value) > 0; value = value[CountEntryBytes:] {
		if c := cursorAt(cursors, binary.BigEndian.Uint32(value)); c != nil {
			c.ReplayCount(binary.BigEndian.Uint64(value[4:]), binary.BigEndian.Uint32(value[12:]))
		}
	}
	return nil
}

// Checkpoint is what a checkpoint record holds: per partition the done
// state and the delivery counts of the group's cursor, and the highest
// fence recorded (or being recorded) before it.
type Checkpoint struct {
	States []delivery.DoneState
	Counts [][]delivery.SeqCount
	Fence  uint64
}

// CheckpointOf captures the cursors. A nil cursor (a partition the log
// does not cover) is captured as nothing done, and restored as nothing.
func CheckpointOf(cursors []*delivery.Cursor) Checkpoint {
	var cp Checkpoint
	for _, c := range cursors {
		if c == nil {
			cp.States = append(cp.States, delivery.DoneState{})
			cp.Counts = append(cp.Counts, nil)
			continue
		}
		cp.States = append(cp.States, c.Snapshot())
		cp.Counts = append(cp.Counts, c.Counts())
	}
	return cp
}

// Restore applies the checkpoint's partition i (if it has one) to c (none
// when c is nil).
func (cp Checkpoint) Restore(i int, c *delivery.Cursor) error {
	if i >= len(cp.States) || c == nil {
		return nil
	}
	if err := c.Restore(cp.States[i]); err != nil {
		return err
	}
	if i < len(cp.Counts) {
		for _, sc := range cp.Counts[i] {
			c.ReplayCount(sc.Seq, sc.Count)
		}
	}
	return nil
}
