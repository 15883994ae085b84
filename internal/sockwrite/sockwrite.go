// Package sockwrite writes to a TCP socket without blocking: one write
// system call that takes what the socket accepts now. The SDK's senders and
// the server's uncorking goroutine use it to write a burst on the goroutine
// that has it, leaving what the socket refuses to a writer goroutine.
package sockwrite

import (
	"net"
	"syscall"
)

// Writer makes non-blocking writes to one socket. It is not safe for
// concurrent use: its caller lets one goroutine write at a time (it keeps
// its state between calls so that a write allocates nothing).
type Writer struct {
	raw syscall.RawConn
	buf []byte
	n   int
	err error
	fn  func(fd uintptr) bool // write, bound once
}

// New returns a Writer for c, or nil when c is not a plain TCP connection
// (TLS, for one, must go through its own Write).
func New(c net.Conn) *Writer {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &Writer{raw: raw}
	w.fn = w.write
	return w
}

// Write writes as much of b as the socket takes now and returns how much
// that was. A full socket is not an error: n is then less than len(b),
// possibly 0. Any other error means the connection is broken.
func (w *Writer) Write(b []byte) (n int, err error) {
	w.buf = b
	rerr := w.raw.Write(w.fn)
	n, err = max(w.n, 0), w.err
	w.buf, w.n, w.err = nil, 0, nil
	switch {
	case rerr != nil:
		return n, rerr
	case err == syscall.EAGAIN:
		return n, nil
	}
	return n, err
}

func (w *Writer) write(fd uintptr) bool {
	for {
		w.n, w.err = syscall.Write(int(fd), w.buf)
		if w.err != syscall.EINTR {
			return true // done either way: never wait for the socket here
		}
	}
}
