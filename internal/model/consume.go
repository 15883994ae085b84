package model

// The consume model: one consumer group on one partition of a cluster,
// with the real kernels of the consume side — the partition leader's
// delivery cursor (internal/delivery: which seq next, delivery ids, ack
// fencing, redelivery, dead letters) and its ack log (internal/acklog:
// which acks need a record, ACK_OK only once a record committed,
// checkpoints, and the new leader's rebuild from the committed log) —
// driven as the node's shell (internal/node/replledger.go) drives them.
// The partition's log is one linear sequence of the group's records here
// (its replication is the replica model's business): a record the leader
// proposed commits in order, is refused before it was appended (ErrBusy),
// waits while the leader has lost its quorum (READ_ONLY_DEGRADED), or — at
// a change of leader — commits or is lost with every record after it. A
// consumer receives messages (or loses them), acks, acks again, nacks;
// ack waits pass. One leader delivers at a time: the leases see to that
// (the replica model and the simulator check them).

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/invariant"
)

// ConsumeConfig bounds a consume exploration. Budgets limit how often an
// action kind may occur along one path.
type ConsumeConfig struct {
	Messages    int    // seqs 1..Messages, all visible from the start
	MaxDeliver  uint32 // deliveries before a message is dead-lettered
	InflightMax int    // deliveries outstanding at once
	// CompactBytes is the checkpoint threshold; an ack record of one seq
	// is 12 bytes, a count record 16 (no framing counted here).
	CompactBytes int64
	AckWaits     int // an ack wait passes (every delivery in flight expires)
	Acks         int // ACKs the consumer sends, retries included
	Nacks        int
	Drops        int // a MSG lost on its way to the consumer
	Refusals     int // a record refused before it was appended (ErrBusy)
	Degrades     int // the leader loses its quorum (and may get it back)
	Elections    int // a new leader takes office, rebuilding from the committed log
	// Quiet: the group may also flush as one that batched nothing a while
	// (acklog.Input.Quiet: a checkpoint below the threshold is due).
	Quiet     bool
	DepthMax  int
	StatesMax int
	AckLog    acklog.Mutations
	Delivery  delivery.Mutations
	// SameIDBase breaks the shell (not a kernel): every leader numbers its
	// delivery ids from the same base, not from its epoch.
	SameIDBase bool
}

// ConsumeResult is the outcome of a consume exploration.
type ConsumeResult struct {
	Outcome
	// What the exploration reached (distinct states entered that way).
	Confirmed    int // an ACK answered durable
	Redeliveries int // a message delivered again
	DeadLetters  int // a dead letter published
	Checkpoints  int // a checkpoint committed
	Rebuilds     int // a new leader rebuilt the group from the log
	Settled      int // every message acked durably or dead-lettered
}

const (
	cbAckWaits = iota
	cbAcks
	cbNacks
	cbDrops
	cbRefusals
	cbDegrades
	cbElections
	cbudgets
)

func (c *ConsumeConfig) budget(i int) int {
	return [cbudgets]int{c.AckWaits, c.Acks, c.Nacks, c.Drops, c.Refusals, c.Degrades, c.Elections}[i]
}

const consumeAckWaitMs = 10

// errBusy is a record refused before it was appended.
var errBusy = errors.New("busy")

// crec is a group record: proposed (id) or committed.
type crec struct {
	id    uint64
	kind  acklog.Kind
	value []byte
}

type cstate struct {
	now      int64
	epoch    uint64
	degraded bool
	cursor   *delivery.Cursor
	alog     *acklog.Log[uint64] // a reply is the seq its ACK acked
	// The group's batches since its last flush, as the node's group
	// goroutine keeps them.
	acks, counts []byte
	dead         []acklog.Key
	replies      []uint64
	done         []acklog.Completion
	pending      []crec // proposed, in log order
	log          []crec // committed
	held         []delivery.Delivery
	// Ghosts: seqs whose ACK was answered durable (confirmed), seqs a
	// cursor took an ack for or dead-lettered (processed), every delivery
	// id sent, and deliveries per seq.
	confirmed, processed uint64
	ids                  []uint64
	sent                 []uint8
	used                 [cbudgets]int
	events               cevent
}

type cevent uint8

const (
	ceConfirmed cevent = 1 << iota
	ceRedelivery
	ceDeadLetter
	ceCheckpoint
	ceRebuild
)

func (s *cstate) clone() *cstate {
	c := *s
	c.cursor, c.alog = s.cursor.Clone(), s.alog.Clone()
	c.acks, c.counts, c.dead, c.replies = slices.Clone(s.acks), slices.Clone(s.counts), slices.Clone(s.dead), slices.Clone(s.replies)
	c.done, c.pending, c.log, c.held = slices.Clone(s.done), slices.Clone(s.pending), slices.Clone(s.log), slices.Clone(s.held)
	c.ids, c.sent = slices.Clone(s.ids), slices.Clone(s.sent)
	c.events = 0
	return &c
}

func bit(seq uint64) uint64 { return 1 << seq }

func ackEntry(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(nil, 0), seq)
}

func countEntry(seq uint64, count uint32) []byte {
	return binary.BigEndian.AppendUint32(ackEntry(seq), count)
}

func (cfg *ConsumeConfig) deliveryConfig() delivery.Config {
	return delivery.Config{AckWaitMs: consumeAckWaitMs, MaxDeliver: cfg.MaxDeliver, InflightMax: cfg.InflightMax, Mutations: cfg.Delivery}
}

// idBase numbers a reign's delivery ids from its epoch, as the node does.
func (cfg *ConsumeConfig) idBase(epoch uint64) uint64 {
	if cfg.SameIDBase {
		return 1 << 30
	}
	return epoch << 40
}

func (cfg *ConsumeConfig) newLog(recordBytes int64) *acklog.Log[uint64] {
	return acklog.New[uint64](acklog.Config{RecordBytesMax: 1 << 20, Mutations: cfg.AckLog,
		EncodeCheckpoint: func(cp acklog.Checkpoint) []byte {
			b, err := json.Marshal(cp)
			if err != nil {
				panic(err)
			}
			return b
		}}, recordBytes)
}

// takeOffice makes a new leader of the next epoch: it rebuilds the
// group's cursor from the committed log (acklog.Rebuild) and starts a new
// ack log, as replicatedLedger.startDelivering does.
func (cfg *ConsumeConfig) takeOffice(s *cstate) string {
	s.epoch++
	rb, err := acklog.NewRebuild(func() ([]*delivery.Cursor, error) {
		c, err := delivery.NewCursor(cfg.deliveryConfig(), 1, cfg.idBase(s.epoch))
		return []*delivery.Cursor{c}, err
	}, 0)
	if err != nil {
		return "KernelAssertion: " + err.Error()
	}
	for i, r := range s.log {
		seq := uint64(i + 1)
		if r.kind == acklog.KindCheckpoint {
			var cp acklog.Checkpoint
			if err := json.Unmarshal(r.value, &cp); err != nil {
				return "KernelAssertion: " + err.Error()
			}
			err = rb.Checkpoint(seq, cp)
		} else {
			err = rb.Record(seq, r.kind, r.value)
		}
		if err != nil {
			return "KernelAssertion: " + err.Error()
		}
	}
	s.cursor, s.alog = rb.Cursors()[0], cfg.newLog(rb.RecordBytes())
	// What the rebuilt cursor holds done: every confirmed ack, and
	// nothing no consumer acked nor any leader dead-lettered (a message
	// done without either is lost to the group).
	done := doneSeqs(s.cursor.Snapshot(), uint64(cfg.Messages))
	if missing := s.confirmed &^ done; missing != 0 {
		return invariant.Violated("RebuildHoldsConfirmedAcks", "epoch %d rebuilt seqs %b as not done, though their ACKs were answered durable", s.epoch, missing).Error()
	}
	if phantom := done &^ s.processed; phantom != 0 {
		return invariant.Violated("NoMessageLost", "epoch %d rebuilt seqs %b as done, though no consumer acked them and none was dead-lettered", s.epoch, phantom).Error()
	}
	// And it counts every delivery a committed record counted: a new
	// leader that forgot some would deliver a message more than
	// MaxDeliver times before it dies.
	rebuilt := map[uint64]uint32{}
	for _, sc := range s.cursor.Counts() {
		rebuilt[sc.Seq] = sc.Count
	}
	for seq := uint64(1); seq <= uint64(cfg.Messages); seq++ {
		if c := s.committedCount(seq); done&bit(seq) == 0 && rebuilt[seq] < c {
			return invariant.Violated("RebuildKeepsDeliveryCounts", "epoch %d rebuilt seq %d with %d deliveries counted, though a committed record counted %d", s.epoch, seq, rebuilt[seq], c).Error()
		}
	}
	s.events |= ceRebuild
	return ""
}

// doneSeqs is the bitmask of seqs 1..n a done state holds done.
func doneSeqs(d delivery.DoneState, n uint64) uint64 {
	var m uint64
	for seq := uint64(1); seq <= n; seq++ {
		if seq < d.Floor || slices.ContainsFunc(d.Ranges, func(r delivery.SeqRange) bool { return r.First <= seq && seq <= r.Last }) {
			m |= bit(seq)
		}
	}
	return m
}

// deliver: the leader sends the next delivery; lost, the consumer never
// hears of it.
func (cfg *ConsumeConfig) deliver(s *cstate, lost bool) (string, bool) {
	d, ok := s.cursor.Next(s.now, uint64(cfg.Messages), 1)
	if !ok {
		return "", false
	}
	if slices.Contains(s.ids, d.DeliveryID) {
		return invariant.Violated("DeliveryIDsUnique", "seq %d delivered with id %#x, already sent", d.Seq, d.DeliveryID).Error(), true
	}
	if s.confirmed&bit(d.Seq) != 0 {
		return invariant.Violated("AckFloorNeverRedelivered", "seq %d delivered again (id %#x, count %d) after its ACK was answered durable", d.Seq, d.DeliveryID, d.Count).Error(), true
	}
	s.ids = append(s.ids, d.DeliveryID)
	if s.sent[d.Seq] > 0 {
		s.events |= ceRedelivery
	}
	s.sent[d.Seq]++
	if !lost {
		s.held = append(s.held, d)
	}
	return "", true
}

// ack: the consumer acks its k-th held delivery at the leader. It keeps
// the delivery until the ACK is answered durable (it may ack again), and
// drops it when the ack is refused as stale.
func (cfg *ConsumeConfig) ack(s *cstate, k int) {
	d := s.held[k]
	isNew, err := s.cursor.Ack(d.Seq, d.DeliveryID)
	if err != nil {
		s.held = slices.Delete(s.held, k, k+1)
		return
	}
	s.processed |= bit(d.Seq)
	if s.alog.NeedsRecord(isNew, acklog.Key{Seq: d.Seq}) {
		s.acks = append(s.acks, ackEntry(d.Seq)...)
	}
	s.replies = append(s.replies, d.Seq)
}

// flush is the group goroutine's pass: expiries, counts and dead letters
// into their batches, then the ack log's Flush and its effects, carried
// out as replicatedLedger.flushPart does.
func (cfg *ConsumeConfig) flush(s *cstate, quiet bool) string {
	s.cursor.Expire(s.now)
	for _, sc := range s.cursor.TakeCounts() {
		s.counts = append(s.counts, countEntry(sc.Seq, sc.Count)...)
	}
	for _, seq := range s.cursor.TakeDead() {
		s.counts = append(s.counts, countEntry(seq, cfg.MaxDeliver)...)
		s.dead = append(s.dead, acklog.Key{Seq: seq})
	}
	eff := s.alog.Flush(acklog.Input[uint64]{Done: s.done, Degraded: s.degraded, Acks: s.acks, Counts: s.counts, Dead: s.dead,
		Replies: s.replies, CompactBytes: cfg.CompactBytes, Cursors: []*delivery.Cursor{s.cursor}, Quiet: quiet})
	s.done, s.acks, s.counts, s.dead, s.replies = nil, nil, nil, nil, nil
	for _, a := range eff.Answers {
		if a.Outcome != acklog.Durable {
			continue
		}
		for _, seq := range a.Replies {
			s.confirmed |= bit(seq)
			s.events |= ceConfirmed
			s.held = slices.DeleteFunc(s.held, func(d delivery.Delivery) bool { return d.Seq == seq })
		}
	}
	for _, p := range eff.Propose {
		s.pending = append(s.pending, crec{id: p.ID, kind: p.Kind, value: p.Value})
	}
	for _, k := range eff.DeadReady {
		if !s.countCommitted(k.Seq, cfg.MaxDeliver) {
			return invariant.Violated("DeadLetterAfterItsCount", "seq %d dead-lettered before a record of its last delivery committed", k.Seq).Error()
		}
		if s.confirmed&bit(k.Seq) != 0 {
			return invariant.Violated("NoDeadLetterOfAnAck", "seq %d dead-lettered after its ACK was answered durable", k.Seq).Error()
		}
		// The dead letter's publish succeeds; its seq is done, recorded
		// with the next ack record (deadletter.go).
		s.cursor.DeadLettered(k.Seq)
		s.processed |= bit(k.Seq)
		s.acks = append(s.acks, ackEntry(k.Seq)...)
		s.events |= ceDeadLetter
	}
	for _, r := range eff.DeadRetry {
		// Recorded again (after a backoff in the node).
		s.counts = append(s.counts, countEntry(r.Key.Seq, cfg.MaxDeliver)...)
		s.dead = append(s.dead, r.Key)
	}
	return ""
}

// countCommitted reports whether a committed count record, or checkpoint,
// holds seq at count or more.
func (s *cstate) countCommitted(seq uint64, count uint32) bool {
	return s.committedCount(seq) >= count
}

// committedCount is the highest delivery count of seq a committed count
// record or checkpoint holds (0: none).
func (s *cstate) committedCount(seq uint64) uint32 {
	var count uint32
	for _, r := range s.log {
		switch r.kind {
		case acklog.KindCount:
			for v := r.value; len(v) >= acklog.CountEntryBytes; v = v[acklog.CountEntryBytes:] {
				if binary.BigEndian.Uint64(v[4:]) == seq {
					count = max(count, binary.BigEndian.Uint32(v[12:]))
				}
			}
		case acklog.KindCheckpoint:
			var cp acklog.Checkpoint
			if json.Unmarshal(r.value, &cp) == nil && len(cp.Counts) > 0 {
				for _, sc := range cp.Counts[0] {
					if sc.Seq == seq {
						count = max(count, sc.Count)
					}
				}
			}
		}
	}
	return count
}

// commit appends the oldest pending record to the log.
func (s *cstate) commit() {
	r := s.pending[0]
	s.pending = s.pending[1:]
	s.log = append(s.log, r)
	s.done = append(s.done, acklog.Completion{ID: r.id})
	if r.kind == acklog.KindCheckpoint {
		s.events |= ceCheckpoint
	}
}

func (cfg *ConsumeConfig) successors(s *cstate) []step[*cstate] {
	var out []step[*cstate]
	try := func(action string, f func(*cstate) string) {
		t := s.clone()
		if err := f(t); err != "" {
			out = append(out, step[*cstate]{action: action, err: err})
			return
		}
		out = append(out, step[*cstate]{action: action, next: t})
	}
	can := func(b int) bool { return s.used[b] < cfg.budget(b) }

	for _, lost := range []bool{false, true} {
		if lost && !can(cbDrops) {
			continue
		}
		t := s.clone()
		err, ok := cfg.deliver(t, lost)
		if !ok {
			break // nothing to deliver now, lost or not
		}
		action := "the leader delivers"
		if lost {
			t.used[cbDrops]++
			action = "the leader delivers, the MSG is lost"
		}
		out = append(out, step[*cstate]{action: action, next: t, err: err})
	}
	for k, d := range s.held {
		if can(cbAcks) {
			try(fmt.Sprintf("the consumer acks seq %d (id %#x)", d.Seq, d.DeliveryID), func(x *cstate) string {
				x.used[cbAcks]++
				cfg.ack(x, k)
				return ""
			})
		}
		if can(cbNacks) {
			try(fmt.Sprintf("the consumer nacks seq %d (id %#x)", d.Seq, d.DeliveryID), func(x *cstate) string {
				x.used[cbNacks]++
				_ = x.cursor.Nack(x.now, d.Seq, d.DeliveryID, 0) // stale or not, the consumer is done with it
				x.held = slices.Delete(x.held, k, k+1)
				return ""
			})
		}
	}
	try("the group flushes", func(x *cstate) string { return cfg.flush(x, false) })
	if cfg.Quiet {
		try("the group flushes, quiet", func(x *cstate) string { return cfg.flush(x, true) })
	}
	if can(cbAckWaits) {
		try("an ack wait passes", func(x *cstate) string { x.used[cbAckWaits]++; x.now += consumeAckWaitMs; return "" })
	}
	if len(s.pending) > 0 && !s.degraded {
		try(fmt.Sprintf("record %d commits", s.pending[0].id), func(x *cstate) string { x.commit(); return "" })
	}
	if can(cbRefusals) {
		for k, r := range s.pending {
			try(fmt.Sprintf("record %d is refused", r.id), func(x *cstate) string {
				x.used[cbRefusals]++
				x.pending = slices.Delete(x.pending, k, k+1)
				x.done = append(x.done, acklog.Completion{ID: r.id, Err: errBusy})
				return ""
			})
		}
	}
	if !s.degraded && can(cbDegrades) {
		try("the leader loses its quorum", func(x *cstate) string { x.used[cbDegrades]++; x.degraded = true; return "" })
	}
	if s.degraded {
		try("the leader's quorum is back", func(x *cstate) string { x.degraded = false; return "" })
	}
	if can(cbElections) {
		// A new leader holds a prefix of what the old one proposed: the
		// first kept records commit, the rest are lost.
		for kept := 0; kept <= len(s.pending); kept++ {
			try(fmt.Sprintf("a new leader takes office with %d of %d pending records", kept, len(s.pending)), func(x *cstate) string {
				x.used[cbElections]++
				for range kept {
					x.commit()
				}
				x.alog.Retire() // its replies are answered NOT_LEADER
				x.pending, x.done, x.degraded = nil, nil, false
				x.acks, x.counts, x.dead, x.replies = nil, nil, nil, nil
				return cfg.takeOffice(x)
			})
		}
	}
	return out
}

func (s *cstate) key() [16]byte {
	var b []byte
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	recs := func(rs []crec) {
		u(uint64(len(rs)))
		for _, r := range rs {
			u(r.id)
			u(uint64(r.kind))
			u(uint64(len(r.value)))
			b = append(b, r.value...)
		}
	}
	u(uint64(s.now))
	u(s.epoch)
	u(uint64(boolByte(s.degraded)))
	b = s.cursor.AppendDigest(b)
	b = s.alog.AppendDigest(b, binary.BigEndian.AppendUint64)
	u(uint64(len(s.acks)))
	b = append(b, s.acks...)
	u(uint64(len(s.counts)))
	b = append(b, s.counts...)
	u(uint64(len(s.dead)))
	for _, k := range s.dead {
		u(k.Seq)
	}
	u(uint64(len(s.replies)))
	for _, r := range s.replies {
		u(r)
	}
	u(uint64(len(s.done)))
	for _, d := range s.done {
		u(d.ID)
		u(uint64(boolByte(d.Err != nil)))
	}
	recs(s.pending)
	recs(s.log)
	u(uint64(len(s.held)))
	for _, d := range s.held {
		u(d.Seq)
		u(d.DeliveryID)
		u(uint64(d.Count))
	}
	u(s.confirmed)
	u(s.processed)
	u(uint64(len(s.ids)))
	for _, id := range s.ids {
		u(id)
	}
	b = append(b, s.sent...)
	for _, v := range s.used {
		u(uint64(v))
	}
	return stateKey(b)
}

// CheckConsume explores every interleaving of the configuration.
func CheckConsume(cfg ConsumeConfig) ConsumeResult {
	if cfg.Messages <= 0 || cfg.Messages > 62 || cfg.MaxDeliver == 0 || cfg.InflightMax <= 0 {
		panic(fmt.Sprintf("model: consume config %+v", cfg))
	}
	if cfg.DepthMax == 0 {
		cfg.DepthMax = 60
	}
	if cfg.StatesMax == 0 {
		cfg.StatesMax = 1_000_000
	}
	init := &cstate{sent: make([]uint8, cfg.Messages+1)}
	var res ConsumeResult
	if err := cfg.takeOffice(init); err != "" {
		res.Violation = err
		return res
	}
	res.Outcome = search[*cstate]{
		successors: cfg.successors,
		key:        (*cstate).key,
		visit: func(s *cstate) {
			res.count(s.events)
			if all := uint64(1)<<(cfg.Messages+1) - 2; s.durablyDone(uint64(cfg.Messages)) == all {
				res.Settled++
			}
		},
		bounded:   func(*cstate) bool { return false },
		depthMax:  cfg.DepthMax,
		statesMax: cfg.StatesMax,
	}.run(init)
	return res
}

// durablyDone is the bitmask of seqs the committed log holds done: in an
// ack record (an ack or a dead letter) or a checkpoint.
func (s *cstate) durablyDone(n uint64) uint64 {
	var m uint64
	for _, r := range s.log {
		switch r.kind {
		case acklog.KindAck:
			acklog.ForEachAck(r.value, func(k acklog.Key) { m |= bit(k.Seq) })
		case acklog.KindCheckpoint:
			var cp acklog.Checkpoint
			if json.Unmarshal(r.value, &cp) == nil && len(cp.States) > 0 {
				m |= doneSeqs(cp.States[0], n)
			}
		}
	}
	return m
}

func (res *ConsumeResult) count(ev cevent) {
	for _, c := range []struct {
		ev cevent
		n  *int
	}{{ceConfirmed, &res.Confirmed}, {ceRedelivery, &res.Redeliveries}, {ceDeadLetter, &res.DeadLetters}, {ceCheckpoint, &res.Checkpoints}, {ceRebuild, &res.Rebuilds}} {
		if ev&c.ev != 0 {
			*c.n++
		}
	}
}
