package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The consumer-group workloads: consume throughput of one member against
// several members of one group on a partitioned stream, and, for Nereus,
// the time a JOIN or a LEAVE takes to reach a stable assignment.
//
// Bounds of the group workloads.
const (
	// groupPartitions is the partition count of a group workload's Nereus
	// topic (a JetStream stream has no partitions: its workers share one
	// durable consumer).
	groupPartitions = 6
	// groupMembersMax is the most members (or workers) a group workload
	// opens; the JetStream consumer's MaxAckPending is sized for it.
	groupMembersMax = 3
	// groupIDBytes is the prefix of a prefilled payload that numbers it,
	// so that the consumers count distinct messages.
	groupIDBytes = 8
	// groupConsumeTimeFactor × limits.TimeLimit bounds the timed part of a
	// group consume run: it must read the whole prefill, rebalances
	// included.
	groupConsumeTimeFactor = 4
	// groupPollInterval paces the polls of the group's description while
	// a join or leave settles: no event says so from outside the broker.
	// It is the resolution of the join and leave samples.
	groupPollInterval = 2 * time.Millisecond
	// groupStableTimeout bounds the wait for one stable assignment.
	groupStableTimeout = 30 * time.Second
)

// groupSystem is a system whose streams a group of consumers can share:
// Nereus members of one group on a partitioned topic, JetStream workers
// fetching from one durable pull consumer.
type groupSystem interface {
	system
	// CreateGroupStream creates an empty stream for a group workload: for
	// Nereus a topic of partitions partitions; JetStream has no partitions
	// and creates its usual stream.
	CreateGroupStream(ctx context.Context, name string, partitions int) error
	// NewSpreadPublisher is NewPublisher whose messages go round-robin to
	// the stream's partitions (where it has them).
	NewSpreadPublisher(ctx context.Context, stream string, partitions, inflightMax int) (publisher, error)
	// NewGroupMember opens a connection with one more consumer of group
	// (a Nereus member named member, a JetStream fetcher of the durable
	// consumer group), with at most batchMax messages per ReceiveBatch.
	NewGroupMember(ctx context.Context, stream, group, member string, batchMax int) (subscriber, error)
}

// ackCounter is a subscriber that counts the outcomes of its acks.
type ackCounter interface {
	ackCounts() (failed, stale uint64)
}

// transientCounter is a subscriber that retried errors it counts as
// transient.
type transientCounter interface {
	transientErrors() int64
}

// runGroupConsume fills a stream with numbered messages (untimed), then
// consumes it with members consumers of one group, each with its own
// connection and goroutine, all opened at once, until every message was
// received at least once, the time bound passes, or no new message came
// for consumeIdleMax. The timed part runs from before the first member is
// opened (joins and rebalances included) to the last new message; the
// count is of distinct messages (redeliveries are counted apart).
func runGroupConsume(ctx context.Context, sys system, stream string, payload []byte, members int, lim limits, prog *progress, logf func(string, ...any)) (runResult, error) {
	gs, ok := sys.(groupSystem)
	if !ok {
		return runResult{}, errors.New("the group workloads need a system whose streams a group can share")
	}
	if len(payload) < groupIDBytes {
		return runResult{}, fmt.Errorf("group_consume needs messages of at least %d bytes", groupIDBytes)
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	err := gs.CreateGroupStream(sctx, stream, groupPartitions)
	cancel()
	if err != nil {
		return runResult{}, fmt.Errorf("create stream %s: %w", stream, err)
	}
	prog.phase(prefillProgressName)
	total, err := prefillNumbered(ctx, gs, stream, payload, lim.countMax(lim.GroupPrefillCountMax, len(payload)), lim.PrefillTimeLimit, prog)
	if err != nil {
		return runResult{}, fmt.Errorf("prefill: %w", err)
	}

	prog.phase(fmt.Sprintf("consume, %d member(s)", members))
	tctx, cancelTimed := context.WithTimeout(ctx, groupConsumeTimeFactor*lim.TimeLimit)
	defer cancelTimed()
	seen := make([]atomic.Bool, total)
	perMember := make([]atomic.Int64, members) // distinct messages each received first
	var distinct, again atomic.Int64
	start := time.Now()
	var lastNewNs atomic.Int64 // since start
	handler := func(member int) func([]byte) {
		return func(p []byte) {
			id := binary.LittleEndian.Uint64(p)
			if id >= uint64(total) || seen[id].Swap(true) {
				again.Add(1)
				return
			}
			perMember[member].Add(1)
			prog.count.Store(distinct.Add(1))
			lastNewNs.Store(int64(time.Since(start)))
		}
	}
	done := func() bool {
		idle := time.Since(start) - time.Duration(lastNewNs.Load())
		return distinct.Load() >= total || tctx.Err() != nil || idle >= consumeIdleMax
	}
	cpu := measureCPU(sys) // the consumption, not the prefill
	group := stream + "-group"
	errs := make([]error, members)
	subs := make([]subscriber, members)
	var wg sync.WaitGroup
	for i := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(tctx, setupTimeout)
			sub, err := gs.NewGroupMember(sctx, stream, group, fmt.Sprintf("m%d", i+1), consumeBatchMax)
			cancel()
			if err != nil {
				errs[i] = fmt.Errorf("open member %d: %w", i+1, err)
				return
			}
			subs[i] = sub
			handle := handler(i)
			for !done() {
				if _, err := sub.ReceiveBatch(tctx, receiveWait, handle); err != nil && tctx.Err() == nil {
					errs[i] = fmt.Errorf("member %d receives: %w", i+1, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	usage := cpu()
	for i, sub := range subs {
		if sub == nil {
			continue
		}
		if ac, ok := sub.(ackCounter); ok {
			if failed, stale := ac.ackCounts(); failed > 0 || stale > 0 {
				logf("%s member %d: %d acks failed, %d stale", stream, i+1, failed, stale)
			}
		}
		if tc, ok := sub.(transientCounter); ok && tc.transientErrors() > 0 {
			logf("%s member %d: %d transient errors retried (JetStream: fetches answered no responders; Nereus: subscriptions refused STALE_ASSIGNMENT, subscribed again)", stream, i+1, tc.transientErrors())
		}
		errs = append(errs, sub.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return runResult{}, err
	}
	counts := make([]string, members)
	for i := range perMember {
		counts[i] = fmt.Sprint(perMember[i].Load())
	}
	logf("%s, %d member(s): %d of %d messages received (by member: %s), %d received again",
		stream, members, distinct.Load(), total, strings.Join(counts, ", "), again.Load())
	return runResult{Messages: distinct.Load(), Elapsed: time.Duration(lastNewNs.Load()), CPU: usage}, ctx.Err()
}

// prefillNumbered publishes up to countMax messages for at most timeLimit,
// message i carrying i in its first groupIDBytes, round-robin over the
// stream's partitions, and returns how many it published (numbered 0 to
// that count - 1: every message handed over is acked, or it fails).
func prefillNumbered(ctx context.Context, gs groupSystem, stream string, payload []byte, countMax int, timeLimit time.Duration, prog *progress) (int64, error) {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	pub, err := gs.NewSpreadPublisher(sctx, stream, groupPartitions, inflightMax)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("new publisher: %w", err)
	}
	defer pub.Close()
	var acked atomic.Int64
	var failed atomic.Pointer[error]
	// Each message needs its own buffer: its number differs and the
	// publisher holds it until its ack.
	var buffers sync.Pool
	tctx, cancelTime := cancelAfter(ctx, timeLimit)
	defer cancelTime()
	var sent int64
	for sent < int64(countMax) && tctx.Err() == nil && failed.Load() == nil {
		buf, _ := buffers.Get().([]byte)
		if len(buf) != len(payload) {
			buf = make([]byte, len(payload))
			copy(buf, payload)
		}
		binary.LittleEndian.PutUint64(buf, uint64(sent))
		err := pub.PublishAsync(tctx, buf, func(err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			} else {
				prog.count.Store(acked.Add(1))
			}
			buffers.Put(buf)
		})
		if err != nil {
			if tctx.Err() != nil {
				break
			}
			return 0, err
		}
		sent++
	}
	fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
	defer fcancel()
	if err := pub.Flush(fctx); err != nil {
		return 0, fmt.Errorf("flush: %w", err)
	}
	if e := failed.Load(); e != nil {
		return 0, *e
	}
	if acked.Load() != sent {
		return 0, fmt.Errorf("%d publishes handed over, %d acked", sent, acked.Load())
	}
	return sent, nil
}
