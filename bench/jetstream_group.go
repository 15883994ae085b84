package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// The JetStream side of the group consume workload (group.go). A stream
// has no partitions: its unit of parallelism is the consumer, and the
// equivalent of a group's members is workers fetching from one durable
// pull consumer, each on its own connection. JetStream assigns nothing to
// a worker, so it has no join or leave workload.

// CreateGroupStream creates the usual stream: partitions has no meaning.
func (s *jetStreamSystem) CreateGroupStream(ctx context.Context, name string, _ int) error {
	return s.CreateStream(ctx, name)
}

// NewSpreadPublisher is NewPublisher: there are no partitions to spread over.
func (s *jetStreamSystem) NewSpreadPublisher(ctx context.Context, stream string, _, inflightMax int) (publisher, error) {
	return s.NewPublisher(ctx, stream, inflightMax)
}

// NewGroupMember opens one more worker of the durable consumer group. Its
// MaxAckPending leaves room for groupMembersMax workers with two batches
// each, as the single consumer of the consume workload has; every worker
// creates the consumer with the same configuration (an idempotent create).
// A create answered "no responders" (the cluster's API not answering yet)
// is retried until ctx ends.
func (s *jetStreamSystem) NewGroupMember(ctx context.Context, stream, group, _ string, batchMax int) (subscriber, error) {
	return s.newWorker(ctx, stream, group, batchMax, groupMembersMax*2*batchMax)
}

// newWorker opens a worker of the durable pull consumer group with
// maxAckPending, its create retried after "no responders".
func (s *jetStreamSystem) newWorker(ctx context.Context, stream, group string, batchMax, maxAckPending int) (subscriber, error) {
	w := &jetStreamWorker{}
	sub, err := createRetryingNoResponders(ctx, group, func() { w.noResponders.Add(1) }, func() (subscriber, error) {
		return s.newPullSubscriber(ctx, stream, group, batchMax, maxAckPending)
	})
	if err != nil {
		return nil, err
	}
	w.jetStreamSubscriber = sub.(*jetStreamSubscriber)
	return w, nil
}

// jetStreamWorker is one worker of a shared durable pull consumer. A
// Fetch answered "no responders" — seen now and then on a consumer of an
// R3 stream just created, before its own leader is elected — counts as
// a fetch that got nothing, after clusterRetryInterval; the workload logs
// how often it happened.
type jetStreamWorker struct {
	*jetStreamSubscriber
	noResponders atomic.Int64
}

func (w *jetStreamWorker) ReceiveBatch(ctx context.Context, wait time.Duration, handle func([]byte)) (int, error) {
	n, err := w.jetStreamSubscriber.ReceiveBatch(ctx, wait, handle)
	if err != nil && errors.Is(err, nats.ErrNoResponders) {
		w.noResponders.Add(1)
		return n, sleepCtx(ctx, clusterRetryInterval)
	}
	return n, err
}

func (w *jetStreamWorker) transientErrors() int64 { return w.noResponders.Load() }
