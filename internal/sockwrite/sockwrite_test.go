package sockwrite

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

func TestWriteTakesWhatTheSocketAcceptsAndNeverBlocks(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peer, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c.(*net.TCPConn).SetWriteBuffer(4 << 10)
	w := New(c)
	if w == nil {
		t.Fatal("no Writer for a TCP connection")
	}
	// Nobody reads: 8 MiB cannot fit in the socket buffers, and Write
	// must return with what fitted instead of waiting.
	data := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16)
	done := make(chan struct{})
	var n int
	go func() {
		defer close(done)
		n, err = w.Write(data)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Write blocked on a full socket")
	}
	if err != nil || n <= 0 || n >= len(data) {
		t.Fatalf("Write of 8 MiB without a reader: n=%d err=%v", n, err)
	}
	// Further writes take what the kernel has drained meanwhile, until the
	// socket is full: then a write takes nothing and is no error.
	total := n
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("1000 writes without a reader never found the socket full")
		}
		n2, err := w.Write(data[total:])
		if err != nil {
			t.Fatal(err)
		}
		if n2 == 0 {
			break
		}
		total += n2
	}
	// What Write reported is exactly what arrives.
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, total)
	if _, err := io.ReadFull(peer, got); err != nil || !bytes.Equal(got, data[:total]) {
		t.Fatalf("the peer did not read the %d bytes written: %v", total, err)
	}
	c.Close()
	if _, err := w.Write(data); err == nil {
		t.Fatal("Write on a closed connection reported no error")
	}
}

func TestNewRefusesConnectionsThatAreNotPlainTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if New(a) != nil {
		t.Fatal("a Writer for a net.Pipe")
	}
}
