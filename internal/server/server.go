// Package server serves the client protocol over TCP (optionally TLS): it
// authenticates connections, decodes frames, routes requests to the node
// and writes replies and deliveries back with bounded, batched writes.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/budget"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Config configures a Server.
type Config struct {
	// Tokens accepted in HELLO, one token-file line each: the secret, then
	// optional permissions (see perms). Empty with AllowNoAuth set disables
	// auth.
	Tokens      []string
	AllowNoAuth bool
	TLS         *tls.Config
	Logger      *slog.Logger
	// FrameBytesMax bounds every frame in both directions.
	FrameBytesMax int
	// HandshakeTimeout bounds the wait for HELLO.
	HandshakeTimeout time.Duration
	// AuthFailDelay is the fixed delay before AUTH_FAILED (DESIGN: 100 ms).
	AuthFailDelay time.Duration
	// OutboundBytesMax bounds a session's queued replies; a client that does
	// not read is disconnected rather than allowed to grow memory.
	OutboundBytesMax int
	// UnansweredBytesMax bounds the read buffers a session's requests
	// hold until they are done with — a publish's until it is answered,
	// which under replication waits for a quorum. Past it the session
	// reads no more frames until answers free room (a larger frame is
	// read and handled alone).
	UnansweredBytesMax int64
	// UnansweredBytesTotalMax bounds the same buffers of all sessions
	// together: a session's reader waits for room in both bounds.
	UnansweredBytesTotalMax int64
	// ConnectionsMax bounds the open client connections; one more is
	// answered UNAVAILABLE and closed. With the per-connection bounds
	// above it bounds the memory clients can hold.
	ConnectionsMax int
}

// ConnectionsMaxDefault is Config.ConnectionsMax's default.
const ConnectionsMaxDefault = 10_000

// UnansweredBytesTotalMaxDefault is Config.UnansweredBytesTotalMax's
// default.
const UnansweredBytesTotalMaxDefault = 1 << 30

// Server accepts client connections for one node.
type Server struct {
	cfg    Config
	node   *node.Node
	log    *slog.Logger
	tokens []tokenEntry

	mu       sync.Mutex
	lis      []net.Listener
	sessions map[*session]struct{}
	// unanswered bounds every session's unanswered frames together
	// (Config.UnansweredBytesTotalMax).
	unanswered *budget.Bytes
	closed     bool
	wg         sync.WaitGroup
}

// ErrNoTokens is returned by New when auth is required but no token is set.
var ErrNoTokens = errors.New("server: no tokens configured; pass a token file or explicitly allow no auth")

// New validates cfg and returns a server for n.
func New(cfg Config, n *node.Node) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.FrameBytesMax == 0 {
		cfg.FrameBytesMax = wire.DefaultFrameBytesMax
	}
	if cfg.FrameBytesMax < wire.FrameBytesMin {
		return nil, fmt.Errorf("server: FrameBytesMax %d below minimum %d", cfg.FrameBytesMax, wire.FrameBytesMin)
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.AuthFailDelay == 0 {
		cfg.AuthFailDelay = 100 * time.Millisecond
	}
	if cfg.OutboundBytesMax == 0 {
		cfg.OutboundBytesMax = 256 << 20
	}
	if cfg.UnansweredBytesMax == 0 {
		cfg.UnansweredBytesMax = 64 << 20
	}
	if cfg.UnansweredBytesTotalMax == 0 {
		cfg.UnansweredBytesTotalMax = UnansweredBytesTotalMaxDefault
	}
	if cfg.UnansweredBytesMax < 1 || cfg.UnansweredBytesTotalMax < 1 {
		return nil, fmt.Errorf("server: UnansweredBytesMax %d, UnansweredBytesTotalMax %d: each must be at least 1", cfg.UnansweredBytesMax, cfg.UnansweredBytesTotalMax)
	}
	if cfg.ConnectionsMax == 0 {
		cfg.ConnectionsMax = ConnectionsMaxDefault
	}
	if cfg.ConnectionsMax < 1 {
		return nil, fmt.Errorf("server: ConnectionsMax %d: it must be at least 1", cfg.ConnectionsMax)
	}
	if len(cfg.Tokens) == 0 && !cfg.AllowNoAuth {
		return nil, ErrNoTokens
	}
	s := &Server{cfg: cfg, node: n, log: cfg.Logger, sessions: map[*session]struct{}{}, unanswered: budget.NewBytes(cfg.UnansweredBytesTotalMax)}
	for i, line := range cfg.Tokens {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			return nil, fmt.Errorf("server: token %d is empty", i+1)
		}
		if len(fields[0]) > wire.TokenBytesMax {
			return nil, fmt.Errorf("server: token %d is %d bytes, longer than the %d a client can send", i+1, len(fields[0]), wire.TokenBytesMax)
		}
		p, err := parsePerms(fields[1:])
		if err != nil {
			return nil, fmt.Errorf("server: token %d: %w", i+1, err)
		}
		// Hashing first gives every comparison the same length, so timing
		// reveals neither the token nor its length.
		s.tokens = append(s.tokens, tokenEntry{hash: sha256.Sum256([]byte(fields[0])), perms: p})
	}
	return s, nil
}

// tokenLineBytesMax bounds a token file's line: a token and its
// permissions.
const tokenLineBytesMax = 64 << 10

// LoadTokens reads a token file: one token per line, optionally followed by
// its permissions ("s3cret pub:orders.* sub:orders.*"); blank lines and
// lines starting with # are ignored.
func LoadTokens(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read token file: %w", err)
	}
	var tokens []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// The token alone must fit HELLO; its permissions follow it.
		if n := len(strings.Fields(line)[0]); n > wire.TokenBytesMax {
			return nil, fmt.Errorf("token file %s line %d: the token is %d bytes, longer than the %d a client can send", path, i+1, n, wire.TokenBytesMax)
		}
		if len(line) > tokenLineBytesMax {
			return nil, fmt.Errorf("token file %s line %d is %d bytes, longer than %d", path, i+1, len(line), tokenLineBytesMax)
		}
		tokens = append(tokens, line)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("token file %s has no tokens", path)
	}
	return tokens, nil
}

type tokenEntry struct {
	hash  [sha256.Size]byte
	perms perms
}

// authenticate compares token against every configured token in constant
// time (no early exit) and returns the matching token's permissions.
func (s *Server) authenticate(token string) (perms, bool) {
	if len(s.tokens) == 0 {
		return perms{all: true}, s.cfg.AllowNoAuth
	}
	h := sha256.Sum256([]byte(token))
	var found perms
	ok := 0
	for i := range s.tokens {
		match := subtle.ConstantTimeCompare(h[:], s.tokens[i].hash[:])
		if match == 1 {
			found = s.tokens[i].perms
		}
		ok |= match
	}
	return found, ok == 1
}

// Serve accepts connections on lis until Close. It returns nil after Close.
func (s *Server) Serve(lis net.Listener) error {
	if s.cfg.TLS != nil {
		lis = tls.NewListener(lis, s.cfg.TLS)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		lis.Close()
		return nil
	}
	s.lis = append(s.lis, lis)
	s.mu.Unlock()
	var backoff time.Duration
	for {
		conn, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(backoff*2, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.startSession(conn)
	}
}

func (s *Server) startSession(conn net.Conn) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return
	}
	if len(s.sessions) >= s.cfg.ConnectionsMax {
		s.mu.Unlock()
		s.node.Metrics().ConnectionsRefused.Inc()
		go s.refuse(conn)
		return
	}
	ss := newSession(s, conn)
	s.sessions[ss] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	s.node.Metrics().Connections.Inc()
	go func() {
		defer s.wg.Done()
		ss.serve()
		s.node.Metrics().Connections.Dec()
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
	}()
}

// refuse tells a connection past ConnectionsMax why it is closed: an ERR
// in place of the HELLO_OK it waits for, written within a second.
func (s *Server) refuse(conn net.Conn) {
	defer conn.Close()
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	msg := wire.Errorf(wire.CodeUnavailable, "the node has its maximum of %d client connections open; retry later or at another node", s.cfg.ConnectionsMax)
	conn.Write(wire.AppendFrame(nil, 0, errFrame(msg)))
}

// Close stops accepting, closes every session and waits for them, bounded by
// ctx.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for _, l := range s.lis {
		l.Close()
	}
	for ss := range s.sessions {
		ss.conn.Close()
		ss.stop()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
