package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Client is a connection to a Nereus broker, shared by any number of
// producers and consumers. It is safe for concurrent use.
type Client struct {
	opts   Options
	closed chan struct{} // closed by Close

	mu           sync.Mutex
	isClosed     bool
	cur          *conn         // current connection; nil or dead means reconnect
	dialing      chan struct{} // non-nil while one goroutine dials; closed when it ends
	nextServer   int           // index into opts.Servers of the next dial
	dialFailures int           // consecutive failed dial rounds
	nextDialAt   time.Time     // no dial round starts before this (backoff)
}

// Dial connects and authenticates to the first reachable server of
// opts.Servers, trying each once. A rejected token fails with an error
// matching ErrAuthFailed.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{opts: opts, closed: make(chan struct{})}
	cn, err := c.dialRound(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = cn
	return c, nil
}

// Close closes the connection. Pending requests fail with ErrClosed;
// producers and consumers of this client stop working.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.isClosed {
		c.mu.Unlock()
		return nil
	}
	c.isClosed = true
	cn := c.cur
	c.mu.Unlock()
	close(c.closed)
	if cn != nil {
		cn.close()
	}
	return nil
}

// dialRound tries every server once, starting after the last one used.
func (c *Client) dialRound(ctx context.Context) (*conn, error) {
	var errs []error
	n := len(c.opts.Servers)
	c.mu.Lock()
	start := c.nextServer
	c.mu.Unlock()
	for i := range n {
		idx := (start + i) % n
		addr := c.opts.Servers[idx]
		cn, err := dialConn(ctx, addr, &c.opts)
		if err == nil {
			c.mu.Lock()
			c.nextServer = idx // stay on a working server
			c.mu.Unlock()
			return cn, nil
		}
		if isTerminalDialError(err) || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err)
	}
	c.mu.Lock()
	c.nextServer = (start + 1) % n
	c.mu.Unlock()
	return nil, errors.Join(errs...)
}

// getConn returns the live connection, dialing (once for all callers, with
// backoff between failed rounds) until one is up or ctx ends. Only
// terminal failures (authentication, closed client, ctx) are returned.
func (c *Client) getConn(ctx context.Context) (*conn, error) {
	var lastErr error
	for {
		c.mu.Lock()
		if c.isClosed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if c.cur != nil && !c.cur.isDead() {
			cn := c.cur
			c.mu.Unlock()
			return cn, nil
		}
		if ch := c.dialing; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctxError(ctx, lastErr)
			case <-c.closed:
				return nil, ErrClosed
			}
		}
		if wait := time.Until(c.nextDialAt); wait > 0 {
			c.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return nil, ctxError(ctx, lastErr)
			case <-c.closed:
				t.Stop()
				return nil, ErrClosed
			}
		}
		ch := make(chan struct{})
		c.dialing = ch
		c.mu.Unlock()

		cn, err := c.dialRound(ctx)

		c.mu.Lock()
		c.dialing = nil
		close(ch)
		if err == nil {
			c.dialFailures = 0
			c.nextDialAt = time.Time{}
			if c.isClosed {
				c.mu.Unlock()
				cn.close()
				return nil, ErrClosed
			}
			c.cur = cn
			c.mu.Unlock()
			return cn, nil
		}
		lastErr = err
		if ctx.Err() == nil && !isTerminalDialError(err) {
			c.dialFailures++
			c.nextDialAt = time.Now().Add(backoff(c.dialFailures, reconnectDelayMin, reconnectDelayMax))
		}
		c.mu.Unlock()
		if isTerminalDialError(err) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctxError(ctx, lastErr)
		}
	}
}

// isClosedNow reports whether Close was called.
func (c *Client) isClosedNow() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// liveConn returns the current connection if it is up, without dialing.
func (c *Client) liveConn() *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && !c.cur.isDead() && !c.isClosed {
		return c.cur
	}
	return nil
}

func ctxError(ctx context.Context, last error) error {
	if last != nil {
		return fmt.Errorf("%w (last error: %w)", ctx.Err(), last)
	}
	return ctx.Err()
}

// withRequestTimeout bounds ctx by RequestTimeout.
func (c *Client) withRequestTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.opts.RequestTimeout)
}

// idempotentRequest sends f and waits for its reply, reconnecting and
// resending after a disconnection until ctx (bounded by RequestTimeout)
// ends. Only for requests that are safe to repeat.
func (c *Client) idempotentRequest(ctx context.Context, f wire.Frame) (wire.Frame, error) {
	ctx, cancel := c.withRequestTimeout(ctx)
	defer cancel()
	for {
		cn, err := c.getConn(ctx)
		if err != nil {
			return nil, err
		}
		reply, err := cn.roundTrip(ctx, f)
		if err != nil && errors.Is(err, ErrDisconnected) && ctx.Err() == nil {
			continue
		}
		return reply, err
	}
}

// Ping measures one round trip to the broker.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	reply, err := c.idempotentRequest(ctx, &wire.Ping{})
	if err != nil {
		return 0, fmt.Errorf("nereus: ping: %w", err)
	}
	if _, ok := reply.(*wire.Pong); !ok {
		return 0, unexpected("PING", reply)
	}
	return time.Since(start), nil
}

// TopicConfig is the configuration a topic is declared with.
type TopicConfig struct {
	Name       string
	Partitions int
	// Retention is the age after which records may be deleted; 0 = unlimited.
	Retention time.Duration
	// RetentionBytes bounds each partition's size; 0 = unlimited.
	RetentionBytes int64
}

// PartitionInfo is the state of one partition.
type PartitionInfo struct {
	Partition int
	Epoch     uint64 // leader epoch
	StartSeq  uint64 // oldest retained seq
	CommitSeq uint64 // last visible seq
}

// TopicInfo is a topic's configuration and the state of its partitions.
type TopicInfo struct {
	Config     TopicConfig
	Partitions []PartitionInfo
}

func (t TopicConfig) toWire() (wire.TopicConfig, error) {
	if err := wire.ValidateName("topic", t.Name); err != nil {
		return wire.TopicConfig{}, err
	}
	if t.Partitions < 1 || t.Partitions > wire.PartitionsMax {
		return wire.TopicConfig{}, wire.Errorf(wire.CodeInvalidArgument, "partitions must be 1-%d, got %d", wire.PartitionsMax, t.Partitions)
	}
	if t.Retention < 0 || t.RetentionBytes < 0 {
		return wire.TopicConfig{}, wire.Errorf(wire.CodeInvalidArgument, "retention must not be negative")
	}
	return wire.TopicConfig{
		Name: t.Name, Partitions: uint32(t.Partitions),
		RetentionMs: t.Retention.Milliseconds(), RetentionBytes: t.RetentionBytes,
	}, nil
}

func topicConfigFromWire(w wire.TopicConfig) TopicConfig {
	return TopicConfig{
		Name: w.Name, Partitions: int(w.Partitions),
		Retention: time.Duration(w.RetentionMs) * time.Millisecond, RetentionBytes: w.RetentionBytes,
	}
}

// DeclareTopic creates a topic, or confirms that an identical one exists
// (created is then false). A topic with a different configuration fails
// with ErrTopicConflict. A declare retried after a disconnection may report
// created=false for a topic the first attempt created.
func (c *Client) DeclareTopic(ctx context.Context, cfg TopicConfig) (created bool, err error) {
	wc, err := cfg.toWire()
	if err != nil {
		return false, fmt.Errorf("nereus: declare %q: %w", cfg.Name, err)
	}
	reply, err := c.idempotentRequest(ctx, &wire.Declare{Topic: wc})
	if err != nil {
		return false, fmt.Errorf("nereus: declare %q: %w", cfg.Name, err)
	}
	ok, isOK := reply.(*wire.DeclareOK)
	if !isOK {
		return false, unexpected("DECLARE", reply)
	}
	return ok.Created, nil
}

// Topics describes the named topics, or all topics when names is empty.
// Named topics that do not exist are absent from the result.
func (c *Client) Topics(ctx context.Context, names ...string) ([]TopicInfo, error) {
	reply, err := c.idempotentRequest(ctx, &wire.Metadata{Topics: names})
	if err != nil {
		return nil, fmt.Errorf("nereus: metadata: %w", err)
	}
	ok, isOK := reply.(*wire.MetadataOK)
	if !isOK {
		return nil, unexpected("METADATA", reply)
	}
	out := make([]TopicInfo, 0, len(ok.Topics))
	for _, t := range ok.Topics {
		info := TopicInfo{Config: topicConfigFromWire(t.Config)}
		for _, p := range t.Partitions {
			info.Partitions = append(info.Partitions, PartitionInfo{
				Partition: int(p.Partition), Epoch: p.Epoch, StartSeq: p.StartSeq, CommitSeq: p.CommitSeq,
			})
		}
		out = append(out, info)
	}
	return out, nil
}

func unexpected(req string, f wire.Frame) error {
	if f == nil {
		return fmt.Errorf("nereus: %s: empty reply: %w", req, wire.ErrBadFrame)
	}
	return fmt.Errorf("nereus: %s: unexpected reply %s: %w", req, f.Type(), wire.ErrBadFrame)
}
