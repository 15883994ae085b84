// Package acklog is the kernel of a consumer group's replicated ack log
// (DESIGN §3): in a cluster a group's acks, delivery counts and
// checkpoints are records in the replicated log of its topic's partition
// 0. The kernel decides which acks need a record, holds the replies that
// wait for a record's commit (an ACK_OK only after its record committed),
// numbers generations so that a retired coordinator's completions answer
// nothing as durable, decides when to write a checkpoint and what it
// holds, tracks what each group still needs from the log (the compaction
// limit), and rebuilds a group's cursors from the committed log.
//
// It is a package of its own rather than part of internal/delivery:
// delivery decides for one group on one partition (which seq next, ack
// fencing, redelivery), while the ack log decides for one group across
// all its partitions how those decisions become durable in a replicated
// log. It is pure: no goroutines, I/O, clock or locks; the node shell
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
)

func (k Kind) String() string {
	switch k {
	case KindAck:
		return "ack"
	case KindCount:
		return "count"
	case KindCheckpoint:
		return "checkpoint"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// AckEntryBytes is one ack in an ack record: partition u32, seq u64 (big
// endian), the layout of the local ledger's ack records too.
const AckEntryBytes = 4 + 8

// CountEntryBytes is one delivery count in a count record: partition
// u32, seq u64, count u32.
const CountEntryBytes = 4 + 8 + 4

// ForEachAck calls f for every ack of an ack record's value.
func ForEachAck(value []byte, f func(Key)) {
	for ; len(value) >= AckEntryBytes; value = value[AckEntryBytes:] {
		f(Key{binary.BigEndian.Uint32(value), binary.BigEndian.Uint64(value[4:])})
	}
}

// ReplayAcks applies an ack record to the cursors (partitions beyond them
// are ignored: a topic never loses partitions, but a record is data).
func ReplayAcks(cursors []*delivery.Cursor, value []byte) error {
	if len(value)%AckEntryBytes != 0 {
		return fmt.Errorf("ack record has %d bytes", len(value))
	}
	ForEachAck(value, func(k Key) {
		if int(k.Partition) < len(cursors) {
			cursors[k.Partition].ReplayAck(k.Seq)
		}
	})
	return nil
}

// ReplayCounts applies a count record to the cursors.
func ReplayCounts(cursors []*delivery.Cursor, value []byte) error {
	if len(value)%CountEntryBytes != 0 {
		return fmt.Errorf("count record has %d bytes", len(value))
	}
	for ; len(value) > 0; value = value[CountEntryBytes:] {
		if part := binary.BigEndian.Uint32(value); int(part) < len(cursors) {
			cursors[part].ReplayCount(binary.BigEndian.Uint64(value[4:]), binary.BigEndian.Uint32(value[12:]))
		}
	}
	return nil
}

// Checkpoint is what a checkpoint record holds: per partition the done
// state and the delivery counts of the group's cursor.
type Checkpoint struct {
	States []delivery.DoneState
	Counts [][]delivery.SeqCount
}

// CheckpointOf captures the cursors.
func CheckpointOf(cursors []*delivery.Cursor) Checkpoint {
	var cp Checkpoint
	for _, c := range cursors {
		cp.States = append(cp.States, c.Snapshot())
		cp.Counts = append(cp.Counts, c.Counts())
	}
	return cp
}

// Restore applies the checkpoint's partition i (if it has one) to c.
func (cp Checkpoint) Restore(i int, c *delivery.Cursor) error {
	if i >= len(cp.States) {
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
