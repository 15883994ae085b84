package server

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// heldSyncs is a MemFS whose fsyncs of some files (newHeldSyncs: the
// topic logs) wait while held: the node answers no publish meanwhile.
type heldSyncs struct {
	*vfs.MemFS
	held    atomic.Bool
	release chan struct{}
	once    sync.Once
}

func newHeldSyncs() *heldSyncs { return newHeldSyncsOf("/topics/") }

// newHeldSyncsOf is newHeldSyncs for the files whose names contain dir.
func newHeldSyncsOf(dir string) *heldSyncs {
	h := &heldSyncs{MemFS: vfs.NewMem(), release: make(chan struct{})}
	h.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSync && h.held.Load() && strings.Contains(name, dir) {
			<-h.release
		}
		return nil
	})
	return h
}

// let lets the held fsyncs and those after them go.
func (h *heldSyncs) let() {
	h.once.Do(func() {
		h.held.Store(false)
		close(h.release)
	})
}

// unansweredOf returns the unanswered bytes of the server's one session.
func unansweredOf(t *testing.T, s *Server) int64 {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sessions) != 1 {
		t.Fatalf("%d sessions, want 1", len(s.sessions))
	}
	for ss := range s.sessions {
		return ss.unanswered.Held()
	}
	return 0
}

// Records of 200 KiB: their frames' buffers are larger than any the pool
// keeps (readBufKeepMax), so each is read into one of its own size, and
// a bound of 256 KiB holds exactly one.
const (
	heldValueBytes = 200 << 10
	heldBound      = 256 << 10
)

// fillUnanswered declares t and sends publishes that stay unanswered
// (fsyncs held), more than the bound holds, then a PING.
func fillUnanswered(t *testing.T, fs *heldSyncs, c *rawConn) (pubs int) {
	c.write(2, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	if _, f := c.read(); f.Type() != wire.TypeDeclareOK {
		t.Fatalf("declare: %#v", f)
	}
	fs.held.Store(true)
	pubs = 5
	for i := range pubs {
		c.write(uint64(10+i), &wire.Pub{Topic: "t", Partition: 0, Value: make([]byte, heldValueBytes)})
	}
	c.write(99, &wire.Ping{})
	return pubs
}

// A session reads no further than its unanswered bound: requests behind
// publishes that hold it wait until answers free room, and then all go.
func TestUnansweredPublishesStopTheReader(t *testing.T) {
	fs := newHeldSyncs()
	defer fs.let() // on failure too: the node's close needs its fsyncs
	s, addr := startServerOn(t, Config{AllowNoAuth: true, UnansweredBytesMax: heldBound}, fs)
	c := dialRaw(t, addr)
	c.hello("")
	pubs := fillUnanswered(t, fs, c)
	c.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, f, err := wire.ReadFrame(c.r, wire.DefaultFrameBytesMax); err == nil {
		t.Fatalf("answered %s while the publishes before it held the session's bound", f.Type())
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	held := unansweredOf(t, s)
	for deadline := time.Now().Add(10 * time.Second); held == 0 && time.Now().Before(deadline); held = unansweredOf(t, s) {
		time.Sleep(time.Millisecond) // a slow machine: the first frame not read yet
	}
	if held < heldValueBytes || held > heldBound {
		t.Fatalf("%d bytes unanswered, want one frame's buffer (%d to %d)", held, heldValueBytes, heldBound)
	}
	fs.let()
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	oks, pong := 0, false
	for range pubs + 1 {
		switch _, f := c.read(); f.Type() {
		case wire.TypePubOK:
			oks++
		case wire.TypePong:
			pong = true
		default:
			t.Fatalf("got %#v", f)
		}
	}
	if oks != pubs || !pong {
		t.Fatalf("%d PUB_OKs and pong %v, want %d and true", oks, pong, pubs)
	}
	if held := unansweredOf(t, s); held != 0 {
		t.Fatalf("%d bytes unanswered after every answer", held)
	}
}

// A reader waiting for unanswered room does not hold up the server's
// Close.
func TestCloseEndsAWaitForUnansweredRoom(t *testing.T) {
	fs := newHeldSyncs()
	defer fs.let() // after the server closed: the node's close needs its fsyncs
	s, addr := startServerOn(t, Config{AllowNoAuth: true, UnansweredBytesMax: heldBound}, fs)
	c := dialRaw(t, addr)
	c.hello("")
	fillUnanswered(t, fs, c)
	time.Sleep(100 * time.Millisecond) // the reader reaches the bound
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("close with a reader waiting for answers: %v", err)
	}
}

// The server bounds all sessions' unanswered frames together: another
// connection's request waits while one connection's publishes hold the
// server's bound (each connection far inside its own), and is answered
// once they are.
func TestUnansweredBoundAcrossConnections(t *testing.T) {
	fs := newHeldSyncs()
	defer fs.let()
	// One publish frame's buffer fits the server's bound; a PING's
	// pooled buffer beside it does not.
	s, addr := startServerOn(t, Config{AllowNoAuth: true, UnansweredBytesTotalMax: heldValueBytes + 1<<10}, fs)
	a := dialRaw(t, addr)
	a.hello("")
	pubs := fillUnanswered(t, fs, a)
	for deadline := time.Now().Add(10 * time.Second); s.unanswered.Held() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	b := dialRaw(t, addr)
	b.hello("")
	b.write(7, &wire.Ping{})
	b.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, f, err := wire.ReadFrame(b.r, wire.DefaultFrameBytesMax); err == nil {
		t.Fatalf("answered %s while another connection's publishes held the server's bound (%d bytes)", f.Type(), s.unanswered.Held())
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	fs.let()
	b.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if corr, f := b.read(); f.Type() != wire.TypePong || corr != 7 {
		t.Fatalf("got %#v on %d, want PONG on 7", f, corr)
	}
	a.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for range pubs + 1 {
		if _, f := a.read(); f.Type() != wire.TypePubOK && f.Type() != wire.TypePong {
			t.Fatalf("got %#v", f)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); s.unanswered.Held() != 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if held := s.unanswered.Held(); held != 0 {
		t.Fatalf("%d bytes unanswered across the server after every answer", held)
	}
}
