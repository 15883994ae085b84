package node

// A group's dead letters: messages that used up MaxDeliver are published to
// the group's dead-letter topic (dlq.GROUP.TOPIC), once the record of their
// last delivery is durable, and leave the group only once their copy is.

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"strconv"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

type dlqResult struct {
	partition uint32
	seq       uint64
	err       *wire.Error
	// gone: the record is no longer in the partition (a repair dropped
	// it, or retention deleted it): nothing was published, and the seq is
	// done all the same.
	gone bool
}

type dlqRetry struct {
	partition uint32
	seq       uint64
	dueMs     int64
	// record: the dead letter's record did not commit (cluster): write it
	// again before publishing.
	record bool
}

// Dead-letter publish retries back off exponentially from dlqRetryFirstMs
// up to dlqRetryMaxMs: a dead-letter topic that stays unwritable costs one
// attempt per message every dlqRetryMaxMs, and one warning (at the first
// failure; later ones log at debug level).
const (
	dlqRetryFirstMs = 100
	dlqRetryMaxMs   = 30_000
)

// dlqBackoffMs is the wait before attempt failures+1 of a dead letter.
func dlqBackoffMs(failures int) int64 {
	wait := int64(dlqRetryFirstMs)
	for i := 1; i < failures && wait < dlqRetryMaxMs; i++ {
		wait *= 2
	}
	return min(wait, dlqRetryMaxMs)
}

// collectDeadLetters finishes dead-letter publishes that completed, starts
// the retries that fell due, and batches the delivery counts of deliveries
// that ended (for the next flush) and the record of each seq that newly
// used up MaxDeliver. A dead letter's publish starts only once that record
// is durable (startReadyDeadLetters), and the message leaves the group
// (is recorded in the ledger like an ack) only after its dead-letter copy
// is durable.
func (g *groupRunner) collectDeadLetters(now int64) {
	g.dlqMu.Lock()
	results := g.dlqResults
	g.dlqResults = nil
	g.dlqMu.Unlock()
	for _, r := range results {
		if g.cursors[r.partition] == nil {
			// Its partition's leadership moved: the next leader finds the
			// message dead and publishes it again (deduplicated).
			continue
		}
		k := ackKey{r.partition, r.seq}
		if r.err != nil {
			g.retryDeadLetter(now, k, r.err, false)
			continue
		}
		if failures := g.dlqFailures[k]; failures > 0 {
			g.node.log.Info("dead-letter publish succeeded after failures", "dlq", g.dlq, "partition", r.partition, "seq", r.seq, "failures", failures)
			delete(g.dlqFailures, k)
		}
		g.cursors[r.partition].DeadLettered(r.seq)
		g.ledgerBatch = binary.BigEndian.AppendUint32(g.ledgerBatch, r.partition)
		g.ledgerBatch = binary.BigEndian.AppendUint64(g.ledgerBatch, r.seq)
		if !r.gone {
			g.node.metrics.deadLetters.WithLabelValues(g.topic.cfg.Name, g.name).Inc()
		}
	}
	kept := g.dlqRetries[:0]
	for _, r := range g.dlqRetries {
		switch {
		case r.dueMs > now:
			kept = append(kept, r)
		case r.record:
			g.recordDead(r.partition, r.seq)
		default:
			g.startDeadLetter(r.partition, r.seq)
		}
	}
	g.dlqRetries = kept
	for pi, c := range g.cursors {
		if c == nil {
			continue
		}
		c.Expire(now)
		for _, sc := range c.TakeCounts() {
			g.batchCount(uint32(pi), sc.Seq, sc.Count)
		}
		for _, seq := range c.TakeDead() {
			g.recordDead(uint32(pi), seq)
		}
	}
}

// recordDead batches the record of a dead letter; its publish starts once
// the record is durable.
func (g *groupRunner) recordDead(pi uint32, seq uint64) {
	g.batchCount(pi, seq, g.cfg.MaxDeliver)
	g.deadPending = append(g.deadPending, ackKey{pi, seq})
}

// retryDeadLetter schedules another attempt at a dead letter whose publish
// (or, with record, whose record) failed, with exponential backoff. Only
// its first failure is a warning.
func (g *groupRunner) retryDeadLetter(now int64, k ackKey, err error, record bool) {
	if g.dlqFailures == nil {
		g.dlqFailures = map[ackKey]int{}
	}
	g.dlqFailures[k]++
	failures := g.dlqFailures[k]
	wait := dlqBackoffMs(failures)
	if failures == 1 {
		g.node.log.Warn("dead-letter publish failed; retrying with backoff (further failures of it log at debug level)",
			"dlq", g.dlq, "partition", k.partition, "seq", k.seq, "retry_in_ms", wait, "err", err)
	} else {
		g.node.log.Debug("dead-letter publish failed again", "dlq", g.dlq, "partition", k.partition, "seq", k.seq,
			"failures", failures, "retry_in_ms", wait, "err", err)
	}
	g.dlqRetries = append(g.dlqRetries, dlqRetry{partition: k.partition, seq: k.seq, dueMs: now + wait, record: record})
}

func (g *groupRunner) batchCount(pi uint32, seq uint64, count uint32) {
	g.countBatch = binary.BigEndian.AppendUint32(g.countBatch, pi)
	g.countBatch = binary.BigEndian.AppendUint64(g.countBatch, seq)
	g.countBatch = binary.BigEndian.AppendUint32(g.countBatch, count)
}

// startReadyDeadLetters publishes the dead letters whose record is durable.
func (g *groupRunner) startReadyDeadLetters() {
	ready := g.deadReady
	g.deadReady = nil
	for _, k := range ready {
		g.startDeadLetter(k.partition, k.seq)
	}
}

func (g *groupRunner) startDeadLetter(pi uint32, seq uint64) {
	read := seq
	if g.node.cfg.Mutations.DeadLetterOfTheNextRecord {
		read++
	}
	e, err := g.fetch(int(pi), read)
	if gap := (*storage.GapError)(nil); errors.As(err, &gap) {
		// A repair dropped the record: there is nothing to dead-letter,
		// and the seq is done (as at delivery).
		g.dlqGone(pi, seq)
		return
	}
	if errors.Is(err, storage.ErrOutOfRange) && seq < g.topic.partitions[pi].startSeq.Load() {
		// DeadLetterOfADeletedRecord: retention deleted the record before
		// its copy was published (its deliveries were over; the cursor
		// skips what the partition no longer holds). Nothing to publish:
		// done, as at delivery. Retried, the read failed for good, every
		// 30 s.
		g.node.log.Info("a dead letter's record was deleted by retention before its copy was published; it is done without one",
			"topic", g.topic.cfg.Name, "group", g.name, "partition", pi, "seq", seq)
		g.dlqGone(pi, seq)
		return
	}
	if err != nil {
		g.dlqDone(pi, seq, wire.Errorf(wire.CodeStorage, "read: %v", err))
		return
	}
	attempt := g.dlqFailures[ackKey{pi, seq}]
	if _, err := g.node.topic(g.dlq); err != nil {
		// Declared through the metadata log in a cluster: the group's
		// goroutine does not wait for it (the answer may come from
		// another goroutine, as a publish's does).
		// DeadLetterAsDurable: a letter leaves its topic for the
		// dead-letter topic, which keeps it with the same replication
		// and ack policy.
		cfg := wire.TopicConfig{Name: g.dlq, Partitions: 1, Replicas: g.topic.cfg.Replicas, Ack: g.topic.cfg.Ack}
		g.node.declareAsync(cfg, func(_ bool, err error) {
			if err != nil {
				g.dlqDone(pi, seq, asWire(err))
				return
			}
			g.publishDeadLetter(pi, seq, e, attempt)
		})
		return
	}
	g.publishDeadLetter(pi, seq, e, attempt)
}

// publishDeadLetter publishes the dead letter of (pi, seq) — its record e —
// to the dead-letter topic; attempt is how many attempts failed before.
// Safe from any goroutine.
func (g *groupRunner) publishDeadLetter(pi uint32, seq uint64, e storage.Entry, attempt int) {
	hs := append(toWireHeaders(e.Record.Headers),
		wire.Header{Key: "nereus-dlq-topic", Value: []byte(g.topic.cfg.Name)},
		wire.Header{Key: "nereus-dlq-group", Value: []byte(g.name)},
		wire.Header{Key: "nereus-dlq-partition", Value: []byte(strconv.Itoa(int(pi)))},
		wire.Header{Key: "nereus-dlq-seq", Value: []byte(strconv.FormatUint(seq, 10))})
	// The producer identity makes a retried dead-letter publish idempotent,
	// on whichever node leads the dead-letter topic's partition.
	pub := &wire.Pub{Topic: g.dlq, Partition: 0, ProducerID: g.dlqProducers[pi],
		ProducerSeq: seq, TimestampMs: e.Record.TimestampMs,
		Key: e.Record.Key, Value: e.Record.Value, Headers: hs}
	if g.node.cfg.Mutations.DeadLetterNotIdempotent {
		pub.ProducerID, pub.ProducerSeq = 0, 0
	}
	g.node.publishToLeader(pub, 0, attempt, func(_ wire.PubOK, err *wire.Error) {
		if err != nil && err.Code == wire.CodeProducerSeqTooOld && !g.node.cfg.Mutations.DeadLetterTooOldRetried {
			// DeadLetterBelowTheWindow: more than a dedup window of the
			// partition's later seqs died first (a message redelivered
			// long while a flood of others died), so the dead-letter
			// topic cannot tell whether this copy landed before. Every
			// retry would be refused the same, for good: publish it
			// without the identity — at least once, twice only if an
			// earlier attempt landed.
			g.node.log.Warn("a dead letter's seq is below the dead-letter topic's dedup window; publishing it without deduplication (it may appear twice)",
				"dlq", g.dlq, "partition", pi, "seq", seq)
			pub.ProducerID, pub.ProducerSeq = 0, 0
			g.node.publishToLeader(pub, 0, attempt, func(_ wire.PubOK, err *wire.Error) { g.dlqDone(pi, seq, err) })
			return
		}
		g.dlqDone(pi, seq, err)
	})
}

// dlqProducerIDs are the producer identities of the dead letters of group
// incarnation key of topic, one per partition (DeadLetterWindowPerPartition):
// a dead letter of partition p is published as producer_seq seq of
// identity p. The identity is the (group, topic) pair's, not the
// dead-letter topic's name: group "a.b" of topic "c" and group "a" of
// topic "b.c" share dlq.a.b.c, and one identity would make the second
// group's dead letter at a (partition, seq) a "duplicate" of the first's,
// dropped while its group counts it done. It is the incarnation's (the
// key): a group used again dead-letters anew. And it is the partition's:
// a dedup window forgets its lowest producer_seq first, so with one
// identity for every partition (producer_seq partition<<48 | seq) a
// window full of a higher partition's dead letters forgot each of a
// lower one's as soon as it was appended, and that copy's retry was
// refused PRODUCER_SEQ_TOO_OLD for good — the message never left the
// group.
func dlqProducerIDs(key, topic string, partitions int) []uint64 {
	ids := make([]uint64, partitions)
	for p := range ids {
		h := fnv.New64a()
		h.Write([]byte(key))
		h.Write([]byte{0})
		h.Write([]byte(topic))
		h.Write(binary.BigEndian.AppendUint32([]byte{0}, uint32(p)))
		ids[p] = h.Sum64() | 1 // never 0 (0 = not idempotent)
	}
	return ids
}

func (g *groupRunner) dlqDone(pi uint32, seq uint64, err *wire.Error) {
	g.dlqResult(dlqResult{partition: pi, seq: seq, err: err})
}

// dlqGone ends the dead letter of a seq whose record is gone.
func (g *groupRunner) dlqGone(pi uint32, seq uint64) {
	g.dlqResult(dlqResult{partition: pi, seq: seq, gone: true})
}

func (g *groupRunner) dlqResult(r dlqResult) {
	g.dlqMu.Lock()
	g.dlqResults = append(g.dlqResults, r)
	g.dlqMu.Unlock()
	g.poke()
}
