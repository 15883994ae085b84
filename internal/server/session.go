package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

type subKey struct{ topic, group string }

// session is one client connection. The reader goroutine (serve) decodes
// and routes requests; replies and deliveries from any goroutine are encoded
// straight into the pending buffer, which the writer goroutine writes out in
// one syscall per batch.
type session struct {
	srv  *Server
	conn net.Conn
	r    *bufio.Reader

	subs map[subKey]*node.Subscription // owned by serve

	outMu      sync.Mutex
	outCond    *sync.Cond
	pending    []byte // encoded frames not yet written
	closing    bool   // write what is pending, then close
	writerDone chan struct{}
}

func newSession(s *Server, conn net.Conn) *session {
	ss := &session{srv: s, conn: conn, r: bufio.NewReaderSize(conn, 64<<10),
		subs: map[subKey]*node.Subscription{}, writerDone: make(chan struct{})}
	ss.outCond = sync.NewCond(&ss.outMu)
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
	ss.outCond.Signal()
}

// sendErr queues an ERR frame.
func (ss *session) sendErr(corr uint64, err error) {
	var we *wire.Error
	if !errors.As(err, &we) {
		we = wire.Errorf(wire.CodeStorage, "%v", err)
	}
	ss.send(corr, &wire.Err{Code: we.Code, Message: we.Message})
}

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
		for len(ss.pending) == 0 && !ss.closing {
			ss.outCond.Wait()
		}
		if len(ss.pending) == 0 {
			ss.outMu.Unlock()
			ss.conn.Close()
			return
		}
		buf := ss.pending
		ss.pending = spare[:0]
		ss.outMu.Unlock()
		ss.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := ss.conn.Write(buf); err != nil {
			ss.outMu.Lock()
			ss.closing = true
			ss.pending = nil
			ss.outMu.Unlock()
			ss.conn.Close()
			return
		}
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
		for _, sub := range ss.subs {
			sub.Close()
		}
		ss.closeAfterFlush()
		<-ss.writerDone
	}()
	if !ss.handshake() {
		return
	}
	for {
		corr, f, err := wire.ReadFrame(ss.r, ss.srv.cfg.FrameBytesMax)
		if err != nil {
			var we *wire.Error
			if errors.As(err, &we) {
				ss.srv.log.Warn("bad frame; closing connection", "remote", ss.conn.RemoteAddr(), "err", err)
				ss.sendErr(corr, we)
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				ss.srv.log.Debug("connection read failed", "remote", ss.conn.RemoteAddr(), "err", err)
			}
			return
		}
		if !ss.dispatch(corr, f) {
			return
		}
	}
}

// handshake requires HELLO first, negotiates the version and checks the
// token. A bad token is answered with a generic AUTH_FAILED after a fixed
// delay counted from when HELLO arrived, then the connection closes.
func (ss *session) handshake() bool {
	cfg := &ss.srv.cfg
	ss.conn.SetReadDeadline(time.Now().Add(cfg.HandshakeTimeout))
	corr, f, err := wire.ReadFrame(ss.r, min(cfg.FrameBytesMax, 64<<10))
	received := time.Now()
	if err != nil {
		var we *wire.Error
		if errors.As(err, &we) {
			ss.sendErr(corr, we)
		}
		return false
	}
	ss.conn.SetReadDeadline(time.Time{})
	hello, ok := f.(*wire.Hello)
	if !ok {
		ss.sendErr(corr, wire.Errorf(wire.CodeNotAuthenticated, "first frame must be HELLO, got %s", f.Type()))
		return false
	}
	if !ss.srv.authenticate(hello.Token) {
		ss.srv.node.Metrics().AuthFailures.Inc()
		ss.srv.log.Warn("authentication failed", "remote", ss.conn.RemoteAddr())
		time.Sleep(time.Until(received.Add(cfg.AuthFailDelay)))
		ss.sendErr(corr, wire.ErrAuthFailed)
		return false
	}
	if hello.VersionMax < wire.VersionMin || hello.VersionMin > wire.VersionMax || hello.VersionMin > hello.VersionMax {
		ss.sendErr(corr, wire.Errorf(wire.CodeUnsupportedVer, "server speaks %d-%d, client %d-%d",
			wire.VersionMin, wire.VersionMax, hello.VersionMin, hello.VersionMax))
		return false
	}
	ss.send(corr, &wire.HelloOK{Version: min(hello.VersionMax, wire.VersionMax), NodeID: ss.srv.node.NodeID(),
		FrameBytesMax: uint32(cfg.FrameBytesMax)})
	return true
}

// sessionSink delivers a subscription's MSG frames with its correlation id.
type sessionSink struct {
	ss   *session
	corr uint64
}

func (k sessionSink) SendMsg(m *wire.Msg) { k.ss.send(k.corr, m) }

// dispatch routes one request; it returns false when the connection must
// close.
func (ss *session) dispatch(corr uint64, f wire.Frame) bool {
	n := ss.srv.node
	switch f := f.(type) {
	case *wire.Declare:
		created, err := n.Declare(f.Topic)
		if err != nil {
			ss.sendErr(corr, err)
			return true
		}
		ss.send(corr, &wire.DeclareOK{Topic: f.Topic, Created: created})
	case *wire.Metadata:
		ss.send(corr, &wire.MetadataOK{Topics: n.Metadata(f.Topics)})
	case *wire.Pub:
		if err := wire.ValidateName("topic", f.Topic); err != nil {
			ss.sendErr(corr, err)
			return true
		}
		n.Publish(f, func(ok wire.PubOK, err *wire.Error) {
			if err != nil {
				ss.sendErr(corr, err)
				return
			}
			ss.send(corr, &ok)
		})
	case *wire.Pull:
		ss.pull(corr, f)
	case *wire.Ack:
		n.Ack(f.Topic, f.Group, f.Entries, ss.ackReply(corr))
	case *wire.Nack:
		n.Nack(f.Topic, f.Group, f.Entries, int64(f.DelayMs), ss.ackReply(corr))
	case *wire.Ping:
		ss.send(corr, &wire.Pong{})
	case *wire.Hello:
		ss.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "HELLO after the handshake"))
		return false
	default:
		ss.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "%s is not a request", f.Type()))
		return false
	}
	return true
}

func (ss *session) ackReply(corr uint64) node.AckReply {
	return func(results []wire.Code, err *wire.Error) {
		if err != nil {
			ss.sendErr(corr, err)
			return
		}
		ss.send(corr, &wire.AckOK{Results: results})
	}
}

func (ss *session) pull(corr uint64, f *wire.Pull) {
	if err := wire.ValidateName("topic", f.Topic); err != nil {
		ss.sendErr(corr, err)
		return
	}
	key := subKey{topic: f.Topic, group: f.Group}
	sub, ok := ss.subs[key]
	if !ok {
		var err error
		sub, err = ss.srv.node.Subscribe(f.Topic, f.Group,
			node.GroupOptions{AckWaitMs: int64(f.AckWaitMs), MaxDeliver: f.MaxDeliver},
			sessionSink{ss: ss, corr: corr})
		if err != nil {
			ss.sendErr(corr, err)
			return
		}
		ss.subs[key] = sub
	}
	if f.Credit > 0 {
		sub.AddCredit(f.Credit)
	}
}
