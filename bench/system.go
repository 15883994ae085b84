package main

import (
	"context"
	"time"
)

// system is one broker under test, started and ready for clients. The
// workloads (workloads.go) are written once against this interface; each
// broker implements it in its own file (nereus.go, jetstream.go). A system is
// driven by one goroutine at a time; the publishers and subscribers it
// returns each own their own connection.
type system interface {
	// CreateStream creates an empty single-partition stream (a Nereus topic,
	// a JetStream stream on one subject) named name, on file storage.
	CreateStream(ctx context.Context, name string) error
	// NewPublisher opens a connection that publishes to stream with at most
	// inflightMax publishes awaiting the broker's ack.
	NewPublisher(ctx context.Context, stream string, inflightMax int) (publisher, error)
	// NewSubscriber opens a connection with a durable consumer named group
	// that reads stream from its start with explicit acks, receiving at most
	// batchMax messages per ReceiveBatch.
	NewSubscriber(ctx context.Context, stream, group string, batchMax int) (subscriber, error)
	// Close stops the broker and releases everything it holds.
	Close() error
}

// publisher publishes to one stream over its own connection.
type publisher interface {
	// Publish publishes payload and returns once the broker acknowledged it.
	Publish(ctx context.Context, payload []byte) error
	// PublishAsync hands payload over and returns; it blocks only while
	// inflightMax publishes await their ack (ctx bounds that wait). done is
	// called exactly once with the outcome, from another goroutine, in
	// publish order; it must be quick. payload must not be modified until
	// done is called.
	PublishAsync(ctx context.Context, payload []byte, done func(error)) error
	// Flush waits until every publish handed over so far has completed.
	Flush(ctx context.Context) error
	// Close releases the connection; publishes still in flight are lost.
	Close() error
}

// subscriber consumes one stream as a durable consumer with explicit acks.
type subscriber interface {
	// ReceiveBatch waits at most wait for a message, then hands up to the
	// subscriber's batchMax messages that are already there to handle, one
	// at a time, and acks each after handle returns. It returns how many
	// messages it handled: 0 with a nil error means none arrived in time.
	ReceiveBatch(ctx context.Context, wait time.Duration, handle func(payload []byte)) (int, error)
	// Close stops the consumer, sending the acks still queued.
	Close() error
}
