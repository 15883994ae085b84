package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Consumer defaults and batching bounds (DESIGN.md §2: credits and acks
// return in batches of 32 messages / 1 MiB / low watermark / 20 ms).
const (
	DefaultCredit           = 512
	CreditMax               = 1 << 16
	creditBatchMessagesMax  = 32
	creditBatchBytesMax     = 1 << 20
	creditBatchDelay        = 20 * time.Millisecond
	ackBatchEntriesMax      = 32
	ackBatchDelay           = 20 * time.Millisecond
	resubscribeDelay        = 100 * time.Millisecond
	consumerCloseAckWaitMax = 5 * time.Second
)

// ConsumerOptions configure a Consumer.
type ConsumerOptions struct {
	// Credit bounds messages granted by the broker and not yet taken by
	// Next; it is also the bound of the consumer's buffer (default 512).
	Credit int
	// AckWait is the redelivery timeout of an unacked message; it
	// configures the group when the broker first creates it (0 = broker
	// default).
	AckWait time.Duration
	// MaxDeliver bounds deliveries of one message (0 = broker default);
	// like AckWait it applies when the group is created.
	MaxDeliver int
	// MessagesMax, when positive, is how many messages this consumer will
	// take with Next in all: it never grants the broker credit beyond it,
	// so no message is delivered to it only to be dropped at Close (and
	// counted toward MaxDeliver). 0 = unbounded.
	MessagesMax int

	// Member, when set, makes the consumer a member of its group under
	// this id: the group's coordinator assigns it partitions — each
	// partition to one member at a time (unless Shared) — and it is
	// delivered only those; rebalances move only the partitions that must
	// move. Without Member every consumer of the group competes for every
	// partition, which a group with members refuses.
	Member string
	// Shared joins the group in shared mode: every member competes for
	// every partition (a work queue), no per-partition order.
	Shared bool
	// SessionTimeout: the coordinator fences a member it has not heard
	// from for this long (0 = broker default, 10s). RebalanceTimeout: it
	// fences a member that has not answered a REVOKE within it (0 = 30s).
	SessionTimeout, RebalanceTimeout time.Duration
	// OnAssigned is called with the partitions the member starts to hold.
	// OnRevoked is called with the partitions it must give up: messages of
	// those partitions not yet taken by Next are dropped, and acks made
	// before OnRevoked returns are sent before the coordinator hears that
	// the partitions are free. Both run on the membership goroutine; keep
	// them short.
	OnAssigned, OnRevoked func(partitions []int)
}

// ConsumerStats counts the outcomes of acks.
type ConsumerStats struct {
	Delivered   uint64 // messages returned by Next
	Acked       uint64 // acks the broker confirmed
	StaleAcks   uint64 // acks rejected with STALE_DELIVERY
	FailedAcks  uint64 // acks that failed otherwise (e.g. disconnected)
	Resubscribe uint64 // subscriptions made after a reconnect
}

// Consumer receives the messages of one (topic, group) through credit-based
// flow control. Next is safe for concurrent use. A background pump owns the
// subscription: it (re)subscribes after reconnects, returns credit in
// batches and sends acks in batches.
//
// In a cluster the group is served by its coordinator, the leader of the
// topic's partition 0. When the subscription or an ack is refused with
// NOT_LEADER, or the connection is lost, the consumer refreshes the
// metadata and subscribes again at the new coordinator. Acks refused by the
// old coordinator fail; their messages are redelivered.
type Consumer struct {
	client    *Client
	key       subKey
	creditMax int
	// messagesMax bounds the credit ever granted: taken + queued +
	// outstanding + unreturned ≤ messagesMax (0 = unbounded).
	messagesMax int
	pull        wire.Pull // template of every PULL (Credit set per send)

	ready    chan struct{}   // capacity 1: a message was queued or err set
	kick     chan struct{}   // capacity 1: the pump has work
	acks     chan ackRequest // bounded queue of acks for the pump
	closed   chan struct{}
	pumpDone chan struct{}

	closeOnce sync.Once

	mu              sync.Mutex
	queue           []*Message // received, not yet taken; len ≤ creditMax
	sub             *conn      // connection of the live subscription, nil if none
	subCorr         uint64
	outstanding     int       // credit the broker holds for us on sub
	unreturned      int       // credit freed by Next, not yet sent in a PULL
	unreturnedBytes int       // payload bytes of those messages
	firstUnreturned time.Time // when unreturned went from 0 to 1
	err             error     // terminal subscription error
	leaving         *conn     // the coordinator is no longer on this conn: move

	delivered, acked, staleAcks, failedAcks, resubscribes atomic.Uint64
	acksInFlight                                          sync.WaitGroup
	// acksOut counts the ACKs in flight too, for a revoke's flush, which
	// may not Wait on acksInFlight while the pump adds to it.
	acksOut atomic.Int64

	// member is the consumer's group membership (nil without
	// ConsumerOptions.Member).
	member                *groupMember
	onAssigned, onRevoked func([]int)
	// flushReq asks the pump to send its ack batch now; it closes the
	// channel once every ack sent so far is answered.
	flushReq chan chan struct{}
}

// ackRequest is one ack handed to the pump; done (capacity 1) is nil for
// async acks.
type ackRequest struct {
	entry wire.AckEntry
	done  chan error
}

// Subscribe starts consuming topic as a member of group. It checks that the
// topic exists (ErrNotFound otherwise). One Client can hold one Consumer per
// (topic, group) at a time.
func (c *Client) Subscribe(ctx context.Context, topic, group string, opts ConsumerOptions) (*Consumer, error) {
	if err := wire.ValidateName("topic", topic); err != nil {
		return nil, fmt.Errorf("nereus: subscribe: %w", err)
	}
	if err := wire.ValidateName("group", group); err != nil {
		return nil, fmt.Errorf("nereus: subscribe: %w", err)
	}
	if opts.Credit <= 0 {
		opts.Credit = DefaultCredit
	}
	if opts.Credit > CreditMax || opts.AckWait < 0 || opts.MaxDeliver < 0 || opts.MessagesMax < 0 || opts.SessionTimeout < 0 || opts.RebalanceTimeout < 0 {
		return nil, fmt.Errorf("nereus: subscribe: credit must be 1-%d, AckWait, MaxDeliver, MessagesMax and the timeouts not negative: %w", CreditMax, wire.ErrInvalidArgument)
	}
	if opts.Member == "" && (opts.Shared || opts.OnAssigned != nil || opts.OnRevoked != nil || opts.SessionTimeout != 0 || opts.RebalanceTimeout != 0) {
		return nil, fmt.Errorf("nereus: subscribe: Shared, the timeouts and the callbacks need a Member: %w", wire.ErrInvalidArgument)
	}
	infos, err := c.Topics(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("nereus: subscribe %s: %w", topic, err)
	}
	if len(infos) == 0 {
		return nil, fmt.Errorf("nereus: subscribe: topic %q: %w", topic, wire.ErrNotFound)
	}
	co := &Consumer{
		client:      c,
		key:         subKey{topic, group},
		creditMax:   opts.Credit,
		messagesMax: opts.MessagesMax,
		pull: wire.Pull{
			Topic: topic, Group: group,
			AckWaitMs:  uint32(min(opts.AckWait.Milliseconds(), 1<<32-1)),
			MaxDeliver: uint32(opts.MaxDeliver),
		},
		ready:      make(chan struct{}, 1),
		kick:       make(chan struct{}, 1),
		acks:       make(chan ackRequest, opts.Credit),
		closed:     make(chan struct{}),
		pumpDone:   make(chan struct{}),
		flushReq:   make(chan chan struct{}, 1),
		onAssigned: opts.OnAssigned,
		onRevoked:  opts.OnRevoked,
	}
	if opts.Member != "" {
		co.member = newGroupMember(co, opts)
		if err := co.member.joinOnce(ctx); err != nil {
			return nil, fmt.Errorf("nereus: subscribe %s/%s: join: %w", topic, group, err)
		}
	}
	cn, err := c.leaderConn(ctx, topic, 0, true) // the group coordinator
	if err != nil {
		return nil, fmt.Errorf("nereus: subscribe %s/%s: %w", topic, group, err)
	}
	if err := co.subscribe(ctx, cn); err != nil {
		return nil, fmt.Errorf("nereus: subscribe %s/%s: %w", topic, group, err)
	}
	go co.pump(cn)
	if co.member != nil {
		go co.member.run()
	}
	return co, nil
}

// setIncarnation makes the next PULLs a member incarnation's; a live
// subscription of an earlier incarnation is dropped and made again.
func (co *Consumer) setIncarnation(member string, inc uint64) {
	co.mu.Lock()
	co.pull.Member, co.pull.Incarnation = member, inc
	cn := co.sub
	co.sub = nil
	co.mu.Unlock()
	if cn != nil {
		cn.dropSub(co.key, co)
	}
	co.wakePump()
}

// release gives up partitions: their messages not yet taken are dropped
// (the broker redelivers them to the next holder), OnRevoked runs, and
// the acks made so far are sent and answered (bounded by RequestTimeout).
func (co *Consumer) release(parts []int) {
	co.mu.Lock()
	kept := co.queue[:0]
	for _, m := range co.queue {
		if !slices.Contains(parts, m.Partition) {
			kept = append(kept, m)
		}
	}
	clear(co.queue[len(kept):])
	co.queue = kept
	co.mu.Unlock()
	if co.onRevoked != nil {
		co.onRevoked(parts)
	}
	done := make(chan struct{})
	select {
	case co.flushReq <- done:
		co.wakePump()
	case <-co.closed:
		return
	}
	t := time.NewTimer(co.client.opts.RequestTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-co.closed:
	}
}

// subscribe attaches to cn's subscription of (topic, group) and grants the
// credit the buffer has room for.
func (co *Consumer) subscribe(ctx context.Context, cn *conn) error {
	corr, existed, leftover, err := cn.attachSub(co.key, co)
	if err != nil {
		return err
	}
	co.mu.Lock()
	co.sub, co.subCorr = cn, corr
	co.outstanding = leftover
	co.unreturned = max(co.creditMax-len(co.queue)-leftover, 0)
	if co.messagesMax > 0 {
		wanted := co.messagesMax - int(co.delivered.Load()) - len(co.queue) - leftover
		co.unreturned = max(min(co.unreturned, wanted), 0)
	}
	co.unreturnedBytes = 0
	co.firstUnreturned = time.Now()
	co.mu.Unlock()
	if !existed && co.unreturned == 0 {
		// The buffer is full of messages from before a reconnect; the
		// first PULL goes out as soon as Next frees room.
		return nil
	}
	return co.returnCredit(ctx, cn, true)
}

// returnCredit sends a PULL with the credit freed by Next when a batching
// threshold is met (or force).
func (co *Consumer) returnCredit(ctx context.Context, cn *conn, force bool) error {
	co.mu.Lock()
	if co.sub != cn || co.unreturned == 0 {
		co.mu.Unlock()
		return nil
	}
	due := force ||
		co.unreturned >= creditBatchMessagesMax ||
		co.unreturnedBytes >= creditBatchBytesMax ||
		co.outstanding <= co.creditMax/4 ||
		time.Since(co.firstUnreturned) >= creditBatchDelay
	if !due {
		co.mu.Unlock()
		return nil
	}
	n := co.unreturned
	co.outstanding += n
	co.unreturned, co.unreturnedBytes = 0, 0
	corr := co.subCorr
	co.mu.Unlock()
	pull := co.pull
	pull.Credit = uint32(n)
	return cn.send(ctx, corr, &pull)
}

// onStream receives a MSG or ERR of the subscription on cn, on cn's reader
// goroutine. It reports whether the consumer took the frame.
func (co *Consumer) onStream(cn *conn, f wire.Frame, err error) bool {
	if err != nil {
		if errors.Is(err, ErrDisconnected) || errors.Is(err, ErrClosed) {
			return true // the pump sees cn.done
		}
		co.mu.Lock()
		if co.sub == cn {
			co.sub = nil
			if !IsRetryable(err) {
				co.err = fmt.Errorf("nereus: subscription %s/%s: %w", co.key.topic, co.key.group, err)
			} else if routeMayHaveMoved(err) {
				co.leaving = cn
			}
		}
		co.mu.Unlock()
		cn.dropSub(co.key, co)
		co.signalReady()
		co.wakePump()
		return true
	}
	m, ok := f.(*wire.Msg)
	if !ok {
		return true
	}
	co.mu.Lock()
	if co.sub != cn {
		co.mu.Unlock()
		return false
	}
	if co.outstanding <= 0 {
		co.mu.Unlock()
		cn.fail(errCreditExceeded)
		return true
	}
	co.outstanding--
	if len(co.queue) >= co.creditMax {
		// Only possible with credit inherited from a detached consumer of
		// larger credit; the broker redelivers after AckWait.
		co.mu.Unlock()
		return true
	}
	co.queue = append(co.queue, messageFromWire(co, m))
	co.mu.Unlock()
	co.signalReady()
	return true
}

func (co *Consumer) signalReady() {
	select {
	case co.ready <- struct{}{}:
	default:
	}
}

func (co *Consumer) wakePump() {
	select {
	case co.kick <- struct{}{}:
	default:
	}
}

// leave tells the pump that cn no longer reaches the group coordinator.
func (co *Consumer) leave(cn *conn) {
	co.mu.Lock()
	co.leaving = cn
	co.mu.Unlock()
	co.wakePump()
}

// takeLeaving reports (once) whether the pump must leave cn.
func (co *Consumer) takeLeaving(cn *conn) bool {
	co.mu.Lock()
	defer co.mu.Unlock()
	l := co.leaving
	co.leaving = nil
	return l != nil && l == cn
}

// coordinatorConn returns the connection of the live subscription, else one
// to the group coordinator.
func (co *Consumer) coordinatorConn(ctx context.Context) (*conn, error) {
	co.mu.Lock()
	cn := co.sub
	co.mu.Unlock()
	if cn != nil && !cn.isDead() {
		return cn, nil
	}
	return co.client.leaderConn(ctx, co.key.topic, 0, true)
}

// Next returns the next message, waiting until one arrives, ctx ends, the
// consumer is closed, or the subscription fails terminally.
func (co *Consumer) Next(ctx context.Context) (*Message, error) {
	for {
		co.mu.Lock()
		if len(co.queue) > 0 {
			m := co.queue[0]
			co.queue[0] = nil
			co.queue = co.queue[1:]
			if len(co.queue) == 0 {
				co.queue = co.queue[:0:0] // let the backing array go
			}
			if co.member != nil && !co.member.holds(uint32(m.Partition)) {
				// Of a partition given up: the broker redelivers it to
				// its holder. Its credit comes back.
				if co.messagesMax == 0 || int(co.delivered.Load())+len(co.queue)+co.outstanding+co.unreturned < co.messagesMax {
					co.unreturned++
				}
				co.mu.Unlock()
				continue
			}
			taken := co.delivered.Add(1)
			if co.messagesMax == 0 || int(taken)+len(co.queue)+co.outstanding+co.unreturned < co.messagesMax {
				if co.unreturned == 0 {
					co.firstUnreturned = time.Now()
				}
				co.unreturned++
				co.unreturnedBytes += m.payloadBytes()
			}
			more := len(co.queue) > 0
			co.mu.Unlock()
			co.wakePump()
			if more {
				co.signalReady()
			}
			return m, nil
		}
		err := co.err
		co.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-co.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-co.closed:
			return nil, ErrClosed
		}
	}
}

// Buffered returns the number of received messages not yet taken by Next.
func (co *Consumer) Buffered() int {
	co.mu.Lock()
	defer co.mu.Unlock()
	return len(co.queue)
}

// Stats returns the consumer's counters.
func (co *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Delivered:   co.delivered.Load(),
		Acked:       co.acked.Load(),
		StaleAcks:   co.staleAcks.Load(),
		FailedAcks:  co.failedAcks.Load(),
		Resubscribe: co.resubscribes.Load(),
	}
}

func (co *Consumer) enqueueAck(ctx context.Context, e wire.AckEntry, done chan error) error {
	select {
	case <-co.closed:
		return ErrClosed
	default:
	}
	select {
	case co.acks <- ackRequest{entry: e, done: done}:
		return nil
	case <-co.closed:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (co *Consumer) nack(ctx context.Context, e wire.AckEntry, delay time.Duration) error {
	ctx, cancel := co.client.withRequestTimeout(ctx)
	defer cancel()
	cn, err := co.coordinatorConn(ctx)
	if err != nil {
		return fmt.Errorf("nereus: nack %d/%d: %w", e.Partition, e.Seq, err)
	}
	reply, err := cn.roundTrip(ctx, &wire.Nack{
		Topic: co.key.topic, Group: co.key.group,
		DelayMs: uint32(min(max(delay.Milliseconds(), 0), 1<<32-1)), Entries: []wire.AckEntry{e},
	})
	if err != nil {
		if hasCode(err, wire.CodeNotLeader, wire.CodeUnavailable) {
			co.leave(cn)
		}
		return fmt.Errorf("nereus: nack %d/%d: %w", e.Partition, e.Seq, err)
	}
	ok, isOK := reply.(*wire.AckOK)
	if !isOK || len(ok.Results) != 1 {
		return unexpected("NACK", reply)
	}
	if ok.Results[0] != wire.CodeOK {
		return fmt.Errorf("nereus: nack %d/%d: %w", e.Partition, e.Seq, &wire.Error{Code: ok.Results[0]})
	}
	return nil
}

// pump runs until Close: it keeps the subscription alive across
// reconnects, returns credit and sends acks.
func (co *Consumer) pump(cn *conn) {
	defer close(co.pumpDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-co.closed:
		case <-co.client.closed:
		}
		cancel()
	}()

	type dialResult struct {
		cn  *conn
		err error
	}
	var dialing chan dialResult
	var batch []ackRequest
	var batchStart, resubscribeAt time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	for {
		if cn == nil && dialing == nil && ctx.Err() == nil {
			dialing = make(chan dialResult, 1)
			go func(ch chan dialResult) {
				// What ended the last connection (loss, NOT_LEADER) may
				// mean the coordinator moved: look it up again first.
				co.client.awaitRefresh(ctx, co.key.topic)
				cn, err := co.client.leaderConn(ctx, co.key.topic, 0, true)
				ch <- dialResult{cn, err}
			}(dialing)
		}
		var connDone <-chan struct{}
		if cn != nil {
			connDone = cn.done
		}
		// Next wake-up: an ack batch or unreturned credit coming due, or a
		// resubscription after a retryable PULL error.
		var wake time.Time
		consider := func(t time.Time) {
			if !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
				wake = t
			}
		}
		if len(batch) > 0 {
			consider(batchStart.Add(ackBatchDelay))
		}
		co.mu.Lock()
		if co.unreturned > 0 && co.sub != nil {
			consider(co.firstUnreturned.Add(creditBatchDelay))
		}
		needSub := cn != nil && co.sub == nil && co.err == nil
		co.mu.Unlock()
		if needSub {
			consider(resubscribeAt)
		}
		wait := time.Hour
		if !wake.IsZero() {
			wait = max(time.Until(wake), 0)
		}
		timer.Reset(wait)

		select {
		case <-ctx.Done():
			co.finishAcks(cn, batch)
			co.setErr(fmt.Errorf("nereus: consumer %s/%s: %w", co.key.topic, co.key.group, ErrClosed))
			return
		case r := <-dialing:
			dialing = nil
			if r.err != nil {
				if !errors.Is(r.err, ErrClosed) && !errors.Is(r.err, context.Canceled) {
					co.setErr(fmt.Errorf("nereus: subscription %s/%s: %w", co.key.topic, co.key.group, r.err))
				}
				continue
			}
			cn = r.cn
			resubscribeAt = time.Time{}
			co.resubscribes.Add(1)
		case <-connDone:
			co.mu.Lock()
			if co.sub == cn {
				co.sub = nil
			}
			co.mu.Unlock()
			co.failAcks(batch, fmt.Errorf("nereus: ack: %w", cn.failure()))
			batch = nil
			cn = nil
		case a := <-co.acks:
			if cn == nil {
				co.failAcks([]ackRequest{a}, fmt.Errorf("nereus: ack: %w", ErrDisconnected))
				break
			}
			if len(batch) == 0 {
				batchStart = time.Now()
			}
			batch = append(batch, a)
			// Take whatever else is queued without waiting.
			for len(batch) < ackBatchEntriesMax {
				select {
				case a := <-co.acks:
					batch = append(batch, a)
					continue
				default:
				}
				break
			}
		case <-co.kick:
		case <-timer.C:
		case done := <-co.flushReq:
			// A revoke: the acks taken in go out now; done closes once
			// every ack sent is answered.
			batch = co.takeQueuedAcks(batch)
			if cn != nil {
				co.sendAllAcks(cn, batch)
				batch = nil
				cn.flush()
			}
			go func() {
				for co.acksOut.Load() > 0 {
					time.Sleep(2 * time.Millisecond)
				}
				close(done)
			}()
		}

		if cn != nil && co.takeLeaving(cn) {
			// The coordinator moved. cn may serve others: only stop using
			// it. Unsent acks fail like on a lost connection.
			co.mu.Lock()
			if co.sub == cn {
				cn.detachSub(co.key, co, co.outstanding)
				co.sub = nil
			}
			co.mu.Unlock()
			co.failAcks(batch, fmt.Errorf("nereus: ack: %s left the coordinator: %w", cn.addr, ErrNotLeader))
			batch = nil
			cn = nil
		}
		if cn == nil {
			continue
		}
		co.mu.Lock()
		needSub = co.sub == nil && co.err == nil
		co.mu.Unlock()
		if needSub {
			if resubscribeAt.IsZero() {
				resubscribeAt = time.Now()
			}
			if !time.Now().Before(resubscribeAt) {
				if err := co.subscribe(ctx, cn); err != nil && !errors.Is(err, ErrDisconnected) {
					co.setErr(fmt.Errorf("nereus: subscription %s/%s: %w", co.key.topic, co.key.group, err))
				}
				resubscribeAt = time.Now().Add(resubscribeDelay)
			}
		} else {
			resubscribeAt = time.Time{}
		}
		_ = co.returnCredit(ctx, cn, false) // a failure shows up as cn.done
		if len(batch) > 0 && (len(batch) >= ackBatchEntriesMax || hasWaiter(batch) || time.Since(batchStart) >= ackBatchDelay) {
			co.sendAcks(cn, batch)
			batch = nil
		}
	}
}

func hasWaiter(batch []ackRequest) bool {
	for _, a := range batch {
		if a.done != nil {
			return true
		}
	}
	return false
}

// setErr records a terminal subscription error for Next.
func (co *Consumer) setErr(err error) {
	co.mu.Lock()
	if co.err == nil {
		co.err = err
	}
	co.mu.Unlock()
	co.signalReady()
}

// failAcks completes acks that could not be sent.
func (co *Consumer) failAcks(batch []ackRequest, err error) {
	for _, a := range batch {
		co.failedAcks.Add(1)
		if a.done != nil {
			a.done <- err
		}
	}
}

// sendAcks sends batch (at most ackBatchEntriesMax entries) as one ACK; the
// reply completes each entry.
// ackRetriesMax bounds the resends of an ACK the broker refused with a
// retryable error (its ledger write failed: the ack may or may not be
// durable, and asking again is safe — acks are idempotent).
const ackRetriesMax = 3

func (co *Consumer) ackStarted() { co.acksInFlight.Add(1); co.acksOut.Add(1) }
func (co *Consumer) ackEnded()   { co.acksOut.Add(-1); co.acksInFlight.Done() }

func (co *Consumer) sendAcks(cn *conn, batch []ackRequest) {
	co.sendAcksAttempt(cn, batch, 0)
}

func (co *Consumer) sendAcksAttempt(cn *conn, batch []ackRequest, attempt int) {
	// Not the pump's context: acks taken in must go out even while closing.
	ctx, cancel := co.client.withRequestTimeout(context.Background())
	defer cancel()
	entries := make([]wire.AckEntry, len(batch))
	for i, a := range batch {
		entries[i] = a.entry
	}
	co.ackStarted()
	_, err := cn.request(ctx, &wire.Ack{Topic: co.key.topic, Group: co.key.group, Entries: entries},
		func(f wire.Frame, err error) {
			defer co.ackEnded()
			var werr *wire.Error
			if hasCode(err, wire.CodeNotLeader, wire.CodeUnavailable) {
				// Asking this node again is pointless: follow the
				// coordinator. These acks fail; their messages come again.
				co.leave(cn)
			} else if attempt < ackRetriesMax && errors.As(err, &werr) && werr.Code.Retryable() {
				co.ackStarted()
				time.AfterFunc(time.Duration(attempt+1)*50*time.Millisecond, func() {
					defer co.ackEnded()
					co.sendAcksAttempt(cn, batch, attempt+1)
				})
				return
			}
			co.completeAcks(batch, f, err)
		})
	if err != nil {
		co.ackEnded()
		co.failAcks(batch, fmt.Errorf("nereus: ack: %w", err))
	}
}

func (co *Consumer) completeAcks(batch []ackRequest, f wire.Frame, err error) {
	if err == nil {
		ok, isOK := f.(*wire.AckOK)
		if !isOK || len(ok.Results) != len(batch) {
			err = unexpected("ACK", f)
		} else {
			for i, a := range batch {
				var aerr error
				switch code := ok.Results[i]; code {
				case wire.CodeOK:
					co.acked.Add(1)
				case wire.CodeStaleDelivery:
					co.staleAcks.Add(1)
					aerr = fmt.Errorf("nereus: ack %d/%d delivery %d: %w", a.entry.Partition, a.entry.Seq, a.entry.DeliveryID, &wire.Error{Code: code})
				default:
					co.failedAcks.Add(1)
					aerr = fmt.Errorf("nereus: ack %d/%d: %w", a.entry.Partition, a.entry.Seq, &wire.Error{Code: code})
				}
				if a.done != nil {
					a.done <- aerr
				}
			}
			return
		}
	}
	co.failAcks(batch, fmt.Errorf("nereus: ack: %w", err))
}

// takeQueuedAcks appends every ack queued for the pump to batch.
func (co *Consumer) takeQueuedAcks(batch []ackRequest) []ackRequest {
	for {
		select {
		case a := <-co.acks:
			batch = append(batch, a)
		default:
			return batch
		}
	}
}

// sendAllAcks sends batch as ACKs of at most ackBatchEntriesMax entries.
func (co *Consumer) sendAllAcks(cn *conn, batch []ackRequest) {
	for len(batch) > 0 {
		n := min(len(batch), ackBatchEntriesMax)
		co.sendAcks(cn, batch[:n:n])
		batch = batch[n:]
	}
}

// finishAcks runs at Close: it sends every queued ack and waits (bounded)
// for the broker to confirm them, then detaches from the subscription.
func (co *Consumer) finishAcks(cn *conn, batch []ackRequest) {
	batch = co.takeQueuedAcks(batch)
	wait := min(co.client.opts.RequestTimeout, consumerCloseAckWaitMax)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if cn != nil && !cn.isDead() {
		co.sendAllAcks(cn, batch)
	} else {
		co.failAcks(batch, fmt.Errorf("nereus: ack: %w", ErrClosed))
	}
	done := make(chan struct{})
	go func() { co.acksInFlight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	co.mu.Lock()
	if co.sub != nil {
		co.sub.detachSub(co.key, co, co.outstanding)
		co.sub = nil
	}
	co.mu.Unlock()
}

// Close stops the consumer: queued acks are sent and awaited (at most
// RequestTimeout or 5s); messages received but not taken by Next are
// dropped and redelivered by the broker after AckWait.
func (co *Consumer) Close() error {
	co.closeOnce.Do(func() {
		close(co.closed)
		<-co.pumpDone
		if co.member != nil {
			co.member.leave() // after the acks: its partitions move at once
		}
	})
	<-co.pumpDone
	return nil
}
