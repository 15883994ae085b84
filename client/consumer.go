package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Consumer defaults and batching bounds (DESIGN.md §2: credits and acks
// return in batches of 32 messages / 1 MiB / low watermark / 20 ms).
const (
	DefaultCredit           = 512
	CreditMax               = 1 << 16
	creditBatchMessagesMax  = 32
	creditBatchBytesMax     = 1 << 20
	creditBatchDelay        = 20 * time.Millisecond
	ackBatchEntriesMax      = 32
	ackBatchDelay           = 20 * time.Millisecond
	resubscribeDelay        = 100 * time.Millisecond
	consumerCloseAckWaitMax = 5 * time.Second
	// A lane whose PULL was refused (NOT_LEADER, UNAVAILABLE: the node
	// delivers nothing of the topic for now) subscribes again after
	// laneRetryDelay plus up to laneRetryJitter.
	laneRetryDelay  = 200 * time.Millisecond
	laneRetryJitter = 300 * time.Millisecond
	// laneReconcileEvery is how often the consumer asks for the topic's
	// metadata to open lanes at nodes that became leaders.
	laneReconcileEvery = time.Second
)

// ConsumerOptions configure a Consumer.
type ConsumerOptions struct {
	// Credit bounds the messages granted by each node serving the
	// consumer (each lane) and not yet taken by Next (default 512): the
	// consumer's buffer holds at most Credit messages per lane.
	Credit int
	// AckWait is the redelivery timeout of an unacked message; it
	// configures the group when the broker first creates it (0 = broker
	// default).
	AckWait time.Duration
	// MaxDeliver bounds deliveries of one message (0 = broker default);
	// like AckWait it applies when the group is created.
	MaxDeliver int
	// MessagesMax, when positive, is how many messages this consumer will
	// take with Next in all: it never grants credit beyond it, summed over
	// every node serving it, so no message is delivered to it only to be
	// dropped at Close (and counted toward MaxDeliver). 0 = unbounded.
	// Credit granted to a node stays there until that node uses it: with
	// several lanes, a node with nothing to deliver may hold part of the
	// budget while another has messages.
	MessagesMax int

	// Member, when set, makes the consumer a member of its group under
	// this id: the group's coordinator assigns it partitions — each
	// partition to one member at a time (unless Shared) — and it is
	// delivered only those; rebalances move only the partitions that must
	// move. Without Member every consumer of the group competes for every
	// partition, which a group with members refuses.
	Member string
	// Shared joins the group in shared mode: every member competes for
	// every partition (a work queue), no per-partition order.
	Shared bool
	// SessionTimeout: the coordinator fences a member it has not heard
	// from for this long (0 = broker default, 10s). RebalanceTimeout: it
	// fences a member that has not answered a REVOKE within it (0 = 30s).
	SessionTimeout, RebalanceTimeout time.Duration
	// OnAssigned is called with the partitions the member starts to hold.
	// OnRevoked is called with the partitions it must give up: messages of
	// those partitions not yet taken by Next or Handle are dropped, and
	// acks made before OnRevoked returns are sent before the coordinator
	// hears that the partitions are free. OnRevoked runs while no Handle
	// callback runs (the revoke waits for them), so a message handled and
	// acked in Handle is never also handled by the partition's next
	// holder; a message taken by Next may be, if its ack comes after
	// OnRevoked returned. Both run on the membership goroutine, which
	// sends no heartbeat meanwhile; keep them short, and call neither
	// Handle nor Close from them.
	OnAssigned, OnRevoked func(partitions []int)
}

// ConsumerStats counts the outcomes of acks, summed over the consumer's
// lanes.
type ConsumerStats struct {
	Delivered  uint64 // messages returned by Next
	Acked      uint64 // acks the broker confirmed
	StaleAcks  uint64 // acks rejected with STALE_DELIVERY
	FailedAcks uint64 // acks that failed otherwise (e.g. disconnected, NOT_LEADER)
	// Resubscribe counts subscriptions made after the first ones: a lane
	// opened after Subscribe (after a reconnect, or at a node that became
	// a leader), and a lane's subscription, made again after its node
	// ended or refused the one before, that delivers.
	Resubscribe uint64
}

// Consumer receives the messages of one (topic, group) through credit-based
// flow control. Next is safe for concurrent use.
//
// The consumer holds one lane per broker node that leads a partition of
// the topic, as the client's metadata names them (one lane on a single
// node): a subscription (PULL) on the connection to that node, with its
// own credit window, and a background pump that returns that lane's
// credit in batches and sends the acks of the messages it delivered, in
// batches, to that same node. Messages of every lane meet in one buffer
// read by Next. A lane lives as long as its connection; when one is lost,
// when a PULL (the first time in a row), ACK or NACK is refused with
// NOT_LEADER or UNAVAILABLE or an ack is answered STALE_DELIVERY, and about
// every second besides, the consumer refreshes the metadata and opens
// lanes at leaders it has none at (rate-limited). A node that refuses a lane's PULL
// with NOT_LEADER or UNAVAILABLE (it does not serve the group: on brokers
// where one coordinator — the leader of partition 0 — delivers the whole
// topic, every other node) gets the PULL again a few hundred milliseconds
// later; the consumer goes on with its other lanes.
//
// An ack goes to the node that delivered the message. Acks refused as a
// whole with NOT_LEADER or UNAVAILABLE, or whose answer was lost with
// their connection, may have been durable: they are asked again at each
// partition's leader (rerouteAcks), whose answer is final. Acks still
// queued when their lane's connection is lost fail. Per entry
// STALE_DELIVERY means the message was redelivered meanwhile (for example
// by a partition's new leader).
type Consumer struct {
	client    *Client
	key       subKey
	creditMax int
	// messagesMax bounds the credit ever granted: taken + queued + Σ over
	// lanes (outstanding + unreturned) ≤ messagesMax (0 = unbounded).
	messagesMax int

	ready     chan struct{} // capacity 1: a message was queued or err set
	reconcile chan struct{} // capacity 1: refresh the metadata and open missing lanes
	closed    chan struct{}
	pumpDone  chan struct{} // closed when every lane stopped and the acks are answered

	closeOnce sync.Once

	mu    sync.Mutex
	pull  wire.Pull        // template of every PULL (Credit set per send)
	queue []*Message       // received, not yet taken; ≤ creditMax per lane
	lanes map[string]*lane // live lanes by node
	err   error            // terminal subscription error
	// lanesRun counts lane pumps; only Subscribe (before the manager
	// starts) and the manager add to it.
	lanesRun sync.WaitGroup

	delivered, acked, staleAcks, failedAcks, resubscribes atomic.Uint64
	acksInFlight                                          sync.WaitGroup
	// acksOut counts the ACKs in flight too, for a revoke's flush, which
	// may not Wait on acksInFlight while lanes add to it.
	acksOut atomic.Int64

	// member is the consumer's group membership (nil without
	// ConsumerOptions.Member).
	member                *groupMember
	onAssigned, onRevoked func([]int)

	// handling excludes a revoke from the Handle callbacks: Handle holds
	// it for reading from taking a message until its callback returns;
	// release holds it for writing from dropping the revoked partitions'
	// messages until their acks are answered. Taken before co.mu, never
	// while holding it.
	handling sync.RWMutex
	// revokeWaitsForHandler, when set (tests), is called when a revoke
	// finds a Handle callback running and is about to wait for it.
	revokeWaitsForHandler func()
}

// lane is the consumer's subscription at one node: a connection, the
// credit granted there, the acks of what it delivered, and the pump
// goroutine that serves them. A lane never changes connection; when its
// connection is lost the lane ends and the consumer opens another.
type lane struct {
	co   *Consumer
	node string // cn's node id (its address if the node named none)
	cn   *conn

	acks     chan ackRequest    // bounded queue of acks for the pump
	kick     chan struct{}      // capacity 1: the pump has work
	flushReq chan chan struct{} // a revoke: send the ack batch now, then close the channel
	stopping chan struct{}      // closed when the pump stops taking acks
	ackMu    sync.RWMutex       // enqueuers hold it for reading; stop takes it to set ended
	ended    bool               // guarded by ackMu: acks can no longer reach the pump
	done     chan struct{}      // closed when the pump has returned

	// Guarded by co.mu.
	subscribed      bool      // attached to cn's subscription of (topic, group)
	subCorr         uint64    // its correlation id
	outstanding     int       // credit the node holds for this lane
	queued          int       // messages of this lane in co.queue
	unreturned      int       // credit freed by Next, not yet sent in a PULL
	unreturnedBytes int       // payload bytes of those messages
	firstUnreturned time.Time // when unreturned went from 0 to more
	resubscribeAt   time.Time // no PULL before this after a refusal (zero: at once)
	fromSub         int       // messages received on the current subscription
	refusals        int       // subscriptions ended in a row without a message
	gone            bool      // the lane ended: it grants no more credit
}

// ackRequest is one ack handed to a lane's pump; done (capacity 1) is nil
// for async acks.
type ackRequest struct {
	entry wire.AckEntry
	done  chan error
}

// Subscribe starts consuming topic as a member of group. It checks that the
// topic exists (ErrNotFound otherwise). One Client can hold one Consumer per
// (topic, group) at a time.
func (c *Client) Subscribe(ctx context.Context, topic, group string, opts ConsumerOptions) (*Consumer, error) {
	if err := wire.ValidateName("topic", topic); err != nil {
		return nil, fmt.Errorf("nereus: subscribe: %w", err)
	}
	if err := wire.ValidateName("group", group); err != nil {
		return nil, fmt.Errorf("nereus: subscribe: %w", err)
	}
	if opts.Credit <= 0 {
		opts.Credit = DefaultCredit
	}
	if opts.Credit > CreditMax || opts.AckWait < 0 || opts.MaxDeliver < 0 || opts.MessagesMax < 0 || opts.SessionTimeout < 0 || opts.RebalanceTimeout < 0 {
		return nil, fmt.Errorf("nereus: subscribe: credit must be 1-%d, AckWait, MaxDeliver, MessagesMax and the timeouts not negative: %w", CreditMax, wire.ErrInvalidArgument)
	}
	if opts.Member == "" && (opts.Shared || opts.OnAssigned != nil || opts.OnRevoked != nil || opts.SessionTimeout != 0 || opts.RebalanceTimeout != 0) {
		return nil, fmt.Errorf("nereus: subscribe: Shared, the timeouts and the callbacks need a Member: %w", wire.ErrInvalidArgument)
	}
	infos, err := c.Topics(ctx, topic) // also fills the routing cache
	if err != nil {
		return nil, fmt.Errorf("nereus: subscribe %s: %w", topic, err)
	}
	if len(infos) == 0 {
		return nil, fmt.Errorf("nereus: subscribe: topic %q: %w", topic, wire.ErrNotFound)
	}
	co := newConsumer(c, subKey{topic, group}, opts)
	if opts.Member != "" {
		co.member = newGroupMember(co, opts)
		if err := co.member.joinOnce(ctx); err != nil {
			return nil, fmt.Errorf("nereus: subscribe %s/%s: join: %w", topic, group, err)
		}
	}
	lanes, err := co.openLanes(ctx, true)
	if err != nil {
		co.mu.Lock()
		for _, l := range lanes {
			l.detachLocked()
		}
		co.mu.Unlock()
		return nil, fmt.Errorf("nereus: subscribe %s/%s: %w", topic, group, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-co.closed:
		case <-co.client.closed:
		}
		cancel()
	}()
	for _, l := range lanes {
		co.startLane(ctx, l)
	}
	go co.manage(ctx)
	if co.member != nil {
		go co.member.run()
	}
	return co, nil
}

func newConsumer(c *Client, key subKey, opts ConsumerOptions) *Consumer {
	return &Consumer{
		client:      c,
		key:         key,
		creditMax:   opts.Credit,
		messagesMax: opts.MessagesMax,
		pull: wire.Pull{
			Topic: key.topic, Group: key.group,
			AckWaitMs:  uint32(min(opts.AckWait.Milliseconds(), 1<<32-1)),
			MaxDeliver: uint32(opts.MaxDeliver),
		},
		ready:      make(chan struct{}, 1),
		reconcile:  make(chan struct{}, 1),
		closed:     make(chan struct{}),
		pumpDone:   make(chan struct{}),
		lanes:      map[string]*lane{},
		onAssigned: opts.OnAssigned,
		onRevoked:  opts.OnRevoked,
	}
}

// openLanes opens a lane at every node the metadata cache names as the
// leader of a partition of the topic and that has no live lane yet — at
// least one lane in all: with no leader known, at any live connection. It
// returns the lanes opened, whose pumps the caller starts. An error is
// returned only for a terminal failure (closed client, refused
// credentials, a subscription this client already holds); with strict
// (Subscribe) a lane that could not be attached fails the whole call.
func (co *Consumer) openLanes(ctx context.Context, strict bool) ([]*lane, error) {
	c := co.client
	c.mu.Lock()
	var routes []route
	if m := c.meta[co.key.topic]; m != nil {
		routes = slices.Clone(m.leaders)
	}
	c.mu.Unlock()
	var opened []*lane
	tried := map[route]bool{}
	open := func(part int32) error {
		cn, err := c.leaderConn(ctx, co.key.topic, part, true)
		if err != nil {
			return err
		}
		if cn == nil || co.hasLane(cn.nodeID, cn.addr) {
			return nil // the leader was not reachable: a seed answered instead
		}
		l, err := co.addLane(ctx, cn)
		if err != nil {
			if strict || errors.Is(err, wire.ErrInvalidArgument) {
				return err
			}
			return nil
		}
		opened = append(opened, l)
		return nil
	}
	for p, r := range routes {
		if r == (route{}) || tried[r] || co.hasLane(r.leader, r.addr) {
			continue
		}
		tried[r] = true
		if err := open(int32(p)); err != nil {
			return opened, err
		}
	}
	co.mu.Lock()
	none := len(co.lanes) == 0
	co.mu.Unlock()
	if none {
		// No leader known (or none reachable): any node, as a seed. A
		// node that does not serve the group refuses the PULL, and the
		// lane asks again while the metadata is refreshed.
		if err := open(-1); err != nil {
			return opened, err
		}
	}
	return opened, nil
}

// hasLane reports whether a live lane reaches the node named by id or
// addr (either may be "").
func (co *Consumer) hasLane(id, addr string) bool {
	co.mu.Lock()
	defer co.mu.Unlock()
	for _, l := range co.lanes {
		if !l.gone && !l.cn.isDead() && (id != "" && l.cn.nodeID == id || addr != "" && l.cn.addr == addr) {
			return true
		}
	}
	return false
}

// addLane makes a lane on cn and subscribes it (the first PULL). A send
// failure still returns the lane: its pump sees the connection end.
func (co *Consumer) addLane(ctx context.Context, cn *conn) (*lane, error) {
	node := cn.node()
	l := &lane{
		co: co, node: node, cn: cn,
		acks:     make(chan ackRequest, co.creditMax),
		kick:     make(chan struct{}, 1),
		flushReq: make(chan chan struct{}, 1),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
	}
	co.mu.Lock()
	if old := co.lanes[node]; old != nil && !old.gone && !old.cn.isDead() {
		co.mu.Unlock()
		return nil, fmt.Errorf("nereus: a lane at %s exists: %w", node, ErrDisconnected)
	}
	co.lanes[node] = l // replaces a lane whose connection died: it ends by itself
	co.mu.Unlock()
	if err := l.subscribe(ctx); err != nil && !errors.Is(err, ErrDisconnected) {
		co.mu.Lock()
		l.gone = true
		if co.lanes[node] == l {
			delete(co.lanes, node)
		}
		co.mu.Unlock()
		return nil, err
	}
	return l, nil
}

// startLane runs l's pump.
func (co *Consumer) startLane(ctx context.Context, l *lane) {
	co.lanesRun.Add(1)
	go l.pump(ctx)
}

// manage runs until Close: it opens lanes at new leaders (when a lane
// asks, and every laneReconcileEvery), then, at Close, waits for the
// lanes' acks and detaches their subscriptions.
func (co *Consumer) manage(ctx context.Context) {
	defer close(co.pumpDone)
	tick := time.NewTicker(laneReconcileEvery)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-co.reconcile:
			// A lane lost its connection or met NOT_LEADER: the leaders
			// may have moved. Rate-limited, shared with producers.
			co.client.awaitRefresh(ctx, co.key.topic)
		case <-tick.C:
			rctx, cancel := co.client.withRequestTimeout(ctx)
			_, _, _ = co.client.topics(rctx, co.key.topic) // stores the leaders
			cancel()
		}
		if ctx.Err() != nil {
			break
		}
		opened, err := co.openLanes(ctx, false)
		for _, l := range opened {
			co.resubscribes.Add(1)
			co.startLane(ctx, l)
		}
		if err != nil && ctx.Err() == nil && !IsRetryable(err) {
			co.setErr(fmt.Errorf("nereus: subscription %s/%s: %w", co.key.topic, co.key.group, err))
		}
	}
	co.lanesRun.Wait() // each sent what it held, or failed it
	wait := min(co.client.opts.RequestTimeout, consumerCloseAckWaitMax)
	t := time.NewTimer(wait)
	defer t.Stop()
	done := make(chan struct{})
	go func() { co.acksInFlight.Wait(); close(done) }()
	select {
	case <-done:
	case <-t.C:
	}
	co.mu.Lock()
	for _, l := range co.lanes {
		l.detachLocked()
	}
	co.mu.Unlock()
	co.setErr(fmt.Errorf("nereus: consumer %s/%s: %w", co.key.topic, co.key.group, ErrClosed))
}

// askReconcile asks the manager to refresh the metadata and open lanes.
func (co *Consumer) askReconcile() {
	select {
	case co.reconcile <- struct{}{}:
	default:
	}
}

// liveLanes returns the lanes whose pumps may still run.
func (co *Consumer) liveLanes() []*lane {
	co.mu.Lock()
	defer co.mu.Unlock()
	out := make([]*lane, 0, len(co.lanes))
	for _, l := range co.lanes {
		out = append(out, l)
	}
	return out
}

// setIncarnation makes the next PULLs a member incarnation's; every lane's
// subscription of an earlier incarnation is dropped and made again.
func (co *Consumer) setIncarnation(member string, inc uint64) {
	co.mu.Lock()
	co.pull.Member, co.pull.Incarnation = member, inc
	lanes := make([]*lane, 0, len(co.lanes))
	for _, l := range co.lanes {
		l.resubscribeAt = time.Time{}
		if l.subscribed {
			// Unrouted first: a MSG arriving after endSubLocked would
			// count as credit exceeded.
			l.cn.dropSub(co.key, l)
			l.endSubLocked()
		}
		lanes = append(lanes, l)
	}
	co.mu.Unlock()
	for _, l := range lanes {
		l.wake()
	}
}

// release gives up partitions: it waits for the Handle callbacks running,
// then their messages not yet taken are dropped (the broker redelivers
// them to the next holder), OnRevoked runs, and the acks made so far are
// sent by every lane and answered (bounded by RequestTimeout). The
// member's view no longer holds parts when release is called, so a Handle
// that starts meanwhile does not take their messages.
func (co *Consumer) release(parts []int) {
	if !co.handling.TryLock() {
		if co.revokeWaitsForHandler != nil {
			co.revokeWaitsForHandler()
		}
		co.handling.Lock()
	}
	defer co.handling.Unlock()
	co.mu.Lock()
	kept := co.queue[:0]
	for _, m := range co.queue {
		if !slices.Contains(parts, m.Partition) {
			kept = append(kept, m)
		} else if m.lane != nil {
			m.lane.queued--
		}
	}
	clear(co.queue[len(kept):])
	co.queue = kept
	co.mu.Unlock()
	for _, l := range co.liveLanes() {
		l.wake() // the freed credit goes back
	}
	if co.onRevoked != nil {
		co.onRevoked(parts)
	}
	t := time.NewTimer(co.client.opts.RequestTimeout)
	defer t.Stop()
	type flush struct {
		l    *lane
		done chan struct{}
	}
	var flushes []flush
	for _, l := range co.liveLanes() {
		done := make(chan struct{})
		select {
		case l.flushReq <- done:
			l.wake()
			flushes = append(flushes, flush{l, done})
		case <-l.done:
		case <-co.closed:
			return
		case <-t.C:
			return
		}
	}
	for _, f := range flushes {
		select {
		case <-f.done:
		case <-f.l.done: // ended: its acks were sent or failed
		case <-co.closed:
			return
		case <-t.C:
			return
		}
	}
	// Every ack taken in so far is sent: wait for the answers.
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	for co.acksOut.Load() > 0 {
		select {
		case <-poll.C:
		case <-co.closed:
			return
		case <-t.C:
			return
		}
	}
}

// subscribe attaches the lane to its connection's subscription of (topic,
// group) and grants the credit its window has room for.
func (l *lane) subscribe(ctx context.Context) error {
	co := l.co
	corr, existed, leftover, err := l.cn.attachSub(co.key, l)
	if err != nil {
		return err
	}
	co.mu.Lock()
	l.subscribed, l.subCorr = true, corr
	l.outstanding = leftover
	l.unreturned, l.unreturnedBytes, l.fromSub = 0, 0, 0
	co.topUpLocked(l)
	n := l.unreturned
	co.mu.Unlock()
	if !existed && n == 0 {
		// The window is full of messages not yet taken (or MessagesMax
		// is reached); the first PULL goes out as soon as Next frees room.
		return nil
	}
	return l.returnCredit(ctx, true)
}

// topUpLocked adds to l's unreturned credit what its window has room for,
// within MessagesMax over every lane. Caller holds co.mu.
func (co *Consumer) topUpLocked(l *lane) {
	if !l.subscribed || l.gone {
		return
	}
	room := co.creditMax - l.queued - l.outstanding - l.unreturned
	if co.messagesMax > 0 && room > 0 {
		granted := co.grantedLocked()
		if co.lanes[l.node] != l {
			granted += l.outstanding + l.unreturned
		}
		room = min(room, co.messagesMax-granted)
	}
	if room <= 0 {
		return
	}
	if l.unreturned == 0 {
		l.firstUnreturned = time.Now()
	}
	l.unreturned += room
}

// grantedLocked is the credit granted so far that may still bring a
// message to Next: taken + queued + Σ over live lanes (outstanding +
// unreturned). Caller holds co.mu.
func (co *Consumer) grantedLocked() int {
	granted := int(co.delivered.Load()) + len(co.queue)
	for _, l := range co.lanes {
		granted += l.outstanding + l.unreturned
	}
	return granted
}

// endSubLocked forgets l's subscription (ended by the broker, or of an
// earlier incarnation): its credit is gone with it. Caller holds co.mu.
func (l *lane) endSubLocked() {
	l.subscribed = false
	l.outstanding, l.unreturned, l.unreturnedBytes = 0, 0, 0
}

// detachLocked leaves l's subscription to a later consumer of the same
// (topic, group) on this connection, with the credit granted and unused.
// Caller holds co.mu.
func (l *lane) detachLocked() {
	if l.subscribed {
		l.cn.detachSub(l.co.key, l, l.outstanding)
		l.endSubLocked()
	}
	l.gone = true
}

// returnCredit sends a PULL with the credit freed by Next when a batching
// threshold is met (or force).
func (l *lane) returnCredit(ctx context.Context, force bool) error {
	co := l.co
	co.mu.Lock()
	if !l.subscribed || l.unreturned == 0 {
		co.mu.Unlock()
		return nil
	}
	due := force ||
		l.unreturned >= creditBatchMessagesMax ||
		l.unreturnedBytes >= creditBatchBytesMax ||
		l.outstanding <= co.creditMax/4 ||
		time.Since(l.firstUnreturned) >= creditBatchDelay
	if !due {
		co.mu.Unlock()
		return nil
	}
	n := l.unreturned
	l.outstanding += n
	l.unreturned, l.unreturnedBytes = 0, 0
	corr := l.subCorr
	pull := co.pull
	co.mu.Unlock()
	pull.Credit = uint32(n)
	return l.cn.send(ctx, corr, &pull)
}

// onStream receives a MSG or ERR of the lane's subscription, on its
// connection's reader goroutine. It reports whether the lane took the
// frame.
func (l *lane) onStream(cn *conn, f wire.Frame, err error) bool {
	co := l.co
	if err != nil {
		if errors.Is(err, ErrDisconnected) || errors.Is(err, ErrClosed) {
			return true // the pump sees cn.done
		}
		co.mu.Lock()
		ask := false
		if l.subscribed {
			if l.fromSub > 0 {
				l.refusals = 0
			}
			l.refusals++
			l.endSubLocked()
			if !IsRetryable(err) {
				co.err = fmt.Errorf("nereus: subscription %s/%s at %s: %w", co.key.topic, co.key.group, cn.addr, err)
			} else {
				// NOT_LEADER, UNAVAILABLE: this node does not serve the
				// group now. Ask again later; look for moved leaders the
				// first time.
				l.resubscribeAt = time.Now().Add(laneRetryDelay + rand.N(laneRetryJitter))
				ask = l.refusals == 1 && routeMayHaveMoved(err)
			}
		}
		co.mu.Unlock()
		cn.dropSub(co.key, l)
		if ask {
			co.askReconcile()
		}
		co.signalReady()
		l.wake()
		return true
	}
	m, ok := f.(*wire.Msg)
	if !ok {
		return true
	}
	co.mu.Lock()
	if !l.subscribed {
		co.mu.Unlock()
		return false
	}
	if l.outstanding <= 0 {
		co.mu.Unlock()
		cn.fail(errCreditExceeded)
		return true
	}
	l.outstanding--
	if l.queued >= co.creditMax {
		// Only possible with credit inherited from a detached consumer of
		// larger credit; the broker redelivers after AckWait.
		co.mu.Unlock()
		return true
	}
	l.queued++
	l.fromSub++
	if l.fromSub == 1 && l.refusals > 0 {
		co.resubscribes.Add(1) // a subscription made again delivers
	}
	co.queue = append(co.queue, messageFromWire(co, l, m))
	co.mu.Unlock()
	co.signalReady()
	return true
}

func (co *Consumer) signalReady() {
	select {
	case co.ready <- struct{}{}:
	default:
	}
}

func (l *lane) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Next returns the next message, waiting until one arrives, ctx ends, the
// consumer is closed, or the subscription fails terminally.
//
// For a member, Next returns only messages of partitions it holds, but the
// partition may be revoked (OnRevoked) before the caller acks the message:
// its ack is then stale and its next holder gets it too. Handle closes
// that window.
func (co *Consumer) Next(ctx context.Context) (*Message, error) {
	for {
		m, err := co.take()
		if m != nil || err != nil {
			return m, err
		}
		if err := co.awaitReady(ctx); err != nil {
			return nil, err
		}
	}
}

// Handle takes the next message as Next does and calls fn with it,
// returning fn's error. For a member, a revoke of the message's partition
// waits for fn to return: acks fn makes (Ack or AckSync) reach the broker
// before the coordinator hears the partition is free, and a message whose
// partition was revoked before fn could be called is not handed to fn (and
// does not count toward MessagesMax): its next holder gets it. So a
// message handled and acked in fn is handled by no other member, unless
// its ack fails (Stats) or is not answered within RequestTimeout, or this
// member is fenced meanwhile (silent past its session timeout).
//
// fn runs while the consumer's revokes wait: keep it short (a revoke that
// waits past RebalanceTimeout fences the member, and the membership
// goroutine sends no heartbeat while it waits), and do not call Handle,
// Next or Close from it. Handle is safe for concurrent use; calls run their
// callbacks at once, and a revoke waits for all of them.
func (co *Consumer) Handle(ctx context.Context, fn func(*Message) error) error {
	for {
		co.handling.RLock()
		m, err := co.take()
		if m != nil {
			defer co.handling.RUnlock()
			return fn(m)
		}
		co.handling.RUnlock()
		if err != nil {
			return err
		}
		if err := co.awaitReady(ctx); err != nil {
			return err
		}
	}
}

// awaitReady waits until a message may have been queued or an error set,
// ctx ends or the consumer is closed.
func (co *Consumer) awaitReady(ctx context.Context) error {
	select {
	case <-co.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-co.closed:
		return ErrClosed
	}
}

// take returns the first queued message of a partition the member holds
// (nil if none is queued), or the terminal subscription error when none
// is queued.
func (co *Consumer) take() (*Message, error) {
	for {
		co.mu.Lock()
		if len(co.queue) > 0 {
			m := co.queue[0]
			co.queue[0] = nil
			co.queue = co.queue[1:]
			if len(co.queue) == 0 {
				co.queue = co.queue[:0:0] // let the backing array go
			}
			l := m.lane
			l.queued--
			if co.member != nil && !co.member.holds(uint32(m.Partition)) {
				// Of a partition given up: the broker redelivers it to
				// its holder. Its credit comes back.
				co.topUpLocked(l)
				co.mu.Unlock()
				co.wakeLanes(l)
				continue
			}
			co.delivered.Add(1)
			before := l.unreturned
			co.topUpLocked(l)
			if l.unreturned > before {
				l.unreturnedBytes += m.payloadBytes()
			}
			more := len(co.queue) > 0
			co.mu.Unlock()
			co.wakeLanes(l)
			if more {
				co.signalReady()
			}
			return m, nil
		}
		err := co.err
		co.mu.Unlock()
		return nil, err
	}
}

// wakeLanes wakes l's pump to return credit; with MessagesMax every lane's,
// since room under the bound may go to any.
func (co *Consumer) wakeLanes(l *lane) {
	if co.messagesMax == 0 {
		l.wake()
		return
	}
	for _, x := range co.liveLanes() {
		x.wake()
	}
}

// Buffered returns the number of received messages not yet taken by Next.
func (co *Consumer) Buffered() int {
	co.mu.Lock()
	defer co.mu.Unlock()
	return len(co.queue)
}

// Stats returns the consumer's counters.
func (co *Consumer) Stats() ConsumerStats {
	return ConsumerStats{
		Delivered:   co.delivered.Load(),
		Acked:       co.acked.Load(),
		StaleAcks:   co.staleAcks.Load(),
		FailedAcks:  co.failedAcks.Load(),
		Resubscribe: co.resubscribes.Load(),
	}
}

// enqueueAck hands an ack to the pump of the lane that delivered the
// message. A lane that ended (its connection was lost) fails it at once.
func (co *Consumer) enqueueAck(ctx context.Context, l *lane, e wire.AckEntry, done chan error) error {
	select {
	case <-co.closed:
		return ErrClosed
	default:
	}
	l.ackMu.RLock()
	defer l.ackMu.RUnlock()
	lost := func() error {
		select {
		case <-co.closed:
			return ErrClosed
		default:
		}
		co.failAcks([]ackRequest{{entry: e, done: done}}, fmt.Errorf("nereus: ack: %w", l.cn.failure()))
		return nil
	}
	if l.ended {
		return lost()
	}
	select {
	case l.acks <- ackRequest{entry: e, done: done}:
		return nil
	case <-l.stopping:
		return lost()
	case <-co.closed:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// nack sends a NACK to the node that delivered the message.
func (co *Consumer) nack(ctx context.Context, l *lane, e wire.AckEntry, delay time.Duration) error {
	ctx, cancel := co.client.withRequestTimeout(ctx)
	defer cancel()
	reply, err := l.cn.roundTrip(ctx, &wire.Nack{
		Topic: co.key.topic, Group: co.key.group,
		DelayMs: uint32(min(max(delay.Milliseconds(), 0), 1<<32-1)), Entries: []wire.AckEntry{e},
	})
	if err != nil {
		if hasCode(err, wire.CodeNotLeader, wire.CodeUnavailable) {
			co.askReconcile()
		}
		return fmt.Errorf("nereus: nack %d/%d: %w", e.Partition, e.Seq, err)
	}
	ok, isOK := reply.(*wire.AckOK)
	if !isOK || len(ok.Results) != 1 {
		return unexpected("NACK", reply)
	}
	if ok.Results[0] != wire.CodeOK {
		return fmt.Errorf("nereus: nack %d/%d: %w", e.Partition, e.Seq, &wire.Error{Code: ok.Results[0]})
	}
	return nil
}

// stop makes the lane take no more acks: enqueuers waiting give up, later
// ones fail at once; what is queued stays for the pump to take.
func (l *lane) stop() {
	close(l.stopping)
	l.ackMu.Lock()
	l.ended = true
	l.ackMu.Unlock()
}

// pump runs until Close or until the lane's connection is lost: it
// subscribes again after a refusal, returns credit and sends acks.
func (l *lane) pump(ctx context.Context) {
	co, cn := l.co, l.cn
	defer co.lanesRun.Done()
	defer close(l.done)
	var batch []ackRequest
	var batchStart time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	for {
		co.mu.Lock()
		needSub := !l.subscribed && co.err == nil && !time.Now().Before(l.resubscribeAt)
		co.mu.Unlock()
		if needSub {
			if err := l.subscribe(ctx); err != nil && !errors.Is(err, ErrDisconnected) {
				co.setErr(fmt.Errorf("nereus: subscription %s/%s: %w", co.key.topic, co.key.group, err))
			}
		}
		co.mu.Lock()
		co.topUpLocked(l) // room under MessagesMax another lane freed
		co.mu.Unlock()
		_ = l.returnCredit(ctx, false) // a failure shows up as cn.done
		if len(batch) > 0 && (len(batch) >= ackBatchEntriesMax || hasWaiter(batch) || time.Since(batchStart) >= ackBatchDelay) {
			co.sendAcks(l, batch)
			batch = nil
		}

		// Next wake-up: an ack batch or unreturned credit coming due, or a
		// subscription after a refusal.
		var wake time.Time
		consider := func(t time.Time) {
			if wake.IsZero() || t.Before(wake) {
				wake = t
			}
		}
		if len(batch) > 0 {
			consider(batchStart.Add(ackBatchDelay))
		}
		co.mu.Lock()
		if l.unreturned > 0 && l.subscribed {
			consider(l.firstUnreturned.Add(creditBatchDelay))
		}
		if !l.subscribed && co.err == nil {
			consider(l.resubscribeAt)
		}
		co.mu.Unlock()
		wait := time.Hour
		if !wake.IsZero() {
			wait = max(time.Until(wake), 0)
		}
		timer.Reset(wait)

		select {
		case <-ctx.Done():
			l.finish(batch)
			return
		case <-cn.done:
			l.lost(batch)
			return
		case a := <-l.acks:
			if len(batch) == 0 {
				batchStart = time.Now()
			}
			batch = append(batch, a)
			// Take whatever else is queued without waiting.
			for len(batch) < ackBatchEntriesMax {
				select {
				case a := <-l.acks:
					batch = append(batch, a)
					continue
				default:
				}
				break
			}
		case <-l.kick:
		case <-timer.C:
		case done := <-l.flushReq:
			// A revoke: the acks taken in go out now; the revoke then
			// waits for their answers.
			batch = l.takeQueuedAcks(batch)
			co.sendAllAcks(l, batch)
			batch = nil
			cn.flush()
			close(done)
		}
	}
}

// lost ends a lane whose connection failed: its unsent acks fail (their
// messages are redelivered), and the consumer looks for the leaders again.
func (l *lane) lost(batch []ackRequest) {
	co := l.co
	l.stop()
	co.mu.Lock()
	l.endSubLocked()
	l.gone = true
	if co.lanes[l.node] == l {
		delete(co.lanes, l.node)
	}
	co.mu.Unlock()
	batch = l.takeQueuedAcks(batch)
	co.failAcks(batch, fmt.Errorf("nereus: ack: %w", l.cn.failure()))
	co.askReconcile()
}

// finish runs at Close: the lane sends every ack queued for it; the
// manager waits for the answers, then detaches the subscription.
func (l *lane) finish(batch []ackRequest) {
	co := l.co
	l.stop()
	batch = l.takeQueuedAcks(batch)
	if !l.cn.isDead() {
		co.sendAllAcks(l, batch)
		l.cn.flush()
	} else {
		co.failAcks(batch, fmt.Errorf("nereus: ack: %w", ErrClosed))
	}
}

func hasWaiter(batch []ackRequest) bool {
	for _, a := range batch {
		if a.done != nil {
			return true
		}
	}
	return false
}

// setErr records a terminal subscription error for Next.
func (co *Consumer) setErr(err error) {
	co.mu.Lock()
	if co.err == nil {
		co.err = err
	}
	co.mu.Unlock()
	co.signalReady()
}

// failAcks completes acks that could not be sent.
func (co *Consumer) failAcks(batch []ackRequest, err error) {
	for _, a := range batch {
		co.failedAcks.Add(1)
		if a.done != nil {
			a.done <- err
		}
	}
}

// ackRetriesMax bounds the resends of an ACK the broker refused with a
// retryable error other than NOT_LEADER and UNAVAILABLE (its ledger write
// failed: the ack may or may not be durable, and asking again is safe —
// acks are idempotent).
const ackRetriesMax = 3

func (co *Consumer) ackStarted() { co.acksInFlight.Add(1); co.acksOut.Add(1) }
func (co *Consumer) ackEnded()   { co.acksOut.Add(-1); co.acksInFlight.Done() }

// sendAcks sends batch (at most ackBatchEntriesMax entries) as one ACK on
// l's connection; the reply completes each entry.
func (co *Consumer) sendAcks(l *lane, batch []ackRequest) {
	co.sendAcksAttempt(l.cn, batch, 0, 0)
}

// sendAcksAttempt sends batch as one ACK on cn: attempt counts its resends
// after a retryable refusal, reroutes the times it was asked again at its
// partitions' leaders (rerouteAcks; cn is then the node the metadata
// named).
func (co *Consumer) sendAcksAttempt(cn *conn, batch []ackRequest, attempt, reroutes int) {
	// Not the pump's context: acks taken in must go out even while closing.
	ctx, cancel := co.client.withRequestTimeout(context.Background())
	defer cancel()
	entries := make([]wire.AckEntry, len(batch))
	for i, a := range batch {
		entries[i] = a.entry
	}
	co.ackStarted()
	_, err := cn.request(ctx, &wire.Ack{Topic: co.key.topic, Group: co.key.group, Entries: entries},
		func(f wire.Frame, err error) {
			defer co.ackEnded()
			var werr *wire.Error
			refused := hasCode(err, wire.CodeNotLeader, wire.CodeUnavailable)
			switch {
			case refused || errors.Is(err, ErrDisconnected):
				// This node no longer serves what it delivered, or the
				// answer was lost: the ack may be durable or not. The
				// partition's leader tells.
				co.askReconcile()
				r := ackReroute{n: reroutes + 1, cause: fmt.Errorf("nereus: ack: %w", err)}
				if refused {
					r.refusedBy, r.routed = cn.node(), reroutes > 0
				}
				co.rerouteAcks(batch, r)
				return
			case attempt < ackRetriesMax && errors.As(err, &werr) && werr.Code.Retryable():
				co.ackStarted()
				time.AfterFunc(time.Duration(attempt+1)*50*time.Millisecond, func() {
					defer co.ackEnded()
					co.sendAcksAttempt(cn, batch, attempt+1, reroutes)
				})
				return
			}
			again := attempt < ackRetriesMax
			if ok, isOK := f.(*wire.AckOK); err == nil && isOK && len(ok.Results) == len(batch) &&
				(slices.Contains(ok.Results, wire.CodeNotLeader) || again && slices.Contains(ok.Results, wire.CodeUnavailable)) {
				// Entries of partitions this node does not deliver: their
				// fate is told at the partition's leader, as for an ACK
				// refused whole. Entries of a partition whose only
				// replica is this node's, not delivering yet: asked here
				// again a moment later (the ack may be durable).
				var kept, moved, retried []ackRequest
				var keptResults []wire.Code
				for i, a := range batch {
					switch {
					case ok.Results[i] == wire.CodeNotLeader:
						moved = append(moved, a)
					case ok.Results[i] == wire.CodeUnavailable && again:
						retried = append(retried, a)
					default:
						kept, keptResults = append(kept, a), append(keptResults, ok.Results[i])
					}
				}
				if len(kept) > 0 {
					co.completeAcks(kept, &wire.AckOK{Results: keptResults}, nil)
				}
				if len(retried) > 0 {
					co.ackStarted()
					time.AfterFunc(time.Duration(attempt+1)*50*time.Millisecond, func() {
						defer co.ackEnded()
						co.sendAcksAttempt(cn, retried, attempt+1, reroutes)
					})
				}
				if len(moved) > 0 {
					co.askReconcile()
					co.rerouteAcks(moved, ackReroute{n: reroutes + 1, refusedBy: cn.node(), routed: reroutes > 0,
						cause: fmt.Errorf("nereus: ack: %w", &wire.Error{Code: wire.CodeNotLeader, Message: "the node does not deliver the partition"})})
				}
				return
			}
			co.completeAcks(batch, f, err)
		})
	if err != nil {
		co.ackEnded()
		co.failAcks(batch, fmt.Errorf("nereus: ack: %w", err)) // not sent
	}
}

// ackReroutesMax bounds how many times an ack is asked again at its
// partition's leader (rerouteAcks) before it fails.
const ackReroutesMax = 5

// ackReroute is one round of rerouteAcks: the nth (from 1), the error the
// acks fail with if none is left, and the node that refused the last ask
// ("" for a lost connection) — routed when the metadata had named it the
// leader.
type ackReroute struct {
	n         int
	cause     error
	refusedBy string
	routed    bool
}

// rerouteAcks asks batch again, after a pause and a refresh of the
// metadata, at the node the metadata names the leader of each entry's
// partition now (AckFollowsItsPartition). It is for acks whose fate the
// node they went to could not tell: refused as a whole with NOT_LEADER or
// UNAVAILABLE, or entry by entry with NOT_LEADER (the node stopped
// delivering the partition, perhaps with the ack's record already
// committed), or answered by nobody (the connection was lost after they
// were sent). That leader answers OK for a seq the group has done — the
// ack was durable — and STALE_DELIVERY for one it delivers again. Before,
// these acks failed as "redelivered", and one that was durable never
// came again.
//
// Only a named leader other than the node that refused is asked: during
// an election (no leader named, or still the one that refused) any other
// node would answer NOT_LEADER again for a partition it does not
// deliver. Round n waits n × 50 ms (and for
// the refresh as long again at most); after ackReroutesMax rounds the acks
// fail with the cause. A named leader that refused a routed ask and is
// still named takes no acks there (a broker whose one coordinator
// delivers the whole topic): the acks fail at once. Acks are idempotent,
// so asking twice is safe.
func (co *Consumer) rerouteAcks(batch []ackRequest, r ackReroute) {
	if r.n > ackReroutesMax || errors.Is(r.cause, ErrClosed) {
		co.failAcks(batch, r.cause)
		return
	}
	c := co.client
	co.ackStarted()
	go func() {
		defer co.ackEnded()
		// The pause lets an election end; the refresh names its winner
		// (rate-limited: waited for a little longer at most).
		refreshed := c.refreshTopic(co.key.topic)
		pause := time.Duration(r.n) * 50 * time.Millisecond
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-c.closed:
			t.Stop()
		}
		t.Reset(pause)
		select {
		case <-refreshed:
		case <-t.C:
		}
		t.Stop()
		ctx, cancel := c.withRequestTimeout(context.Background())
		defer cancel()
		byConn := map[*conn][]ackRequest{}
		var wait []ackRequest
		for _, a := range batch {
			c.mu.Lock()
			route := c.routeLocked(co.key.topic, int32(a.entry.Partition))
			c.mu.Unlock()
			named := route.leader
			if named == "" {
				named = route.addr
			}
			switch {
			case named == r.refusedBy && r.routed:
				co.failAcks([]ackRequest{a}, fmt.Errorf("%w (%s, named the leader of partition %d, refuses seq %d)",
					r.cause, named, a.entry.Partition, a.entry.Seq))
				continue
			case named == r.refusedBy:
				wait = append(wait, a) // the metadata has not moved yet
				continue
			}
			// Only the named leader: with none named (an election) or
			// none reachable, leaderConn gives some other node.
			cn, err := c.leaderConn(ctx, co.key.topic, int32(a.entry.Partition), true)
			switch {
			case errors.Is(err, ErrClosed):
				co.failAcks([]ackRequest{a}, fmt.Errorf("nereus: ack: %w", err))
			case err != nil || cn == nil || named == "" || cn.node() != named && cn.addr != route.addr:
				wait = append(wait, a)
			default:
				byConn[cn] = append(byConn[cn], a)
			}
		}
		for cn, acks := range byConn {
			co.sendAcksAttempt(cn, acks, 0, r.n)
		}
		if len(wait) > 0 {
			next := r
			next.n++
			co.rerouteAcks(wait, next)
		}
	}()
}

// completeAcks completes batch with its answer f (or err).
func (co *Consumer) completeAcks(batch []ackRequest, f wire.Frame, err error) {
	if err == nil {
		ok, isOK := f.(*wire.AckOK)
		if !isOK || len(ok.Results) != len(batch) {
			err = unexpected("ACK", f)
		} else {
			stale := false
			for i, a := range batch {
				var aerr error
				switch code := ok.Results[i]; code {
				case wire.CodeOK:
					co.acked.Add(1)
				case wire.CodeStaleDelivery:
					stale = true
					co.staleAcks.Add(1)
					aerr = fmt.Errorf("nereus: ack %d/%d delivery %d: %w", a.entry.Partition, a.entry.Seq, a.entry.DeliveryID, &wire.Error{Code: code})
				default:
					co.failedAcks.Add(1)
					aerr = fmt.Errorf("nereus: ack %d/%d: %w", a.entry.Partition, a.entry.Seq, &wire.Error{Code: code})
				}
				if a.done != nil {
					a.done <- aerr
				}
			}
			if stale {
				// Redelivered meanwhile: after AckWait, or by the
				// partition's new leader, which may need a lane.
				co.askReconcile()
			}
			return
		}
	}
	co.failAcks(batch, fmt.Errorf("nereus: ack: %w", err))
}

// takeQueuedAcks appends every ack queued for the lane to batch.
func (l *lane) takeQueuedAcks(batch []ackRequest) []ackRequest {
	for {
		select {
		case a := <-l.acks:
			batch = append(batch, a)
		default:
			return batch
		}
	}
}

// sendAllAcks sends batch as ACKs of at most ackBatchEntriesMax entries.
func (co *Consumer) sendAllAcks(l *lane, batch []ackRequest) {
	for len(batch) > 0 {
		n := min(len(batch), ackBatchEntriesMax)
		co.sendAcks(l, batch[:n:n])
		batch = batch[n:]
	}
}

// Close stops the consumer: every lane's queued acks are sent and awaited
// (at most RequestTimeout or 5s); messages received but not taken by Next
// are dropped and redelivered by the broker after AckWait. A member then
// LEAVEs its group.
func (co *Consumer) Close() error {
	co.closeOnce.Do(func() {
		close(co.closed)
		<-co.pumpDone
		if co.member != nil {
			co.member.leave() // after the acks: its partitions move at once
		}
	})
	<-co.pumpDone
	return nil
}
