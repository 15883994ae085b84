package server

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// testSession returns a session (with its writer running) on the server end
// of a loopback TCP connection, and the client end.
func testSession(t *testing.T) (*session, net.Conn) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Open(node.Config{DataDir: "/d", Env: env.Env{FS: vfs.NewMem()}, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	s, err := New(Config{AllowNoAuth: true, Logger: logger}, n)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	conn, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ss := newSession(s, conn)
	if ss.inline == nil {
		t.Fatal("a plain TCP session has no inline writer")
	}
	go ss.writer()
	t.Cleanup(func() {
		ss.closeAfterFlush()
		<-ss.writerDone
	})
	return ss, client
}

func TestCorkedRepliesWaitForUncorkThenLeaveInOrder(t *testing.T) {
	ss, client := testSession(t)
	ss.Cork()
	for i := uint64(1); i <= 100; i++ {
		ss.send(i, &wire.PubOK{Seq: i})
	}
	client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := client.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a corked reply was written before Uncork (%d bytes, %v)", n, err)
	}
	ss.Uncork()
	ss.outMu.Lock()
	inline := len(ss.pending) == 0 && ss.spare != nil // writeInlineLocked wrote it all
	ss.outMu.Unlock()
	if !inline {
		t.Error("Uncork with an idle writer did not write the burst itself")
	}
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(client)
	for i := uint64(1); i <= 100; i++ {
		corr, f, err := wire.ReadFrame(r, wire.DefaultFrameBytesMax)
		if err != nil {
			t.Fatal(err)
		}
		if ok, isOK := f.(*wire.PubOK); !isOK || corr != i || ok.Seq != i {
			t.Fatalf("frame %d: corr %d, %#v", i, corr, f)
		}
	}
}

func TestUncorkLeavesWhatTheSocketRefusesToTheWriterInOrder(t *testing.T) {
	ss, client := testSession(t)
	// A small send buffer and a client not yet reading: the inline write
	// cannot take the whole burst. (The client's receive buffer keeps its
	// default: a tiny one stalls the stream on zero-window probes.)
	ss.conn.(*net.TCPConn).SetWriteBuffer(4 << 10)
	const frames = 2000
	value := bytes.Repeat([]byte("v"), 1024)
	ss.Cork()
	for i := uint64(1); i <= frames; i++ {
		ss.send(i, &wire.Msg{Topic: "t", Seq: i, Value: value})
	}
	// A frame sent while the burst is being written goes after all of it,
	// whatever part of the burst the socket refuses.
	// The pause gives a writer that would not wait for the inline write
	// time to write that frame first.
	testHookInlineWrite = func() {
		ss.send(frames+1, &wire.Pong{})
		time.Sleep(20 * time.Millisecond)
	}
	defer func() { testHookInlineWrite = nil }()
	ss.Uncork()
	testHookInlineWrite = nil
	// What the socket refused is still pending, or the writer (signalled
	// by Uncork) has already taken it and is blocked writing it.
	ss.outMu.Lock()
	left := len(ss.pending) > 0 || ss.writing
	ss.outMu.Unlock()
	if !left {
		t.Fatal("the socket took 2 MiB without a reader: the partial write is not exercised")
	}
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(client)
	for i := uint64(1); i <= frames+1; i++ {
		corr, f, err := wire.ReadFrame(r, wire.DefaultFrameBytesMax)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if corr != i {
			t.Fatalf("frame %d arrived with corr %d", i, corr)
		}
		if m, isMsg := f.(*wire.Msg); i <= frames && (!isMsg || m.Seq != i || !bytes.Equal(m.Value, value)) {
			t.Fatalf("frame %d: %#v", i, f)
		}
	}
}
