package sim

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Violation is a broken invariant: its name (DESIGN §4), what happened, and
// when.
type Violation struct {
	Invariant string
	Detail    string
	AtMs      int64 // virtual ms since the run started
	Event     int
}

func (v *Violation) String() string {
	return fmt.Sprintf("%s at t=%dms (event %d): %s", v.Invariant, v.AtMs, v.Event, v.Detail)
}

// The invariants the checker enforces.
const (
	// AckedNeverLost: every PUB_OK'd record stays readable at its seq.
	AckedNeverLost = invariant.AckedNeverLost
	// NoDuplicateFromReplay: a producer replay never appends twice, and a
	// replay's PUB_OK names the original position.
	NoDuplicateFromReplay = "NoDuplicateFromReplay"
	// VisibleMonotonic: the visible prefix never shrinks and a visible
	// position never changes content.
	VisibleMonotonic = "VisibleMonotonic"
	// DeliveredOnlyVisible: only visible records are delivered, with the
	// content that was acknowledged at that position (a corrupt record is
	// never served).
	DeliveredOnlyVisible = "DeliveredOnlyVisible"
	// AckFloorNeverRedelivered: a record whose ACK got ACK_OK is never
	// delivered to the group again.
	AckFloorNeverRedelivered = "AckFloorNeverRedelivered"
	// DeliveryIDsUnique: a single node never sends two deliveries of a
	// partition under one delivery id, across restarts and a damaged
	// incarnation file (N25g): an ACK naming an earlier delivery could
	// otherwise settle a later one. (A cluster's ids carry 10 bits of the
	// count with the epoch: a reuse there is possible by design.)
	DeliveryIDsUnique = "DeliveryIDsUnique"
	// Liveness: once faults heal, every acknowledged record is delivered and
	// acked by the group within a bounded time.
	Liveness = "Liveness"
	// PublishAnswered: an idempotent publish is never refused for good.
	PublishAnswered = "PublishAnswered"
	// RepairRestores: after a salvage repair of a damaged node no
	// partition is corrupt, and its log reads back around the gaps.
	RepairRestores = "RepairRestores"
	// DurableTailNotTorn: a single node's start never cuts as a torn
	// write the records its dedup snapshot stood for (they were synced).
	DurableTailNotTorn = "DurableTailNotTorn"
	// SettingsKept: a single node's topic keeps the retention it was
	// declared with — after a repair rebuilt topics.json (settings back
	// to their defaults), once the operator's TOPIC_UPDATE set it again.
	SettingsKept = "SettingsKept"
	// GroupDeleteNamesItsIncarnation: a group delete removes the
	// incarnation it was decided against, never the next one, and so does
	// a retry of one already applied, which names the incarnation it
	// deleted (meta: GroupDeleteRetryDeletesOnce) — checked where only the
	// deleter's forced deletes move a group's incarnation.
	GroupDeleteNamesItsIncarnation = "GroupDeleteNamesItsIncarnation"
	// GroupSettingsOnEveryNode: after group updates, every runner of the
	// group on every node holds the last one's settings, whatever its
	// consumers' PULLs ask and however it started (groupupdate.go).
	GroupSettingsOnEveryNode = "GroupSettingsOnEveryNode"
)

type position struct {
	partition uint32
	seq       uint64
}

func (p position) String() string { return fmt.Sprintf("%d/%d", p.partition, p.seq) }

type prodKey struct{ producerID, producerSeq uint64 }

type ackRecord struct {
	pos   position
	value string
}

// checker is the reference model and the invariant checks. It lives apart
// from the broker and sees only what a client or an operator could see:
// frames on the wire, the broker's metadata and reads of its log.
type checker struct {
	w         *World
	acked     map[prodKey]ackRecord
	ackedAt   map[position]prodKey
	seen      map[position]string            // content delivered at a position
	groupDone map[position]bool              // ACK_OK'd for the group
	maxSentID map[position]map[string]uint64 // highest delivery id each node sent per position
	sentIDs   map[deliveryKey]uint64         // the seq each delivery id was sent for (single node)
	doneAtID  map[position]map[string]uint64 // maxSentID when the ack was confirmed
	maxCommit map[commitKey]uint64           // highest commit_seq observed per partition (and node incarnation in a cluster)
	// perIncarnation: a cluster member's commit_seq is its own knowledge,
	// which starts over when it restarts (a single node's never shrinks).
	perIncarnation bool
	damaged        map[uint32]bool // partitions hit by a bit flip: loss is expected there
	// lost lists, per partition, the seqs a single node's repairs
	// dropped: a retry of a record there appends again on purpose, and a
	// PUB_OK naming one names a record that is gone. cut is, per
	// partition, the lowest seq a torn tail cut of committed records
	// started from (a flip into the last batches, after a crash): from
	// there on a position may hold another record than before.
	// unreadable lists the ranges the final read-back found damaged
	// (refused, never served). keptTorn lists the seqs a torn tail cut
	// filled (storage.Options.KeepTornSeqs: never handed out again), of
	// records never committed or lost to a flip: a gap to readers.
	lost       map[uint32][]storage.SeqRange
	cut        map[uint32]uint64
	unreadable map[uint32][]storage.SeqRange
	keptTorn   map[uint32][]storage.SeqRange
	stateFlips int // bit flips into a node's state files (single node)
	// retained is, with a retention (cluster runs), the highest start seq
	// any node reported per partition: records below it may be compacted
	// before the group saw them (nil: no retention, nothing may go).
	retained   map[uint32]uint64
	sent       map[string]bool // every value a producer ever published
	violation  *Violation
	deliveries int
	// groupInc is the group's incarnation the checker follows, in a run
	// with group deletes (0: none; see groupDeleted).
	groupInc uint64
}

// groupDeleted: a node applied a delete of the group's incarnation, and
// inc is the group's incarnation now (group deletes). The acks are
// forgotten; the next incarnation must deliver and ack everything again
// (GroupIncarnationStartsEmpty). An ACK_OK from a node that had not
// applied the delete when it answered is the deleted incarnation's, which
// it still served, and confirms nothing of the next (ackConfirms). Counted
// before, such an answer — to a member of the new incarnation asking
// again an ack whose answer it lost, of a delivery made before the delete
// — made the next incarnation's own delivery of the record look like a
// redelivery after a confirmed ack (seed 1 of --nodes 5 --replicas 3
// --members --group-deletes 2).
func (c *checker) groupDeleted(inc uint64) {
	clear(c.groupDone)
	clear(c.doneAtID)
	c.groupInc = inc
}

// ackConfirms reports whether an ACK_OK a node sent while it served the
// group's incarnation inc confirms acks of the incarnation the checker
// follows.
func (c *checker) ackConfirms(inc uint64) bool { return inc >= c.groupInc }

// anyDamaged reports whether a bit flip hit any partition.
func (c *checker) anyDamaged() bool { return len(c.damaged) > 0 }

// mayRefuse reports whether a bit flip hit any file: a DATA_CORRUPT
// answer is then the right one until a repair, not a failure.
func (c *checker) mayRefuse() bool { return c.anyDamaged() || c.stateFlips > 0 }

// acksForgotten: a repair dropped acks from the group's ledger (a
// damaged range, or its snapshot). Their messages may be delivered again,
// at least once; an ack confirmed after it counts as before.
func (c *checker) acksForgotten() { clear(c.doneAtID) }

// forgetAcks: a repair or a cut tail dropped these acks from the group's
// ledger; the others stay confirmed.
func (c *checker) forgetAcks(acks []position) {
	for _, pos := range acks {
		delete(c.doneAtID, pos)
	}
}

func newChecker(w *World, damaged map[uint32]bool) *checker {
	return &checker{w: w, acked: map[prodKey]ackRecord{}, ackedAt: map[position]prodKey{},
		seen: map[position]string{}, groupDone: map[position]bool{}, maxCommit: map[commitKey]uint64{},
		maxSentID: map[position]map[string]uint64{}, doneAtID: map[position]map[string]uint64{}, sentIDs: map[deliveryKey]uint64{},
		damaged: damaged, sent: map[string]bool{}}
}

func (c *checker) violate(invariant, format string, args ...any) {
	if c.violation != nil {
		return
	}
	c.violation = &Violation{Invariant: invariant, Detail: fmt.Sprintf(format, args...),
		AtMs: c.w.nowMs - epochMs, Event: c.w.events}
	c.w.tracef("VIOLATION %s", c.violation)
}

// dropped notes the seqs of partition p a repair drops.
func (c *checker) dropped(p uint32, seqs []storage.SeqRange) {
	if len(seqs) == 0 {
		return
	}
	if c.lost == nil {
		c.lost = map[uint32][]storage.SeqRange{}
	}
	c.lost[p] = append(c.lost[p], seqs...)
}

// tornKept notes the seqs of partition p a torn tail cut kept.
func (c *checker) tornKept(p uint32, r storage.SeqRange) {
	if c.keptTorn == nil {
		c.keptTorn = map[uint32][]storage.SeqRange{}
	}
	c.keptTorn[p] = append(c.keptTorn[p], r)
}

// isLost reports whether a repair dropped the record at pos.
func (c *checker) isLost(pos position) bool { return inRanges(c.lost[pos.partition], pos.seq) }

func inRanges(rs []storage.SeqRange, seq uint64) bool {
	return slices.ContainsFunc(rs, func(r storage.SeqRange) bool { return r.First <= seq && seq <= r.Last })
}

// cutFrom notes a torn tail cut of partition p's committed records from
// seq first on.
func (c *checker) cutFrom(p uint32, first uint64) {
	if c.cut == nil {
		c.cut = map[uint32]uint64{}
	}
	if at, ok := c.cut[p]; !ok || first < at {
		c.cut[p] = first
	}
}

// reused reports whether pos may hold another record than it did: a
// torn tail cut of its partition's committed records reached it.
func (c *checker) reused(pos position) bool {
	at, ok := c.cut[pos.partition]
	return ok && pos.seq >= at
}

// gone reports whether the record acknowledged at pos may be gone: a
// repair dropped it, a cut took it, or the final read-back found it
// damaged. Only those, in a partition a bit flip hit, lose records.
func (c *checker) gone(pos position) bool {
	return c.damaged[pos.partition] && (c.isLost(pos) || c.reused(pos) || inRanges(c.unreadable[pos.partition], pos.seq))
}

func (c *checker) publishAcked(producerID, producerSeq uint64, value string, ok *wire.PubOK) {
	k := prodKey{producerID, producerSeq}
	pos := position{ok.Partition, ok.Seq}
	if ok.Duplicate && c.isLost(pos) {
		c.violate(NoDuplicateFromReplay, "producer %d seq %d answered as a duplicate of %s, which a repair dropped", producerID, producerSeq, pos)
		return
	}
	if prev, dup := c.acked[k]; dup {
		if prev.pos != pos {
			c.violate(NoDuplicateFromReplay, "producer %d seq %d acked at %s and again at %s", producerID, producerSeq, prev.pos, pos)
		}
		return
	}
	if other, taken := c.ackedAt[pos]; taken && !c.reused(pos) {
		c.violate(AckedNeverLost, "position %s acked for producer %d seq %d and for producer %d seq %d",
			pos, other.producerID, other.producerSeq, producerID, producerSeq)
		return
	}
	if seen, ok := c.seen[pos]; ok && seen != value && !c.reused(pos) {
		c.violate(VisibleMonotonic, "position %s delivered %q, later acked as %q", pos, seen, value)
		return
	}
	c.acked[k] = ackRecord{pos: pos, value: value}
	c.ackedAt[pos] = k
}

// brokerSends checks a MSG as the broker puts it on the wire.
func (c *checker) brokerSends(b *broker, f wire.Frame) {
	m, ok := f.(*wire.Msg)
	if !ok {
		return
	}
	pos := position{m.Partition, m.Seq}
	// A node's delivery ids only grow (within a reign and a load of the
	// group, and across them by their prefix), so a delivery it creates
	// after the ack was confirmed has a higher id than every one it sent
	// before. Compared node by node: a deposed leader that redelivers after
	// a later leader's ack was confirmed (ids of an older epoch, lower than
	// the later leader's) is caught too. An older MSG still in flight on a
	// slow connection is checked when it was sent, not when it arrives.
	// A READ_ONLY_DEGRADED leader keeps delivering from its own cursor by
	// design, and may send again what a leader elected without it
	// acknowledged (ARCHITECTURE, Known gaps): not counted.
	var info wire.PartitionInfo
	found := false
	for _, t := range b.node.Metadata([]string{simTopic}) {
		if int(m.Partition) < len(t.Partitions) {
			info, found = t.Partitions[m.Partition], true
		}
	}
	if doneAt, ok := c.doneAtID[pos]; ok && m.DeliveryID > doneAt[b.id] && !info.ReadOnly {
		c.violate(AckFloorNeverRedelivered, "%s sent %s again (delivery %d) after its ack was confirmed", cmp.Or(b.id, "broker"), pos, m.DeliveryID)
	}
	sent := c.maxSentID[pos]
	if sent == nil {
		sent = map[string]uint64{}
		c.maxSentID[pos] = sent
	}
	sent[b.id] = max(sent[b.id], m.DeliveryID)
	if !c.perIncarnation {
		k := deliveryKey{m.Partition, m.DeliveryID}
		if seq, ok := c.sentIDs[k]; ok {
			c.violate(DeliveryIDsUnique, "delivery %d of partition %d sent for seq %d, again for seq %d", m.DeliveryID, m.Partition, seq, m.Seq)
		}
		c.sentIDs[k] = m.Seq
	}
	if found && m.Seq > info.CommitSeq {
		c.violate(DeliveredOnlyVisible, "MSG %d/%d sent above commit_seq %d", m.Partition, m.Seq, info.CommitSeq)
	}
}

func (c *checker) delivered(consumer string, m *wire.Msg) {
	c.deliveries++
	pos := position{m.Partition, m.Seq}
	value := string(m.Value)
	if prev, ok := c.seen[pos]; ok && prev != value && !c.reused(pos) {
		c.violate(VisibleMonotonic, "position %s delivered as %q, earlier as %q", pos, value, prev)
		return
	}
	if !c.sent[value] {
		c.violate(DeliveredOnlyVisible, "%s got %q at %s: no producer ever sent it (corrupt record served)", consumer, value, pos)
		return
	}
	c.seen[pos] = value
	if k, ok := c.ackedAt[pos]; ok && c.acked[k].value != value && !c.reused(pos) {
		c.violate(DeliveredOnlyVisible, "position %s acked as %q, delivered as %q", pos, c.acked[k].value, value)
	}
}

func (c *checker) groupAcked(consumer string, e wire.AckEntry) {
	pos := position{e.Partition, e.Seq}
	c.groupDone[pos] = true
	if _, ok := c.doneAtID[pos]; !ok { // first confirmed (since acksForgotten)
		c.doneAtID[pos] = maps.Clone(c.maxSentID[pos])
		if c.doneAtID[pos] == nil {
			c.doneAtID[pos] = map[string]uint64{}
		}
	}
}

// afterEvent checks what must hold in every state: the visible prefix of a
// partition never shrinks, across crashes and restarts.
func (c *checker) afterEvent(b *broker) {
	if !b.up {
		return
	}
	for _, t := range b.node.Metadata([]string{simTopic}) {
		for _, p := range t.Partitions {
			k := commitKey{partition: p.Partition}
			if c.perIncarnation {
				k.node, k.incarnation = b.id, b.started
			}
			if p.State == wire.PartitionStateCorrupt && p.CommitSeq == 0 {
				continue // not opened (its log ends below what was durable): no commit known
			}
			if cut, ok := c.cut[p.Partition]; p.CommitSeq < c.maxCommit[k] && !(ok && cut <= p.CommitSeq+1) {
				c.violate(VisibleMonotonic, "partition %d commit_seq went from %d to %d %s", p.Partition, c.maxCommit[k], p.CommitSeq, b.id)
			}
			c.maxCommit[k] = max(c.maxCommit[k], p.CommitSeq)
			if c.retained != nil {
				c.retained[p.Partition] = max(c.retained[p.Partition], p.StartSeq)
			}
		}
	}
}

type deliveryKey struct {
	partition uint32
	id        uint64
}

type commitKey struct {
	partition   uint32
	node        string
	incarnation int
}

// compacted reports whether retention may have removed pos.
func (c *checker) compacted(pos position) bool { return pos.seq < c.retained[pos.partition] }

// undelivered lists acknowledged positions the group has not acked yet
// (outside damaged partitions), sorted.
func (c *checker) undelivered() []position {
	var out []position
	for pos := range c.ackedAt {
		if !c.groupDone[pos] && !c.gone(pos) && !c.compacted(pos) {
			out = append(out, pos)
		}
	}
	slices.SortFunc(out, func(a, b position) int {
		if a.partition != b.partition {
			return cmp.Compare(uint64(a.partition), uint64(b.partition))
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

// finalChecks reads the whole log of each partition from the broker pick
// names for it (freshly restarted): every acknowledged record is at its
// position with its content, and no producer sequence is stored twice.
func (c *checker) finalChecks(pick func(partition uint32) *broker, partitions uint32) {
	stored := map[prodKey]position{}
	for p := uint32(0); p < partitions; p++ {
		b := pick(p)
		if b == nil || !b.up {
			c.violate(Liveness, "no node up to read partition %d back", p)
			return
		}
		meta := b.node.Metadata([]string{simTopic})
		if len(meta) == 0 {
			c.violate(AckedNeverLost, "topic %q missing after restart", simTopic)
			return
		}
		commit := meta[0].Partitions[p].CommitSeq
		from := uint64(1)
		if c.retained != nil {
			from = max(from, meta[0].Partitions[p].StartSeq)
			c.retained[p] = max(c.retained[p], from)
		}
		for from <= commit {
			entries, err := b.node.Read(simTopic, p, from, 1024)
			if damaged := (*storage.CorruptError)(nil); errors.As(err, &damaged) && c.damaged[p] {
				// A flipped bit that recovery found: refused, never
				// served; every record after it is checked too.
				if c.unreadable == nil {
					c.unreadable = map[uint32][]storage.SeqRange{}
				}
				c.unreadable[p] = append(c.unreadable[p], storage.SeqRange{First: from, Last: damaged.Damage.LastSeq})
				from = damaged.Damage.LastSeq + 1
				continue
			}
			if gap := (*storage.GapError)(nil); errors.As(err, &gap) && (c.damaged[p] || inRanges(c.keptTorn[p], from)) {
				from = gap.Next // dropped by the repair, or a torn tail's kept seqs, on purpose
				continue
			}
			if err != nil || len(entries) == 0 {
				if !c.damaged[p] {
					c.violate(AckedNeverLost, "partition %d unreadable at %d: %v", p, from, err)
					return
				}
				// Damage found only now (after the final power loss: no
				// repair), refused as DATA_CORRUPT: nothing from here on is
				// served, damaged or not.
				if c.unreadable == nil {
					c.unreadable = map[uint32][]storage.SeqRange{}
				}
				c.unreadable[p] = append(c.unreadable[p], storage.SeqRange{First: from, Last: commit})
				break
			}
			for _, e := range entries {
				pos := position{p, e.Seq}
				k := prodKey{e.Record.ProducerID, e.Record.ProducerSeq}
				if k.producerID != 0 {
					if prev, dup := stored[k]; dup {
						c.violate(NoDuplicateFromReplay, "producer %d seq %d stored at %s and %s", k.producerID, k.producerSeq, prev, pos)
						return
					}
					stored[k] = pos
				}
				// A seq a repair dropped holds no record (a single node's
				// read skips it) or a cluster partition's lost record (no
				// producer): the acked one is gone, as the repair said.
				lostRecord := c.isLost(pos) && k.producerID == 0
				if want, ok := c.ackedAt[pos]; ok && (want != k || c.acked[want].value != string(e.Record.Value)) && !c.reused(pos) && !lostRecord {
					c.violate(AckedNeverLost, "position %s holds producer %d seq %d %q, acked producer %d seq %d %q",
						pos, k.producerID, k.producerSeq, e.Record.Value, want.producerID, want.producerSeq, c.acked[want].value)
					return
				}
			}
			from = entries[len(entries)-1].Seq + 1
		}
	}
	keys := make([]prodKey, 0, len(c.acked))
	for k := range c.acked {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b prodKey) int {
		if a.producerID != b.producerID {
			return cmp.Compare(a.producerID, b.producerID)
		}
		return cmp.Compare(a.producerSeq, b.producerSeq)
	})
	for _, k := range keys {
		rec := c.acked[k]
		if c.gone(rec.pos) || c.compacted(rec.pos) {
			continue
		}
		if got, ok := stored[k]; !ok || got != rec.pos {
			c.violate(AckedNeverLost, "producer %d seq %d acked at %s is not in the log", k.producerID, k.producerSeq, rec.pos)
			return
		}
	}
}
