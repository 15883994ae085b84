package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/budget"
	"github.com/nereus-broker/nereus/internal/sockwrite"
	"github.com/nereus-broker/nereus/internal/wire"
)

// session is one client connection. The reader goroutine (serve) decodes
// and routes requests; replies and deliveries from any goroutine are encoded
// straight into the pending buffer, which the writer goroutine writes out in
// one syscall per batch. A burst of PUB_OKs is corked instead (node.Corker)
// and written by the goroutine that sent it, when it uncorks and the writer
// is idle: on a 2-vCPU VM waking the writer costs an ack tens of µs.
type session struct {
	srv  *Server
	conn net.Conn
	r    *bufio.Reader

	proto *Protocol // owned by serve

	outMu   sync.Mutex
	outCond *sync.Cond
	pending []byte // encoded frames not yet written
	closing bool   // write what is pending, then close
	writing bool   // the writer or an uncorking goroutine is writing to conn
	corks   int    // Cork calls not yet uncorked: send only queues
	spare   []byte // a written buffer, for pending to reuse after an inline write
	// inline writes without blocking; nil unless conn is plain TCP.
	inline     *sockwrite.Writer
	writerDone chan struct{}
	// unanswered bounds the read buffers of frames not yet done with —
	// a publish's until it is answered (Config.UnansweredBytesMax), within
	// the server's bound of all sessions' (UnansweredBytesTotalMax).
	unanswered *budget.Bytes
	// stopped closes when the server closes: a reader waiting for
	// unanswered room stops waiting.
	stopped  chan struct{}
	stopOnce sync.Once
}

func newSession(s *Server, conn net.Conn) *session {
	ss := &session{srv: s, conn: conn, r: bufio.NewReaderSize(conn, 64<<10), writerDone: make(chan struct{}),
		unanswered: budget.NewBytesWithin(s.cfg.UnansweredBytesMax, s.unanswered), stopped: make(chan struct{})}
	ss.outCond = sync.NewCond(&ss.outMu)
	ss.proto = s.NewProtocol(ss.send, conn.RemoteAddr().String())
	ss.proto.corker = ss
	ss.inline = sockwrite.New(conn)
	return ss
}

// send queues one frame. A client that lets its queue grow past the bound
// is disconnected: memory stays bounded and nothing acked is lost.
func (ss *session) send(corr uint64, f wire.Frame) {
	ss.outMu.Lock()
	defer ss.outMu.Unlock()
	if ss.closing {
		return
	}
	ss.pending = wire.AppendFrame(ss.pending, corr, f)
	if len(ss.pending) > ss.srv.cfg.OutboundBytesMax {
		ss.srv.log.Warn("client not reading; closing connection", "remote", ss.conn.RemoteAddr(), "queued_bytes", len(ss.pending))
		ss.pending = nil
		ss.closing = true
		ss.conn.Close()
	}
	if ss.corks == 0 {
		ss.outCond.Signal()
	}
}

// Cork holds what send queues until the matching Uncork.
func (ss *session) Cork() {
	ss.outMu.Lock()
	ss.corks++
	ss.outMu.Unlock()
}

// Uncork ends a Cork. The last one writes what is pending: on this
// goroutine when nobody is writing (one non-blocking write; the writer
// takes what the socket does not), else through the writer.
func (ss *session) Uncork() {
	ss.outMu.Lock()
	defer ss.outMu.Unlock()
	ss.corks--
	if ss.corks > 0 || len(ss.pending) == 0 {
		return
	}
	if ss.inline != nil && !ss.writing && !ss.closing {
		ss.writeInlineLocked()
	}
	if len(ss.pending) > 0 || ss.closing {
		ss.outCond.Signal()
	}
}

// writeInlineLocked writes pending with one non-blocking write and keeps
// what the socket did not take at the head of pending. Caller holds outMu,
// which is released during the write; writing keeps the writer out.
func (ss *session) writeInlineLocked() {
	buf := ss.pending
	ss.pending, ss.spare = ss.spare[:0], nil
	ss.writing = true
	ss.outMu.Unlock()
	if testHookInlineWrite != nil {
		testHookInlineWrite()
	}
	n, err := ss.inline.Write(buf)
	ss.outMu.Lock()
	ss.writing = false
	switch {
	case err != nil:
		ss.closing = true
		ss.pending = nil
		ss.conn.Close()
	case n < len(buf):
		ss.pending = append(buf[n:len(buf):len(buf)], ss.pending...) // the unsent bytes go first
	default:
		ss.spare = buf[:0]
	}
}

// testHookInlineWrite, when set by a test, runs in writeInlineLocked
// while outMu is released, before the write.
var testHookInlineWrite func()

// closeAfterFlush writes what is queued, then closes the connection.
func (ss *session) closeAfterFlush() {
	ss.outMu.Lock()
	ss.closing = true
	ss.outCond.Signal()
	ss.outMu.Unlock()
}

func (ss *session) writer() {
	defer close(ss.writerDone)
	var spare []byte
	for {
		ss.outMu.Lock()
		for ss.writing || (len(ss.pending) == 0 || ss.corks > 0) && !ss.closing {
			ss.outCond.Wait()
		}
		if len(ss.pending) == 0 {
			ss.outMu.Unlock()
			ss.conn.Close()
			return
		}
		buf := ss.pending
		ss.pending = spare[:0]
		ss.writing = true
		ss.outMu.Unlock()
		ss.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err := ss.conn.Write(buf)
		ss.outMu.Lock()
		ss.writing = false
		if err != nil {
			ss.closing = true
			ss.pending = nil
			ss.outMu.Unlock()
			ss.conn.Close()
			return
		}
		ss.outMu.Unlock()
		if cap(buf) <= 4<<20 {
			spare = buf
		} else {
			spare = nil
		}
	}
}

func (ss *session) serve() {
	go ss.writer()
	defer func() {
		ss.proto.Close()
		ss.closeAfterFlush()
		<-ss.writerDone
	}()
	if !ss.handshake() {
		return
	}
	for {
		buf := readBufs.Get().(*readBuf)
		corr, f, used, err := wire.ReadFrameInto(ss.r, ss.srv.cfg.FrameBytesMax, buf.b)
		if used != nil {
			buf.b = used
		}
		if err != nil {
			releaseReadBuf(buf)
			if !ss.proto.ReadFailed(corr, err) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				ss.srv.log.Debug("connection read failed", "remote", ss.conn.RemoteAddr(), "err", err)
			}
			return
		}
		// A publish keeps its frame's buffer until it is answered. Past the
		// session's bound, or the server's for all sessions, the reader
		// waits for answers, and reads nothing meanwhile: the client's
		// writes back up (TCP's backpressure), not our memory.
		held := int64(cap(buf.b))
		if !ss.unanswered.Acquire(held, ss.stopped) {
			releaseReadBuf(buf)
			return
		}
		buf.charged, buf.budget = held, ss.unanswered
		if !ss.proto.handle(corr, f, buf) {
			return
		}
	}
}

// readBuf is a buffer a frame was read into, and what it is charged to.
type readBuf struct {
	b       []byte
	budget  *budget.Bytes // the session's unanswered bytes; nil: none
	charged int64
}

// readBufs recycles the buffers frames are read into, so that a publish
// allocates none: Protocol.handle releases each one when its frame is done.
var readBufs = sync.Pool{New: func() any { return &readBuf{b: make([]byte, 0, 4<<10)} }}

// readBufKeepMax bounds the buffers kept in readBufs.
const readBufKeepMax = 128 << 10

// releaseReadBuf gives buf's bytes back to its session and buf (nil:
// none) to readBufs.
func releaseReadBuf(buf *readBuf) {
	if buf == nil {
		return
	}
	if buf.budget != nil {
		buf.budget.Release(buf.charged)
		buf.budget, buf.charged = nil, 0
	}
	if cap(buf.b) <= readBufKeepMax {
		readBufs.Put(buf)
	}
}

// stop ends a wait for unanswered room (the server is closing).
func (ss *session) stop() { ss.stopOnce.Do(func() { close(ss.stopped) }) }

// handshake reads HELLO under a deadline and carries out the protocol's
// verdict, including its fixed delay before AUTH_FAILED.
func (ss *session) handshake() bool {
	cfg := &ss.srv.cfg
	ss.conn.SetReadDeadline(time.Now().Add(cfg.HandshakeTimeout))
	corr, f, err := wire.ReadFrame(ss.r, min(cfg.FrameBytesMax, 64<<10))
	if err != nil {
		ss.proto.ReadFailed(corr, err)
		return false
	}
	ss.conn.SetReadDeadline(time.Time{})
	v := ss.proto.Hello(corr, f)
	time.Sleep(v.Delay)
	ss.send(corr, v.Reply)
	return v.Accepted
}
