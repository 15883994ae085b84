package client

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Scheduled is a stored schedule: the broker publishes its message to
// its topic once the broker's clock reaches DeliverAt, exactly once.
type Scheduled struct {
	Shard     uint32
	ID        uint64 // names the schedule within its shard (CancelSchedule)
	DeliverAt time.Time
	// Duplicate: a retry answered with the original schedule.
	Duplicate bool
}

// Schedule stores msg for publication to topic at deliverAt (one in the
// past is due at once) and returns once the schedule is durable. The
// message is published exactly once and never before deliverAt by the
// broker's clock. Each call takes the next sequence of the client's
// producer identity, so the call's own retries (after a lost connection,
// or at a new leader of its shard) are deduplicated by the broker; a
// call waits while its sequence would run SeqSpanMax or more ahead of the
// oldest schedule still in flight: the broker remembers the last 1,024
// sequences of a producer per shard, and a retry that fell out of them
// could only be refused PRODUCER_SEQ_TOO_OLD (which a shard stalled
// during a hand-off, while the other took newer sequences, used to
// cause). ErrOutcomeUnknown: a retry reached a lane that has closed so
// many times since the original that it no longer knows whether it
// admitted it — list the lane's schedules before scheduling it again.
func (c *Client) Schedule(ctx context.Context, topic string, msg Message, deliverAt time.Time) (Scheduled, error) {
	id, seq, err := c.nextScheduleIdentity(ctx)
	if err != nil {
		return Scheduled{}, fmt.Errorf("nereus: schedule to %s: %w", topic, err)
	}
	defer c.scheduleDone(seq)
	pub, err := msg.toPub(topic, id, seq)
	if err != nil {
		return Scheduled{}, fmt.Errorf("nereus: schedule to %s: %w", topic, err)
	}
	f := &wire.Schedule{Pub: pub, DeliverAtMs: deliverAt.UnixMilli()}
	reply, err := c.shardRequest(ctx, func(shards uint32) int32 {
		return int32(wire.SchedShard(topic, pub.Key, pub.ProducerID, pub.ProducerSeq, 0, shards))
	}, f)
	if err != nil {
		return Scheduled{}, fmt.Errorf("nereus: schedule to %s: %w", topic, err)
	}
	ok, isOK := reply.(*wire.ScheduleOK)
	if !isOK {
		return Scheduled{}, fmt.Errorf("nereus: schedule to %s: unexpected %s", topic, reply.Type())
	}
	return Scheduled{Shard: ok.Shard, ID: ok.ID, DeliverAt: time.UnixMilli(ok.DeliverAtMs), Duplicate: ok.Duplicate}, nil
}

// nextScheduleIdentity is the producer identity of the next schedule:
// one producer per client (drawn at the first schedule), the next
// sequence for each call — a shard's dedup table holds one producer per
// client, not one per schedule. It waits (until ctx ends) while the next
// sequence would be SeqSpanMax or more ahead of the oldest in flight
// (ScheduleSeqSpan); scheduleDone ends a sequence's flight.
func (c *Client) nextScheduleIdentity(ctx context.Context) (id, seq uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.schedID == 0 {
		if c.schedID, err = randomProducerID(); err != nil {
			return 0, 0, err
		}
		c.schedOpen, c.schedFreed = map[uint64]struct{}{}, make(chan struct{})
	}
	for {
		oldest := c.schedSeq + 1
		for s := range c.schedOpen {
			oldest = min(oldest, s)
		}
		if c.schedSeq+1 < oldest+SeqSpanMax {
			break
		}
		freed := c.schedFreed
		c.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			c.mu.Lock()
			return 0, 0, fmt.Errorf("waiting for schedule %d, %d sequences ahead of one still in flight: %w", c.schedSeq+1, SeqSpanMax, ctx.Err())
		}
		c.mu.Lock()
	}
	c.schedSeq++
	c.schedOpen[c.schedSeq] = struct{}{}
	return c.schedID, c.schedSeq, nil
}

// scheduleDone ends the flight of schedule sequence seq.
func (c *Client) scheduleDone(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.schedOpen, seq)
	close(c.schedFreed)
	c.schedFreed = make(chan struct{})
}

// ScheduleInfo is a live schedule: PENDING (waiting for its time or its
// lane) or FIRING (claimed, being published).
type ScheduleInfo struct {
	Shard     uint32    `json:"shard"`
	ID        uint64    `json:"id"`
	DeliverAt time.Time `json:"deliver_at"`
	Topic     string    `json:"topic"`
	Partition uint32    `json:"partition"`
	State     string    `json:"state"`
}

// ShardInfo is a schedule shard: its lifecycle and counts.
type ShardInfo struct {
	Shard      uint32    `json:"shard"`
	Lifecycle  string    `json:"lifecycle"`
	Owner      string    `json:"owner"`
	OwnerEpoch uint64    `json:"owner_epoch"`
	Pending    uint32    `json:"pending"`
	NextDue    time.Time `json:"next_due,omitzero"`
	Fired      uint64    `json:"fired"`
	Unknown    uint64    `json:"unknown"`
	Cancelled  uint64    `json:"cancelled"`
}

// LaneInfo is a destination topic's lane in a shard: its admission gate
// (OPEN, ADMIN_PAUSED, ORDERING_BROKEN, CLOSED, RETIRED) and its runtime
// readiness (RECOVERING_EVIDENCE, READY, BLOCKED).
type LaneInfo struct {
	Shard       uint32 `json:"shard"`
	Topic       string `json:"topic"`
	Gate        string `json:"gate"`
	Readiness   string `json:"readiness"`
	Incarnation uint64 `json:"incarnation"`
	Pending     uint32 `json:"pending"`
}

// SchedStatus is the scheduler's shards and lanes.
type SchedStatus struct {
	Shards []ShardInfo `json:"shards"`
	Lanes  []LaneInfo  `json:"lanes"`
}

// shardRequest sends f to the leader of the schedule shard pick chooses
// (given the shard count; before __sched exists, to any node, which
// creates it) and waits for the answer, going again after a lost
// connection, NOT_LEADER or UNAVAILABLE (a new owner taking office) with
// fresh metadata, until ctx (bounded by RequestTimeout) ends. Only for
// requests that are safe to repeat.
func (c *Client) shardRequest(ctx context.Context, pick func(shards uint32) int32, f wire.Frame) (wire.Frame, error) {
	ctx, cancel := c.withRequestTimeout(ctx)
	defer cancel()
	if c.partitionCount(wire.SchedTopic) == 0 {
		c.awaitRefresh(ctx, wire.SchedTopic)
	}
	for {
		part := int32(-1)
		if n := c.partitionCount(wire.SchedTopic); n > 0 {
			part = pick(n)
		}
		cn, err := c.leaderConn(ctx, wire.SchedTopic, part, true)
		if err != nil {
			return nil, err
		}
		reply, err := cn.roundTrip(ctx, f)
		if err == nil || !routeMayHaveMoved(err) || ctx.Err() != nil {
			return reply, err
		}
		c.awaitRefresh(ctx, wire.SchedTopic)
	}
}

// schedShards is the number of schedule shards (0 before the first
// schedule created them).
func (c *Client) schedShards(ctx context.Context) uint32 {
	c.awaitRefresh(ctx, wire.SchedTopic)
	return c.partitionCount(wire.SchedTopic)
}

// schedAdmin sends f to the leader of every shard (f.Shard set for each)
// and merges the answers; the first error ends it.
func (c *Client) schedAdmin(ctx context.Context, f wire.SchedAdmin) (*wire.SchedAdminOK, error) {
	out := &wire.SchedAdminOK{}
	for shard := range c.schedShards(ctx) {
		f.Shard = shard
		reply, err := c.shardRequest(ctx, func(uint32) int32 { return int32(shard) }, &f)
		if err != nil {
			return nil, err
		}
		ok, isOK := reply.(*wire.SchedAdminOK)
		if !isOK {
			return nil, fmt.Errorf("unexpected %s", reply.Type())
		}
		out.Schedules = append(out.Schedules, ok.Schedules...)
		out.Shards = append(out.Shards, ok.Shards...)
		out.Lanes = append(out.Lanes, ok.Lanes...)
	}
	return out, nil
}

// Schedules lists live schedules of topic ("" = every topic), earliest
// first (ListSchedules' order), at most limit (0: one page's worth,
// 1,000) — spilled ones included. ListSchedules lists any number.
func (c *Client) Schedules(ctx context.Context, topic string, limit int) ([]ScheduleInfo, error) {
	if limit <= 0 {
		limit = wire.SchedListLimitMax
	}
	var out []ScheduleInfo
	for s, err := range c.ListSchedules(ctx, topic, min(limit, wire.SchedListLimitMax)) {
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		if len(out) == limit {
			break
		}
	}
	return out, nil
}

// ScheduleCursor is where a page of a shard's listing ended: the next
// page holds the schedules after (DeliverAt, ID). The zero cursor is the
// start.
type ScheduleCursor struct {
	DeliverAt time.Time
	ID        uint64
}

// SchedulePage is one page of a shard's live schedules.
type SchedulePage struct {
	Schedules []ScheduleInfo
	// More: schedules follow Next.
	More bool
	// Next is the cursor of the next page: after the last of Schedules.
	Next ScheduleCursor
}

// ListSchedulePage lists one page of shard's live schedules of topic (""
// = every topic) after cursor, by (deliver_at, id), at most limit (0 or
// above 1,000: 1,000). The shard's owner answers from its state as of the
// page, its spilled schedules included, so paging through a shard lists
// every schedule live throughout exactly once, in order, whatever
// changes between the pages (new schedules, fired ones, a new owner, a
// rebuilt spill). A shard that cannot answer right now (a new owner
// taking office, its spill being rebuilt) is retried until ctx ends.
func (c *Client) ListSchedulePage(ctx context.Context, shard uint32, topic string, cursor ScheduleCursor, limit int) (SchedulePage, error) {
	f := &wire.SchedListPage{Shard: shard, Topic: topic, Limit: uint32(min(max(0, limit), wire.SchedListLimitMax))}
	if cursor.ID != 0 {
		f.AfterDeliverAtMs, f.AfterID = cursor.DeliverAt.UnixMilli(), cursor.ID
	}
	reply, err := c.shardRequest(ctx, func(uint32) int32 { return int32(shard) }, f)
	if err != nil {
		return SchedulePage{}, fmt.Errorf("nereus: list schedules of shard %d: %w", shard, err)
	}
	ok, isOK := reply.(*wire.SchedListPageOK)
	if !isOK {
		return SchedulePage{}, fmt.Errorf("nereus: list schedules of shard %d: unexpected %s", shard, reply.Type())
	}
	page := SchedulePage{More: ok.More, Next: cursor}
	for _, s := range ok.Schedules {
		page.Schedules = append(page.Schedules, ScheduleInfo{Shard: s.Shard, ID: s.ID, DeliverAt: time.UnixMilli(s.DeliverAtMs), Topic: s.Topic, Partition: s.Partition, State: s.State})
	}
	if n := len(page.Schedules); n > 0 {
		last := page.Schedules[n-1]
		page.Next = ScheduleCursor{DeliverAt: last.DeliverAt, ID: last.ID}
	} else if page.More {
		return SchedulePage{}, fmt.Errorf("nereus: list schedules of shard %d: an empty page with more to follow", shard)
	}
	return page, nil
}

// ListSchedules iterates over every live schedule of topic ("" = every
// topic), earliest first — by deliver_at, then shard and id — reading
// each shard a page of pageSize (0: 1,000) at a time as the iteration
// goes: it holds at most a page per shard, whatever the broker holds. A
// schedule that stays live throughout the iteration is yielded exactly
// once; one made or resolved meanwhile may or may not be. An error ends
// the iteration (yielded with a zero ScheduleInfo).
func (c *Client) ListSchedules(ctx context.Context, topic string, pageSize int) iter.Seq2[ScheduleInfo, error] {
	return func(yield func(ScheduleInfo, error) bool) {
		type shardList struct {
			shard   uint32
			buf     []ScheduleInfo
			cursor  ScheduleCursor
			started bool
			more    bool
		}
		var shards []*shardList
		for shard := range c.schedShards(ctx) {
			shards = append(shards, &shardList{shard: shard})
		}
		for {
			var next *shardList
			for _, s := range shards {
				if len(s.buf) == 0 && (!s.started || s.more) {
					page, err := c.ListSchedulePage(ctx, s.shard, topic, s.cursor, pageSize)
					if err != nil {
						yield(ScheduleInfo{}, err)
						return
					}
					s.buf, s.cursor, s.more, s.started = page.Schedules, page.Next, page.More, true
				}
				if len(s.buf) > 0 && (next == nil || earlierSchedule(s.buf[0], next.buf[0])) {
					next = s
				}
			}
			if next == nil {
				return
			}
			head := next.buf[0]
			next.buf = next.buf[1:]
			if !yield(head, nil) {
				return
			}
		}
	}
}

// earlierSchedule orders schedules of several shards: by deliver_at,
// then shard, then id.
func earlierSchedule(a, b ScheduleInfo) bool {
	if !a.DeliverAt.Equal(b.DeliverAt) {
		return a.DeliverAt.Before(b.DeliverAt)
	}
	if a.Shard != b.Shard {
		return a.Shard < b.Shard
	}
	return a.ID < b.ID
}

// SchedulerStatus describes the shards and the lanes (of topic; "" =
// all).
func (c *Client) SchedulerStatus(ctx context.Context, topic string) (SchedStatus, error) {
	ok, err := c.schedAdmin(ctx, wire.SchedAdmin{Op: wire.SchedStatus, Topic: topic})
	if err != nil {
		return SchedStatus{}, fmt.Errorf("nereus: scheduler status: %w", err)
	}
	var out SchedStatus
	for _, s := range ok.Shards {
		si := ShardInfo{Shard: s.Shard, Lifecycle: s.Lifecycle, Owner: s.Owner, OwnerEpoch: s.OwnerEpoch, Pending: s.Pending,
			Fired: s.Fired, Unknown: s.Unknown, Cancelled: s.Cancelled}
		if s.NextDueMs != 0 {
			si.NextDue = time.UnixMilli(s.NextDueMs)
		}
		out.Shards = append(out.Shards, si)
	}
	for _, l := range ok.Lanes {
		out.Lanes = append(out.Lanes, LaneInfo(l))
	}
	return out, nil
}

// CancelSchedule cancels a pending schedule; one already firing or fired
// cannot be (NOT_FOUND).
func (c *Client) CancelSchedule(ctx context.Context, shard uint32, id uint64) error {
	if n := c.schedShards(ctx); shard >= n {
		return fmt.Errorf("nereus: cancel schedule %d/%d: no shard %d (there are %d)", shard, id, shard, n)
	}
	if _, err := c.shardRequest(ctx, func(uint32) int32 { return int32(shard) }, &wire.SchedAdmin{Op: wire.SchedCancel, Shard: shard, ID: id}); err != nil {
		return fmt.Errorf("nereus: cancel schedule %d/%d: %w", shard, id, err)
	}
	return nil
}

// Lane commands for LaneCommand.
const (
	LanePause  = "pause"  // hold the lane's due messages (new schedules are still taken)
	LaneResume = "resume" // back to OPEN
	LaneClose  = "close"  // refuse new schedules, hold the due ones
	LaneRetire = "retire" // for good: pending schedules are cancelled
)

// LaneCommand changes the admission gate of topic's lane.
func (c *Client) LaneCommand(ctx context.Context, topic, command string) error {
	op, ok := map[string]uint8{LanePause: wire.LanePause, LaneResume: wire.LaneResume, LaneClose: wire.LaneClose, LaneRetire: wire.LaneRetire}[command]
	if !ok {
		return fmt.Errorf("nereus: lane command %q: want pause, resume, close or retire", command)
	}
	if c.schedShards(ctx) == 0 {
		// No shard yet: a node creates them (and checks the topic).
		if _, err := c.shardRequest(ctx, func(uint32) int32 { return 0 }, &wire.SchedAdmin{Op: wire.SchedStatus}); err != nil {
			return fmt.Errorf("nereus: lane %s of %s: %w", command, topic, err)
		}
	}
	if _, err := c.schedAdmin(ctx, wire.SchedAdmin{Op: wire.SchedLane, Topic: topic, LaneOp: op}); err != nil {
		return fmt.Errorf("nereus: lane %s of %s: %w", command, topic, err)
	}
	return nil
}
