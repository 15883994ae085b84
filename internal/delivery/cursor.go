// Package delivery is the consume-side kernel: for one consumer group on one
// partition it decides which seq to deliver next, fences acks with
// delivery ids, schedules redelivery and dead-lettering, and keeps the ack
// floor. It is pure (DESIGN §3): time arrives as a millisecond argument, ids
// from a base the shell persists, and durability is the shell's job — it
// persists the ack records a call returns before answering the client.
package delivery

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// ErrStale is returned for an ack or nack whose delivery id is not the
// current delivery of that seq (redelivered since, or never delivered).
var ErrStale = errors.New("stale delivery")

// Config bounds one cursor.
type Config struct {
	AckWaitMs   int64  // redeliver an unacked message after this long
	MaxDeliver  uint32 // after this many deliveries, dead-letter instead
	InflightMax int    // deliveries outstanding at once
	// Mutations break guards on purpose (tests only).
	Mutations Mutations
}

// Mutations are deliberate bugs behind a test-only switch: each disables
// one guard, and a test must fail with it on.
type Mutations struct {
	// ReplayAckKeepsRetry: a replayed ack marks its seq done but leaves a
	// redelivery an earlier count record queued for it.
	ReplayAckKeepsRetry bool
	// DeadOnLastDelivery: a delivery that uses up MaxDeliver is queued
	// for dead-lettering as it is sent, not once it ends unacked — an
	// ack of it comes too late.
	DeadOnLastDelivery bool
	// LoweredMaxKeepsRetries: SetLimits leaves a retry that used up a
	// lowered max deliveries queued, to go out once more.
	LoweredMaxKeepsRetries bool
}

// Validate checks the bounds once, at construction.
func (c Config) Validate() error {
	if c.AckWaitMs <= 0 || c.MaxDeliver == 0 || c.InflightMax <= 0 {
		return fmt.Errorf("delivery: config needs positive AckWaitMs, MaxDeliver and InflightMax: %+v", c)
	}
	return nil
}

// Delivery is one MSG to send.
type Delivery struct {
	Seq        uint64
	DeliveryID uint64
	Count      uint32 // 1 on first delivery
}

type inflight struct {
	id         uint64
	count      uint32
	deadlineMs int64
	owner      uint64 // the subscription it was sent to (shell-assigned id)
}

type retry struct {
	seq   uint64
	count uint32 // deliveries so far
	dueMs int64
}

// Cursor is the delivery state of one group on one partition.
//
// Invariants: every seq < ackFloor is done; done holds sorted, maximal
// ranges of done seqs, all above ackFloor (ackFloor itself is never done);
// a seq is in at most one of {inflight, retries, dead, done}; a
// seq below ackFloor is never delivered again (AckFloorNeverRedelivered).
//
// Delivery counts are durable through the shell: every delivery that ends
// without an ack (ack wait, NACK, release) is returned by TakeCounts for
// the ledger, and a seq that used up MaxDeliver by TakeDead, which the
// shell records too before it publishes the dead letter. Recovery replays
// them with ReplayCount, so MaxDeliver holds across restarts; only a
// delivery still in flight when the shell stops goes uncounted.
type Cursor struct {
	cfg       Config
	ackFloor  uint64              // every seq below is done (acked or dead-lettered)
	nextNew   uint64              // lowest seq never delivered in this incarnation
	done      []SeqRange          // done seqs above ackFloor, as ranges: memory per gap, not per seq
	inflight  map[uint64]inflight // delivered, awaiting ack
	retries   []retry             // awaiting redelivery, in due order per insertion
	dead      map[uint64]bool     // to dead-letter; true once handed to the shell
	counts    []SeqCount          // ended deliveries not yet taken by TakeCounts
	idBase    uint64              // high bits of delivery ids for this incarnation
	idCounter uint64
}

// NewCursor starts a cursor at startSeq (the partition's oldest retained
// seq). idBase makes delivery ids unique across restarts: the shell persists
// an incarnation number and passes it shifted into the high bits.
func NewCursor(cfg Config, startSeq, idBase uint64) (*Cursor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if startSeq == 0 {
		startSeq = 1
	}
	return &Cursor{cfg: cfg, ackFloor: startSeq, nextNew: startSeq,
		inflight: map[uint64]inflight{},
		dead:     map[uint64]bool{}, idBase: idBase}, nil
}

// SetLimits changes the ack wait and the max deliveries (a group update).
// Deliveries in flight keep their deadline; the new ack wait holds from
// the next delivery. A retry that has used up a lowered max deliveries
// goes to the dead letters at once rather than out once more
// (LoweredMaxDeliverNotExceeded); a raised one gives messages not yet
// dead more deliveries.
func (c *Cursor) SetLimits(ackWaitMs int64, maxDeliver uint32) error {
	cfg := c.cfg
	cfg.AckWaitMs, cfg.MaxDeliver = ackWaitMs, maxDeliver
	if err := cfg.Validate(); err != nil {
		return err
	}
	c.cfg = cfg
	c.retries = slices.DeleteFunc(c.retries, func(r retry) bool {
		if r.count < maxDeliver || c.cfg.Mutations.LoweredMaxKeepsRetries {
			return false
		}
		c.dead[r.seq] = false
		return true
	})
	return nil
}

// Limits returns the ack wait and the max deliveries in force.
func (c *Cursor) Limits() (ackWaitMs int64, maxDeliver uint32) {
	return c.cfg.AckWaitMs, c.cfg.MaxDeliver
}

// SeqCount records that seq has been delivered Count times.
type SeqCount struct {
	Seq   uint64
	Count uint32
}

// ReplayAck applies one durable ack (or dead-lettered) record during
// recovery. It wins over any count recorded for seq.
func (c *Cursor) ReplayAck(seq uint64) {
	if !c.cfg.Mutations.ReplayAckKeepsRetry {
		c.forget(seq)
	}
	c.markDone(seq)
}

// ReplayCount applies one durable delivery count during recovery: seq,
// unless done, waits for redelivery as delivery count+1, or for
// dead-lettering once count reaches MaxDeliver. The highest count
// recorded for a seq wins, whatever the order of the records.
func (c *Cursor) ReplayCount(seq uint64, count uint32) {
	if count == 0 || c.isDone(seq) {
		return
	}
	if _, dead := c.dead[seq]; dead {
		return
	}
	for i, r := range c.retries {
		if r.seq == seq {
			count = max(count, r.count)
			c.retries = slices.Delete(c.retries, i, i+1)
			break
		}
	}
	if count >= c.cfg.MaxDeliver {
		c.dead[seq] = false
		return
	}
	c.retries = append(c.retries, retry{seq: seq, count: count})
}

// forget drops seq from the retries and dead letters.
func (c *Cursor) forget(seq uint64) {
	delete(c.dead, seq)
	c.retries = slices.DeleteFunc(c.retries, func(r retry) bool { return r.seq == seq })
}

// Counts returns the delivery count of every seq that is pending with at
// least one delivery ended, sorted by seq: what the shell has recorded
// when every count TakeCounts and TakeDead returned is durable. A seq in
// flight counts the deliveries before the current one. Snapshots carry it.
func (c *Cursor) Counts() []SeqCount {
	var out []SeqCount
	for seq, in := range c.inflight {
		if in.count > 1 {
			out = append(out, SeqCount{Seq: seq, Count: in.count - 1})
		}
	}
	for _, r := range c.retries {
		out = append(out, SeqCount{Seq: r.seq, Count: r.count})
	}
	for seq := range c.dead {
		out = append(out, SeqCount{Seq: seq, Count: c.cfg.MaxDeliver})
	}
	slices.SortFunc(out, func(a, b SeqCount) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// TakeCounts returns, in order, the counts of the deliveries that ended
// without an ack since the last call (each seq with its deliveries so
// far), for the shell to record before the redelivery can be sent.
func (c *Cursor) TakeCounts() []SeqCount {
	out := c.counts
	c.counts = nil
	return out
}

// ReplayFloor applies a durable floor (from a ledger snapshot) during recovery.
func (c *Cursor) ReplayFloor(floor uint64) {
	c.ackFloor = max(c.ackFloor, floor)
	c.advanceFloor()
	c.nextNew = max(c.nextNew, c.ackFloor)
}

// Snapshot returns the cursor's done state (the floor and the done seqs
// above it as maximal ranges). It holds what the shell has persisted only
// when every ack the cursor returned as new is durable: the shell takes it
// right after a successful ledger flush.
func (c *Cursor) Snapshot() DoneState {
	return DoneState{Floor: c.ackFloor, Ranges: slices.Clone(c.done)}
}

// Restore applies a durable done state (a ledger snapshot) during recovery,
// before the acks recorded after it are replayed with ReplayAck. Seqs below
// the cursor's current floor (retention) stay done. Its cost is linear in
// the number of ranges, not of done seqs.
func (c *Cursor) Restore(s DoneState) error {
	if err := s.Validate(); err != nil {
		return err
	}
	c.done = mergeRanges(c.done, s.Ranges)
	c.ReplayFloor(s.Floor)
	return nil
}

// mergeRanges returns the union of two sorted range lists as sorted,
// maximal ranges.
func mergeRanges(a, b []SeqRange) []SeqRange {
	all := append(slices.Clone(a), b...)
	slices.SortFunc(all, func(x, y SeqRange) int {
		switch {
		case x.First < y.First:
			return -1
		case x.First > y.First:
			return 1
		}
		return 0
	})
	var out []SeqRange
	for _, r := range all {
		if n := len(out); n > 0 && r.First <= out[n-1].Last+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Truncated tells the cursor that retention removed every seq < startSeq:
// they can no longer be delivered and count as done.
func (c *Cursor) Truncated(startSeq uint64) {
	c.ReplayFloor(startSeq)
	c.retries = slices.DeleteFunc(c.retries, func(r retry) bool { return r.seq < startSeq })
	for s := range c.inflight {
		if s < startSeq {
			delete(c.inflight, s)
		}
	}
	for s := range c.dead {
		if s < startSeq {
			delete(c.dead, s)
		}
	}
}

// Next returns the next delivery, if any is due: redeliveries first, then new
// seqs up to commitSeq (only visible records are ever delivered). owner names
// the subscription it goes to, so Release can return it early.
func (c *Cursor) Next(nowMs int64, commitSeq uint64, owner uint64) (Delivery, bool) {
	if len(c.inflight) >= c.cfg.InflightMax {
		return Delivery{}, false
	}
	for i, r := range c.retries {
		// A retry above commitSeq waits: the log lost that record (only media
		// corruption can shrink it) and it must not be served until visible.
		if r.dueMs > nowMs || r.seq > commitSeq {
			continue
		}
		c.retries = slices.Delete(c.retries, i, i+1)
		return c.deliver(nowMs, r.seq, r.count+1, owner), true
	}
	for c.nextNew <= commitSeq {
		seq := c.nextNew
		c.nextNew++
		if c.isDone(seq) || c.isPending(seq) {
			continue
		}
		return c.deliver(nowMs, seq, 1, owner), true
	}
	return Delivery{}, false
}

func (c *Cursor) deliver(nowMs int64, seq uint64, count uint32, owner uint64) Delivery {
	c.idCounter++
	id := c.idBase | c.idCounter
	c.inflight[seq] = inflight{id: id, count: count, deadlineMs: nowMs + c.cfg.AckWaitMs, owner: owner}
	if c.cfg.Mutations.DeadOnLastDelivery && count >= c.cfg.MaxDeliver {
		c.dead[seq] = false
	}
	return Delivery{Seq: seq, DeliveryID: id, Count: count}
}

// Ack completes a delivery. Acking a seq that is already done is a no-op
// success, so a client may retry an ack whose answer it lost. It returns
// whether the ack is new (the shell must persist it before answering).
func (c *Cursor) Ack(seq, deliveryID uint64) (isNew bool, err error) {
	if c.isDone(seq) {
		return false, nil
	}
	in, ok := c.inflight[seq]
	if !ok || in.id != deliveryID {
		return false, ErrStale
	}
	delete(c.inflight, seq)
	c.markDone(seq)
	return true, nil
}

// Nack returns a delivery for redelivery after delayMs, or to the dead
// letters when it has used up MaxDeliver.
func (c *Cursor) Nack(nowMs int64, seq, deliveryID uint64, delayMs int64) error {
	in, ok := c.inflight[seq]
	if !ok || in.id != deliveryID {
		return ErrStale
	}
	delete(c.inflight, seq)
	c.requeue(seq, in.count, nowMs+max(delayMs, 0))
	return nil
}

// Release returns every delivery in flight to owner (a subscription that
// closed) for redelivery now, instead of after its ack wait. The delivery
// still counts toward MaxDeliver, and its id becomes stale.
func (c *Cursor) Release(nowMs int64, owner uint64) {
	var released []uint64
	for seq, in := range c.inflight {
		if in.owner == owner {
			released = append(released, seq)
		}
	}
	slices.Sort(released) // map order must not leak into the kernel's output
	for _, seq := range released {
		in := c.inflight[seq]
		delete(c.inflight, seq)
		c.requeue(seq, in.count, nowMs)
	}
}

// Expire moves every delivery whose ack wait has passed to redelivery (or
// dead letters). The shell calls it on its timer.
func (c *Cursor) Expire(nowMs int64) {
	var expired []uint64
	for seq, in := range c.inflight {
		if in.deadlineMs <= nowMs {
			expired = append(expired, seq)
		}
	}
	slices.Sort(expired) // map order must not leak into the kernel's output
	for _, seq := range expired {
		in := c.inflight[seq]
		delete(c.inflight, seq)
		c.requeue(seq, in.count, nowMs)
	}
}

func (c *Cursor) requeue(seq uint64, count uint32, dueMs int64) {
	if count >= c.cfg.MaxDeliver {
		c.dead[seq] = false // TakeDead hands it to the shell, which records it
		return
	}
	c.retries = append(c.retries, retry{seq: seq, count: count, dueMs: dueMs})
	c.counts = append(c.counts, SeqCount{Seq: seq, Count: count})
}

// TakeDead returns the seqs newly due for dead-lettering, in order, each
// once. They stay pending (never redelivered) until the shell calls
// DeadLettered after the dead-letter copy is durable, or DeadLetterFailed.
// The shell records each (as a count of MaxDeliver) and publishes its
// dead letter only once that record is durable.
func (c *Cursor) TakeDead() []uint64 {
	var out []uint64
	for s, taken := range c.dead {
		if !taken {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	for _, s := range out {
		c.dead[s] = true
	}
	return out
}

// DeadLetterFailed hands seq back so a later TakeDead offers it again.
func (c *Cursor) DeadLetterFailed(seq uint64) {
	if _, ok := c.dead[seq]; ok {
		c.dead[seq] = false
	}
}

// DeadLettered marks seq done after its dead-letter copy is durable. The
// shell persists it in the ledger like an ack.
func (c *Cursor) DeadLettered(seq uint64) {
	delete(c.dead, seq)
	c.markDone(seq)
}

// NextDeadlineMs is the earliest time something becomes due (ack wait or
// retry), or -1 when nothing is pending; shells sleep until then.
func (c *Cursor) NextDeadlineMs() int64 {
	next := c.NextExpiryMs()
	for _, r := range c.retries {
		if next < 0 || r.dueMs < next {
			next = r.dueMs
		}
	}
	return next
}

// NextExpiryMs is the earliest ack deadline of a delivery in flight, or
// -1 when none is: what falls due without a subscription's credit (an
// expiry may dead-letter), where a retry waits for one.
func (c *Cursor) NextExpiryMs() int64 {
	next := int64(-1)
	for _, in := range c.inflight {
		if next < 0 || in.deadlineMs < next {
			next = in.deadlineMs
		}
	}
	return next
}

// AckFloor is the lowest seq not yet done.
func (c *Cursor) AckFloor() uint64 { return c.ackFloor }

// Untouched reports whether the cursor has handed out nothing from its
// floor on: the floor is the next seq Next would deliver new, with
// nothing in flight or waiting below it.
func (c *Cursor) Untouched() bool { return c.ackFloor >= c.nextNew }

// Inflight is the number of deliveries awaiting ack.
func (c *Cursor) Inflight() int { return len(c.inflight) }

// Pending reports whether seq is in flight, awaiting retry or dead-lettering.
func (c *Cursor) isPending(seq uint64) bool {
	if _, ok := c.inflight[seq]; ok {
		return true
	}
	if _, ok := c.dead[seq]; ok {
		return true
	}
	for _, r := range c.retries {
		if r.seq == seq {
			return true
		}
	}
	return false
}

func (c *Cursor) isDone(seq uint64) bool {
	if seq < c.ackFloor {
		return true
	}
	i, found := c.rangeAt(seq)
	return found && i >= 0
}

// rangeAt returns the index of the first range whose Last ≥ seq, and
// whether that range contains seq.
func (c *Cursor) rangeAt(seq uint64) (int, bool) {
	i, _ := slices.BinarySearchFunc(c.done, seq, func(r SeqRange, s uint64) int {
		if r.Last < s {
			return -1
		}
		if r.First > s {
			return 1
		}
		return 0
	})
	return i, i < len(c.done) && c.done[i].First <= seq && seq <= c.done[i].Last
}

func (c *Cursor) markDone(seq uint64) {
	if seq < c.ackFloor {
		return
	}
	i, found := c.rangeAt(seq)
	switch {
	case found:
		return
	case i > 0 && c.done[i-1].Last+1 == seq:
		c.done[i-1].Last = seq
		if i < len(c.done) && c.done[i].First == seq+1 { // now touches the next run
			c.done[i-1].Last = c.done[i].Last
			c.done = slices.Delete(c.done, i, i+1)
		}
	case i < len(c.done) && c.done[i].First == seq+1:
		c.done[i].First = seq
	default:
		c.done = slices.Insert(c.done, i, SeqRange{First: seq, Last: seq})
	}
	c.advanceFloor()
}

// advanceFloor moves the floor over every done run that reaches it.
func (c *Cursor) advanceFloor() {
	for len(c.done) > 0 && c.done[0].First <= c.ackFloor {
		c.ackFloor = max(c.ackFloor, c.done[0].Last+1)
		c.done = c.done[1:]
	}
	if len(c.done) == 0 {
		c.done = nil // let a long-gone backing array be collected
	}
}

// Clone returns an independent copy of the cursor (the model checker
// explores from copies).
func (c *Cursor) Clone() *Cursor {
	d := *c
	d.done = slices.Clone(c.done)
	d.inflight = maps.Clone(c.inflight)
	d.retries = slices.Clone(c.retries)
	d.dead = maps.Clone(c.dead)
	d.counts = slices.Clone(c.counts)
	return &d
}

// AppendDigest appends a canonical encoding of the cursor's state to b:
// equal cursors encode equally (the model checker hashes states with it).
// The retries keep their order: Next serves them in it.
func (c *Cursor) AppendDigest(b []byte) []byte {
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	u(c.ackFloor)
	u(c.nextNew)
	u(c.idBase)
	u(c.idCounter)
	u(uint64(len(c.done)))
	for _, r := range c.done {
		u(r.First)
		u(r.Last)
	}
	u(uint64(len(c.inflight)))
	for _, seq := range slices.Sorted(maps.Keys(c.inflight)) {
		in := c.inflight[seq]
		u(seq)
		u(in.id)
		u(uint64(in.count))
		u(uint64(in.deadlineMs))
		u(in.owner)
	}
	u(uint64(len(c.retries)))
	for _, r := range c.retries {
		u(r.seq)
		u(uint64(r.count))
		u(uint64(r.dueMs))
	}
	u(uint64(len(c.dead)))
	for _, seq := range slices.Sorted(maps.Keys(c.dead)) {
		u(seq)
		if c.dead[seq] {
			u(1)
		} else {
			u(0)
		}
	}
	u(uint64(len(c.counts)))
	for _, sc := range c.counts {
		u(sc.Seq)
		u(uint64(sc.Count))
	}
	return b
}
