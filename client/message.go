package client

import (
	"context"
	"fmt"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Message is a record: what a Producer publishes and what a Consumer
// delivers. Publish reads Key, Value, Headers, Timestamp and
// TargetPartition; the other fields are set on delivered messages.
// A delivered message is owned by the caller of Next; its byte slices are
// not reused by the SDK.
type Message struct {
	Key     []byte
	Value   []byte
	Headers []Header
	// Timestamp of the record. On publish, zero means the broker's clock.
	Timestamp time.Time
	// TargetPartition pins a publish to one partition; nil chooses by key
	// hash, else by producer identity, else round-robin (the broker's rule,
	// applied by the producer once it knows the partition count). See
	// PartitionOf.
	TargetPartition *int

	// Delivered messages only.
	Topic         string
	Partition     int
	Seq           uint64
	DeliveryID    uint64
	DeliveryCount int

	consumer *Consumer // nil for messages not delivered by a Consumer
	lane     *lane     // the consumer's lane that delivered it: its acks go there
}

// PartitionOf returns a pointer to p, for Message.TargetPartition.
func PartitionOf(p int) *int { return &p }

func (m *Message) payloadBytes() int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func (m *Message) toPub(topic string, producerID, seq uint64) (wire.Pub, error) {
	p := wire.Pub{
		Topic: topic, Partition: wire.PartitionAuto,
		ProducerID: producerID, ProducerSeq: seq,
		Key: m.Key, Value: m.Value,
	}
	if m.TargetPartition != nil {
		if *m.TargetPartition < 0 || *m.TargetPartition >= wire.PartitionsMax {
			return p, wire.Errorf(wire.CodeInvalidArgument, "partition %d out of range", *m.TargetPartition)
		}
		p.Partition = int32(*m.TargetPartition)
	}
	if !m.Timestamp.IsZero() {
		p.TimestampMs = m.Timestamp.UnixMilli()
	}
	if len(m.Headers) > wire.HeadersMax {
		return p, wire.Errorf(wire.CodeInvalidArgument, "%d headers, at most %d", len(m.Headers), wire.HeadersMax)
	}
	for _, h := range m.Headers {
		if len(h.Key) > wire.HeaderKeyBytesMax {
			return p, wire.Errorf(wire.CodeInvalidArgument, "header key of %d bytes, at most %d", len(h.Key), wire.HeaderKeyBytesMax)
		}
		p.Headers = append(p.Headers, wire.Header{Key: h.Key, Value: h.Value})
	}
	return p, nil
}

func messageFromWire(consumer *Consumer, l *lane, f *wire.Msg) *Message {
	m := &Message{
		Key: f.Key, Value: f.Value,
		Topic: f.Topic, Partition: int(f.Partition), Seq: f.Seq,
		DeliveryID: f.DeliveryID, DeliveryCount: int(f.DeliveryCount),
		consumer: consumer, lane: l,
	}
	if f.TimestampMs != 0 {
		m.Timestamp = time.UnixMilli(f.TimestampMs)
	}
	for _, h := range f.Headers {
		m.Headers = append(m.Headers, Header{Key: h.Key, Value: h.Value})
	}
	return m
}

func (m *Message) ackEntry() wire.AckEntry {
	return wire.AckEntry{Partition: uint32(m.Partition), Seq: m.Seq, DeliveryID: m.DeliveryID}
}

// Ack acknowledges the message asynchronously: the ack joins a batch (up to
// 32 entries or 20 ms) sent to the node that delivered the message, and its
// outcome is counted in the consumer's Stats. It blocks only while that
// lane's bounded ack queue is full.
func (m *Message) Ack() error {
	if m.consumer == nil || m.lane == nil {
		return fmt.Errorf("nereus: ack of a message not delivered by a consumer: %w", wire.ErrInvalidArgument)
	}
	return m.consumer.enqueueAck(context.Background(), m.lane, m.ackEntry(), nil)
}

// AckSync acknowledges the message, at the node that delivered it, and
// waits until the ack is durable. A delivery that is no longer current
// (redelivered meanwhile, say by a partition's new leader) fails with an
// error matching ErrStaleDelivery. An ack the node refuses because it no
// longer serves the partition (NOT_LEADER or UNAVAILABLE, for the whole
// ACK or for its entry), or whose answer is lost with its connection, may
// still have been made durable: it is
// asked again at the partition's leader once the metadata names one
// (for about 1.5 s at most), and that answer is returned — nil when the
// ack was durable (the message does not come again), ErrStaleDelivery
// when it is redelivered. Only when no leader answers (or the named
// leader refuses it) does it fail with ErrNotLeader, UNAVAILABLE or
// ErrDisconnected, and then the message may or may not come again. An
// ack not yet sent when its connection is lost fails with ErrDisconnected:
// the message is redelivered.
func (m *Message) AckSync(ctx context.Context) error {
	if m.consumer == nil || m.lane == nil {
		return fmt.Errorf("nereus: ack of a message not delivered by a consumer: %w", wire.ErrInvalidArgument)
	}
	done := make(chan error, 1)
	if err := m.consumer.enqueueAck(ctx, m.lane, m.ackEntry(), done); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("nereus: ack %d/%d: %w", m.Partition, m.Seq, ctx.Err())
	}
}

// Nack returns the message for redelivery after delay (0 = at once) and
// waits for the answer of the node that delivered it.
func (m *Message) Nack(ctx context.Context, delay time.Duration) error {
	if m.consumer == nil || m.lane == nil {
		return fmt.Errorf("nereus: nack of a message not delivered by a consumer: %w", wire.ErrInvalidArgument)
	}
	return m.consumer.nack(ctx, m.lane, m.ackEntry(), delay)
}
