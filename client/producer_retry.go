package client

// The producer's retries: what follows a failed attempt (requeue), and the
// loop that resends what is due, times out silent attempts and expires
// what passed its deadline.

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// anyAttempt makes requeue skip its attempt check.
const anyAttempt = -1

// requeue decides what follows a failed attempt: a delayed resend when the
// error is retryable and the message may be resent, else completion with
// the error. sent tells whether the attempt may have reached the broker.
// An outcome of an attempt other than the current one is ignored.
func (p *Producer) requeue(req *pubRequest, attempt int, err error, sent bool) {
	if routeMayHaveMoved(err) {
		p.client.refreshTopic(p.topic)
	}
	if hasCode(err, wire.CodeNotLeader) {
		sent = false // refused before any append: even a non-idempotent publish may go again
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.finished || (attempt != anyAttempt && attempt != req.attempts) {
		return
	}
	if p.inflight[req.seq] == req {
		delete(p.inflight, req.seq)
	}
	req.lastErr = err
	mayResend := !sent || p.producerID != 0
	if p.isClosed || p.client.isClosedNow() {
		err = ErrClosed
	}
	if !IsRetryable(err) || !mayResend {
		p.finishLocked(req, PublishResult{}, fmt.Errorf("nereus: publish seq %d: %w", req.seq, err))
		return
	}
	if req.abandoned != nil || !time.Now().Before(req.deadline) {
		p.finishLocked(req, PublishResult{}, p.expiredError(req))
		return
	}
	req.notBefore = time.Now().Add(backoff(max(req.attempts, 1), retryBackoffMin, p.opts.RetryBackoffMax))
	p.insertRetryLocked(req)
	p.kick()
}

// insertRetryLocked queues req for a resend, keeping seq order.
func (p *Producer) insertRetryLocked(req *pubRequest) {
	i := sort.Search(len(p.retry), func(i int) bool { return p.retry[i].seq >= req.seq })
	if i < len(p.retry) && p.retry[i] == req {
		return
	}
	p.retry = append(p.retry, nil)
	copy(p.retry[i+1:], p.retry[i:])
	p.retry[i] = req
}

func (p *Producer) expiredError(req *pubRequest) error {
	cause := req.abandoned
	if cause == nil {
		cause = context.DeadlineExceeded
	}
	if req.lastErr != nil {
		return fmt.Errorf("nereus: publish seq %d gave up after %d attempts: %w (last error: %w)", req.seq, req.attempts, cause, req.lastErr)
	}
	return fmt.Errorf("nereus: publish seq %d: %w", req.seq, cause)
}

// retryLoop resends queued requests in sequence order when they are due,
// times out attempts without a reply, and expires requests past their
// deadline.
func (p *Producer) retryLoop() {
	defer close(p.loopDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.closed:
		case <-p.client.closed:
		case <-ctx.Done():
		}
		cancel()
	}()
	defer p.failAll(ErrClosed)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, next := p.collectDue(time.Now())
		if len(due) > 0 {
			p.resend(ctx, due)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-p.wake:
		case <-timer.C:
		case <-ctx.Done():
			return
		}
	}
}

// resend sends due requests, in order, each to its partition's leader once
// a connection is up; the wait for connections is bounded by the earliest
// deadline among them. Connecting happens before sendMu is taken, so
// publishers are not held up by a dial.
func (p *Producer) resend(ctx context.Context, due []*pubRequest) {
	deadline := due[0].deadline
	for _, req := range due {
		if req.deadline.Before(deadline) {
			deadline = req.deadline
		}
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	conns := make([]*conn, len(due))
	for i, req := range due {
		cn, err := p.target(dctx, req, true)
		if err != nil {
			p.requeue(req, anyAttempt, err, false)
			continue
		}
		conns[i] = cn
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	now := time.Now()
	for i, req := range due {
		if conns[i] != nil {
			p.send(req, conns[i], now)
		}
	}
}

// collectDue removes and returns the queued requests due for a resend, in
// sequence order, expiring those past their deadline; it also moves
// attempts unanswered for RequestTimeout back to the queue. next is the
// earliest time something else falls due (zero if nothing is pending),
// recorded as loopWakeAt.
func (p *Producer) collectDue(now time.Time) (due []*pubRequest, next time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	consider := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	attemptTimeout := p.client.opts.RequestTimeout
	for _, req := range p.inflight {
		switch {
		case req.abandoned != nil || !now.Before(req.deadline):
			p.finishLocked(req, PublishResult{}, p.expiredError(req))
		case now.Sub(req.sentAt) >= attemptTimeout:
			delete(p.inflight, req.seq)
			req.lastErr = fmt.Errorf("%w: no PUB_OK within %v", ErrDisconnected, attemptTimeout)
			// Failing a silent connection fails its requests: their
			// requeue refreshes the metadata, away from that node.
			p.client.giveUpIfSilent(req.conn)
			req.notBefore = now
			p.insertRetryLocked(req)
		default:
			consider(req.sentAt.Add(attemptTimeout))
			consider(req.deadline)
		}
	}
	kept := p.retry[:0]
	for _, req := range p.retry {
		switch {
		case req.finished:
		case req.abandoned != nil || !now.Before(req.deadline):
			p.finishLocked(req, PublishResult{}, p.expiredError(req))
		case !req.notBefore.After(now):
			due = append(due, req)
		default:
			kept = append(kept, req)
			consider(req.notBefore)
			consider(req.deadline)
		}
	}
	clear(p.retry[len(kept):])
	p.retry = kept
	p.loopWakeAt = next
	return due, next
}
