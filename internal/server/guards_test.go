package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Guards a mutation sweep of this package found untested: each test here
// fails with its guard deleted or broken.

// ask sends f on corr and returns the answer's code (CodeOK for anything
// but ERR), checking that the answer comes on corr.
func (c *rawConn) ask(corr uint64, f wire.Frame) wire.Code {
	c.t.Helper()
	c.write(corr, f)
	got, a := c.read()
	if got != corr {
		c.t.Fatalf("%s answered %#v on corr %d, want %d", f.Type(), a, got, corr)
	}
	if e, ok := a.(*wire.Err); ok {
		return e.Code
	}
	return wire.CodeOK
}

// mustAsk is ask of a request that must succeed.
func (c *rawConn) mustAsk(corr uint64, f wire.Frame) {
	c.t.Helper()
	if code := c.ask(corr, f); code != wire.CodeOK {
		c.t.Fatalf("%s answered %s", f.Type(), code)
	}
}

// expectPong checks that the connection answers a PING next: nothing was
// sent after the answers read before it.
func (c *rawConn) expectPong(corr uint64) {
	c.t.Helper()
	c.write(corr, &wire.Ping{})
	if got, f := c.read(); f.Type() != wire.TypePong || got != corr {
		c.t.Fatalf("PING %d answered %#v on corr %d: a frame more came before it", corr, f, got)
	}
}

// A HELLO whose versions miss the server's, or run backwards, is answered
// UNSUPPORTED_VERSION and the connection closes; a range touching the
// server's at either end is served at the highest common version. Only a
// wrong token counts as an authentication failure.
func TestHelloWithoutACommonVersionIsRefused(t *testing.T) {
	s, addr := startServerOn(t, Config{Tokens: []string{"tok"}}, vfs.NewMem())
	for _, v := range [][2]uint16{{0, wire.VersionMin - 1}, {wire.VersionMax + 1, wire.VersionMax + 2}, {2, 1}} {
		c := dialRaw(t, addr)
		c.write(1, &wire.Hello{VersionMin: v[0], VersionMax: v[1], Token: "tok"})
		c.expectErr(1, wire.CodeUnsupportedVer)
		c.expectClosed()
	}
	for _, v := range [][2]uint16{{0, wire.VersionMin}, {wire.VersionMax, wire.VersionMax + 1}} {
		c := dialRaw(t, addr)
		c.write(1, &wire.Hello{VersionMin: v[0], VersionMax: v[1], Token: "tok"})
		_, f := c.read()
		if ok, isOK := f.(*wire.HelloOK); !isOK || ok.Version != min(v[1], wire.VersionMax) {
			t.Fatalf("versions %d-%d answered %#v", v[0], v[1], f)
		}
	}
	if n := metricValue(t, s, "nereus_auth_failures_total"); n != 0 {
		t.Fatalf("%v auth failures counted for good tokens", n)
	}
	c := dialRaw(t, addr)
	c.write(1, &wire.Hello{VersionMin: 1, VersionMax: 1, Token: "bad"})
	c.expectErr(1, wire.CodeAuthFailed)
	if n := metricValue(t, s, "nereus_auth_failures_total"); n != 1 {
		t.Fatalf("%v auth failures counted after one wrong token, want 1", n)
	}
}

// PUB_BATCH came with version 2: a connection at exactly 2 may send it.
func TestPubBatchAtVersion2(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	if v := c.helloVersion("", wire.VersionPubBatch); v != wire.VersionPubBatch {
		t.Fatalf("version %d chosen, want %d", v, wire.VersionPubBatch)
	}
	c.write(2, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	c.read()
	c.write(0, &wire.PubBatch{Topic: "t", Partition: 0, Records: []wire.PubRecord{{Corr: 5, Value: []byte("a")}}})
	if _, f := c.read(); f.Type() != wire.TypePubBatchOK || f.(*wire.PubBatchOK).Results[0].Code != wire.CodeOK {
		t.Fatalf("PUB_BATCH at version 2 answered %#v", f)
	}
}

// A PUB_BATCH refused for its topic appends none of its records.
func TestRefusedPubBatchAppendsNothing(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"root", "reader sub:t"}})
	root := dialRaw(t, addr)
	root.hello("root")
	root.mustAsk(1, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	r := dialRaw(t, addr)
	r.helloVersion("reader", wire.VersionMax)
	r.write(0, &wire.PubBatch{Topic: "t", Partition: 0, Records: []wire.PubRecord{{Corr: 5, Value: []byte("a")}}})
	if _, f := r.read(); f.(*wire.PubBatchOK).Results[0].Code != wire.CodeUnauthorized {
		t.Fatalf("refused batch answered %#v", f)
	}
	// The next record the topic takes is its first.
	root.write(2, &wire.Pub{Topic: "t", Partition: 0, Value: []byte("b")})
	if _, f := root.read(); f.Type() != wire.TypePubOK || f.(*wire.PubOK).Seq != 1 {
		t.Fatalf("the first record published after the refused batch answered %#v, want seq 1", f)
	}
}

// Every frame gives its read buffer back to the unanswered bounds once
// done with: a refused PUB, an answered PUB_BATCH, and a frame that closes
// the connection (a PUB_BATCH at version 1), whose buffer the server's
// bound of all sessions would otherwise lose for good.
func TestFramesGiveBackTheirBuffers(t *testing.T) {
	s, addr := startServerOn(t, Config{Tokens: []string{"root", "reader sub:t"}}, vfs.NewMem())
	r := dialRaw(t, addr)
	r.helloVersion("reader", wire.VersionMax)
	r.write(1, &wire.Pub{Topic: "t", Partition: 0, Value: []byte("x")})
	r.expectErr(1, wire.CodeUnauthorized)
	if held := s.unanswered.Held(); held != 0 {
		t.Fatalf("%d bytes unanswered after a refused PUB", held)
	}
	r.conn.Close()
	waitHeld(t, s, 0)

	c := dialRaw(t, addr)
	c.helloVersion("root", wire.VersionMax)
	c.mustAsk(2, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	c.write(0, &wire.PubBatch{Topic: "t", Partition: 0, Records: []wire.PubRecord{{Corr: 5, Value: []byte("a")}}})
	if _, f := c.read(); f.Type() != wire.TypePubBatchOK {
		t.Fatalf("batch answered %#v", f)
	}
	if held := s.unanswered.Held(); held != 0 {
		t.Fatalf("%d bytes unanswered after an answered PUB_BATCH", held)
	}
	c.conn.Close()
	waitHeld(t, s, 0)

	old := dialRaw(t, addr)
	old.helloVersion("root", 1)
	old.write(3, &wire.PubBatch{Topic: "t", Partition: 0, Records: []wire.PubRecord{{Corr: 5, Value: []byte("a")}}})
	old.expectErr(3, wire.CodeBadFrame)
	old.expectClosed()
	waitHeld(t, s, 0)
}

// waitHeld waits for the server's unanswered bytes, of all sessions, to
// come to want (a closing session gives its bytes back after it answers).
func waitHeld(t *testing.T, s *Server, want int64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for s.unanswered.Held() != want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if held := s.unanswered.Held(); held != want {
		t.Fatalf("%d bytes unanswered across the server, want %d", held, want)
	}
}

// NACK and SCHEDULE are checked like ACK and PUB: a token without sub: or
// pub: for the topic is refused; one with it reaches the node, which
// answers that the topic does not exist. SCHED_ADMIN's cancel and lane
// commands need admin; its list and status do not.
func TestNackScheduleAndSchedAdminNeedTheirPermissions(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"admin admin", "user sub:mine pub:mine"}})
	u := dialRaw(t, addr)
	u.hello("user")
	a := dialRaw(t, addr)
	a.hello("admin")
	for _, tc := range []struct {
		c    *rawConn
		f    wire.Frame
		want wire.Code
	}{
		{u, &wire.Nack{Topic: "theirs", Group: "g"}, wire.CodeUnauthorized},
		{u, &wire.Nack{Topic: "mine", Group: "g"}, wire.CodeNotFound},
		{u, &wire.Schedule{Pub: wire.Pub{Topic: "theirs", Partition: wire.PartitionAuto}, DeliverAtMs: 1}, wire.CodeUnauthorized},
		{u, &wire.Schedule{Pub: wire.Pub{Topic: "mine", Partition: wire.PartitionAuto}, DeliverAtMs: 1}, wire.CodeNotFound},
		{u, &wire.SchedAdmin{Op: wire.SchedCancel, ID: 1}, wire.CodeUnauthorized},
		{u, &wire.SchedAdmin{Op: wire.SchedLane, Topic: "mine", LaneOp: wire.LanePause}, wire.CodeUnauthorized},
		{u, &wire.SchedAdmin{Op: wire.SchedList, Limit: 1}, wire.CodeOK},
		{u, &wire.SchedAdmin{Op: wire.SchedStatus}, wire.CodeOK},
		{a, &wire.SchedAdmin{Op: wire.SchedCancel, ID: 1}, wire.CodeNotFound},
		{a, &wire.SchedAdmin{Op: wire.SchedLane, Topic: "mine", LaneOp: wire.LanePause}, wire.CodeNotFound},
	} {
		if code := tc.c.ask(7, tc.f); code != tc.want {
			t.Errorf("%#v answered %s, want %s", tc.f, code, tc.want)
		}
		tc.c.expectPong(8)
	}
}

// Errors of reads, group requests, bucket and scheduler commands are
// answered, once: nothing follows them. A bucket's delete, a schedule and
// a page of schedules are answered too.
func TestErrorAnswersComeAlone(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	c.helloVersion("", wire.VersionMax)
	c.mustAsk(1, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	for _, tc := range []struct {
		f    wire.Frame
		code wire.Code
	}{
		{&wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto}, DeliverAtMs: time.Now().Add(time.Hour).UnixMilli()}, wire.CodeOK},
		{&wire.SchedListPage{Shard: 0, Limit: 1}, wire.CodeOK},
		{&wire.SchedListPage{Shard: 1 << 20, Limit: 1}, wire.CodeNotFound},
		{&wire.Describe{Metadata: wire.Metadata{Topics: []string{".."}}}, wire.CodeInvalidArgument},
		{&wire.TopicDelete{TopicRef: wire.TopicRef{Topic: "none"}}, wire.CodeNotFound},
		{&wire.GroupList{Group: ".."}, wire.CodeInvalidArgument},
		{&wire.GroupIncarnation{Group: ".."}, wire.CodeInvalidArgument},
		{&wire.ControlAck{MemberRef: wire.MemberRef{Group: "g", Member: "m"}, NoticeID: 1}, wire.CodeInvalidArgument},
		{&wire.Join{Group: "..", Member: "m", Topics: []string{"t"}, JoinID: 1}, wire.CodeInvalidArgument},
		{&wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: ".."}}, wire.CodeInvalidArgument},
		{&wire.KVBucketDelete{Bucket: "none"}, wire.CodeNotFound},
		{&wire.KVBucketList{Bucket: ".."}, wire.CodeInvalidArgument},
		{&wire.KVWrite{Bucket: "none", Op: wire.KVOpPut, Key: []byte("k")}, wire.CodeNotFound},
		{&wire.KVWatch{Bucket: "none", Credit: 1}, wire.CodeNotFound},
		{&wire.KVGet{Bucket: "none", Key: []byte("k")}, wire.CodeNotFound},
		{&wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: "b"}}, wire.CodeOK},
		{&wire.KVBucketDelete{Bucket: "b"}, wire.CodeOK},
	} {
		if code := c.ask(5, tc.f); code != tc.code {
			t.Errorf("%#v answered %s, want %s", tc.f, code, tc.code)
		}
		c.expectPong(6)
	}
}

// METADATA and DESCRIBE answer for the internal topics that locate the
// group coordinator and the schedule shards, names a client may not use
// otherwise.
func TestMetadataOfTheInternalTopics(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	c.hello("")
	for _, name := range []string{wire.CoordinatorTopic, wire.SchedTopic} {
		if code := c.ask(2, &wire.Metadata{Topics: []string{name}}); code != wire.CodeOK {
			t.Errorf("METADATA of %s answered %s", name, code)
		}
		if code := c.ask(3, &wire.Describe{Metadata: wire.Metadata{Topics: []string{name}}}); code != wire.CodeOK {
			t.Errorf("DESCRIBE of %s answered %s", name, code)
		}
	}
}

// serveRecord starts a server whose topic t holds one record, "a", and
// returns its address and a connection past HELLO.
func serveRecord(t *testing.T) (string, *rawConn) {
	t.Helper()
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	c.hello("")
	c.mustAsk(1, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 1}})
	c.mustAsk(2, &wire.Pub{Topic: "t", Partition: 0, Value: []byte("a")})
	return addr, c
}

// A PULL whose subscription ended (its group was deleted: the PULL is
// answered NOT_FOUND) subscribes again, to the group's next incarnation.
func TestPullAfterItsGroupWasDeletedSubscribesAgain(t *testing.T) {
	_, c := serveRecord(t)
	c.write(10, &wire.Pull{Topic: "t", Group: "g", Credit: 1})
	if corr, f := c.read(); corr != 10 || f.Type() != wire.TypeMsg {
		t.Fatalf("PULL answered %#v on %d", f, corr)
	}
	c.write(11, &wire.GroupDeleteForce{Group: "g"})
	got := map[uint64]wire.Frame{}
	for range 2 {
		corr, f := c.read()
		got[corr] = f
	}
	if e, ok := got[10].(*wire.Err); !ok || e.Code != wire.CodeNotFound {
		t.Fatalf("the deleted group's PULL got %#v, want ERR NOT_FOUND", got[10])
	}
	if f := got[11]; f == nil || f.Type() != wire.TypeGroupOK {
		t.Fatalf("GROUP_DELETE_FORCE answered %#v", f)
	}
	c.write(12, &wire.Pull{Topic: "t", Group: "g", Credit: 1})
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if corr, f := c.read(); corr != 12 || f.Type() != wire.TypeMsg || string(f.(*wire.Msg).Value) != "a" {
		t.Fatalf("a PULL after the delete got %#v on %d, want the record again", f, corr)
	}
}

// A connection that closes gives its unacked deliveries back at once: a
// consumer on another connection gets them long before their ack wait.
func TestClosingAConnectionReleasesItsDeliveries(t *testing.T) {
	addr, a := serveRecord(t)
	a.write(10, &wire.Pull{Topic: "t", Group: "g", Credit: 1, AckWaitMs: 60_000})
	if _, f := a.read(); f.Type() != wire.TypeMsg {
		t.Fatalf("PULL answered %#v", f)
	}
	// A second PULL adds credit to the subscription that holds the
	// delivery; it is not a subscription of its own.
	a.write(11, &wire.Pull{Topic: "t", Group: "g", Credit: 1, AckWaitMs: 60_000})
	a.expectPong(12)
	a.conn.Close()
	b := dialRaw(t, addr)
	b.hello("")
	b.write(20, &wire.Pull{Topic: "t", Group: "g", Credit: 1})
	b.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if corr, f := b.read(); corr != 20 || f.Type() != wire.TypeMsg || string(f.(*wire.Msg).Value) != "a" {
		t.Fatalf("the other consumer got %#v on %d, want the closed connection's delivery", f, corr)
	}
}

// sentFrames keeps what a Protocol sends, from any goroutine.
type sentFrames struct {
	mu     sync.Mutex
	frames []wire.Frame
}

func (k *sentFrames) send(_ uint64, f wire.Frame) {
	k.mu.Lock()
	k.frames = append(k.frames, f)
	k.mu.Unlock()
}

// count returns how many frames were sent that match.
func (k *sentFrames) count(match func(wire.Frame) bool) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, f := range k.frames {
		if match(f) {
			n++
		}
	}
	return n
}

// waitFor waits until a sent frame matches.
func (k *sentFrames) waitFor(t *testing.T, what string, match func(wire.Frame) bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); k.count(match) == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("no %s sent", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// openProtocol returns a connection's Protocol on s (which allows no
// auth), past its HELLO, sending into the returned frames.
func openProtocol(t *testing.T, s *Server) (*Protocol, *sentFrames) {
	t.Helper()
	k := &sentFrames{}
	p := s.NewProtocol(k.send, t.Name())
	if v := p.Hello(1, &wire.Hello{VersionMin: 1, VersionMax: wire.VersionMax}); !v.Accepted {
		t.Fatalf("HELLO answered %#v", v.Reply)
	}
	return p, k
}

func isPut(f wire.Frame) bool {
	ev, ok := f.(*wire.KVEvent)
	return ok && ev.Kind == wire.KVEventPut
}

func isType(typ wire.FrameType) func(wire.Frame) bool {
	return func(f wire.Frame) bool { return f.Type() == typ }
}

// A connection's close ends its KV watches and its members' notices: a
// write and a rebalance after it reach the connections still open only.
func TestAClosedConnectionHearsNoMore(t *testing.T) {
	s, _ := startServerOn(t, Config{AllowNoAuth: true}, vfs.NewMem())
	p1, sent1 := openProtocol(t, s)
	p1.Handle(2, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: "b"}})
	sent1.waitFor(t, "KV_BUCKET_OK", isType(wire.TypeKVBucketOK))
	p1.Handle(3, &wire.KVWatch{Bucket: "b", Credit: 100})
	p1.Handle(4, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 2}})
	p1.Handle(5, &wire.Join{Group: "m", Member: "a", Topics: []string{"t"}, JoinID: 1})
	sent1.waitFor(t, "JOIN_OK", isType(wire.TypeJoinOK))
	sent1.waitFor(t, "NOTICE", isType(wire.TypeNotice))
	p1.Close()
	notices := sent1.count(isType(wire.TypeNotice))

	p2, sent2 := openProtocol(t, s)
	defer p2.Close()
	p2.Handle(2, &wire.KVWatch{Bucket: "b", Credit: 100})
	p2.Handle(3, &wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k"), Value: []byte("v")})
	p2.Handle(4, &wire.Join{Group: "m", Member: "b", Topics: []string{"t"}, JoinID: 1})
	sent2.waitFor(t, "put event", isPut)
	sent2.waitFor(t, "JOIN_OK", isType(wire.TypeJoinOK))
	time.Sleep(100 * time.Millisecond) // what the closed connection would hear comes with them
	if n := sent1.count(isPut); n != 0 {
		t.Errorf("a closed connection's watch sent %d put events", n)
	}
	if n := sent1.count(isType(wire.TypeNotice)) - notices; n != 0 {
		t.Errorf("a closed connection's member was sent %d notices", n)
	}
}

// readUntil reads frames, passing over others, until one of type typ comes
// on corr; an ERR on corr fails the test.
func (c *rawConn) readUntil(corr uint64, typ wire.FrameType) wire.Frame {
	c.t.Helper()
	for {
		got, f := c.read()
		if got != corr {
			continue
		}
		if e, ok := f.(*wire.Err); ok {
			c.t.Fatalf("ERR %s (%s) on corr %d, want %s", e.Code, e.Message, corr, typ)
		}
		if f.Type() == typ {
			return f
		}
	}
}

// A member that joins again on its connection pulls as its new
// incarnation: the PULL replaces the old incarnation's subscription,
// whose delivery the new one gets at once.
func TestAMemberJoinedAgainPullsAsItsNewIncarnation(t *testing.T) {
	_, c := serveRecord(t)
	for i, joinID := range []uint64{1, 2} {
		corr := uint64(10 * (i + 1))
		c.write(corr, &wire.Join{Group: "m", Member: "a", Topics: []string{"t"}, JoinID: joinID})
		inc := c.readUntil(corr, wire.TypeJoinOK).(*wire.JoinOK).Incarnation
		n := c.readUntil(corr, wire.TypeNotice).(*wire.Notice)
		c.write(corr+2, &wire.ControlAck{MemberRef: wire.MemberRef{Group: "m", Member: "a", Incarnation: inc}, NoticeID: n.NoticeID})
		c.readUntil(corr+2, wire.TypeGroupOK)
		c.write(corr+1, &wire.Pull{Topic: "t", Group: "m", Member: "a", Incarnation: inc, Credit: 1, AckWaitMs: 60_000})
		c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if m := c.readUntil(corr+1, wire.TypeMsg).(*wire.Msg); string(m.Value) != "a" {
			t.Fatalf("incarnation %d pulled %#v", i+1, m)
		}
	}
}

// A token line's permissions: "*" is everything; a glob that is no name
// is refused for sub: as for the others; a word that is no permission is
// refused, even one ending like a name.
func TestPermissionFields(t *testing.T) {
	p, err := parsePerms([]string{"*"})
	if err != nil || !p.canDeclare() || !p.canPublish("x") || !p.canConsume("x") || !p.canWriteKV("b") {
		t.Fatalf(`"*" parsed to %+v, %v`, p, err)
	}
	for _, bad := range [][]string{{"sub:bad/name"}, {"readers"}} {
		if p, err := parsePerms(bad); err == nil {
			t.Errorf("%q parsed to %+v", bad, p)
		}
	}
}

// A cancelled watch sends nothing more: a put after KV_WATCH_CANCEL
// reaches only the watch still running.
func TestKVWatchCancelEndsTheWatch(t *testing.T) {
	s, _ := startServerOn(t, Config{AllowNoAuth: true}, vfs.NewMem())
	p, sent := openProtocol(t, s)
	defer p.Close()
	p.Handle(2, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: "b"}})
	sent.waitFor(t, "KV_BUCKET_OK", isType(wire.TypeKVBucketOK))
	p.Handle(3, &wire.KVWatch{Bucket: "b", Credit: 100})
	p.Handle(4, &wire.KVWatch{Bucket: "b", Credit: 100})
	p.Handle(0, &wire.KVWatchCancel{Watch: 3})
	p.Handle(5, &wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k"), Value: []byte("v")})
	sent.waitFor(t, "put event", isPut)
	time.Sleep(50 * time.Millisecond) // the cancelled watch's event would come with the other's
	if n := sent.count(isPut); n != 1 {
		t.Fatalf("%d put events sent, want the running watch's one", n)
	}
}

// A refusal names the permission that was missing: kvread: is enough to
// read a bucket, not to write it.
func TestKVRefusalsNameThePermissionNeeded(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"none pub:*"}})
	c := dialRaw(t, addr)
	c.hello("none")
	for _, tc := range []struct {
		f      wire.Frame
		kvread bool
	}{
		{&wire.KVBucketList{Bucket: "b"}, true},
		{&wire.KVGet{Bucket: "b", Key: []byte("k")}, true},
		{&wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k")}, false},
	} {
		c.write(1, tc.f)
		_, f := c.read()
		e, ok := f.(*wire.Err)
		if !ok || e.Code != wire.CodeUnauthorized || strings.Contains(e.Message, "kvread:b") != tc.kvread {
			t.Errorf("%#v answered %#v, naming kvread:b %v", tc.f, f, tc.kvread)
		}
	}
}

// A watch the node ends (its bucket was deleted) is answered its error on
// its corr, and that corr may start a watch again.
func TestAnEndedWatchFreesItsCorr(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	c.hello("")
	c.mustAsk(1, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: "b"}})
	c.write(3, &wire.KVWatch{Bucket: "b", Credit: 100})
	c.write(4, &wire.KVBucketDelete{Bucket: "b"})
	// The delete's answer and the watch's end come in either order.
	for deleted, ended := false, false; !deleted || !ended; {
		corr, f := c.read()
		switch e, isErr := f.(*wire.Err); {
		case corr == 4 && f.Type() == wire.TypeKVBucketOK:
			deleted = true
		case corr == 3 && isErr && e.Code == wire.CodeNotFound:
			ended = true
		case isErr:
			t.Fatalf("ERR %s (%s) on corr %d", e.Code, e.Message, corr)
		}
	}
	c.mustAsk(5, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: "b"}})
	c.write(3, &wire.KVWatch{Bucket: "b", Credit: 100})
	if corr, f := c.read(); corr != 3 || f.Type() != wire.TypeKVEvent {
		t.Fatalf("a watch on the ended watch's corr got %#v on %d", f, corr)
	}
}

// New refuses bounds below their minimums and takes them at it; it names
// the token line that is wrong; without a logger it logs to the default.
func TestNewChecksItsConfig(t *testing.T) {
	ok := Config{AllowNoAuth: true}
	for _, tc := range []struct {
		name  string
		set   func(*Config)
		valid bool
	}{
		{"frame bytes below the minimum", func(c *Config) { c.FrameBytesMax = wire.FrameBytesMin - 1 }, false},
		{"frame bytes at the minimum", func(c *Config) { c.FrameBytesMax = wire.FrameBytesMin }, true},
		{"unanswered bytes below 1", func(c *Config) { c.UnansweredBytesMax = -1 }, false},
		{"unanswered bytes 1", func(c *Config) { c.UnansweredBytesMax = 1 }, true},
		{"unanswered total below 1", func(c *Config) { c.UnansweredBytesTotalMax = -1 }, false},
		{"unanswered total 1", func(c *Config) { c.UnansweredBytesTotalMax = 1 }, true},
		{"connections below 1", func(c *Config) { c.ConnectionsMax = -1 }, false},
		{"connections 1", func(c *Config) { c.ConnectionsMax = 1 }, true},
	} {
		cfg := ok
		tc.set(&cfg)
		if _, err := New(cfg, nil); (err == nil) != tc.valid {
			t.Errorf("%s: New answered %v", tc.name, err)
		}
	}
	for _, tc := range []struct {
		tokens []string
		line   string
	}{
		{[]string{"a", " "}, "token 2 is empty"},
		{[]string{"a", "b", "c bad"}, "token 3:"},
	} {
		if _, err := New(Config{Tokens: tc.tokens}, nil); err == nil || !strings.Contains(err.Error(), tc.line) {
			t.Errorf("tokens %q: New answered %v, want %q", tc.tokens, err, tc.line)
		}
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if s, err := New(Config{AllowNoAuth: true, Logger: logger}, nil); err != nil || s.log != logger {
		t.Errorf("New with a logger: %v, logs to another", err)
	}
	if s, err := New(Config{AllowNoAuth: true}, nil); err != nil || s.log != slog.Default() {
		t.Errorf("New without a logger: %v, does not log to the default", err)
	}
}

// A token file's lines are its tokens, less blank lines and comments; a
// file without any, a token too long for HELLO or a line too long (each
// named by its line), and a file that cannot be read (saying why) are
// errors. A token at HELLO's limit loads with its permissions.
func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	got, err := LoadTokens(write("ok", "# root\n  s3cret  \n\nreader sub:orders.*\n"))
	if err != nil || fmt.Sprint(got) != "[s3cret reader sub:orders.*]" {
		t.Fatalf("tokens %q, %v", got, err)
	}
	for name, c := range map[string]struct{ text, says string }{
		"empty":          {"# nothing\n\n", "has no tokens"},
		"token too long": {"ok\n" + strings.Repeat("x", wire.TokenBytesMax+1) + " sub:a\n", "line 2: the token is 4097 bytes"},
		"line too long":  {"# c\nok sub:" + strings.Repeat("a", tokenLineBytesMax) + "\n", "line 2 is 65543 bytes"},
	} {
		if got, err := LoadTokens(write(name, c.text)); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s token file loaded %d tokens, %v; want an error saying %q", name, len(got), err, c.says)
		}
	}
	limit := strings.Repeat("x", wire.TokenBytesMax)
	if got, err := LoadTokens(write("at the limit", limit+" pub:orders.* sub:orders.*\n")); err != nil || len(got) != 1 {
		t.Errorf("a token of %d bytes with permissions: %v", wire.TokenBytesMax, err)
	} else if _, err := New(Config{Tokens: got}, nil); err != nil {
		t.Errorf("a token of %d bytes with permissions: %v", wire.TokenBytesMax, err)
	}
	if _, err := New(Config{Tokens: []string{limit + "x"}}, nil); err == nil || !strings.Contains(err.Error(), "token 1 is 4097 bytes") {
		t.Errorf("New with a token longer than HELLO carries: %v", err)
	}
	if got, err := LoadTokens(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing token file loaded %q, %v", got, err)
	}
}

// within runs f and fails the test if it has not returned within 2 s.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}

// newListening returns a server without a node (it serves no connection)
// and a listener on loopback the test's cleanup closes.
func newListening(t *testing.T) (*Server, net.Listener) {
	t.Helper()
	s, err := New(Config{AllowNoAuth: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	return s, lis
}

// Close closes the listeners Serve accepts on, and Serve returns nil; a
// Serve after Close returns nil at once and closes its listener too. A
// second Close returns.
func TestCloseEndsServe(t *testing.T) {
	s, lis := newListening(t)
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		n := len(s.lis)
		s.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Serve did not take its listener")
		}
	}
	within(t, "Close", func() { s.Close(context.Background()) })
	within(t, "Serve", func() {
		if err := <-served; err != nil {
			t.Errorf("Serve returned %v after Close", err)
		}
	})
	late, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	within(t, "Serve after Close", func() {
		if err := s.Serve(late); err != nil {
			t.Errorf("Serve after Close returned %v", err)
		}
	})
	for _, l := range []net.Listener{lis, late} {
		if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
			c.Close()
			t.Errorf("%s still accepts after Close", l.Addr())
		}
	}
	within(t, "a second Close", func() { s.Close(context.Background()) })
}

// timeoutError is an accept error that passes.
type timeoutError struct{}

func (timeoutError) Error() string   { return "accept timed out" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// errListener answers Accept with its errors, in order.
type errListener struct {
	net.Listener
	errs []error
}

func (l *errListener) Accept() (net.Conn, error) {
	err := l.errs[0]
	l.errs = l.errs[1:]
	return nil, err
}

// Serve waits out accept timeouts and returns any other accept error.
func TestServeReturnsAcceptErrorsButTimeouts(t *testing.T) {
	s, lis := newListening(t)
	for _, broken := range []error{errors.New("listener broken"), &net.OpError{Op: "accept", Err: errors.New("listener broken")}} {
		start := time.Now()
		within(t, "Serve", func() {
			if err := s.Serve(&errListener{Listener: lis, errs: []error{timeoutError{}, timeoutError{}, broken}}); err != broken {
				t.Errorf("Serve returned %v, want %v", err, broken)
			}
		})
		// It waits 5 ms after the first timeout, then twice as long.
		if d := time.Since(start); d < 15*time.Millisecond {
			t.Errorf("two accept timeouts waited out in %v, want at least 15ms", d)
		}
	}
}

// The open connections gauge counts a connection while it is open.
func TestConnectionsAreCountedWhileOpen(t *testing.T) {
	s, addr := startServerOn(t, Config{AllowNoAuth: true}, vfs.NewMem())
	c := dialRaw(t, addr)
	c.hello("")
	if n := metricValue(t, s, "nereus_client_connections"); n != 1 {
		t.Fatalf("%v connections counted with one open", n)
	}
	c.conn.Close()
	for deadline := time.Now().Add(2 * time.Second); metricValue(t, s, "nereus_client_connections") != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v connections counted after the one closed", metricValue(t, s, "nereus_client_connections"))
		}
	}
}

// A connection accepted as the server closes is closed, not served.
func TestAConnectionAfterCloseIsClosed(t *testing.T) {
	s, _ := startServerOn(t, Config{AllowNoAuth: true}, vfs.NewMem())
	within(t, "Close", func() { s.Close(context.Background()) })
	client, conn := net.Pipe()
	defer client.Close()
	within(t, "startSession", func() { s.startSession(conn) })
	client.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the connection after Close reads %v, want EOF", err)
	}
	within(t, "a look at the sessions", func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.sessions) != 0 {
			t.Errorf("%d sessions after Close", len(s.sessions))
		}
	})
}

// A JOIN answered after its connection closed (in a cluster the answer
// comes from the metadata applier, here held up by its fsync) leaves no
// notice sink behind: its member hears nothing, and the node does not
// keep the closed connection for it.
func TestAJoinAnsweredAfterItsConnectionClosedHearsNothing(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	fs := newHeldSyncsOf("/meta/")
	defer fs.let()
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(node.Config{NodeID: "n1", DataDir: "/d", Env: env.Env{FS: fs}, Logger: logger,
		Cluster: &node.ClusterConfig{Members: []node.Member{{ID: "n1", PeerAddr: pl.Addr().String()}},
			Secret: []byte("test-cluster-secret-0123456789ab"), PeerListener: pl}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	s, err := New(Config{AllowNoAuth: true, Logger: logger}, n)
	if err != nil {
		t.Fatal(err)
	}
	p1, sent1 := openProtocol(t, s)
	p1.Handle(2, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 2}})
	sent1.waitFor(t, "DECLARE_OK", isType(wire.TypeDeclareOK))
	fs.held.Store(true)
	p1.Handle(3, &wire.Join{Group: "m", Member: "a", Topics: []string{"t"}, JoinID: 1})
	p1.Close()
	fs.let()
	// Another member's JOIN is applied after a's: once it is answered, a's
	// answer came too, and its ASSIGN would have gone out.
	p2, sent2 := openProtocol(t, s)
	defer p2.Close()
	p2.Handle(2, &wire.Join{Group: "m", Member: "b", Topics: []string{"t"}, JoinID: 1})
	sent2.waitFor(t, "JOIN_OK", isType(wire.TypeJoinOK))
	time.Sleep(100 * time.Millisecond)
	if n := sent1.count(isType(wire.TypeNotice)); n != 0 {
		t.Fatalf("a member whose connection closed before its JOIN was answered was sent %d notices", n)
	}
}

// Close closes the open connections and returns once their sessions
// ended.
func TestCloseClosesConnectionsAndWaitsForThem(t *testing.T) {
	s, addr := startServerOn(t, Config{AllowNoAuth: true}, vfs.NewMem())
	c := dialRaw(t, addr)
	c.hello("")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s.mu.Lock()
	open := len(s.sessions)
	s.mu.Unlock()
	if open != 0 {
		t.Fatalf("Close returned with %d sessions running", open)
	}
	c.expectClosed()
}

// A session whose queued replies pass OutboundBytesMax (its client does
// not read) drops them and closes its connection; queued bytes at the
// bound are kept, and nothing is queued after.
func TestRepliesPastTheOutboundBoundClose(t *testing.T) {
	ss, client := testSession(t)
	one := len(wire.AppendFrame(nil, 1, &wire.Pong{}))
	ss.srv.cfg.OutboundBytesMax = 2 * one
	ss.Cork() // nothing is written: the queue only grows
	defer ss.Uncork()
	queued := func() (int, bool) {
		ss.outMu.Lock()
		defer ss.outMu.Unlock()
		return len(ss.pending), ss.closing
	}
	ss.send(1, &wire.Pong{})
	ss.send(2, &wire.Pong{})
	if n, closing := queued(); n != 2*one || closing {
		t.Fatalf("at the bound: %d bytes queued, closing %v", n, closing)
	}
	ss.send(3, &wire.Pong{})
	ss.send(4, &wire.Pong{})
	if n, closing := queued(); n != 0 || !closing {
		t.Fatalf("past the bound: %d bytes queued, closing %v", n, closing)
	}
	client.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the client reads %d bytes, %v; want the connection closed", n, err)
	}
}

// The handshake is bounded: a client silent past HandshakeTimeout is
// closed, and a first frame is read only up to 64 KiB (FRAME_TOO_LARGE
// past it) whatever FrameBytesMax allows. An authenticated connection
// is not bound by the handshake's deadline.
func TestHandshakeIsBounded(t *testing.T) {
	const timeout = 100 * time.Millisecond
	addr := startServer(t, Config{AllowNoAuth: true, HandshakeTimeout: timeout})
	silent := dialRaw(t, addr)
	silent.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	silent.expectClosed()

	// PUBs whose frames (as their length prefix counts them) are 64 KiB
	// and one byte more, as first frames.
	empty := int(binary.BigEndian.Uint32(wire.AppendFrame(nil, 1, &wire.Pub{Topic: "t"})))
	for _, extra := range []int{0, 1} {
		c := dialRaw(t, addr)
		c.write(1, &wire.Pub{Topic: "t", Value: make([]byte, 64<<10-empty+extra)})
		want := map[int]wire.Code{0: wire.CodeNotAuthenticated, 1: wire.CodeFrameTooLarge}[extra]
		if _, f := c.read(); f.Type() != wire.TypeErr || f.(*wire.Err).Code != want {
			t.Fatalf("a first frame of 64 KiB and %d bytes answered %#v, want ERR %s", extra, f, want)
		}
		c.expectClosed()
	}

	c := dialRaw(t, addr)
	c.hello("")
	time.Sleep(3 * timeout)
	c.expectPong(2)
}

// Corks nest: an Uncork inside another Cork writes nothing; the last one
// writes what was queued.
func TestCorksNest(t *testing.T) {
	ss, client := testSession(t)
	ss.Cork()
	ss.Cork()
	ss.send(1, &wire.Pong{})
	ss.Uncork()
	client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := client.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a reply was written while a Cork still held (%d bytes, %v)", n, err)
	}
	ss.Uncork()
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if corr, f, err := wire.ReadFrame(bufio.NewReader(client), wire.DefaultFrameBytesMax); err != nil || corr != 1 || f.Type() != wire.TypePong {
		t.Fatalf("after the last Uncork: %#v on %d, %v", f, corr, err)
	}
}

// A write that fails (the client is gone) ends the writer: the connection
// is closed and nothing is queued after, so a session whose client left
// holds no replies.
func TestAFailedWriteEndsTheWriter(t *testing.T) {
	ss, client := testSession(t)
	client.(*net.TCPConn).SetLinger(0) // its close resets the connection
	client.Close()
	value := make([]byte, 64<<10)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		select {
		case <-ss.writerDone:
		default:
			if time.Now().After(deadline) {
				t.Fatal("the writer goes on writing to a reset connection")
			}
			ss.send(1, &wire.Msg{Topic: "t", Value: value})
			continue
		}
		break
	}
	ss.send(2, &wire.Pong{})
	ss.outMu.Lock()
	queued, closing := len(ss.pending), ss.closing
	ss.outMu.Unlock()
	if queued != 0 || !closing {
		t.Fatalf("after the failed write: %d bytes queued, closing %v", queued, closing)
	}
	if err := ss.conn.SetReadDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the connection is still open: %v", err)
	}
}

// After the handshake, a second HELLO or a frame that is no request (a
// reply type) is answered BAD_FRAME and closes the connection.
func TestNonRequestsCloseTheConnection(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	for _, f := range []wire.Frame{&wire.Hello{VersionMin: 1, VersionMax: 1}, &wire.Pong{}} {
		c := dialRaw(t, addr)
		c.hello("")
		c.write(2, f)
		c.expectErr(2, wire.CodeBadFrame)
		c.expectClosed()
	}
}

// An error that is not the protocol's is answered STORAGE with its text.
func TestOtherErrorsAreAnsweredStorage(t *testing.T) {
	if f := errFrame(errors.New("disk on fire")); f.Code != wire.CodeStorage || f.Message != "disk on fire" {
		t.Fatalf("answered %#v", f)
	}
}

// Frames behind a DECLARE in progress wait, up to heldFramesMax: the one
// past it is answered BAD_FRAME and closes the connection. (Only a Manual
// cluster node answers a DECLARE after the call; this sets the state.)
func TestFramesPastTheHeldBoundAreRefused(t *testing.T) {
	s, _ := startServerOn(t, Config{AllowNoAuth: true}, vfs.NewMem())
	p, sent := openProtocol(t, s)
	defer p.Close()
	p.declaring = true
	for i := range heldFramesMax {
		if !p.Handle(uint64(i), &wire.Ping{}) {
			t.Fatalf("held frame %d closed the connection", i)
		}
	}
	if p.Handle(heldFramesMax, &wire.Ping{}) {
		t.Fatal("a frame past the held bound kept the connection open")
	}
	sent.mu.Lock()
	defer sent.mu.Unlock()
	if len(sent.frames) != 1 || sent.frames[0].Type() != wire.TypeErr || sent.frames[0].(*wire.Err).Code != wire.CodeBadFrame {
		t.Fatalf("sent %d frames, first %#v; want ERR BAD_FRAME alone", len(sent.frames), sent.frames[0])
	}
}
