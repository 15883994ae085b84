package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/sockwrite"
	"github.com/nereus-broker/nereus/internal/wire"
)

// replyHandler receives a reply frame, or the request's error (an ERR frame
// as *wire.Error, or a disconnection). It runs on the connection's reader
// goroutine and must not block.
type replyHandler func(f wire.Frame, err error)

// conn is one authenticated connection. It is safe for concurrent use.
// Lifecycle: reader and writer goroutines start after HELLO; the first of
// them to fail calls fail, which closes the socket; the reader then fails
// every pending request and closes done. done closed means no handler of
// this conn will run again.
type conn struct {
	nc            net.Conn
	addr          string
	nodeID        string
	frameBytesMax int           // outgoing bound, from HELLO_OK
	done          chan struct{} // closed by the reader on exit
	closing       chan struct{} // closed by fail
	failOnce      sync.Once

	// Outgoing frames are encoded straight into outBuf, in order. Whoever
	// finds nobody writing may write it out: the writer goroutine (kicked
	// when outBuf stops being empty), or, on plain TCP, a sender with one
	// non-blocking write once outBuf holds inlineWriteBytes, or before it
	// waits for a reply or a window slot (flush). On a 2-vCPU VM the writer
	// goroutine, woken by a sender that goes on running, often starts only
	// when that sender blocks, hundreds of µs later: a publisher's burst
	// then reached the broker all at once, after the last message.
	outMu   sync.Mutex
	outBuf  []byte            // encoded frames not yet written
	spare   []byte            // a written buffer for outBuf to reuse
	writing bool              // a goroutine is writing to nc; only one may
	drained chan struct{}     // closed when outBuf is next taken (senders waiting for room)
	kick    chan struct{}     // capacity 1: wakes the writer goroutine
	inline  *sockwrite.Writer // nil unless plain TCP: no inline writes; guarded by writing
	// batch is the PUB_BATCH open at the end of outBuf (protocol v2):
	// PUBs queued one after another for the same topic, partition and
	// producer join it as records, until another frame is queued, a
	// writer takes outBuf or it holds pubBatchBytesMax (each seals it).
	batch      wire.PubBatchWriter
	pubBatches bool // the broker speaks PUB_BATCH (HELLO_OK's version)
	// groupIncarnations: the broker knows GROUP_INCARNATION and
	// GROUP_DELETE_INCARNATION (HELLO_OK's version).
	groupIncarnations bool
	// topicUpdates: the broker knows TOPIC_UPDATE (protocol version 4).
	topicUpdates bool
	// groupUpdates: the broker knows GROUP_UPDATE (protocol version 5).
	groupUpdates bool

	mu       sync.Mutex
	err      error                   // why the conn failed; set once by fail
	dead     bool                    // no more registrations accepted
	nextCorr uint64                  // last correlation id used
	pending  map[uint64]replyHandler // one-shot: removed at the first reply
	streams  map[uint64]replyHandler // persistent: subscriptions (MSG frames)
	subs     map[subKey]*connSub     // server-side subscriptions of this conn

	// lastRead is when the latest frame arrived (monotonic, since
	// monoBase; the reader stores it): a request that waited out a
	// RequestTimeout checks whether the broker said anything meanwhile
	// (giveUpIfSilent).
	lastRead atomic.Int64
}

// subKey names a (topic, group) subscription.
type subKey struct{ topic, group string }

// connSub is the server-side subscription of one (topic, group) on one
// connection. The broker routes its MSG frames with the correlation id of the
// first PULL, so the id outlives any one Consumer. Its owner is the lane of
// the Consumer that uses it. Fields are guarded by conn.mu.
type connSub struct {
	corr     uint64
	owner    *lane // nil when no consumer is attached
	leftover int   // credit granted by a detached consumer, not yet used
}

// dialConn connects to addr, performs HELLO and starts the goroutines.
func dialConn(ctx context.Context, addr string, opts *Options) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	var nc net.Conn
	var err error
	d := &net.Dialer{}
	if opts.TLSConfig != nil {
		cfg := opts.TLSConfig.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		td := &tls.Dialer{NetDialer: d, Config: cfg}
		nc, err = td.DialContext(ctx, "tcp", addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", ErrDisconnected, addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	hello := wire.AppendFrame(nil, 1, &wire.Hello{
		VersionMin: wire.VersionMin, VersionMax: wire.VersionMax,
		Token: opts.Token, ClientName: opts.ClientName,
	})
	br := bufio.NewReaderSize(nc, ioBufferBytes)
	if _, err := nc.Write(hello); err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: hello to %s: %w", ErrDisconnected, addr, err)
	}
	_, f, err := wire.ReadFrame(br, opts.FrameBytesMax)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%w: hello reply from %s: %w", ErrDisconnected, addr, err)
	}
	var ok *wire.HelloOK
	switch f := f.(type) {
	case *wire.HelloOK:
		ok = f
	case *wire.Err:
		nc.Close()
		return nil, fmt.Errorf("nereus: hello to %s: %w", addr, f.AsError())
	default:
		nc.Close()
		return nil, fmt.Errorf("%w: hello to %s: unexpected %s", ErrDisconnected, addr, f.Type())
	}
	if !stop() {
		nc.Close()
		return nil, fmt.Errorf("%w: hello to %s: %w", ErrDisconnected, addr, ctx.Err())
	}
	_ = nc.SetDeadline(time.Time{})
	frameMax := int(ok.FrameBytesMax)
	if frameMax <= 0 {
		frameMax = wire.DefaultFrameBytesMax
	}
	c := &conn{
		nc:            nc,
		addr:          addr,
		nodeID:        ok.NodeID,
		frameBytesMax: frameMax,
		kick:          make(chan struct{}, 1),
		done:          make(chan struct{}),
		closing:       make(chan struct{}),
		nextCorr:      1, // 1 was the HELLO
		pending:       make(map[uint64]replyHandler),
		streams:       make(map[uint64]replyHandler),
		subs:          make(map[subKey]*connSub),
		pubBatches:    ok.Version >= wire.VersionPubBatch,

		groupIncarnations: ok.Version >= wire.VersionGroupIncarnation,
		topicUpdates:      ok.Version >= wire.VersionTopicUpdate,
		groupUpdates:      ok.Version >= wire.VersionGroupUpdate,
	}
	c.inline = sockwrite.New(nc)
	go c.readLoop(br, opts.FrameBytesMax)
	go c.writeLoop()
	return c, nil
}

// node names the connection's node: its id, or its address when it
// named none.
func (c *conn) node() string {
	if c.nodeID != "" {
		return c.nodeID
	}
	return c.addr
}

// isDead reports whether the connection has failed.
func (c *conn) isDead() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// monoBase is the origin of conn.lastRead: durations since it use the
// monotonic clock.
var monoBase = time.Now()

// giveUpIfSilent fails the connection when not one frame has arrived on it
// for quiet, the RequestTimeout a request has just waited out for its
// reply. A broker that answers nothing at all for that long is stopped or
// cut off, though its socket may stay open: a SIGSTOPped process's kernel
// still accepts connections and buffers what is sent, and writes to it
// block once the buffers fill. Kept, such a connection would draw every
// retry and every metadata refresh back to the silent node; failed, its
// requests are retried where the refreshed metadata points. It reports
// whether it failed the connection.
func (c *conn) giveUpIfSilent(quiet time.Duration) bool {
	if since := time.Since(monoBase) - time.Duration(c.lastRead.Load()); since < quiet {
		return false
	}
	c.fail(fmt.Errorf("%w: %s answered nothing for %v", ErrDisconnected, c.addr, quiet))
	return true
}

// fail marks the connection failed with cause and closes the socket; the
// reader then fails pending requests. Safe to call many times.
func (c *conn) fail(cause error) {
	c.failOnce.Do(func() {
		c.mu.Lock()
		if !errors.Is(cause, ErrDisconnected) && !errors.Is(cause, ErrClosed) {
			cause = fmt.Errorf("%w: %s: %w", ErrDisconnected, c.addr, cause)
		}
		c.err = cause
		c.mu.Unlock()
		close(c.closing)
		_ = c.nc.Close()
	})
}

func (c *conn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return fmt.Errorf("%w: %s", ErrDisconnected, c.addr)
	}
	return c.err
}

func (c *conn) readLoop(br *bufio.Reader, frameBytesMax int) {
	var buf []byte // reused by the next read unless the frame aliases it
	for {
		corr, f, used, err := wire.ReadFrameInto(br, frameBytesMax, buf)
		if err != nil {
			c.fail(err)
			break
		}
		c.lastRead.Store(int64(time.Since(monoBase)))
		buf = nil
		switch f.(type) {
		case *wire.PubOK, *wire.AckOK, *wire.PubBatchOK: // no byte fields: nothing aliases used
			if cap(used) <= readBufKeepMax {
				buf = used
			}
		}
		if b, ok := f.(*wire.PubBatchOK); ok {
			// Each record's answer, as its PUB's would have come; the
			// batch's PUB_OKs share one allocation.
			oks := make([]wire.PubOK, len(b.Results))
			for i := range b.Results {
				c.dispatch(b.Results[i].Corr, b.Results[i].ResultIn(&oks[i]))
			}
			continue
		}
		c.dispatch(corr, f)
	}
	c.mu.Lock()
	c.dead = true
	handlers := make([]replyHandler, 0, len(c.pending)+len(c.streams))
	for _, h := range c.pending {
		handlers = append(handlers, h)
	}
	for _, h := range c.streams {
		handlers = append(handlers, h)
	}
	c.pending, c.streams = nil, nil
	err := c.err
	c.mu.Unlock()
	for _, h := range handlers {
		h(nil, err)
	}
	close(c.done)
}

func (c *conn) dispatch(corr uint64, f wire.Frame) {
	c.mu.Lock()
	h, ok := c.pending[corr]
	if ok {
		delete(c.pending, corr)
	} else {
		h, ok = c.streams[corr]
	}
	c.mu.Unlock()
	if !ok {
		return // a reply to an abandoned request
	}
	if e, isErr := f.(*wire.Err); isErr {
		h(nil, e.AsError())
		return
	}
	h(f, nil)
}

// writeLoop writes outBuf whenever it is kicked and nobody else is
// writing: one blocking write per batch of frames.
func (c *conn) writeLoop() {
	for {
		select {
		case <-c.kick:
		case <-c.closing:
			return
		}
		for {
			c.outMu.Lock()
			if c.writing || len(c.outBuf) == 0 {
				// An inline writer kicks again if it leaves bytes behind.
				c.outMu.Unlock()
				break
			}
			buf := c.takeLocked()
			c.outMu.Unlock()
			_, err := c.nc.Write(buf)
			c.wroteLocking(buf)
			if err != nil {
				c.fail(err)
				return
			}
		}
	}
}

// takeLocked hands outBuf to a writer, which must call wroteLocking after.
// Caller holds outMu.
func (c *conn) takeLocked() []byte {
	buf := c.batch.Seal(c.outBuf)
	c.outBuf, c.spare = c.spare[:0], nil
	c.writing = true
	if c.drained != nil {
		close(c.drained)
		c.drained = nil
	}
	return buf
}

// wroteLocking ends a write of buf begun with takeLocked.
func (c *conn) wroteLocking(buf []byte) {
	c.outMu.Lock()
	c.writing = false
	if cap(buf) <= outBufKeepMax {
		c.spare = buf[:0]
	}
	c.outMu.Unlock()
}

// outBufKeepMax and readBufKeepMax bound the buffers kept for reuse.
const (
	outBufKeepMax  = 1 << 20
	readBufKeepMax = 128 << 10
)

// writeInlineLocked writes outBuf with one non-blocking write on the
// calling goroutine, puts what the socket did not take back at the head of
// outBuf and kicks the writer for it. Caller holds outMu, released during
// the write, and has checked that inline is set and nobody is writing.
func (c *conn) writeInlineLocked() {
	buf := c.takeLocked()
	c.outMu.Unlock()
	if testHookInlineWrite != nil {
		testHookInlineWrite(c)
	}
	n, err := c.inline.Write(buf)
	c.outMu.Lock()
	c.writing = false
	switch {
	case err != nil:
		c.outMu.Unlock()
		c.fail(err)
		c.outMu.Lock()
		return
	case n < len(buf):
		// The unsent bytes go first; a batch opened meanwhile is sealed
		// where it is, as they move it.
		c.outBuf = append(buf[n:len(buf):len(buf)], c.batch.Seal(c.outBuf)...)
	default:
		if cap(buf) <= outBufKeepMax {
			c.spare = buf[:0]
		}
	}
	if len(c.outBuf) > 0 {
		c.wakeWriter()
	}
}

// testHookInlineWrite, when set by a test, runs in writeInlineLocked
// while outMu is released, before the write.
var testHookInlineWrite func(*conn)

func (c *conn) wakeWriter() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// flush writes what is queued on this goroutine, if nobody is writing (else
// that writer takes it). Senders call it before they wait for replies.
func (c *conn) flush() {
	c.outMu.Lock()
	if c.inline != nil && !c.writing && len(c.outBuf) > 0 {
		c.writeInlineLocked()
	}
	c.outMu.Unlock()
}

// inlineWriteBytes is how much a sender lets queue before it writes it out
// itself (plain TCP, nobody writing): a burst reaches the broker as it is
// made, not after its last frame.
const inlineWriteBytes = 64 << 10

// enqueue encodes f with correlation id corr at the end of outBuf. While
// outBuf holds outQueueBytesMax or more it first waits for the writer to
// take it, up to timeout or ctx (nil: no context).
func (c *conn) enqueue(ctx context.Context, timeout time.Duration, corr uint64, f wire.Frame) error {
	c.outMu.Lock()
	for len(c.outBuf) >= outQueueBytesMax {
		if c.drained == nil {
			c.drained = make(chan struct{})
		}
		drained := c.drained
		c.outMu.Unlock()
		if err := c.waitDrained(ctx, timeout, drained); err != nil {
			return err
		}
		c.outMu.Lock()
	}
	if c.isDead() {
		c.outMu.Unlock()
		return c.failure()
	}
	start := len(c.outBuf)
	if err := c.appendLocked(corr, f); err != nil {
		c.outMu.Unlock()
		return err
	}
	switch {
	case c.writing:
		// The writer takes it when its write returns.
	case c.inline != nil && len(c.outBuf) >= inlineWriteBytes:
		c.writeInlineLocked()
	case start == 0:
		c.wakeWriter()
	}
	c.outMu.Unlock()
	return nil
}

// pubBatchBytesMax is where the SDK closes a PUB_BATCH and opens the
// next: the broker starts on a batch's records only once the whole frame
// has arrived, so a burst of large records goes in frames small enough to
// overlap its sending with the broker's work, while small records still
// share a frame by the hundred.
const pubBatchBytesMax = 16 << 10

// appendLocked encodes f at the end of outBuf: a PUB as a record of the
// open PUB_BATCH when it may join it, else of a new one (protocol v2),
// any other frame after sealing the open batch. A frame over the broker's
// limit is cut back out. Caller holds outMu.
func (c *conn) appendLocked(corr uint64, f wire.Frame) error {
	if pub, ok := f.(*wire.Pub); ok && c.pubBatches {
		if c.batch.Fits(c.outBuf, pub, wire.PubRecordBytes(pub), min(c.frameBytesMax, pubBatchBytesMax)) {
			c.outBuf = c.batch.Add(c.outBuf, corr, pub)
			return nil
		}
		c.outBuf = c.batch.Seal(c.outBuf)
		start := len(c.outBuf)
		c.outBuf = c.batch.Open(c.outBuf, corr, pub)
		// Its size alone, as the PUB it is until another joins: with its
		// checksum to come, without its length prefix.
		if n := len(c.outBuf) - start - wire.PubBatchOneExtraBytes; n > c.frameBytesMax {
			c.batch.Abandon()
			c.outBuf = c.outBuf[:start]
			return fmt.Errorf("nereus: PUB of %d bytes exceeds the broker's frame limit %d: %w", n, c.frameBytesMax, wire.ErrFrameTooLarge)
		}
		return nil
	}
	c.outBuf = c.batch.Seal(c.outBuf)
	start := len(c.outBuf)
	c.outBuf = wire.AppendFrame(c.outBuf, corr, f)
	if n := len(c.outBuf) - start - 4; n > c.frameBytesMax {
		c.outBuf = c.outBuf[:start]
		return fmt.Errorf("nereus: %s of %d bytes exceeds the broker's frame limit %d: %w",
			f.Type(), n, c.frameBytesMax, wire.ErrFrameTooLarge)
	}
	return nil
}

// waitDrained waits for drained, the connection's failure, ctx or timeout.
func (c *conn) waitDrained(ctx context.Context, timeout time.Duration, drained chan struct{}) error {
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-drained:
		return nil
	case <-c.closing:
		return c.failure()
	case <-done:
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("nereus: no room to send for %v: %w", timeout, context.DeadlineExceeded)
	}
}

// requestWithin is request with the wait for room bounded by d instead of
// a context: the hot publish path, which must not allocate a context per
// message.
func (c *conn) requestWithin(d time.Duration, f wire.Frame, h replyHandler) (uint64, error) {
	return c.requestWith(nil, d, f, h)
}

// request sends f with a fresh correlation id and registers h for its one
// reply. If it returns an error, h is never called.
func (c *conn) request(ctx context.Context, f wire.Frame, h replyHandler) (uint64, error) {
	return c.requestWith(ctx, noTimeout, f, h)
}

// noTimeout bounds waits that a context bounds instead.
const noTimeout = 24 * time.Hour

// requestWith registers h under a fresh correlation id, then encodes and
// enqueues f: one lock per request, and no reply can precede the frame.
func (c *conn) requestWith(ctx context.Context, timeout time.Duration, f wire.Frame, h replyHandler) (uint64, error) {
	corr, err := c.register(false, h)
	if err != nil {
		return 0, err
	}
	if err := c.enqueue(ctx, timeout, corr, f); err != nil {
		if c.forget(corr) {
			return 0, err
		}
		// The reader already failed it and called h: report through h only.
		return corr, nil
	}
	return corr, nil
}

// register files h under a fresh correlation id — for one reply, or for
// every frame of the stream — unless the connection is dead.
func (c *conn) register(stream bool, h replyHandler) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || c.isDead() {
		return 0, c.errLocked()
	}
	c.nextCorr++
	if stream {
		c.streams[c.nextCorr] = h
	} else {
		c.pending[c.nextCorr] = h
	}
	return c.nextCorr, nil
}

// forget drops the pending handler of corr; it reports whether it was still
// registered (so the caller now owns its completion).
func (c *conn) forget(corr uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pending[corr]; ok {
		delete(c.pending, corr)
		return true
	}
	return false
}

// roundTrip sends f and waits for its reply or ctx.
func (c *conn) roundTrip(ctx context.Context, f wire.Frame) (wire.Frame, error) {
	type result struct {
		f   wire.Frame
		err error
	}
	ch := make(chan result, 1)
	corr, err := c.request(ctx, f, func(f wire.Frame, err error) { ch <- result{f, err} })
	if err != nil {
		return nil, err
	}
	c.flush()
	select {
	case r := <-ch:
		return r.f, r.err
	case <-ctx.Done():
		c.forget(corr)
		return nil, fmt.Errorf("nereus: %s: %w", f.Type(), ctx.Err())
	}
}

// send writes f with correlation id corr and registers nothing (PULL).
func (c *conn) send(ctx context.Context, corr uint64, f wire.Frame) error {
	return c.enqueue(ctx, noTimeout, corr, f)
}

// attachSub attaches owner (a consumer's lane) to the (topic, group)
// subscription of this conn,
// creating its correlation id and stream handler on first use. It returns
// the correlation id to PULL with, whether a PULL was already sent on it
// (the subscription exists at the broker), and the credit a previously
// detached consumer left unused.
func (c *conn) attachSub(key subKey, owner *lane) (corr uint64, existed bool, leftover int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return 0, false, 0, c.errLocked()
	}
	s := c.subs[key]
	if s != nil {
		if s.owner != nil {
			return 0, false, 0, fmt.Errorf("nereus: %s/%s is already consumed on this client: %w", key.topic, key.group, wire.ErrInvalidArgument)
		}
		s.owner = owner
		leftover, s.leftover = s.leftover, 0
		return s.corr, true, leftover, nil
	}
	c.nextCorr++
	s = &connSub{corr: c.nextCorr, owner: owner}
	c.subs[key] = s
	c.streams[s.corr] = func(f wire.Frame, err error) { c.onStream(s, f, err) }
	return s.corr, false, 0, nil
}

func (c *conn) errLocked() error {
	if c.err != nil {
		return c.err
	}
	return fmt.Errorf("%w: %s", ErrDisconnected, c.addr)
}

// detachSub records credit the leaving owner had granted but not used, so
// the next consumer of the same subscription on this conn inherits it.
func (c *conn) detachSub(key subKey, owner *lane, outstanding int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.subs[key]; s != nil && s.owner == owner {
		s.owner = nil
		s.leftover += outstanding
	}
}

// dropSub forgets a subscription whose PULL failed, so the next attach
// starts over with a new correlation id.
func (c *conn) dropSub(key subKey, owner *lane) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.subs[key]; s != nil && s.owner == owner {
		delete(c.subs, key)
		delete(c.streams, s.corr)
	}
}

// onStream routes MSG and ERR frames of a subscription to its owner.
func (c *conn) onStream(s *connSub, f wire.Frame, err error) {
	c.mu.Lock()
	owner := s.owner
	c.mu.Unlock()
	if owner != nil && owner.onStream(c, f, err) {
		return
	}
	if _, ok := f.(*wire.Msg); ok {
		c.mu.Lock()
		if s.leftover > 0 {
			s.leftover--
			c.mu.Unlock()
			return // unowned delivery: redelivered after AckWait
		}
		c.mu.Unlock()
		c.fail(errCreditExceeded)
	}
}

// errCreditExceeded means the broker sent more MSG frames than credit granted.
var errCreditExceeded = errors.New("nereus: broker exceeded the granted credit")

// close shuts the connection down.
func (c *conn) close() { c.fail(ErrClosed) }

// openStream sends f with a fresh correlation id whose every reply —
// the first and the frames pushed after it (a JOIN's NOTICEs) — goes to h
// until closeStream.
func (c *conn) openStream(ctx context.Context, f wire.Frame, h replyHandler) (uint64, error) {
	corr, err := c.register(true, h)
	if err != nil {
		return 0, err
	}
	if err := c.enqueue(ctx, noTimeout, corr, f); err != nil {
		c.closeStream(corr)
		return 0, err
	}
	return corr, nil
}

// closeStream stops routing corr's frames.
func (c *conn) closeStream(corr uint64) {
	c.mu.Lock()
	delete(c.streams, corr)
	c.mu.Unlock()
}
