package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Metadata refreshes are rate-limited: consecutive refreshes that find no
// change back off from metadataRefreshMin to metadataRefreshMax.
const (
	metadataRefreshMin = 50 * time.Millisecond
	metadataRefreshMax = 2 * time.Second
)

// Client is a connection to a Nereus broker or cluster, shared by any number
// of producers and consumers. It holds one connection to a seed server and,
// in a cluster, one per partition leader it routes to. It is safe for
// concurrent use.
type Client struct {
	opts   Options
	closed chan struct{} // closed by Close

	mu         sync.Mutex
	isClosed   bool
	seed       connSlot             // connection to one of opts.Servers
	nextServer int                  // index into opts.Servers of the next dial
	pool       map[string]*connSlot // connections to leaders, by address
	meta       map[string]*topicMeta
	// schedID and schedSeq: the producer identity of this client's
	// schedules (Schedule), drawn at the first one. schedOpen holds the
	// sequences of the schedules in flight; schedFreed is closed (and
	// replaced) whenever one ends.
	schedID, schedSeq uint64
	schedOpen         map[uint64]struct{}
	schedFreed        chan struct{}
}

// connSlot holds one connection that is redialed on demand: one dial at a
// time, with backoff between failed dials. Fields are guarded by Client.mu.
type connSlot struct {
	cur        *conn         // nil or dead means redial
	dialing    chan struct{} // non-nil while one goroutine dials; closed when it ends
	failures   int           // consecutive failed dials
	nextDialAt time.Time     // no dial starts before this (backoff)
	lastErr    error         // why the last dial failed
}

// topicMeta is the cached routing of one topic. Fields are guarded by
// Client.mu.
type topicMeta struct {
	leaders    []route       // by partition; nil until first fetched
	refreshing chan struct{} // non-nil while a refresh waits or runs; closed when it ends
	again      bool          // a refresh was asked for while one ran
	unchanged  int           // consecutive refreshes that changed nothing
	nextAt     time.Time     // no refresh starts before this
}

// route names a partition's leader: node id and client address, either
// possibly "" (unknown).
type route struct{ leader, addr string }

// Dial connects and authenticates to the first reachable server of
// opts.Servers, trying each once. A rejected token fails with an error
// matching ErrAuthFailed.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{opts: opts, closed: make(chan struct{}), pool: map[string]*connSlot{}, meta: map[string]*topicMeta{}}
	cn, err := c.dialRound(ctx)
	if err != nil {
		return nil, err
	}
	c.seed.cur = cn
	return c, nil
}

// Close closes every connection. Pending requests fail with ErrClosed;
// producers and consumers of this client stop working.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.isClosed {
		c.mu.Unlock()
		return nil
	}
	c.isClosed = true
	conns := []*conn{c.seed.cur}
	for _, s := range c.pool {
		conns = append(conns, s.cur)
	}
	c.mu.Unlock()
	close(c.closed)
	for _, cn := range conns {
		if cn != nil {
			cn.close()
		}
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

// getConn returns the live seed connection, dialing (once for all callers,
// with backoff between failed rounds) until one is up or ctx ends. Only
// terminal failures (authentication, closed client, ctx) are returned.
func (c *Client) getConn(ctx context.Context) (*conn, error) {
	return c.slotConn(ctx, &c.seed, c.dialRound, true)
}

// slotConn returns s's live connection, dialing it with dial when it is
// down. With persist it retries (after backoff) until ctx ends; without, it
// makes at most one dial and fails at once while s is backing off.
func (c *Client) slotConn(ctx context.Context, s *connSlot, dial func(context.Context) (*conn, error), persist bool) (*conn, error) {
	var lastErr error
	for {
		c.mu.Lock()
		if c.isClosed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if s.cur != nil && !s.cur.isDead() {
			cn := s.cur
			c.mu.Unlock()
			return cn, nil
		}
		if ch := s.dialing; ch != nil {
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
		if wait := time.Until(s.nextDialAt); wait > 0 {
			if !persist {
				err := s.lastErr
				c.mu.Unlock()
				return nil, err
			}
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
		s.dialing = ch
		c.mu.Unlock()

		cn, err := dial(ctx)

		c.mu.Lock()
		s.dialing = nil
		close(ch)
		if err == nil {
			s.failures = 0
			s.nextDialAt, s.lastErr = time.Time{}, nil
			if c.isClosed {
				c.mu.Unlock()
				cn.close()
				return nil, ErrClosed
			}
			s.cur = cn
			c.mu.Unlock()
			return cn, nil
		}
		lastErr = err
		if ctx.Err() == nil && !isTerminalDialError(err) {
			s.failures++
			s.nextDialAt = time.Now().Add(backoff(s.failures, reconnectDelayMin, reconnectDelayMax))
			s.lastErr = err
		}
		c.mu.Unlock()
		if isTerminalDialError(err) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctxError(ctx, lastErr)
		}
		if !persist {
			return nil, err
		}
	}
}

// giveUpIfSilent fails cn when the broker sent nothing on it for a whole
// RequestTimeout (conn.giveUpIfSilent). The silent node's kernel may still
// accept a connection and leave HELLO unanswered for a whole DialTimeout,
// so it is not dialed first again: when cn was the seed connection the
// next seed dial starts at the next server, and the leader slot of its
// address (pooled, or made now) is not redialed for a RequestTimeout —
// until then the retries that still route there (they may run before the
// metadata refresh) go to a live seed instead.
func (c *Client) giveUpIfSilent(cn *conn) {
	if !cn.giveUpIfSilent(c.opts.RequestTimeout) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seed.cur == cn && c.opts.Servers[c.nextServer] == cn.addr {
		c.nextServer = (c.nextServer + 1) % len(c.opts.Servers)
	}
	s := c.pool[cn.addr]
	if s == nil {
		s = &connSlot{}
		c.pool[cn.addr] = s
	}
	s.failures++
	s.nextDialAt, s.lastErr = time.Now().Add(c.opts.RequestTimeout), cn.failure()
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

// liveConn returns a connection that is up, preferring the seed's, without
// dialing; nil if none is.
func (c *Client) liveConn() *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed {
		return nil
	}
	if c.seed.cur != nil && !c.seed.cur.isDead() {
		return c.seed.cur
	}
	for _, s := range c.pool {
		if s.cur != nil && !s.cur.isDead() {
			return s.cur
		}
	}
	return nil
}

// anyConn returns a live connection, dialing a seed when none is up.
func (c *Client) anyConn(ctx context.Context) (*conn, error) {
	if cn := c.liveConn(); cn != nil {
		return cn, nil
	}
	return c.getConn(ctx)
}

// leaderConn returns a connection to the leader of partition part of topic
// as the metadata cache names it, matched by node id (the seed may be that
// node) or else by address. When the leader is unknown (part < 0, no
// metadata yet, election running) it returns any live connection: a
// non-leader answers NOT_LEADER and the caller refreshes. Without dial it
// returns nil rather than connect; with dial it connects to the leader and
// falls back to a seed when that fails. Only terminal errors are returned.
func (c *Client) leaderConn(ctx context.Context, topic string, part int32, dial bool) (*conn, error) {
	c.mu.Lock()
	r := c.routeLocked(topic, part)
	cn := c.findLiveLocked(r)
	// The seed's own node is redialed through the seed list, as a single
	// node always is: its advertised address may not be reachable as is.
	seedNode := c.seed.cur != nil && r.leader != "" && c.seed.cur.nodeID == r.leader
	var slot *connSlot
	if cn == nil && r.addr != "" && !seedNode && dial && !c.isClosed {
		slot = c.pool[r.addr]
		if slot == nil {
			slot = &connSlot{}
			c.pool[r.addr] = slot
		}
	}
	c.mu.Unlock()
	if cn != nil {
		return cn, nil
	}
	if !dial {
		if r != (route{}) {
			return nil, nil // known leader, not connected: the caller dials
		}
		return c.liveConn(), nil
	}
	if seedNode {
		return c.getConn(ctx)
	}
	if slot != nil {
		cn, err := c.slotConn(ctx, slot, func(ctx context.Context) (*conn, error) {
			return dialConn(ctx, r.addr, &c.opts)
		}, false)
		if err == nil {
			return cn, nil
		}
		if errors.Is(err, ErrClosed) || isTerminalDialError(err) {
			return nil, err
		}
		c.refreshTopic(topic) // the leader may be gone
	}
	return c.anyConn(ctx)
}

// routeLocked returns the cached leader of topic's partition part.
func (c *Client) routeLocked(topic string, part int32) route {
	if m := c.meta[topic]; m != nil && part >= 0 && int(part) < len(m.leaders) {
		return m.leaders[part]
	}
	return route{}
}

// findLiveLocked returns a live connection to r's node, nil if none.
func (c *Client) findLiveLocked(r route) *conn {
	if r == (route{}) || c.isClosed {
		return nil
	}
	match := func(cn *conn) bool {
		return cn != nil && !cn.isDead() && (r.leader != "" && cn.nodeID == r.leader || r.addr != "" && cn.addr == r.addr)
	}
	if match(c.seed.cur) {
		return c.seed.cur
	}
	if s := c.pool[r.addr]; s != nil && match(s.cur) {
		return s.cur
	}
	for _, s := range c.pool {
		if match(s.cur) {
			return s.cur
		}
	}
	return nil
}

// partitionCount returns topic's partition count from the metadata cache,
// 0 when it is not known yet.
func (c *Client) partitionCount(topic string) uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.meta[topic]; m != nil {
		return uint32(len(m.leaders))
	}
	return 0
}

// refreshTopic starts a refresh of topic's metadata, unless one is already
// waiting or running (it then runs once more afterwards), and returns a
// channel closed when the current refresh ends. Refreshes that change
// nothing back off, so callers may ask as often as they fail.
func (c *Client) refreshTopic(topic string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed {
		return c.closed
	}
	m := c.metaLocked(topic)
	if m.refreshing != nil {
		m.again = true
		return m.refreshing
	}
	if time.Since(m.nextAt) > metadataRefreshMax {
		m.unchanged = 0 // quiet for a while: react quickly again
	}
	ch := make(chan struct{})
	m.refreshing = ch
	go c.runRefresh(topic, ch, time.Until(m.nextAt))
	return ch
}

// awaitRefresh refreshes topic's metadata and waits for it (or ctx).
func (c *Client) awaitRefresh(ctx context.Context, topic string) {
	select {
	case <-c.refreshTopic(topic):
	case <-ctx.Done():
	}
}

func (c *Client) metaLocked(topic string) *topicMeta {
	m := c.meta[topic]
	if m == nil {
		m = &topicMeta{}
		c.meta[topic] = m
	}
	return m
}

func (c *Client) runRefresh(topic string, done chan struct{}, delay time.Duration) {
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-c.closed:
			t.Stop()
		}
	}
	var changed bool
	if !c.isClosedNow() {
		// Topics stores what it learns in the cache.
		_, changed, _ = c.topics(context.Background(), topic)
	}
	c.mu.Lock()
	m := c.meta[topic]
	switch {
	case changed || m.leaderless():
		// An election is running: it ends within an election timeout, so
		// keep asking at the quickest pace rather than backing off.
		m.unchanged = 0
	default:
		m.unchanged++
	}
	m.nextAt = time.Now().Add(backoff(m.unchanged+1, metadataRefreshMin, metadataRefreshMax))
	m.refreshing = nil
	again := m.again
	m.again = false
	c.mu.Unlock()
	close(done)
	if again {
		c.refreshTopic(topic)
	}
}

// leaderless reports whether some partition's leader is unknown.
func (m *topicMeta) leaderless() bool {
	return slices.ContainsFunc(m.leaders, func(r route) bool { return r.leader == "" })
}

// forgetTopic drops a deleted topic's routes: the name declared again
// may have other partitions and leaders.
func (c *Client) forgetTopic(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.meta[name]; m != nil {
		m.leaders = nil
	}
}

// storeMetadata caches the routing of topics and reports whether any
// leader or partition count changed.
func (c *Client) storeMetadata(topics []wire.TopicInfo) (changed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range topics {
		leaders := make([]route, t.Config.Partitions)
		for _, p := range t.Partitions {
			if int(p.Partition) < len(leaders) {
				leaders[p.Partition] = route{leader: p.Leader, addr: p.LeaderAddr}
			}
		}
		m := c.metaLocked(t.Config.Name)
		if !slices.Equal(m.leaders, leaders) {
			m.leaders = leaders
			changed = true
		}
	}
	return changed
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

// idempotentRequest sends f to any node and waits for its reply,
// reconnecting and resending after a disconnection until ctx (bounded by
// RequestTimeout) ends. Only for requests that are safe to repeat and that
// every node answers (DECLARE is forwarded, METADATA answered locally).
func (c *Client) idempotentRequest(ctx context.Context, f wire.Frame) (wire.Frame, error) {
	ctx, cancel := c.withRequestTimeout(ctx)
	defer cancel()
	for {
		cn, err := c.anyConn(ctx)
		if err != nil {
			return nil, err
		}
		sentAt := time.Now()
		reply, err := cn.roundTrip(ctx, f)
		if err != nil && errors.Is(err, ErrDisconnected) && ctx.Err() == nil {
			continue
		}
		if err != nil && ctx.Err() != nil && time.Since(sentAt) >= c.opts.RequestTimeout {
			c.giveUpIfSilent(cn) // the next request goes to another node
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
	// It must be a whole number of milliseconds (the protocol unit).
	Retention time.Duration
	// RetentionBytes bounds each partition's size; 0 = unlimited.
	RetentionBytes int64
	// Replicas is the replication factor: 1, 3 or 5; 0 = the broker's
	// default (1 on a single node, 3 in a cluster of 3 or more).
	Replicas int
	// Ack is when a replicated record is acknowledged: "quorum" (a majority
	// of the replicas fsynced it; "" means quorum) or "all" (every replica
	// did; a lagging replica then blocks writes with QUORUM_LOST).
	Ack string
}

// PartitionInfo is the state of one partition, as the answering node knows it.
type PartitionInfo struct {
	Partition int
	Epoch     uint64 // leader epoch
	StartSeq  uint64 // oldest retained seq
	CommitSeq uint64 // last visible seq
	// Leader is the node id of the partition's leader and LeaderAddr its
	// client address; "" while unknown (an election is running, or the
	// answering node no longer hears the leader it knew).
	Leader     string
	LeaderAddr string
	// ReadOnly is set while the leader has lost its ack quorum: publishes
	// fail with ErrQuorumLost (the producer retries them until its deadline).
	ReadOnly bool
	// Corrupt is set when the answering node found damage in the
	// partition's log: publishes fail with a DATA_CORRUPT error (not
	// retried) until an operator repairs it.
	Corrupt bool
	// Replicas lists the replica group; empty on a single node.
	Replicas []ReplicaInfo
}

// ReplicaInfo is one member of a partition's replica group. State (InSync,
// CatchingUp, NeedsRebuild, or Unreachable: not heard from for two
// election timeouts) is known only when the answering node leads the
// partition, else "" (a follower reports Rebuilding for itself).
type ReplicaInfo struct {
	Node       string
	State      string
	FlushedSeq uint64 // last seq the replica has fsynced
}

// TopicInfo is a topic's configuration and the state of its partitions.
type TopicInfo struct {
	Config     TopicConfig
	Partitions []PartitionInfo
	// Incarnation numbers this life of the topic's name: 1 for its first
	// declare, one more each time it is declared again after a delete.
	Incarnation uint64
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
	if t.Retention%time.Millisecond != 0 {
		// Retention travels in whole milliseconds, and 0 means unlimited:
		// 1ns must not silently become "keep forever".
		return wire.TopicConfig{}, wire.Errorf(wire.CodeInvalidArgument, "retention %v is not a whole number of milliseconds", t.Retention)
	}
	switch t.Replicas {
	case 0, 1, 3, 5:
	default:
		return wire.TopicConfig{}, wire.Errorf(wire.CodeInvalidArgument, "replicas must be 1, 3 or 5 (0 = broker default), got %d", t.Replicas)
	}
	ack, err := wire.ParseAckPolicy(t.Ack)
	if err != nil {
		return wire.TopicConfig{}, wire.Errorf(wire.CodeInvalidArgument, "%v", err)
	}
	return wire.TopicConfig{
		Name: t.Name, Partitions: uint32(t.Partitions),
		RetentionMs: t.Retention.Milliseconds(), RetentionBytes: t.RetentionBytes,
		Replicas: uint8(t.Replicas), Ack: ack,
	}, nil
}

func topicConfigFromWire(w wire.TopicConfig) TopicConfig {
	return TopicConfig{
		Name: w.Name, Partitions: int(w.Partitions),
		Retention: time.Duration(w.RetentionMs) * time.Millisecond, RetentionBytes: w.RetentionBytes,
		Replicas: int(w.Replicas), Ack: w.Ack.String(),
	}
}

// DeclareTopic creates a topic, or confirms that an identical one exists
// (created is then false). A topic with a different configuration fails
// with ErrTopicConflict. A declare retried after a disconnection may report
// created=false for a topic the first attempt created. Any node of a
// cluster accepts it.
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

// Topics describes the named topics, or all topics when names is empty,
// with their incarnations (DESCRIBE). Named topics that do not exist are
// absent from the result.
func (c *Client) Topics(ctx context.Context, names ...string) ([]TopicInfo, error) {
	reply, err := c.idempotentRequest(ctx, &wire.Describe{Metadata: wire.Metadata{Topics: names}})
	if err != nil {
		return nil, fmt.Errorf("nereus: describe: %w", err)
	}
	ok, isOK := reply.(*wire.DescribeOK)
	if !isOK {
		return nil, unexpected("DESCRIBE", reply)
	}
	c.storeMetadata(ok.Topics)
	return topicInfos(ok.Topics), nil
}

// DeleteTopic deletes a topic: every node stops it and removes its data,
// and consumer groups lose its partitions. Declaring the name again makes
// a new, empty topic with the next incarnation. incarnation, when not 0,
// names the incarnation to delete (as Topics described it): another one
// is left alone (ErrNotFound). A topic that does not exist (never
// declared, or deleted already) is ErrNotFound; internal topics are
// refused. It returns the incarnation deleted. In a cluster it goes to
// the metadata leader.
func (c *Client) DeleteTopic(ctx context.Context, name string, incarnation uint64) (deleted uint64, err error) {
	if err := wire.ValidateName("topic", name); err != nil {
		return 0, fmt.Errorf("nereus: delete topic: %w", err)
	}
	reply, err := c.coordinatorRequest(ctx, &wire.TopicDelete{TopicRef: wire.TopicRef{Topic: name, Incarnation: incarnation}})
	if err != nil {
		return 0, fmt.Errorf("nereus: delete topic %s: %w", name, err)
	}
	ok, isOK := reply.(*wire.TopicDeleteOK)
	if !isOK {
		return 0, unexpected("TOPIC_DELETE", reply)
	}
	c.forgetTopic(name)
	return ok.Incarnation, nil
}

// TopicUpdate is a change to the settings of a topic that may change
// after its declare: its retention. A nil field keeps its value; 0 means
// unlimited, as in TopicConfig.
type TopicUpdate struct {
	Retention      *time.Duration // a whole number of milliseconds
	RetentionBytes *int64         // per partition
	// Incarnation, when not 0, names the incarnation to update (as
	// Topics described it): another one is left alone (ErrNotFound).
	Incarnation uint64
}

// UpdateTopic changes a topic's retention and returns its configuration
// and incarnation after the change (an update that changes nothing
// succeeds too). Each partition applies it at its next retention check:
// a shorter retention deletes what it no longer keeps then. A topic that
// does not exist is ErrNotFound; internal topics are refused. In a
// cluster it goes to the metadata leader, and the metadata log carries it
// to every node.
func (c *Client) UpdateTopic(ctx context.Context, name string, u TopicUpdate) (TopicConfig, uint64, error) {
	f := wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: name, Incarnation: u.Incarnation}}
	if u.Retention != nil {
		if *u.Retention%time.Millisecond != 0 {
			return TopicConfig{}, 0, fmt.Errorf("nereus: update topic %s: %w", name,
				wire.Errorf(wire.CodeInvalidArgument, "retention %v is not a whole number of milliseconds", *u.Retention))
		}
		f.Set |= wire.SetRetentionMs
		f.RetentionMs = u.Retention.Milliseconds()
	}
	if u.RetentionBytes != nil {
		f.Set |= wire.SetRetentionBytes
		f.RetentionBytes = *u.RetentionBytes
	}
	if err := wire.ValidateName("topic", name); err != nil {
		return TopicConfig{}, 0, fmt.Errorf("nereus: update topic: %w", err)
	}
	if err := f.Validate(); err != nil {
		return TopicConfig{}, 0, fmt.Errorf("nereus: update topic %s: %w", name, err)
	}
	if cn, err := c.leaderConn(ctx, wire.CoordinatorTopic, 0, true); err == nil && !cn.topicUpdates {
		return TopicConfig{}, 0, fmt.Errorf("nereus: update topic %s: the broker speaks a protocol version below %d, which cannot update a topic",
			name, wire.VersionTopicUpdate)
	}
	reply, err := c.coordinatorRequest(ctx, &f)
	if err != nil {
		return TopicConfig{}, 0, fmt.Errorf("nereus: update topic %s: %w", name, err)
	}
	ok, isOK := reply.(*wire.TopicUpdateOK)
	if !isOK {
		return TopicConfig{}, 0, unexpected("TOPIC_UPDATE", reply)
	}
	return topicConfigFromWire(ok.Topic), ok.Incarnation, nil
}

// topics asks METADATA for the routing cache, reporting whether that
// changed.
func (c *Client) topics(ctx context.Context, names ...string) ([]TopicInfo, bool, error) {
	reply, err := c.idempotentRequest(ctx, &wire.Metadata{Topics: names})
	if err != nil {
		return nil, false, fmt.Errorf("nereus: metadata: %w", err)
	}
	ok, isOK := reply.(*wire.MetadataOK)
	if !isOK {
		return nil, false, unexpected("METADATA", reply)
	}
	changed := c.storeMetadata(ok.Topics)
	return topicInfos(ok.Topics), changed, nil
}

func topicInfos(topics []wire.TopicInfo) []TopicInfo {
	out := make([]TopicInfo, 0, len(topics))
	for _, t := range topics {
		info := TopicInfo{Config: topicConfigFromWire(t.Config), Incarnation: t.Incarnation}
		for _, p := range t.Partitions {
			pi := PartitionInfo{
				Partition: int(p.Partition), Epoch: p.Epoch, StartSeq: p.StartSeq, CommitSeq: p.CommitSeq,
				Leader: p.Leader, LeaderAddr: p.LeaderAddr, ReadOnly: p.ReadOnly,
				Corrupt: p.State == wire.PartitionStateCorrupt,
			}
			for _, r := range p.Replicas {
				pi.Replicas = append(pi.Replicas, ReplicaInfo{Node: r.Node, State: r.State, FlushedSeq: r.FlushedSeq})
			}
			info.Partitions = append(info.Partitions, pi)
		}
		out = append(out, info)
	}
	return out
}

func unexpected(req string, f wire.Frame) error {
	if f == nil {
		return fmt.Errorf("nereus: %s: empty reply: %w", req, wire.ErrBadFrame)
	}
	return fmt.Errorf("nereus: %s: unexpected reply %s: %w", req, f.Type(), wire.ErrBadFrame)
}
