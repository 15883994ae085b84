package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// rawPeer is the broker end of a conn under test: it answers HELLO, then
// reads nothing until the test reads from r.
type rawPeer struct {
	nc net.Conn
	r  *bufio.Reader
}

// dialRawPeer returns a conn to an in-test peer that has only answered its
// HELLO, and that peer.
func dialRawPeer(t *testing.T) (*conn, *rawPeer) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	peers := make(chan *rawPeer, 1)
	go func() {
		nc, err := lis.Accept()
		if err != nil {
			peers <- nil
			return
		}
		p := &rawPeer{nc: nc, r: bufio.NewReader(nc)}
		corr, _, err := wire.ReadFrame(p.r, wire.DefaultFrameBytesMax)
		if err == nil {
			_, err = nc.Write(wire.AppendFrame(nil, corr, &wire.HelloOK{Version: wire.VersionMax, NodeID: "n1", FrameBytesMax: wire.DefaultFrameBytesMax}))
		}
		if err != nil {
			nc.Close()
			peers <- nil
			return
		}
		peers <- p
	}()
	opts, err := Options{Servers: []string{lis.Addr().String()}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialConn(context.Background(), lis.Addr().String(), &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	p := <-peers
	if p == nil {
		t.Fatal("the peer failed the handshake")
	}
	t.Cleanup(func() { p.nc.Close() })
	if c.inline == nil {
		t.Fatal("a plain TCP conn has no inline writer")
	}
	return c, p
}

// readPubs reads the PUBs of len(corrs) publishes from p, as PUB frames
// or records of PUB_BATCH frames: each must have the next correlation id
// of corrs, that id as its producer seq, and value. It returns how many
// frames carried them.
func (p *rawPeer) readPubs(t *testing.T, corrs []uint64, value []byte) int {
	t.Helper()
	p.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	frames := 0
	for i := 0; i < len(corrs); frames++ {
		corr, f, err := wire.ReadFrame(p.r, wire.DefaultFrameBytesMax)
		if err != nil {
			t.Fatalf("publish %d of %d: %v", i+1, len(corrs), err)
		}
		var recs []wire.PubRecord
		switch f := f.(type) {
		case *wire.Pub:
			recs = []wire.PubRecord{{Corr: corr, ProducerSeq: f.ProducerSeq, Value: f.Value}}
		case *wire.PubBatch:
			recs = f.Records
		default:
			t.Fatalf("publish %d of %d arrived in a %s", i+1, len(corrs), f.Type())
		}
		for _, r := range recs {
			if i == len(corrs) || r.Corr != corrs[i] || r.ProducerSeq != corrs[i] || !bytes.Equal(r.Value, value) {
				t.Fatalf("publish %d of %d arrived as corr %d, want %v", i+1, len(corrs), r.Corr, corrs[min(i, len(corrs)-1)])
			}
			i++
		}
	}
	return frames
}

// span returns from, from+1, ..., to.
func span(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestInlineWriteLeavesWhatTheSocketRefusesAheadOfLaterFrames(t *testing.T) {
	c, peer := dialRawPeer(t)
	// A small send buffer and a peer not yet reading: an inline write
	// cannot take a 64 KiB burst.
	c.nc.(*net.TCPConn).SetWriteBuffer(4 << 10)
	value := bytes.Repeat([]byte("v"), 1024)
	pub := func(i uint64) *wire.Pub {
		return &wire.Pub{Topic: "t", Partition: 0, ProducerID: 1, ProducerSeq: i, Value: value}
	}
	// Frames 1..199 queued without waking the writer goroutine (as if it
	// had not been scheduled yet); frame 200 takes the buffer past 64 KiB,
	// so its sender writes all of it inline.
	const frames, hooked = 200, 1000
	c.outMu.Lock()
	for i := uint64(1); i < frames; i++ {
		c.outBuf = wire.AppendFrame(c.outBuf, i, pub(i))
	}
	c.outMu.Unlock()
	// A frame queued during the inline write goes after every byte of the
	// burst, whatever part of it the socket refuses.
	inline := false
	testHookInlineWrite = func(c *conn) {
		if !inline {
			inline = true
			if err := c.send(context.Background(), hooked, pub(hooked)); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { testHookInlineWrite = nil }()
	if err := c.send(context.Background(), frames, pub(frames)); err != nil {
		t.Fatal(err)
	}
	testHookInlineWrite = nil
	if !inline {
		t.Fatal("no inline write: 200 KiB queued without the sender writing")
	}
	c.outMu.Lock()
	left := len(c.outBuf) > 0 || c.writing
	c.outMu.Unlock()
	if !left {
		t.Fatal("the socket took every frame without a reader: the partial write is not exercised")
	}
	peer.readPubs(t, append(span(1, frames), hooked), value)
}

func TestFlushWritesQueuedFramesOnTheCallersGoroutine(t *testing.T) {
	c, peer := dialRawPeer(t)
	value := []byte("v")
	// Hold the writer goroutine off: with a kick pending it would write.
	c.outMu.Lock()
	c.outBuf = wire.AppendFrame(c.outBuf, 1, &wire.Pub{Topic: "t", ProducerID: 1, ProducerSeq: 1, Value: value})
	c.outMu.Unlock()
	c.flush()
	c.outMu.Lock()
	left := len(c.outBuf)
	c.outMu.Unlock()
	if left != 0 {
		t.Fatalf("flush left %d bytes queued", left)
	}
	peer.readPubs(t, []uint64{1}, value)
}

func TestSendWaitsForRoomThenTimesOut(t *testing.T) {
	c, peer := dialRawPeer(t)
	value := bytes.Repeat([]byte("v"), 16<<10)
	pub := &wire.Pub{Topic: "t", ProducerID: 1, Value: value}
	// Nobody reads: past the socket buffers and outQueueBytesMax a send
	// must wait for room and give up at its bound, not queue forever.
	limit := uint64(outQueueBytesMax/len(value) + 2048)
	var i uint64
	var err error
	for i = 1; i <= limit; i++ {
		pub.ProducerSeq = i + 1 // its corr: 1 was the HELLO
		if _, err = c.requestWithin(20*time.Millisecond, pub, func(wire.Frame, error) {}); err != nil {
			break
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after %d sends of 16 KiB without a reader: %v", i-1, err)
	}
	if c.isDead() {
		t.Fatal("a send that found no room failed the connection")
	}
	// Once the peer reads, everything queued arrives, in order (corr 1
	// was the HELLO).
	peer.readPubs(t, span(2, i), value)
}

// TestQueuedPubsTravelInOneBatch: PUBs of one producer queued while
// nobody writes leave in one PUB_BATCH; another frame queued between
// them, another partition, or a broker of protocol version 1 splits them.
func TestQueuedPubsTravelInOneBatch(t *testing.T) {
	c, peer := dialRawPeer(t)
	value := []byte("v")
	pub := func(i uint64, partition int32) *wire.Pub {
		return &wire.Pub{Topic: "t", Partition: partition, ProducerID: 1, ProducerSeq: i, Value: value}
	}
	c.outMu.Lock() // the writer goroutine cannot take outBuf meanwhile
	for i := uint64(1); i <= 5; i++ {
		if err := c.appendLocked(i, pub(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	c.outMu.Unlock()
	c.flush()
	if frames := peer.readPubs(t, span(1, 5), value); frames != 1 {
		t.Fatalf("5 queued PUBs left in %d frames", frames)
	}

	c.outMu.Lock()
	for _, step := range []struct {
		corr      uint64
		f         wire.Frame
		partition int32
	}{{6, nil, 0}, {7, nil, 0}, {8, &wire.Ping{}, 0}, {9, nil, 0}, {10, nil, 1}} {
		f := step.f
		if f == nil {
			f = pub(step.corr, step.partition)
		}
		if err := c.appendLocked(step.corr, f); err != nil {
			t.Fatal(err)
		}
	}
	c.outMu.Unlock()
	c.flush()
	if frames := peer.readPubs(t, []uint64{6, 7}, value); frames != 1 {
		t.Fatalf("PUBs 6 and 7 left in %d frames", frames)
	}
	if corr, f, err := wire.ReadFrame(peer.r, wire.DefaultFrameBytesMax); err != nil || corr != 8 || f.Type() != wire.TypePing {
		t.Fatalf("after the first batch: %v %v %v, want the PING", corr, f, err)
	}
	if frames := peer.readPubs(t, []uint64{9, 10}, value); frames != 2 {
		t.Fatalf("PUBs to two partitions left in %d frames", frames)
	}

	c.pubBatches = false // as after a HELLO_OK of version 1
	c.outMu.Lock()
	for i := uint64(11); i <= 12; i++ {
		if err := c.appendLocked(i, pub(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	c.outMu.Unlock()
	c.flush()
	if frames := peer.readPubs(t, span(11, 12), value); frames != 2 {
		t.Fatalf("to a version 1 broker 2 PUBs left in %d frames", frames)
	}
}

// TestPubOverTheFrameLimitIsRefusedAlone: a PUB whose batch would exceed
// the broker's frame limit on its own is refused, and nothing of it is
// left queued: the next PUB travels whole.
func TestPubOverTheFrameLimitIsRefusedAlone(t *testing.T) {
	c, peer := dialRawPeer(t)
	c.frameBytesMax = 4 << 10
	big := &wire.Pub{Topic: "t", ProducerID: 1, ProducerSeq: 1, Value: make([]byte, 4<<10)}
	if err := c.send(context.Background(), 1, big); !errors.Is(err, wire.ErrFrameTooLarge) {
		t.Fatalf("a PUB over the frame limit: %v", err)
	}
	// One exactly at the limit, as the PUB it travels as, is taken.
	exact := &wire.Pub{Topic: "t", ProducerID: 1, ProducerSeq: 3}
	exact.Value = make([]byte, c.frameBytesMax-(len(wire.AppendFrame(nil, 3, exact))-4))
	if n := len(wire.AppendFrame(nil, 3, exact)) - 4; n != c.frameBytesMax {
		t.Fatalf("setup: the PUB is %d bytes, not the limit %d", n, c.frameBytesMax)
	}
	if err := c.send(context.Background(), 3, exact); err != nil {
		t.Fatalf("a PUB at the frame limit: %v", err)
	}
	small := []byte("v")
	if err := c.send(context.Background(), 2, &wire.Pub{Topic: "t", ProducerID: 1, ProducerSeq: 2, Value: small}); err != nil {
		t.Fatal(err)
	}
	c.flush()
	if _, f, err := wire.ReadFrame(peer.r, wire.DefaultFrameBytesMax); err != nil || f.(*wire.Pub).ProducerSeq != 3 {
		t.Fatalf("the PUB at the limit arrived as %#v (%v)", f, err)
	}
	peer.readPubs(t, []uint64{2}, small)
}
