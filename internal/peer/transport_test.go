package peer

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

type received struct {
	mu   sync.Mutex
	msgs []string // "from:topic:epoch"
	ch   chan struct{}
}

func (r *received) handler(from uint32, f wire.Frame) {
	r.mu.Lock()
	switch m := f.(type) {
	case *wire.Replicate:
		r.msgs = append(r.msgs, itoa(from)+":"+m.Topic+":"+itoa(uint32(m.Epoch)))
	case *wire.PeerDeclare:
		r.msgs = append(r.msgs, itoa(from)+":declare:"+m.Topic.Name)
	default:
		r.msgs = append(r.msgs, itoa(from)+":"+f.Type().String())
	}
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

func (r *received) waitFor(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		if len(r.msgs) >= n {
			out := append([]string(nil), r.msgs...)
			r.mu.Unlock()
			return out
		}
		r.mu.Unlock()
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("received %d messages, want %d", len(r.msgs), n)
		}
	}
}

func itoa(v uint32) string {
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v /= 10 {
		b = append([]byte{byte('0' + v%10)}, b...)
	}
	return string(b)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// cluster starts n transports on loopback that all know each other.
func cluster(t testing.TB, n int, secrets ...string) ([]*Transport, []*received) {
	t.Helper()
	return clusterTuned(t, n, nil, secrets...)
}

// clusterTuned is cluster with tune (nil: none) applied to every Config.
func clusterTuned(t testing.TB, n int, tune func(*Config), secrets ...string) ([]*Transport, []*received) {
	t.Helper()
	listeners := map[uint32]net.Listener{}
	addrs := map[uint32]string{}
	for id := uint32(1); id <= uint32(n); id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[id], addrs[id] = l, l.Addr().String()
	}
	var ts []*Transport
	var rs []*received
	for id := uint32(1); id <= uint32(n); id++ {
		secret := "a-cluster-secret-of-some-length"
		if int(id) <= len(secrets) {
			secret = secrets[id-1]
		}
		r := &received{ch: make(chan struct{}, 1)}
		cfg := Config{ID: id, Listener: listeners[id], Peers: addrs, Secret: []byte(secret), Handler: r.handler, Logger: quiet,
			ClientAddr: "127.0.0.1:48" + itoa(50+id)}
		if tune != nil {
			tune(&cfg)
		}
		tr, err := Listen(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		ts, rs = append(ts, tr), append(rs, r)
	}
	return ts, rs
}

func TestPeersExchangeFramesInOrder(t *testing.T) {
	ts, rs := cluster(t, 3)
	for e := uint64(1); e <= 50; e++ {
		for !ts[0].Send(2, &wire.Replicate{Topic: "t", Epoch: e}) {
			t.Fatal("send dropped with an empty queue")
		}
	}
	ts[2].Send(2, &wire.Replicate{Topic: "u", Epoch: 7})
	got := rs[1].waitFor(t, 51)
	var fromOne []string
	for _, m := range got {
		if m[:2] == "1:" {
			fromOne = append(fromOne, m)
		}
	}
	for i, m := range fromOne {
		if m != "1:t:"+itoa(uint32(i+1)) {
			t.Fatalf("frame %d from node 1 is %q: order or sender wrong", i, m)
		}
	}
	if len(rs[0].msgs) != 0 {
		t.Fatalf("node 1 received %v", rs[0].msgs)
	}
	// The handshake told node 2 where the dialers serve clients.
	if a := ts[1].ClientAddr(1); a != "127.0.0.1:4851" {
		t.Fatalf("node 2 learned client address %q for node 1", a)
	}
}

func TestForwardedDeclaresTravel(t *testing.T) {
	ts, rs := cluster(t, 2)
	ts[1].Send(1, &wire.PeerDeclare{ReqID: 1, Topic: wire.TopicConfig{Name: "orders", Partitions: 1}})
	if got := rs[0].waitFor(t, 1); got[0] != "2:declare:orders" {
		t.Fatalf("node 1 got %v", got)
	}
}

func TestWrongSecretIsRefused(t *testing.T) {
	ts, rs := cluster(t, 2, "the-right-secret-for-the-cluster", "a-wrong-secret-for-the-cluster!!")
	for i := 0; i < 20; i++ {
		ts[0].Send(2, &wire.Replicate{Topic: "t"})
		ts[1].Send(1, &wire.Replicate{Topic: "t"})
	}
	// Give the dialers time to try (and fail) repeatedly; nothing may arrive.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		for i, r := range rs {
			r.mu.Lock()
			n := len(r.msgs)
			r.mu.Unlock()
			if n != 0 {
				t.Fatalf("node %d accepted %d frames from a peer with another secret", i+1, n)
			}
		}
		<-time.After(20 * time.Millisecond)
	}
}

func TestReconnectsAfterPeerRestart(t *testing.T) {
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr2 := l2.Addr().String()
	l1, _ := net.Listen("tcp", "127.0.0.1:0")
	peers := map[uint32]string{1: l1.Addr().String(), 2: addr2}
	secret := []byte("a-cluster-secret-of-some-length")
	r1, r2 := &received{ch: make(chan struct{}, 1)}, &received{ch: make(chan struct{}, 1)}
	t1, err := Listen(Config{ID: 1, Listener: l1, Peers: peers, Secret: secret, Handler: r1.handler, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Close()
	t2, err := Listen(Config{ID: 2, Listener: l2, Peers: peers, Secret: secret, Handler: r2.handler, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t1.Send(2, &wire.Replicate{Topic: "before", Epoch: 1})
	r2.waitFor(t, 1)
	t2.Close()
	// Frames for a peer that went away are not kept for its return: stale
	// heartbeats would only flood it.
	for i := 0; i < 20; i++ {
		t1.Send(2, &wire.Replicate{Topic: "stale", Epoch: 1})
	}
	// Node 2 comes back on the same address; node 1's dialer reconnects.
	l2b, err := net.Listen("tcp", addr2)
	if err != nil {
		t.Skipf("cannot rebind %s: %v", addr2, err)
	}
	r2b := &received{ch: make(chan struct{}, 1)}
	t2b, err := Listen(Config{ID: 2, Listener: l2b, Peers: peers, Secret: secret, Handler: r2b.handler, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer t2b.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		t1.Send(2, &wire.Replicate{Topic: "after", Epoch: 2})
		r2b.mu.Lock()
		n := len(r2b.msgs)
		r2b.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no frame after the peer restarted")
		}
		<-time.After(50 * time.Millisecond)
	}
	r2b.mu.Lock()
	defer r2b.mu.Unlock()
	for _, m := range r2b.msgs {
		if strings.Contains(m, "stale") {
			t.Fatalf("a frame queued while the peer was down arrived after it came back: %v", r2b.msgs)
		}
	}
}

func TestSendNeverBlocksAndCountsDrops(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	// Peer 2's address accepts nothing useful: a listener nobody serves.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	defer dead.Close()
	tr, err := Listen(Config{ID: 1, Listener: l, Peers: map[uint32]string{1: l.Addr().String(), 2: dead.Addr().String()},
		Secret: []byte("a-cluster-secret-of-some-length"), Handler: func(uint32, wire.Frame) {}, Logger: quiet, QueueMax: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	sent := 0
	for i := 0; i < 100; i++ {
		if tr.Send(2, &wire.Replicate{Topic: "t"}) {
			sent++
		}
	}
	if sent > 8+1 || tr.Dropped(2) < 100-9 {
		t.Fatalf("queue bound 8: %d queued, %d dropped", sent, tr.Dropped(2))
	}
	if tr.Send(9, &wire.Replicate{}) {
		t.Fatal("send to an unknown peer succeeded")
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := Listen(Config{ID: 1, Secret: []byte("short"), Handler: func(uint32, wire.Frame) {}}); err == nil {
		t.Fatal("short secret accepted")
	}
}

// A link that idled past the write timeout still carries a frame larger
// than the write buffer: that frame goes to the socket inside Write, which
// must run under a fresh deadline, not the expired one of the last batch
// (the write failed at once, the connection was dropped, the frame lost).
func TestLargeFrameAfterAnIdleLinkArrives(t *testing.T) {
	const writeTimeout = 50 * time.Millisecond
	ts, rs := clusterTuned(t, 2, func(c *Config) { c.WriteTimeout = writeTimeout })
	ts[0].Send(2, &wire.Replicate{Topic: "small", Epoch: 1})
	rs[1].waitFor(t, 1)
	time.Sleep(3 * writeTimeout) // the link idles: the scenario is time passing
	big := &wire.Replicate{Topic: "big", Epoch: 2, Entries: []wire.ReplicaEntry{{Seq: 1, Epoch: 2, Data: make([]byte, 128<<10)}}}
	if !ts[0].Send(2, big) {
		t.Fatal("send dropped on an idle link")
	}
	if got := rs[1].waitFor(t, 2); got[1] != "1:big:2" {
		t.Fatalf("received %v", got)
	}
}

// TestFramesArriveIntactWhateverTheirEntries: frames the write loop
// writes from their entries' own slices (a REPLICATE with an entry of at
// least wire.DirectEntryBytesMin), frames encoded at Send (small entries,
// none, another type) and a mix of both, sent back to back so that they
// share vectored writes, arrive in order and byte for byte as sent.
func TestFramesArriveIntactWhateverTheirEntries(t *testing.T) {
	var mu sync.Mutex
	var got []wire.Frame
	gotOne := make(chan struct{}, 1)
	ts, _ := clusterTuned(t, 2, func(c *Config) {
		c.Handler = func(_ uint32, f wire.Frame) {
			mu.Lock()
			got = append(got, f)
			mu.Unlock()
			select {
			case gotOne <- struct{}{}:
			default:
			}
		}
	})
	data := func(n, seed int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(seed + i*31)
		}
		return b
	}
	var sent []wire.Frame
	for i := 0; i < 40; i++ {
		f := &wire.Replicate{Topic: "t", Epoch: uint64(i), To: 2}
		switch i % 4 {
		case 0: // large entries only
			f.Entries = []wire.ReplicaEntry{{Seq: 1, Data: data(wire.DirectEntryBytesMin, i)}, {Seq: 2, Data: data(70<<10, i+1)}}
		case 1: // small entries only
			f.Entries = []wire.ReplicaEntry{{Seq: 1, Data: data(1024, i)}, {Seq: 2, Data: data(10, i+1)}}
		case 2: // mixed, with an empty one
			f.Entries = []wire.ReplicaEntry{{Seq: 1, Data: data(100, i)}, {Seq: 2, Data: data(40<<10, i+1)}, {Seq: 3}, {Seq: 4, Data: data(5, i)}}
		}
		sent = append(sent, f)
		if i%10 == 9 {
			sent = append(sent, &wire.PeerDeclare{ReqID: uint64(i), Topic: wire.TopicConfig{Name: "d"}})
		}
	}
	for _, f := range sent {
		if !ts[0].Send(2, f) {
			t.Fatal("send dropped")
		}
	}
	deadline := time.After(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= len(sent) {
			break
		}
		select {
		case <-gotOne:
		case <-deadline:
			t.Fatalf("received %d of %d frames", n, len(sent))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range sent {
		want, have := wire.AppendFrame(nil, 0, sent[i]), wire.AppendFrame(nil, 0, got[i])
		if !bytes.Equal(want, have) {
			t.Fatalf("frame %d (%s) arrived different from what was sent", i, sent[i].Type())
		}
	}
}
