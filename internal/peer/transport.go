// Package peer is the node-to-node transport: authenticated TCP
// connections between the members of a cluster that carry replication
// frames (wire.Replicate) and forwarded requests (wire.PeerDeclare). Each node dials every other node once and sends
// on that connection; it receives on the connections the others dialed.
// Sends never block: a peer that is down or slow loses messages beyond a
// bounded queue, which the replication protocol tolerates (it retries).
package peer

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Version of the peer protocol: nodes of different versions do not
// connect. 2: PEER_PUBLISH carries the topic incarnation it is bound to.
const Version = 2

// Config configures a Transport.
type Config struct {
	ID     uint32
	Listen string // address peers dial (host:port)
	// Listener, when set, is used instead of listening on Listen (tests
	// create listeners first to learn their ports).
	Listener net.Listener
	Peers    map[uint32]string // every other member's peer address
	Secret   []byte            // the cluster secret; never sent over the wire
	// ClientAddr is this node's client address, told to every peer in the
	// handshake so that nodes can point clients at a leader.
	ClientAddr string
	// Handler receives every frame (Replicate, PeerDeclare, PeerDeclareOK,
	// PeerPublish, PeerPublishOK) from an authenticated peer. It runs on that connection's reader
	// goroutine and must not block long. from is the authenticated sender:
	// the shell must not trust ids inside the frame.
	Handler func(from uint32, f wire.Frame)
	Logger  *slog.Logger
	// QueueMax bounds the frames queued per peer (default 4096).
	QueueMax int
	// DialTimeout bounds one dial plus handshake (default 2 s).
	DialTimeout time.Duration
	// FrameBytesMax bounds every frame (default wire.DefaultFrameBytesMax).
	FrameBytesMax int
	// WriteTimeout bounds each write to a peer (default 10 s): a peer that
	// takes nothing for that long (stopped, its buffers full) loses the
	// connection, and what was queued for it.
	WriteTimeout time.Duration
}

// ErrAuth is returned when a peer fails the handshake.
var ErrAuth = errors.New("peer: authentication failed")

// Transport connects one node to its peers. Safe for concurrent use.
type Transport struct {
	cfg Config
	lis net.Listener

	mu          sync.Mutex
	outs        map[uint32]*outbound
	inbound     map[net.Conn]struct{}
	clientAddrs map[uint32]string // learned from authenticated handshakes
	closed      bool
	wg          sync.WaitGroup
	done        chan struct{}
}

// outbound is the queue and dialing loop toward one peer.
type outbound struct {
	to      uint32
	addr    string
	queue   chan outFrame // frames to write, in order
	dropped uint64        // frames lost to a full queue (under Transport.mu)
	redial  chan struct{} // capacity 1: the peer just dialed us, so it is up: stop backing off
	// up is set while a connection is established, lost once one was lost.
	// Frames for a peer whose connection was lost are dropped, not queued,
	// until it is back: replication resends what matters, and a burst of
	// stale frames on reconnect would only flood the peer. (Before the
	// first connection frames queue, so a starting cluster loses nothing.)
	up, lost atomic.Bool
	// mu makes Send's check-and-enqueue atomic with the dial loop marking
	// the connection lost and draining the queue; without it a frame that
	// passed the check could land after the drain and reach the restarted
	// peer.
	mu sync.Mutex
}

// Listen validates cfg and starts accepting peer connections and dialing
// every peer.
func Listen(cfg Config) (*Transport, error) {
	if cfg.ID == 0 || len(cfg.Secret) < 16 || cfg.Handler == nil {
		return nil, errors.New("peer: need a non-zero ID, a secret of at least 16 bytes and a handler")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.QueueMax == 0 {
		cfg.QueueMax = 4096
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	if cfg.FrameBytesMax == 0 {
		cfg.FrameBytesMax = wire.DefaultFrameBytesMax
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	lis := cfg.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", cfg.Listen); err != nil {
			return nil, fmt.Errorf("peer: listen %s: %w", cfg.Listen, err)
		}
	}
	t := &Transport{cfg: cfg, lis: lis, outs: map[uint32]*outbound{}, inbound: map[net.Conn]struct{}{},
		clientAddrs: map[uint32]string{}, done: make(chan struct{})}
	for id, addr := range cfg.Peers {
		if id == cfg.ID {
			continue
		}
		o := &outbound{to: id, addr: addr, queue: make(chan outFrame, cfg.QueueMax), redial: make(chan struct{}, 1)}
		t.outs[id] = o
		t.wg.Add(1)
		go t.dialLoop(o)
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// Addr is the address the transport listens on.
func (t *Transport) Addr() string { return t.lis.Addr().String() }

// ClientAddr is the client address peer id announced when it last
// connected ("" = not heard from yet).
func (t *Transport) ClientAddr(id uint32) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.clientAddrs[id]
}

// Send queues f for peer to; it never blocks. It reports false when the
// frame was dropped (unknown peer, closed transport or full queue).
func (t *Transport) Send(to uint32, f wire.Frame) bool {
	o := t.outs[to]
	if o == nil {
		return false
	}
	frame := newOutFrame(f)
	o.mu.Lock()
	queued := false
	if !o.lost.Load() || o.up.Load() {
		select {
		case <-t.done:
			o.mu.Unlock()
			frame.release()
			return false
		case o.queue <- frame:
			queued = true
		default:
		}
	}
	o.mu.Unlock()
	if !queued {
		frame.release()
		t.mu.Lock()
		o.dropped++
		t.mu.Unlock()
	}
	return queued
}

// Dropped reports how many frames to peer were lost to a full queue.
func (t *Transport) Dropped(to uint32) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o := t.outs[to]; o != nil {
		return o.dropped
	}
	return 0
}

// Close stops everything and waits for the goroutines.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.done)
	err := t.lis.Close()
	for c := range t.inbound {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}

const (
	backoffMin = 50 * time.Millisecond
	backoffMax = 2 * time.Second
)

// dialLoop keeps one authenticated connection to a peer and writes its
// queue to it, reconnecting with bounded exponential backoff.
func (t *Transport) dialLoop(o *outbound) {
	defer t.wg.Done()
	backoff := backoffMin
	for {
		conn, err := t.dial(o)
		if err != nil {
			t.cfg.Logger.Debug("peer dial failed", "peer", o.to, "addr", o.addr, "err", err)
			select {
			case <-t.done:
				return
			case <-time.After(backoff):
				backoff = min(backoff*2, backoffMax)
			case <-o.redial:
				// A restarted peer must hear from us at once, or it times out
				// and campaigns, disturbing a healthy group.
				backoff = backoffMin
			}
			continue
		}
		backoff = backoffMin
		t.cfg.Logger.Info("peer connected", "peer", o.to, "addr", o.addr)
		o.up.Store(true)
		err = t.writeLoop(conn, o)
		o.mu.Lock()
		o.lost.Store(true)
		o.up.Store(false)
		for len(o.queue) > 0 { // what was queued for the lost connection is stale
			(<-o.queue).release()
		}
		o.mu.Unlock()
		conn.Close()
		if err == nil {
			return // closed
		}
		t.cfg.Logger.Info("peer connection lost", "peer", o.to, "err", err)
	}
}

// writeLoop writes the queue to conn: each time, the frames queued by
// then (at most writeBatchFramesMax, about writeBatchBytesMax) in one
// vectored write, from their own buffers — no copy into a write buffer.
func (t *Transport) writeLoop(conn net.Conn, o *outbound) error {
	var (
		batch   []outFrame
		pieces  net.Buffers
		scratch []byte // AppendFramePieces', for frames encoded here
	)
	for {
		var frame outFrame
		select {
		case <-t.done:
			return nil
		case frame = <-o.queue:
		}
		bytes := 0
		for {
			batch = append(batch, frame)
			n := len(pieces)
			pieces, scratch = frame.appendPieces(pieces, scratch)
			for _, p := range pieces[n:] {
				bytes += len(p)
			}
			if len(batch) == writeBatchFramesMax || bytes >= writeBatchBytesMax {
				break
			}
			select {
			case frame = <-o.queue:
				continue
			default:
			}
			break
		}
		// The deadline covers this batch's write, not one left over from a
		// batch long past (an idle link: it fails at once) nor none (the
		// first batch: a stopped peer would block it for good).
		conn.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
		unwritten := pieces // WriteTo consumes what it is called on
		_, err := unwritten.WriteTo(conn)
		for i := range batch {
			batch[i].release()
		}
		clear(batch) // keep no frame alive through the spare arrays
		clear(pieces)
		batch, pieces = batch[:0], pieces[:0]
		if cap(scratch) > writeScratchBytesMax {
			scratch = nil
		}
		scratch = scratch[:0]
		if err != nil {
			return err
		}
	}
}

// Bounds of one write of the write loop, and of the scratch buffer it
// keeps.
const (
	writeBatchFramesMax  = 256
	writeBatchBytesMax   = 4 << 20
	writeScratchBytesMax = 1 << 20
)

// proof is HMAC-SHA256 over a role label, both ids and nonces and the
// dialer's client address, so a proof can neither be replayed nor
// reflected back to its sender, and the address is authenticated too.
func (t *Transport) proof(role string, dialer, acceptor uint32, dialerClientAddr string, dialerNonce, acceptorNonce []byte) []byte {
	mac := hmac.New(sha256.New, t.cfg.Secret)
	fmt.Fprintf(mac, "nereus-peer-v%d|%s|%d|%d|%q|", Version, role, dialer, acceptor, dialerClientAddr)
	mac.Write(dialerNonce)
	mac.Write([]byte{'|'})
	mac.Write(acceptorNonce)
	return mac.Sum(nil)
}

func nonce() []byte {
	b := make([]byte, wire.PeerNonceBytes)
	rand.Read(b)
	return b
}

// dial connects and runs the dialer's half of the handshake: HELLO, check
// the acceptor's proof, send ours.
func (t *Transport) dial(o *outbound) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", o.addr)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
	mine := nonce()
	if _, err := conn.Write(wire.AppendFrame(nil, 0, &wire.PeerHello{Version: Version, From: t.cfg.ID, To: o.to, Nonce: mine, ClientAddr: t.cfg.ClientAddr})); err != nil {
		conn.Close()
		return nil, err
	}
	_, f, err := wire.ReadFrame(conn, 4<<10)
	if err != nil {
		conn.Close()
		return nil, err
	}
	ch, ok := f.(*wire.PeerChallenge)
	if !ok || len(ch.Nonce) != wire.PeerNonceBytes ||
		!hmac.Equal(ch.Proof, t.proof("accept", t.cfg.ID, o.to, t.cfg.ClientAddr, mine, ch.Nonce)) {
		conn.Close()
		return nil, fmt.Errorf("%w: peer %d at %s did not prove the cluster secret", ErrAuth, o.to, o.addr)
	}
	if _, err := conn.Write(wire.AppendFrame(nil, 0, &wire.PeerAuth{Proof: t.proof("dial", t.cfg.ID, o.to, t.cfg.ClientAddr, mine, ch.Nonce)})); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		conn, err := t.lis.Accept()
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			t.cfg.Logger.Error("peer accept failed", "err", err)
			return
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			conn.Close()
			return
		}
		t.inbound[conn] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serveInbound(conn)
	}
}

// serveInbound authenticates a dialing peer and hands its frames to the
// handler. Any protocol error closes the connection.
func (t *Transport) serveInbound(conn net.Conn) {
	defer t.wg.Done()
	defer func() {
		conn.Close()
		t.mu.Lock()
		delete(t.inbound, conn)
		t.mu.Unlock()
	}()
	conn.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
	r := bufio.NewReaderSize(conn, 64<<10)
	_, f, err := wire.ReadFrame(r, 4<<10)
	if err != nil {
		return
	}
	hello, ok := f.(*wire.PeerHello)
	if !ok || hello.Version != Version || hello.To != t.cfg.ID || len(hello.Nonce) != wire.PeerNonceBytes {
		return
	}
	if _, known := t.cfg.Peers[hello.From]; !known || hello.From == t.cfg.ID {
		t.cfg.Logger.Warn("peer hello from an unknown member", "from", hello.From, "remote", conn.RemoteAddr())
		return
	}
	mine := nonce()
	if _, err := conn.Write(wire.AppendFrame(nil, 0, &wire.PeerChallenge{Nonce: mine,
		Proof: t.proof("accept", hello.From, t.cfg.ID, hello.ClientAddr, hello.Nonce, mine)})); err != nil {
		return
	}
	_, f, err = wire.ReadFrame(r, 4<<10)
	if err != nil {
		return
	}
	auth, ok := f.(*wire.PeerAuth)
	if !ok || !hmac.Equal(auth.Proof, t.proof("dial", hello.From, t.cfg.ID, hello.ClientAddr, hello.Nonce, mine)) {
		t.cfg.Logger.Warn("peer failed authentication", "from", hello.From, "remote", conn.RemoteAddr())
		return
	}
	conn.SetDeadline(time.Time{})
	t.mu.Lock()
	t.clientAddrs[hello.From] = hello.ClientAddr
	t.mu.Unlock()
	if o := t.outs[hello.From]; o != nil {
		select {
		case o.redial <- struct{}{}:
		default:
		}
	}
	for {
		_, f, err := wire.ReadFrame(r, t.cfg.FrameBytesMax)
		if err != nil {
			return
		}
		switch f.(type) {
		case *wire.Replicate, *wire.PeerDeclare, *wire.PeerDeclareOK, *wire.PeerPublish, *wire.PeerPublishOK:
			t.cfg.Handler(hello.From, f)
		default:
			t.cfg.Logger.Warn("unexpected frame from peer", "from", hello.From, "type", f.Type())
			return
		}
	}
}

// outFrame is a frame queued for a peer: encoded (in a pooled buffer,
// getFrameBuffer) when Send is called, or — a REPLICATE with an entry of
// at least wire.DirectEntryBytesMin — kept as the frame and encoded by
// the write loop as pieces (wire.AppendFramePieces), its large entries
// written from their own slices, so that they are not first copied into
// a frame buffer per follower (at 64 KiB records that copy was a fifth of
// an r3 leader's CPU; small entries gain nothing from it: they are
// copied into the pieces anyway). That is safe
// because a REPLICATE's entry
// data is never written again once handed to Send: it is a proposal's own
// encoding, an entry read back from the log, or a received frame's bytes
// (replog); a frame whose byte fields alias a buffer its caller reuses (a
// forwarded PUB aliases the client session's read buffer) is encoded at
// Send.
type outFrame struct {
	encoded   []byte
	replicate *wire.Replicate
}

func newOutFrame(f wire.Frame) outFrame {
	if r, ok := f.(*wire.Replicate); ok {
		for i := range r.Entries {
			if len(r.Entries[i].Data) >= wire.DirectEntryBytesMin {
				return outFrame{replicate: r}
			}
		}
	}
	return outFrame{encoded: wire.AppendFrame(getFrameBuffer(wire.FrameBytes(f)), 0, f)}
}

// appendPieces appends the frame's bytes to pieces (see
// wire.AppendFramePieces; an encoded frame is one piece).
func (f outFrame) appendPieces(pieces net.Buffers, scratch []byte) (net.Buffers, []byte) {
	if f.replicate != nil {
		return wire.AppendFramePieces(pieces, scratch, 0, f.replicate)
	}
	return append(pieces, f.encoded), scratch
}

// release gives the frame's buffer back; nothing may use f afterwards.
func (f outFrame) release() {
	if f.encoded != nil {
		putFrameBuffer(f.encoded)
	}
}
