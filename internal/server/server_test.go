package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

func startServer(t *testing.T, cfg Config) string {
	t.Helper()
	_, addr := startServerOn(t, cfg, vfs.NewMem())
	return addr
}

// startServerOn starts a server and its node on fs; the test's cleanup
// closes both.
func startServerOn(t *testing.T, cfg Config, fs vfs.FS) (*Server, string) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Open(node.Config{DataDir: "/d", Env: env.Env{FS: fs}, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = logger
	s, err := New(cfg, n)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
		n.Close()
	})
	return s, lis.Addr().String()
}

type rawConn struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, conn: c, r: bufio.NewReader(c)}
}

func (c *rawConn) write(corr uint64, f wire.Frame) {
	c.t.Helper()
	if _, err := c.conn.Write(wire.AppendFrame(nil, corr, f)); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawConn) read() (uint64, wire.Frame) {
	c.t.Helper()
	corr, f, err := wire.ReadFrame(c.r, wire.DefaultFrameBytesMax)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return corr, f
}

// expectClosed asserts the server closed the connection (a reset counts:
// closing with unread input makes the kernel send RST).
func (c *rawConn) expectClosed() {
	c.t.Helper()
	if _, _, err := wire.ReadFrame(c.r, wire.DefaultFrameBytesMax); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		c.t.Fatalf("connection still open: %v", err)
	}
}

func (c *rawConn) hello(token string) {
	c.t.Helper()
	c.write(1, &wire.Hello{VersionMin: 1, VersionMax: 1, Token: token})
	if _, f := c.read(); f.Type() != wire.TypeHelloOK {
		c.t.Fatalf("hello answered %#v", f)
	}
}

func TestWrongTokenFailsAfterFixedDelayAndCloses(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"right"}})
	c := dialRaw(t, addr)
	start := time.Now()
	c.write(9, &wire.Hello{VersionMin: 1, VersionMax: 1, Token: "wrong"})
	corr, f := c.read()
	elapsed := time.Since(start)
	e, ok := f.(*wire.Err)
	if !ok || e.Code != wire.CodeAuthFailed || corr != 9 {
		t.Fatalf("got %#v corr %d, want ERR AUTH_FAILED", f, corr)
	}
	if elapsed < 100*time.Millisecond {
		t.Fatalf("AUTH_FAILED after %v, want at least 100ms", elapsed)
	}
	if e.Message != "" {
		t.Fatalf("AUTH_FAILED must be generic, says %q", e.Message)
	}
	c.expectClosed()
	// The right token works.
	dialRaw(t, addr).hello("right")
}

func TestFirstFrameMustBeHello(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"tok"}})
	c := dialRaw(t, addr)
	c.write(1, &wire.Metadata{})
	if _, f := c.read(); f.(*wire.Err).Code != wire.CodeNotAuthenticated {
		t.Fatalf("got %#v", f)
	}
	c.expectClosed()
}

func TestNoTokensRequiresExplicitOptOut(t *testing.T) {
	if _, err := New(Config{}, nil); !errors.Is(err, ErrNoTokens) {
		t.Fatalf("New without tokens: %v", err)
	}
}

func TestMalformedFrameGetsBadFrameAndCloses(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	c.hello("")
	b := wire.AppendFrame(nil, 5, &wire.Ping{})
	b[len(b)-1] ^= 0xff // break the checksum
	c.conn.Write(b)
	if _, f := c.read(); f.(*wire.Err).Code != wire.CodeBadFrame {
		t.Fatalf("got %#v", f)
	}
	c.expectClosed()
}

func TestOversizedFrameGetsFrameTooLargeAndCloses(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true, FrameBytesMax: wire.FrameBytesMin})
	c := dialRaw(t, addr)
	c.hello("")
	c.write(5, &wire.Pub{Topic: "t", Value: make([]byte, wire.FrameBytesMin)})
	if corr, f := c.read(); f.(*wire.Err).Code != wire.CodeFrameTooLarge || corr != 5 {
		t.Fatalf("got %#v on corr %d, want FRAME_TOO_LARGE on the request's corr 5", f, corr)
	}
	c.expectClosed()
}

func TestPublishPullAckOverTheWire(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	c.hello("")
	c.write(2, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	if _, f := c.read(); !f.(*wire.DeclareOK).Created {
		t.Fatalf("declare: %#v", f)
	}
	for i := uint64(0); i < 3; i++ {
		c.write(10+i, &wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 1, ProducerSeq: i, Value: []byte("v")})
	}
	for i := 0; i < 3; i++ {
		if _, f := c.read(); f.Type() != wire.TypePubOK {
			t.Fatalf("pub: %#v", f)
		}
	}
	c.write(20, &wire.Pull{Topic: "t", Group: "g", Credit: 2})
	var entries []wire.AckEntry
	for i := 0; i < 2; i++ {
		corr, f := c.read()
		m, ok := f.(*wire.Msg)
		if !ok || corr != 20 {
			t.Fatalf("expected MSG with corr 20, got %#v corr %d", f, corr)
		}
		entries = append(entries, wire.AckEntry{Partition: m.Partition, Seq: m.Seq, DeliveryID: m.DeliveryID})
	}
	entries = append(entries, wire.AckEntry{Partition: 0, Seq: 3, DeliveryID: 12345})
	c.write(30, &wire.Ack{Topic: "t", Group: "g", Entries: entries})
	corr, f := c.read()
	res := f.(*wire.AckOK).Results
	if corr != 30 || res[0] != wire.CodeOK || res[1] != wire.CodeOK || res[2] != wire.CodeStaleDelivery {
		t.Fatalf("ack results %v corr %d", res, corr)
	}
	c.write(31, &wire.Ping{})
	if corr, f := c.read(); f.Type() != wire.TypePong || corr != 31 {
		t.Fatalf("ping: %#v", f)
	}
}

func TestTokenPermissions(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"root", "writer pub:orders.* admin", "reader sub:orders.eu"}})
	root := dialRaw(t, addr)
	root.hello("root")
	for i, name := range []string{"orders.eu", "billing"} {
		root.write(uint64(i+1), &wire.Declare{Topic: wire.TopicConfig{Name: name, Partitions: 1}})
		if _, f := root.read(); f.Type() != wire.TypeDeclareOK {
			t.Fatalf("root declare %s: %#v", name, f)
		}
	}
	expect := func(c *rawConn, corr uint64, f wire.Frame, want wire.FrameType, code wire.Code) {
		t.Helper()
		c.write(corr, f)
		_, got := c.read()
		if e, ok := got.(*wire.Err); ok {
			if want != wire.TypeErr || e.Code != code {
				t.Fatalf("%s: got ERR %s (%s)", f.Type(), e.Code, e.Message)
			}
			return
		}
		if got.Type() != want {
			t.Fatalf("%s: got %s, want %s", f.Type(), got.Type(), want)
		}
	}
	w := dialRaw(t, addr)
	w.hello("writer")
	expect(w, 1, &wire.Pub{Topic: "orders.eu", Partition: 0, Value: []byte("x")}, wire.TypePubOK, 0)
	expect(w, 2, &wire.Pub{Topic: "billing", Partition: 0, Value: []byte("x")}, wire.TypeErr, wire.CodeUnauthorized)
	expect(w, 3, &wire.Pull{Topic: "orders.eu", Group: "g", Credit: 1}, wire.TypeErr, wire.CodeUnauthorized)
	expect(w, 4, &wire.Declare{Topic: wire.TopicConfig{Name: "orders.us", Partitions: 1}}, wire.TypeDeclareOK, 0)

	r := dialRaw(t, addr)
	r.hello("reader")
	expect(r, 1, &wire.Pub{Topic: "orders.eu", Partition: 0, Value: []byte("x")}, wire.TypeErr, wire.CodeUnauthorized)
	expect(r, 2, &wire.Declare{Topic: wire.TopicConfig{Name: "x", Partitions: 1}}, wire.TypeErr, wire.CodeUnauthorized)
	expect(r, 3, &wire.Ack{Topic: "orders.us", Group: "g"}, wire.TypeErr, wire.CodeUnauthorized)
	expect(r, 4, &wire.Pull{Topic: "orders.eu", Group: "g", Credit: 1}, wire.TypeMsg, 0)
	// A refused request does not close the connection.
	expect(r, 5, &wire.Ping{}, wire.TypePong, 0)
	// Groups: a reader joins only for topics it may consume, and may not
	// delete groups (an admin token may).
	expect(r, 6, &wire.Join{Group: "m", Member: "a", Topics: []string{"orders.eu", "billing"}, JoinID: 1}, wire.TypeErr, wire.CodeUnauthorized)
	expect(r, 7, &wire.Join{Group: "m", Member: "a", Topics: []string{"orders.eu"}, JoinID: 1}, wire.TypeJoinOK, 0)
	if corr, f := r.read(); f.Type() != wire.TypeNotice || corr != 7 {
		t.Fatalf("after JOIN_OK: %s on corr %d, want its NOTICE on 7", f.Type(), corr)
	}
	expect(r, 8, &wire.Leave{MemberRef: wire.MemberRef{Group: "m", Member: "a"}}, wire.TypeGroupOK, 0)
	expect(r, 9, &wire.GroupDelete{Group: "m"}, wire.TypeErr, wire.CodeUnauthorized)
	expect(r, 12, &wire.GroupDeleteForce{Group: "m"}, wire.TypeErr, wire.CodeUnauthorized)
	expect(w, 5, &wire.GroupDelete{Group: "m"}, wire.TypeGroupOK, 0)
	expect(w, 8, &wire.GroupDelete{Group: "never-joined"}, wire.TypeErr, wire.CodeNotFound)
	expect(w, 9, &wire.GroupDeleteForce{Group: "never-joined"}, wire.TypeGroupOK, 0)
	// GROUP_INCARNATION is a read; GROUP_DELETE_INCARNATION needs an
	// admin token, and answers a retry of the delete above (incarnation 1)
	// OK, deleting nothing more.
	expect(r, 13, &wire.GroupIncarnation{Group: "m"}, wire.TypeGroupIncarnationOK, 0)
	expect(r, 14, &wire.GroupDeleteIncarnation{GroupRef: wire.GroupRef{Group: "m", Incarnation: 2}}, wire.TypeErr, wire.CodeUnauthorized)
	expect(w, 10, &wire.GroupDeleteIncarnation{GroupRef: wire.GroupRef{Group: "m", Incarnation: 1}}, wire.TypeGroupOK, 0)
	expect(w, 11, &wire.GroupDeleteIncarnation{GroupRef: wire.GroupRef{Group: "m", Incarnation: 3}, Force: true}, wire.TypeErr, wire.CodeNotFound)
	// Topic updates and deletion need an admin token too; DESCRIBE is a
	// read. TOPIC_UPDATE needs protocol version 4: on w's connection of
	// version 1 it is BAD_FRAME, and the connection stays open.
	update := &wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: "billing"}, Set: wire.SetRetentionMs, RetentionMs: 60_000}
	r4, w4 := dialRaw(t, addr), dialRaw(t, addr)
	r4.helloVersion("reader", wire.VersionTopicUpdate)
	w4.helloVersion("writer", wire.VersionTopicUpdate)
	expect(r4, 2, update, wire.TypeErr, wire.CodeUnauthorized)
	expect(w, 12, update, wire.TypeErr, wire.CodeBadFrame)
	expect(w, 13, &wire.Ping{}, wire.TypePong, 0)
	expect(w4, 2, update, wire.TypeTopicUpdateOK, 0)
	// GROUP_UPDATE: an admin token and protocol version 5.
	groupUpdate := &wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "m"}, Set: wire.SetMaxDeliver, MaxDeliver: 3}
	r5, w5 := dialRaw(t, addr), dialRaw(t, addr)
	r5.helloVersion("reader", wire.VersionGroupUpdate)
	w5.helloVersion("writer", wire.VersionGroupUpdate)
	expect(r5, 2, groupUpdate, wire.TypeErr, wire.CodeUnauthorized)
	expect(w4, 3, groupUpdate, wire.TypeErr, wire.CodeBadFrame)
	expect(w4, 4, &wire.Ping{}, wire.TypePong, 0)
	expect(w5, 2, groupUpdate, wire.TypeGroupUpdateOK, 0)
	expect(w5, 3, &wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "m"}, Set: wire.SetMaxDeliver}, wire.TypeErr, wire.CodeInvalidArgument)
	expect(r, 10, &wire.TopicDelete{TopicRef: wire.TopicRef{Topic: "billing"}}, wire.TypeErr, wire.CodeUnauthorized)
	expect(r, 11, &wire.Describe{Metadata: wire.Metadata{Topics: []string{"billing"}}}, wire.TypeDescribeOK, 0)
	expect(w, 6, &wire.TopicDelete{TopicRef: wire.TopicRef{Topic: "billing"}}, wire.TypeTopicDeleteOK, 0)
	expect(w, 7, &wire.TopicDelete{TopicRef: wire.TopicRef{Topic: "billing"}}, wire.TypeErr, wire.CodeNotFound)
}

func TestBadPermissionIsAConfigError(t *testing.T) {
	if _, err := New(Config{Tokens: []string{"tok publish:everything"}}, nil); err == nil {
		t.Fatal("unknown permission accepted")
	}
	for _, bad := range []string{"tok pub:bad/name", "tok kv:bad/name", "tok kvread:", "tok kv:__kv.b"} {
		if _, err := New(Config{Tokens: []string{bad}}, nil); err == nil {
			t.Fatalf("bad glob accepted: %q", bad)
		}
	}
	if _, err := New(Config{Tokens: []string{"tok kv:config.* kvread:* admin"}}, nil); err != nil {
		t.Fatalf("bucket permissions refused: %v", err)
	}
}

// Every name a client sends over the wire is checked: reserved and
// path-like names in DECLARE, PUB, PULL, ACK and METADATA, and writes into
// the dead-letter namespace, are refused with INVALID_ARGUMENT and a reason;
// the connection stays usable.
func TestReservedNamesAreRefusedOverTheWire(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	c.hello("")
	c.write(2, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	if _, f := c.read(); f.Type() != wire.TypeDeclareOK {
		t.Fatalf("declare t: %#v", f)
	}
	frames := []wire.Frame{
		&wire.Declare{Topic: wire.TopicConfig{Name: "__meta", Partitions: 1}},
		&wire.Declare{Topic: wire.TopicConfig{Name: "..", Partitions: 1}},
		&wire.Declare{Topic: wire.TopicConfig{Name: "dlq.g.t", Partitions: 1}},
		&wire.Pub{Topic: "__meta", Partition: wire.PartitionAuto, Value: []byte("v")},
		&wire.Pub{Topic: "dlq.g.t", Partition: wire.PartitionAuto, Value: []byte("v")},
		&wire.Pull{Topic: "..", Group: "g", Credit: 1},
		&wire.Pull{Topic: "t", Group: "..", Credit: 1},
		&wire.Pull{Topic: "t", Group: "__g", Credit: 1},
		&wire.Ack{Topic: "t", Group: "."},
		&wire.Metadata{Topics: []string{"t", "__meta"}},
	}
	for i, fr := range frames {
		corr := uint64(100 + i)
		c.write(corr, fr)
		got, f := c.read()
		e, ok := f.(*wire.Err)
		if !ok || got != corr || e.Code != wire.CodeInvalidArgument || e.Message == "" {
			t.Errorf("%#v answered %#v (corr %d)", fr, f, got)
		}
	}
	c.write(200, &wire.Metadata{Topics: []string{"t"}})
	if _, f := c.read(); f.Type() != wire.TypeMetadataOK || len(f.(*wire.MetadataOK).Topics) != 1 {
		t.Fatalf("metadata of t: %#v", f)
	}
}
