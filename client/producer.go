package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Producer bounds and defaults.
const (
	DefaultMaxInFlight = 256
	MaxInFlightMax     = 512
	// SeqSpanMax bounds how far the newest sequence handed over may run
	// ahead of the oldest one not yet completed. The broker remembers the
	// last 1 024 producer_seqs of a producer per partition; a message that
	// is still being retried must stay inside that window, or its retry
	// could only be answered PRODUCER_SEQ_TOO_OLD.
	SeqSpanMax             = 1024
	DefaultRetryBackoffMax = 2 * time.Second
	DefaultDeliveryTimeout = 2 * time.Minute
	retryBackoffMin        = 20 * time.Millisecond
)

// ProducerOptions configure a Producer.
type ProducerOptions struct {
	// Topic every message is published to. Required.
	Topic string
	// ProducerID is the idempotence identity; 0 = random (crypto/rand).
	// Reuse an id across restarts only together with FirstSeq.
	ProducerID uint64
	// FirstSeq is the producer sequence of the first message (default 1).
	FirstSeq uint64
	// MaxInFlight bounds publishes awaiting PUB_OK (default 256, max 512).
	MaxInFlight int
	// RetryBackoffMax caps the delay between retries (default 2s).
	RetryBackoffMax time.Duration
	// DeliveryTimeout bounds the retries of one message, counted from its
	// handoff (default 2m). A Publish context deadline applies as well.
	DeliveryTimeout time.Duration
	// DisableIdempotence publishes with producer id 0: no deduplication,
	// so a publish whose fate is unknown after a disconnect is failed, not
	// retried. The zero value keeps the producer idempotent.
	DisableIdempotence bool
}

// PublishResult is the broker's acknowledgement of a durable, visible record.
type PublishResult struct {
	Partition int
	Seq       uint64
	Epoch     uint64
	// Duplicate is true when the broker answered a retry from its dedup
	// table: the record was appended once, by an earlier attempt.
	Duplicate bool
	// ProducerSeq is the producer sequence the message was published with.
	ProducerSeq uint64
}

// Producer publishes to one topic. With idempotence on (the default) each
// message gets the next producer sequence when it is handed over, and every
// retry resends that same sequence, so the broker appends it exactly once.
// Safe for concurrent use; messages from one goroutine are sent in order.
//
// In a cluster the producer picks each message's partition itself, with the
// broker's rule (target partition, else key hash, else producer identity,
// else round-robin), and sends it to that partition's leader; NOT_LEADER,
// UNAVAILABLE, QUORUM_LOST and lost connections refresh the topic's metadata
// and the message is retried, on the same partition, at the new leader.
type Producer struct {
	client     *Client
	topic      string
	producerID uint64 // 0 when idempotence is disabled
	opts       ProducerOptions
	rr         atomic.Uint32 // round-robin partition counter
	routed     atomic.Bool   // the first handover asked for the topic's leaders
	// sentOn is the connection of the latest send, flushed before the
	// producer waits (conn.flush).
	sentOn atomic.Pointer[conn]

	window      chan struct{}   // one token per message handed over and not completed
	completions chan completion // capacity MaxInFlight: never blocks a sender
	wake        chan struct{}   // capacity 1: nudges the retry loop
	closed      chan struct{}   // closed by Close
	loopDone    chan struct{}   // closed when the retry loop exits
	callbacksOK chan struct{}   // closed when the callback goroutine exits

	sendMu sync.Mutex // orders (sequence assignment, enqueue) among senders

	mu          sync.Mutex
	isClosed    bool
	nextSeq     uint64
	inflight    map[uint64]*pubRequest // sent, awaiting a reply, by producer seq
	retry       []*pubRequest          // waiting to be (re)sent, sorted by seq
	outstanding int                    // handed over, callback not yet run
	idleWaiters []chan struct{}        // closed when outstanding reaches 0
	// unfinished holds the seqs handed over and not yet finished; oldest
	// is at or below the smallest of them (advanced lazily). See SeqSpanMax.
	unfinished map[uint64]struct{}
	oldest     uint64
	spanWake   chan struct{} // capacity 1: a message finished
	// loopWakeAt is when the retry loop looks next of its own accord
	// (zero: not before a kick). An attempt that must time out earlier
	// kicks it: an attempt started outside the loop (handOver) would
	// otherwise have no watchdog while the loop sleeps — no attempt
	// timeout, no DeliveryTimeout — and a broker that never answers would
	// hold its window slot indefinitely.
	loopWakeAt time.Time
}

// pubRequest is one message from handoff to completion. Fields after pub
// are guarded by Producer.mu.
type pubRequest struct {
	seq      uint64
	pub      wire.Pub
	deadline time.Time
	done     func(PublishResult, error)

	attempts  int       // sends so far
	conn      *conn     // connection of the current attempt
	sentAt    time.Time // start of the current attempt
	notBefore time.Time // earliest resend
	lastErr   error
	abandoned error // set when the Publish caller gave up
	finished  bool
}

type completion struct {
	req *pubRequest
	res PublishResult
	err error
}

// NewProducer creates a producer. Its goroutines stop at Close.
func (c *Client) NewProducer(opts ProducerOptions) (*Producer, error) {
	if err := wire.ValidateName("topic", opts.Topic); err != nil {
		return nil, fmt.Errorf("nereus: producer: %w", err)
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.MaxInFlight > MaxInFlightMax {
		return nil, fmt.Errorf("nereus: producer: MaxInFlight %d over %d: %w", opts.MaxInFlight, MaxInFlightMax, wire.ErrInvalidArgument)
	}
	if opts.RetryBackoffMax <= 0 {
		opts.RetryBackoffMax = DefaultRetryBackoffMax
	}
	if opts.DeliveryTimeout <= 0 {
		opts.DeliveryTimeout = DefaultDeliveryTimeout
	}
	if opts.FirstSeq == 0 {
		opts.FirstSeq = 1
	}
	id := opts.ProducerID
	if opts.DisableIdempotence {
		id = 0
	} else if id == 0 {
		var err error
		if id, err = randomProducerID(); err != nil {
			return nil, err
		}
	}
	p := &Producer{
		client:      c,
		topic:       opts.Topic,
		producerID:  id,
		opts:        opts,
		window:      make(chan struct{}, opts.MaxInFlight),
		completions: make(chan completion, opts.MaxInFlight),
		wake:        make(chan struct{}, 1),
		closed:      make(chan struct{}),
		loopDone:    make(chan struct{}),
		callbacksOK: make(chan struct{}),
		nextSeq:     opts.FirstSeq,
		oldest:      opts.FirstSeq,
		unfinished:  make(map[uint64]struct{}),
		spanWake:    make(chan struct{}, 1),
		inflight:    make(map[uint64]*pubRequest),
	}
	c.refreshTopic(opts.Topic) // learn the leaders before the first publish
	go p.retryLoop()
	go p.callbackLoop()
	return p, nil
}

// ID returns the producer id (0 when idempotence is disabled).
func (p *Producer) ID() uint64 { return p.producerID }

// Publish publishes m and waits for its PUB_OK. Retries end when ctx does or
// after DeliveryTimeout; the error then wraps both the cause and the last
// attempt's error (errors.Is(err, ErrQuorumLost), for example). When ctx
// ends first the message may still be appended by an attempt already sent.
func (p *Producer) Publish(ctx context.Context, m Message) (PublishResult, error) {
	type result struct {
		res PublishResult
		err error
	}
	ch := make(chan result, 1)
	req, err := p.handOver(ctx, m, true, func(r PublishResult, err error) { ch <- result{r, err} })
	if err != nil {
		return PublishResult{}, err
	}
	p.flush()
	select {
	case r := <-ch:
		return r.res, r.err
	case <-ctx.Done():
		return PublishResult{}, p.abandon(req, ctx.Err())
	}
}

// PublishAsync hands m over and returns once it has a sequence number and
// has been queued for sending; ctx bounds only the wait for a free slot in
// the in-flight window. done is called exactly once with the outcome, from a
// goroutine of the producer, in completion order; it must not block long
// (it holds up later callbacks) and must not call Flush or Close.
func (p *Producer) PublishAsync(ctx context.Context, m Message, done func(PublishResult, error)) error {
	if done == nil {
		done = func(PublishResult, error) {}
	}
	_, err := p.handOver(ctx, m, false, done)
	return err
}

// handOver gives m its producer sequence and sends it. ctx bounds the wait
// for a window slot; with ctxBoundsDelivery (Publish) its deadline also
// bounds the retries, otherwise (PublishAsync) only DeliveryTimeout does.
func (p *Producer) handOver(ctx context.Context, m Message, ctxBoundsDelivery bool, done func(PublishResult, error)) (*pubRequest, error) {
	pub, err := m.toPub(p.topic, p.producerID, 0)
	if err != nil {
		return nil, fmt.Errorf("nereus: publish: %w", err)
	}
	select {
	case p.window <- struct{}{}: // a free slot: skip the three-way select
	default:
		p.flush() // what was sent so far must leave before this waits
		select {
		case p.window <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("nereus: publish: waiting for the in-flight window: %w", ctx.Err())
		case <-p.closed:
			return nil, ErrClosed
		}
	}
	now := time.Now()
	deadline := now.Add(p.opts.DeliveryTimeout)
	if d, ok := ctx.Deadline(); ok && ctxBoundsDelivery && d.Before(deadline) {
		deadline = d
	}
	if !p.routed.Swap(true) && p.client.partitionCount(p.topic) == 0 {
		// Learn the leaders before the first send: guessing sends the first
		// window to followers, whose NOT_LEADER answers then arrive as
		// retries interleaved with (and behind) the later messages.
		mctx, cancel := context.WithTimeout(ctx, p.client.opts.RequestTimeout)
		p.client.awaitRefresh(mctx, p.topic)
		cancel()
	}
	// Wait for the span without sendMu: the retry loop needs it to resend
	// the very message being waited for.
	for {
		p.sendMu.Lock()
		p.mu.Lock()
		if p.spanOKLocked() {
			break
		}
		p.mu.Unlock()
		p.sendMu.Unlock()
		if err := p.waitSpan(ctx); err != nil {
			<-p.window
			return nil, err
		}
	}
	defer p.sendMu.Unlock()
	if p.isClosed || p.client.isClosedNow() {
		p.mu.Unlock()
		<-p.window
		return nil, ErrClosed
	}
	req := &pubRequest{seq: p.nextSeq, pub: pub, deadline: deadline, done: done}
	p.unfinished[req.seq] = struct{}{}
	if p.producerID != 0 {
		req.pub.ProducerSeq = req.seq
	}
	p.nextSeq++
	p.outstanding++
	var cn *conn
	attempt := 0
	if len(p.retry) > 0 {
		p.retry = append(p.retry, req) // keep order behind earlier retries
		p.kick()
	} else {
		// The first attempt starts under the same lock. target takes
		// Client.mu inside mu: it does not dial, and the Client never takes
		// a producer's lock.
		cn, _ = p.target(context.Background(), req, false) // no dial: no error
		attempt = p.beginAttemptLocked(req, cn, now)
	}
	p.mu.Unlock()
	if attempt > 0 {
		p.request(req, cn, attempt)
	}
	return req, nil
}

// spanOKLocked reports whether the next sequence is within SeqSpanMax of
// the oldest unfinished one. Caller holds mu.
func (p *Producer) spanOKLocked() bool {
	for p.oldest < p.nextSeq {
		if _, ok := p.unfinished[p.oldest]; ok {
			break
		}
		p.oldest++
	}
	return p.producerID == 0 || p.nextSeq-p.oldest < SeqSpanMax
}

// waitSpan waits until spanOKLocked holds. It must not be called with
// sendMu held: the retry loop takes sendMu to resend the oldest message.
func (p *Producer) waitSpan(ctx context.Context) error {
	for {
		p.mu.Lock()
		ok := p.spanOKLocked()
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-p.spanWake:
		case <-ctx.Done():
			return fmt.Errorf("nereus: publish: waiting for sequence %d, more than %d ahead of one still being retried: %w",
				p.nextSeq, SeqSpanMax, ctx.Err())
		case <-p.closed:
			return ErrClosed
		}
	}
}

// target pins req to its partition once the topic's partition count is
// known (until then the broker applies the same rule to PartitionAuto) and
// returns the connection to that partition's leader; see Client.leaderConn.
// Only the goroutine that owns req (handOver, then the retry loop) calls it.
func (p *Producer) target(ctx context.Context, req *pubRequest, dial bool) (*conn, error) {
	if req.pub.Partition == wire.PartitionAuto {
		if n := p.client.partitionCount(p.topic); n > 0 {
			req.pub.Partition = int32(p.partitionFor(&req.pub, n))
		}
	}
	return p.client.leaderConn(ctx, p.topic, req.pub.Partition, dial)
}

// partitionFor is the broker's rule for PartitionAuto. It must match the
// broker's exactly: a retry of one producer sequence has to reach the
// partition whose dedup table knows it.
func (p *Producer) partitionFor(pub *wire.Pub, n uint32) uint32 {
	switch {
	case len(pub.Key) > 0:
		return wire.PartitionForKey(pub.Key, n)
	case pub.ProducerID != 0:
		return wire.PartitionForProducer(pub.ProducerID, pub.ProducerSeq, n)
	}
	return p.rr.Add(1) % n
}

// send makes one attempt of req on cn (nil = no live connection to its
// leader: the retry loop dials it at once), starting at now. Caller holds
// sendMu, not mu.
func (p *Producer) send(req *pubRequest, cn *conn, now time.Time) {
	p.mu.Lock()
	attempt := p.beginAttemptLocked(req, cn, now)
	p.mu.Unlock()
	if attempt > 0 {
		p.request(req, cn, attempt)
	}
}

// beginAttemptLocked records a new attempt of req on cn and returns its
// number, or 0 when there is none to make: req is finished, or has no
// connection (it is then queued for the retry loop). Caller holds mu.
func (p *Producer) beginAttemptLocked(req *pubRequest, cn *conn, now time.Time) int {
	if req.finished {
		return 0
	}
	if cn == nil {
		p.insertRetryLocked(req)
		p.kick()
		return 0
	}
	req.attempts++
	req.conn, req.sentAt = cn, now
	p.inflight[req.seq] = req
	check := now.Add(p.client.opts.RequestTimeout)
	if req.deadline.Before(check) {
		check = req.deadline
	}
	if p.loopWakeAt.IsZero() || p.loopWakeAt.After(check) {
		p.loopWakeAt = check
		p.kick()
	}
	return req.attempts
}

// request sends attempt number attempt of req on cn. Caller holds sendMu,
// not mu.
func (p *Producer) request(req *pubRequest, cn *conn, attempt int) {
	if p.sentOn.Load() != cn {
		p.sentOn.Store(cn)
	}
	// A deadline on the enqueue only: the bounded writer queue could be
	// full of a dying connection's frames.
	if _, err := cn.requestWithin(p.client.opts.RequestTimeout, &req.pub, func(f wire.Frame, err error) { p.onReply(req, attempt, f, err) }); err != nil {
		// request failed before the frame was queued: it never left.
		p.requeue(req, attempt, err, false)
	}
}

// flush writes out what the latest send queued, unless a writer is at it.
func (p *Producer) flush() {
	if cn := p.sentOn.Load(); cn != nil {
		cn.flush()
	}
}

// onReply handles the outcome of attempt number attempt of req. It runs on
// a connection's reader goroutine.
func (p *Producer) onReply(req *pubRequest, attempt int, f wire.Frame, err error) {
	if err == nil {
		ok, isOK := f.(*wire.PubOK)
		if !isOK {
			err = unexpected("PUB", f)
		} else {
			// A PUB_OK from any attempt is genuine: the record is durable.
			p.mu.Lock()
			p.finishLocked(req, PublishResult{
				Partition: int(ok.Partition), Seq: ok.Seq, Epoch: ok.Epoch,
				Duplicate: ok.Duplicate, ProducerSeq: req.seq,
			}, nil)
			p.mu.Unlock()
			return
		}
	}
	p.requeue(req, attempt, err, true)
}

// finishLocked completes req once. Caller holds mu.
func (p *Producer) finishLocked(req *pubRequest, res PublishResult, err error) {
	if req.finished {
		return
	}
	req.finished = true
	if p.inflight[req.seq] == req {
		delete(p.inflight, req.seq)
	}
	delete(p.unfinished, req.seq)
	select {
	case p.spanWake <- struct{}{}:
	default:
	}
	// Capacity MaxInFlight and at most MaxInFlight requests exist: no block.
	p.completions <- completion{req: req, res: res, err: err}
}

// abandon stops retrying req on behalf of a Publish whose ctx ended and
// returns the error to report.
func (p *Producer) abandon(req *pubRequest, cause error) error {
	p.mu.Lock()
	req.abandoned = cause
	err := p.expiredError(req)
	p.mu.Unlock()
	p.kick()
	return err
}

func (p *Producer) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// callbackLoop runs the callbacks in completion order, freeing each
// window slot at once; the completions of a burst are counted under one
// lock.
func (p *Producer) callbackLoop() {
	defer close(p.callbacksOK)
	callback := func(c completion) {
		c.req.done(c.res, c.err)
		<-p.window
	}
	for c := range p.completions {
		callback(c)
		n := 1
	burst:
		for n < cap(p.completions) {
			select {
			case c, ok := <-p.completions:
				if !ok {
					break burst
				}
				callback(c)
				n++
			default:
				break burst
			}
		}
		p.mu.Lock()
		p.outstanding -= n
		if p.outstanding == 0 {
			for _, w := range p.idleWaiters {
				close(w)
			}
			p.idleWaiters = nil
		}
		p.mu.Unlock()
	}
}

// failAll completes every request still queued or in flight with err.
func (p *Producer) failAll(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failAllLocked(err)
}

func (p *Producer) failAllLocked(err error) {
	for _, req := range p.inflight {
		p.finishLocked(req, PublishResult{}, fmt.Errorf("nereus: publish seq %d: %w", req.seq, err))
	}
	for _, req := range p.retry {
		p.finishLocked(req, PublishResult{}, fmt.Errorf("nereus: publish seq %d: %w", req.seq, err))
	}
	p.retry = nil
}

// Flush waits until every message handed over so far has completed (its
// callback has returned), or ctx ends.
func (p *Producer) Flush(ctx context.Context) error {
	p.mu.Lock()
	if p.outstanding == 0 {
		p.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	p.idleWaiters = append(p.idleWaiters, w)
	p.mu.Unlock()
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("nereus: flush: %w", ctx.Err())
	}
}

// Close stops the producer. Messages not yet acknowledged complete with
// ErrClosed (call Flush first to wait for them). Close waits for the
// remaining callbacks to run. It must not be called from a callback.
func (p *Producer) Close() error {
	p.mu.Lock()
	if p.isClosed {
		p.mu.Unlock()
		<-p.callbacksOK
		return nil
	}
	p.isClosed = true
	p.mu.Unlock()
	close(p.closed)
	<-p.loopDone
	p.sendMu.Lock() // no send in progress past this point
	p.mu.Lock()
	p.failAllLocked(ErrClosed)
	close(p.completions)
	p.mu.Unlock()
	p.sendMu.Unlock()
	<-p.callbacksOK
	return nil
}

// randomProducerID draws a producer identity (never 0: 0 means not
// idempotent) from crypto/rand.
func randomProducerID() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("nereus: producer id: %w", err)
		}
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id, nil
		}
	}
}
