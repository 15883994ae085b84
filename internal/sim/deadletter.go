package sim

import (
	"maps"
	"strconv"

	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Dead letters (Options.DeadLetters, ClusterOptions.DeadLetters, `nereus
// sim --dead-letters`): the consumers subscribe with max_deliver
// deadLetterMaxDeliver and always NACK the poison messages (poison), so
// each of those goes to the group's dead-letter topic under every fault —
// a count record, a publish forwarded to the dead-letter topic's leader,
// the copy published again after a restart or a change of leader, and
// only then the message leaves the group. Others may die too, when their
// deliveries end unacked often enough (a stall, a nack, a crash). The
// deadLetterWatch reads every node's copy of the dead-letter topic after
// every event and checks each dead letter as it first appears:
//
//   - DeadLetterOnce: a message is dead-lettered at one seq of the
//     dead-letter topic (its retries are deduplicated by the group's
//     producer identity, DeadLetterWindowPerPartition);
//   - NoDeadLetterOfAnAck: no message whose ACK was answered durable is
//     dead-lettered afterwards;
//   - DeadLetterIsTheRecord: the copy holds the message's value, and its
//     headers name its topic, group, partition and seq.
//
// A dead letter counts as consumed by the group (Liveness: every
// acknowledged message is acked or dead-lettered), and as done: a
// delivery of it sent afterwards breaks AckFloorNeverRedelivered.
const (
	DeadLetterOnce        = "DeadLetterOnce"
	NoDeadLetterOfAnAck   = "NoDeadLetterOfAnAck"
	DeadLetterIsTheRecord = "DeadLetterIsTheRecord"
)

// deadLetterMaxDeliver is the consumers' max_deliver in dead-letter runs
// (1000 otherwise: nothing dies).
const deadLetterMaxDeliver = 3

// consumersMaxDeliver is the max_deliver the consumers' PULLs ask.
func consumersMaxDeliver(o Options) uint32 {
	if o.DeadLetters {
		return deadLetterMaxDeliver
	}
	return 1000
}

// poison reports whether the consumers always NACK the message at seq:
// one in eight.
func poison(seq uint64) bool { return seq%8 == 5 }

// deadLetterTopic is the group's dead-letter topic.
const deadLetterTopic = "dlq." + simGroup + "." + simTopic

// deadLetterWatch follows the dead-letter topic at every node.
type deadLetterWatch struct {
	s *sim
	// next is the next seq to read at each node incarnation.
	next map[commitKey]uint64
	// at is the dead-letter topic's seq of each dead letter.
	at map[position]uint64
}

func newDeadLetterWatch(s *sim) *deadLetterWatch {
	return &deadLetterWatch{s: s, next: map[commitKey]uint64{}, at: map[position]uint64{}}
}

// observe reads what each node up committed of the dead-letter topic
// since it last looked.
func (dw *deadLetterWatch) observe() {
	for _, b := range dw.s.nodes {
		if !b.up || b.node == nil || dw.s.chk.violation != nil {
			continue
		}
		for _, t := range b.node.Metadata([]string{deadLetterTopic}) {
			for _, info := range t.Partitions {
				dw.observePartition(b, info)
			}
		}
	}
}

func (dw *deadLetterWatch) observePartition(b *broker, info wire.PartitionInfo) {
	k := commitKey{partition: info.Partition, node: b.id, incarnation: b.started}
	from := max(dw.next[k], 1)
	for from <= info.CommitSeq {
		entries, err := b.node.Read(deadLetterTopic, info.Partition, from, 256)
		if err != nil || len(entries) == 0 {
			// Not applied here yet (looked at again later), not hosted
			// here, or damaged: the healthy copies are read.
			return
		}
		for i := range entries {
			e := &entries[i]
			if e.Seq > info.CommitSeq {
				break
			}
			dw.deadLetter(b, e)
			from = e.Seq + 1
		}
		dw.next[k] = from
	}
}

// deadLetter checks the dead letter e, read at node b.
func (dw *deadLetterWatch) deadLetter(b *broker, e *storage.Entry) {
	chk := dw.s.chk
	if replog.IsControl(&e.Record) {
		return // an install entry, a dedup carry
	}
	h := map[string]string{}
	for _, x := range e.Record.Headers {
		h[x.Key] = string(x.Value)
	}
	p, errP := strconv.ParseUint(h["nereus-dlq-partition"], 10, 32)
	seq, errS := strconv.ParseUint(h["nereus-dlq-seq"], 10, 64)
	if errP != nil || errS != nil || h["nereus-dlq-topic"] != simTopic || h["nereus-dlq-group"] != simGroup {
		chk.violate(DeadLetterIsTheRecord, "%s: dead letter %d has headers %v", b.id, e.Seq, h)
		return
	}
	pos := position{uint32(p), seq}
	if at, ok := dw.at[pos]; ok {
		if at != e.Seq {
			chk.violate(DeadLetterOnce, "%s dead-lettered at %s:%d and at %d", pos, deadLetterTopic, at, e.Seq)
		}
		return
	}
	if k, ok := chk.ackedAt[pos]; ok && chk.acked[k].value != string(e.Record.Value) && !chk.reused(pos) {
		chk.violate(DeadLetterIsTheRecord, "%s: dead letter %d of %s holds %q, the message was %q", b.id, e.Seq, pos, e.Record.Value, chk.acked[k].value)
		return
	}
	if _, acked := chk.doneAtID[pos]; acked {
		chk.violate(NoDeadLetterOfAnAck, "%s dead-lettered at %s:%d after its ACK was answered durable", pos, deadLetterTopic, e.Seq)
		return
	}
	dw.at[pos] = e.Seq
	dw.s.w.tracef("checker: %s dead-lettered at %s:%d (read at %s)", pos, deadLetterTopic, e.Seq, b.id)
	// Done for the group, as an ack confirmed now.
	chk.groupDone[pos] = true
	chk.doneAtID[pos] = maps.Clone(chk.maxSentID[pos])
	if chk.doneAtID[pos] == nil {
		chk.doneAtID[pos] = map[string]uint64{}
	}
}

// count is the messages seen dead-lettered (0 without a watch).
func (dw *deadLetterWatch) count() int {
	if dw == nil {
		return 0
	}
	return len(dw.at)
}
