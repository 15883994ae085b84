package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Defaults applied by Dial to zero-valued Options fields.
const (
	DefaultServer         = "127.0.0.1:4850"
	DefaultDialTimeout    = 5 * time.Second
	DefaultRequestTimeout = 10 * time.Second
)

// Internal bounds of a connection.
const (
	outQueueBytesMax  = 4 << 20  // encoded frames waiting to be written; senders wait past it
	ioBufferBytes     = 64 << 10 // bufio sizes of reader and writer
	reconnectDelayMin = 50 * time.Millisecond
	reconnectDelayMax = 2 * time.Second
)

// Options configure a Client. The zero value (plus a server) is usable.
type Options struct {
	// Servers is the seed list tried in order, cycling on reconnect.
	// Empty means DefaultServer. See ParseServers for "a:1,b:2" lists.
	Servers []string
	// Token authenticates the connection (HELLO).
	Token string
	// ClientName identifies the client in broker logs.
	ClientName string
	// DialTimeout bounds one TCP+TLS+HELLO attempt to one server (default 5s).
	DialTimeout time.Duration
	// RequestTimeout bounds a request without a context deadline, and one
	// attempt of a producer publish (default 10s).
	RequestTimeout time.Duration
	// FrameBytesMax bounds frames this client reads
	// (default wire.DefaultFrameBytesMax). Outgoing frames are bounded by
	// what the broker announced in HELLO_OK.
	FrameBytesMax int
	// TLSConfig enables TLS when non-nil; ServerName defaults to the host.
	TLSConfig *tls.Config
}

func (o Options) withDefaults() (Options, error) {
	if len(o.Servers) == 0 {
		o.Servers = []string{DefaultServer}
	}
	for _, s := range o.Servers {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return o, fmt.Errorf("nereus: server address %q: %w", s, err)
		}
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.FrameBytesMax <= 0 {
		o.FrameBytesMax = wire.DefaultFrameBytesMax
	}
	if o.FrameBytesMax < wire.FrameBytesMin {
		return o, fmt.Errorf("nereus: FrameBytesMax %d below the protocol minimum %d", o.FrameBytesMax, wire.FrameBytesMin)
	}
	if len(o.Token) > wire.TokenBytesMax {
		return o, errors.New("nereus: token too long")
	}
	if len(o.ClientName) > wire.ClientNameBytesMax {
		return o, errors.New("nereus: client name too long")
	}
	return o, nil
}

// ParseServers splits a comma-separated seed list ("h1:4850, h2:4850"),
// trimming blanks and dropping empty items. A host without a port gets 4850.
func ParseServers(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(s); err != nil && !strings.Contains(s, ":") {
			s = net.JoinHostPort(s, "4850")
		}
		out = append(out, s)
	}
	return out
}

// backoff returns the delay before retry number attempt (1-based):
// exponential from min, capped at max, with up to 25% jitter.
func backoff(attempt int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

// retryPause waits before a request's retry number attempt — backoff
// from 10 ms to 500 ms — reporting false if ctx ended first.
func retryPause(ctx context.Context, attempt int) bool {
	t := time.NewTimer(backoff(attempt, 10*time.Millisecond, 500*time.Millisecond))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
