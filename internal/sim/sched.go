package sim

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The scheduled-delivery workload of a cluster run: a client schedules
// messages into two topics of their own (two lanes of every shard:
// schedule i goes to schedDestTopics[i%2]), one every 0-150 ms, each due
// up to 3 s after it is sent, through a connection to every node (a
// SCHEDULE goes to the node its shard's leader is believed to be;
// NOT_LEADER moves the shard on to the next node). The checks: a message is visible in the topic no earlier
// than its deliver_at minus the largest forward clock skew any node had
// (NeverEarly, with the owner's clock error as the documented bound);
// after healing every acknowledged schedule is published; at the end its
// message is in the log exactly once, and an unacknowledged one at most
// once (ExactlyOnce). The ghost checks of the owner's gates, lanes and
// intake, and the destination outages, are in schedghost.go.

// schedDestTopics are the destinations: each is a lane in every shard.
var schedDestTopics = [2]string{"sd", "se"}

// schedDestPartitions is each destination topic's partition count.
const schedDestPartitions = 2

// schedTopic is the destination of schedule i.
func schedTopic(i int) string { return schedDestTopics[i%len(schedDestTopics)] }

// schedGapMsMax bounds the pause between two schedules' first sends, so
// that intake goes on through the fault phase.
const schedGapMsMax = 150

type schedClient struct {
	s        *sim
	pauser   *lanePauser     // ClusterOptions.LanePauses (nil: none)
	canceler *schedCanceller // ClusterOptions.SchedCancels (nil: none)
	ids      map[int]schedID // by acknowledged schedule: its shard and id
	refused  map[int]bool    // refused by a closed lane (RefusedNeverPublished)
	// mayRefuse: a send of the schedule went out while its lane was
	// closed or being closed or resumed; its answer may be a refusal,
	// decided then and answered later.
	mayRefuse map[int]bool
	total     int
	next      int
	window    int
	due       []int64 // by index: deliver_at in virtual time
	// laneSinceMs: by shard and topic, when the first schedule of that
	// lane was acknowledged (LaneFiresOnlyIntoItsIncarnation).
	laneSinceMs map[schedLane]int64
	// seenIn: by value seen published, the incarnation of its topic it
	// was seen in (ExactlyOnce across incarnations).
	seenIn   map[string]uint64
	inflight map[int]bool
	sentTo   map[int]int // by schedule in flight: the node it was last sent to
	// attempts numbers each schedule's sends (the high half of their
	// corr): a resend may go out while an earlier send's answer is still
	// on its way, and a probe of IntakeNeverBlocked is the latest send's.
	attempts map[int]uint32
	acked    map[string]int64 // value → deliver_at
	conns    []*conn
	ready    []bool
	declared []int // DECLARE_OKs on each connection: ready with one per topic
	// nextSendMs: no new schedule is sent before it (filling: a fill is
	// scheduled for then).
	nextSendMs int64
	filling    bool
	ghost      *schedGhost
	shardAt    [node.SchedShards]int // the node a shard's SCHEDULEs go to
	seen       map[string]bool       // values seen published
	unseen     map[int]bool          // acknowledged schedules not seen published yet
	shards     []int                 // by schedule (shardOf)
	// maxSkewMs is the largest forward clock skew any node has had: how
	// early an owner may fire by its own clock.
	maxSkewMs int64
}

func (sc *schedClient) name() string { return "sched" }

func schedValue(i int) string { return fmt.Sprintf("sch-%d", i) }

// required reports whether acknowledged schedule i must be published: not
// one a cancel took or may have taken, nor one of a retired lane.
func (sc *schedClient) required(i int) bool {
	return sc.canceler.required(i) && !sc.pauser.retiredLane(schedTopic(i)) && !sc.pauser.lostToRecreate(i)
}

// schedIndex is the schedule whose value v is (-1: none).
func schedIndex(v string) int {
	var i int
	if _, err := fmt.Sscanf(v, "sch-%d", &i); err != nil {
		return -1
	}
	return i
}

// schedID is where a SCHEDULE_OK put a schedule.
type schedID struct {
	shard uint32
	id    uint64
}

func (sc *schedClient) connect(at int) {
	sc.ready[at], sc.declared[at] = false, 0
	sc.conns[at] = sc.s.nodes[at].dial(sc, sc.s.partitioned[sc.name()])
	if c := sc.conns[at]; c.open {
		c.send(0, &wire.Hello{VersionMin: wire.VersionMin, VersionMax: wire.VersionMax, ClientName: sc.name()})
		for _, t := range schedDestTopics {
			c.send(0, &wire.Declare{Topic: wire.TopicConfig{Name: t, Partitions: schedDestPartitions, Replicas: sc.s.replicas}})
		}
	}
}

func (sc *schedClient) nodeOf(c *conn) int {
	return slices.Index(sc.conns, c)
}

func (sc *schedClient) onClose(c *conn) {
	at := sc.nodeOf(c)
	if at < 0 {
		return
	}
	sc.ready[at] = false
	sc.ghost.connClosed(at)
	sc.s.w.after(sc.s.w.between(10, 200), func() { sc.connect(at) })
	// What was in flight on this connection and whose shard is believed
	// elsewhere by now (a NOT_LEADER of another schedule moved it) goes
	// there: the reconnection resends only what its node is believed to
	// own, and nothing else would ever send it again.
	for _, i := range slices.Sorted(maps.Keys(sc.inflight)) { // in order: a run replays bit for bit
		if sc.sentTo[i] == at && sc.shardAt[sc.shardOf(i)] != at {
			sc.s.w.after(sc.s.w.between(5, 50), func() { sc.send(i) })
		}
	}
}

// shardOf is schedule i's shard (computed once: the checks ask after
// every event).
func (sc *schedClient) shardOf(i int) int {
	if sc.shards == nil {
		sc.shards = make([]int, sc.total)
		for j := range sc.shards {
			sc.shards[j] = int(wire.SchedShard(schedTopic(j), []byte(schedValue(j)), 0, 0, 0, node.SchedShards))
		}
	}
	return sc.shards[i]
}

func (sc *schedClient) onFrame(c *conn, corr uint64, f wire.Frame) {
	at := sc.nodeOf(c)
	if at < 0 {
		return
	}
	switch f := f.(type) {
	case *wire.DeclareOK:
		if sc.declared[at]++; sc.declared[at] < len(schedDestTopics) {
			return
		}
		sc.ready[at] = true
		sc.resend(at)
		sc.fill()
	case *wire.ScheduleOK:
		i, attempt := schedCorrParts(corr)
		// The ghost hears every answer, also one to a send the client
		// no longer waits for: an IntakeNeverBlocked probe is judged by
		// its own send's answer.
		sc.ghost.intakeAnswered(i, attempt, nil)
		if !sc.inflight[i] {
			sc.s.w.tracef("sched late SCHEDULE_OK %s (send %d) at n%d -> %d/%d", schedValue(i), attempt, at+1, f.Shard, f.ID)
			return
		}
		delete(sc.inflight, i)
		delete(sc.sentTo, i)
		sc.acked[schedValue(i)] = sc.due[i]
		sc.ids[i] = schedID{f.Shard, f.ID}
		sc.pauser.admitted(sc.s.nodes[at], i, f.Shard, f.ID)
		if lane := (schedLane{f.Shard, schedTopic(i)}); sc.laneSinceMs[lane] == 0 {
			sc.laneSinceMs[lane] = sc.s.w.nowMs
		}
		sc.unseen[i] = true
		sc.s.w.tracef("sched SCHEDULE_OK %s -> %d/%d dup=%v", schedValue(i), f.Shard, f.ID, f.Duplicate)
		sc.fill()
	case *wire.Err:
		if corr == 0 {
			if !sc.ready[at] {
				c.breakConn("declare failed")
			}
			return
		}
		i, attempt := schedCorrParts(corr)
		sc.ghost.intakeAnswered(i, attempt, f)
		if !sc.inflight[i] {
			sc.s.w.tracef("sched late ERR %s (send %d) at n%d: %s", schedValue(i), attempt, at+1, f.Code)
			return
		}
		sc.s.w.tracef("sched ERR %s (send %d) at n%d: %s %s", schedValue(i), attempt, at+1, f.Code, f.Message)
		switch {
		case f.Code == wire.CodeNotLeader:
			shard := sc.shardOf(i)
			if sc.shardAt[shard] == at {
				sc.shardAt[shard] = (at + 1) % len(sc.conns)
			}
			sc.s.w.after(sc.s.w.between(5, 50), func() { sc.send(i) })
		case f.Code.Retryable(), f.Code == wire.CodeNotFound && sc.pauser.recreated(schedTopic(i)):
			// (NOT_FOUND: its destination deleted, to be declared again.)
			sc.s.w.after(sc.s.w.between(5, 50), func() { sc.send(i) })
		case f.Code == wire.CodeInvalidArgument && sc.mayRefuse[i]:
			// Its lane was closed (a send made while it may have been):
			// never admitted (RefusedNeverPublished).
			delete(sc.inflight, i)
			delete(sc.sentTo, i)
			sc.refused[i] = true
			sc.fill()
		case f.Code == wire.CodeDataCorrupt && sc.s.chk.anyDamaged():
			delete(sc.inflight, i) // a damaged shard refuses writes until repaired
			delete(sc.sentTo, i)
		default:
			sc.s.chk.violate("ScheduleAnswered", "SCHEDULE %s failed permanently: %s", schedValue(i), f.AsError())
		}
	}
}

// fill keeps the window of schedules in flight full, starting one new
// schedule at most every schedGapMsMax.
func (sc *schedClient) fill() {
	for len(sc.inflight) < sc.window && sc.next < sc.total {
		if now := sc.s.w.nowMs; now < sc.nextSendMs {
			if !sc.filling {
				sc.filling = true
				sc.s.w.after(sc.nextSendMs-now, func() { sc.filling = false; sc.fill() })
			}
			return
		}
		i := sc.next
		sc.next++
		sc.due[i] = sc.s.w.nowMs + sc.s.w.between(0, 3000)
		sc.nextSendMs = sc.s.w.nowMs + sc.s.w.between(0, schedGapMsMax)
		sc.inflight[i] = true
		sc.send(i)
	}
}

// resend sends again what was in flight to the shards at node at.
func (sc *schedClient) resend(at int) {
	for _, i := range slices.Sorted(maps.Keys(sc.inflight)) { // in order: a run replays bit for bit
		if sc.shardAt[sc.shardOf(i)] == at {
			sc.send(i)
		}
	}
}

// send sends schedule i to the node its shard is believed at (its
// producer identity makes every resend idempotent).
func (sc *schedClient) send(i int) {
	if !sc.inflight[i] {
		return
	}
	at := sc.shardAt[sc.shardOf(i)]
	if !sc.ready[at] {
		return // sent when that connection is ready again
	}
	v := schedValue(i)
	if sc.pauser.closes(schedTopic(i)) {
		sc.mayRefuse[i] = true
	}
	sc.sentTo[i] = at
	sc.attempts[i]++
	sc.ghost.intakeSent(i, at, sc.attempts[i])
	sc.conns[at].send(uint64(sc.attempts[i])<<32|uint64(i+1), &wire.Schedule{Pub: wire.Pub{Topic: schedTopic(i), Partition: wire.PartitionAuto,
		ProducerID: 7000 + uint64(i), ProducerSeq: 1, Key: []byte(v), Value: []byte(v)}, DeliverAtMs: sc.due[i]})
}

// schedCorrParts splits a SCHEDULE's corr into its schedule and the
// number of the send it answers.
func schedCorrParts(corr uint64) (i int, attempt uint32) {
	return int(corr&0xffffffff) - 1, uint32(corr >> 32)
}

// observe checks what is published so far: nothing early, nothing twice,
// nothing that was never scheduled.
func (sc *schedClient) observe() {
	for _, b := range sc.s.nodes {
		sc.maxSkewMs = max(sc.maxSkewMs, b.skewMs)
	}
	for _, b := range sc.s.nodes {
		if !b.up {
			continue
		}
		values, incs := schedValues(b)
		for v, n := range values {
			if n > 1 {
				sc.s.chk.violate("ExactlyOnce", "%s: scheduled message %s published %d times", b.id, v, n)
				return
			}
			if sc.seen[v] {
				if was := sc.seenIn[v]; was != incs[v] {
					sc.s.chk.violate("ExactlyOnce", "%s: scheduled message %s is in %s incarnation %d; it was seen published into incarnation %d before",
						b.id, v, schedTopic(schedIndex(v)), incs[v], was)
					return
				}
				continue
			}
			var i int
			if _, err := fmt.Sscanf(v, "sch-%d", &i); err != nil || i >= sc.next {
				sc.s.chk.violate("ExactlyOnce", "%s: %q in the scheduled topic was never scheduled", b.id, v)
				return
			}
			sc.seen[v], sc.seenIn[v] = true, incs[v]
			delete(sc.unseen, i)
			sc.canceler.published(i, b.id)
			if sc.refused[i] {
				sc.s.chk.violate(RefusedNeverPublished, "%s: schedule %s published; it was refused while its lane was closed", b.id, v)
				return
			}
			if early := sc.due[i] - sc.maxSkewMs - sc.s.w.nowMs; early > 0 {
				sc.s.chk.violate("NeverEarly", "%s: scheduled message %s published %d ms before its deliver_at (beyond the largest clock skew, %d ms)",
					b.id, v, early, sc.maxSkewMs)
				return
			}
		}
	}
}

// done reports whether every schedule was answered and every acknowledged
// one published.
func (sc *schedClient) done() bool {
	if sc.next < sc.total || len(sc.inflight) > 0 {
		return false
	}
	for v := range sc.acked {
		if !sc.seen[v] && sc.required(schedIndex(v)) {
			return false
		}
	}
	return true
}

func (sc *schedClient) missing() (n int, first string) {
	n = len(sc.inflight) + sc.total - sc.next
	for i := range sc.next {
		v := schedValue(i)
		if _, acked := sc.acked[v]; !acked && !sc.inflight[i] || sc.seen[v] || !sc.required(i) {
			continue
		}
		if _, acked := sc.acked[v]; acked {
			n++
		}
		if first == "" {
			state := "in flight"
			if id, ok := sc.ids[i]; ok {
				state = fmt.Sprintf("acknowledged as %d/%d, not published", id.shard, id.id)
			}
			first = fmt.Sprintf("%s to %s, %s", v, schedTopic(i), state)
		}
	}
	return n, cmp.Or(first, "none")
}

// finalCheck reads the scheduled topic at the end: every acknowledged
// schedule's message exactly once.
func (sc *schedClient) finalCheck() {
	best := schedValuesOfCluster(sc.s)
	for v := range sc.acked {
		i := schedIndex(v)
		switch {
		case sc.required(i) && best[v] != 1:
			sc.s.chk.violate("ExactlyOnce", "acknowledged schedule %s published %d times", v, best[v])
			return
		case best[v] > 1:
			sc.s.chk.violate("ExactlyOnce", "acknowledged schedule %s published %d times (a cancel may have taken it)", v, best[v])
			return
		case best[v] > 0 && sc.canceler.cancelled(i):
			sc.s.chk.violate(CancelledNeverPublished, "schedule %s is in its topic after the final power loss; its cancel was answered OK", v)
			return
		}
	}
}

// schedValues counts the values of the scheduled topics' committed
// records on b (of the partitions it holds a replica of), with the
// incarnation of the topic each was read in.
func schedValues(b *broker) (map[string]int, map[string]uint64) {
	out, incs := map[string]int{}, map[string]uint64{}
	for _, t := range b.node.Metadata(schedDestTopics[:]) {
		for _, p := range t.Partitions {
			vs, _ := schedPartitionValues(b, t.Config.Name, p)
			for v, n := range vs {
				out[v] += n
				incs[v] = t.Incarnation
			}
		}
	}
	return out, incs
}

// schedValuesOfCluster counts the values of the scheduled topics'
// committed records, each partition read from the up node whose replica
// of it holds the most: with fewer replicas than nodes, no node need hold
// every partition.
func schedValuesOfCluster(s *sim) map[string]int {
	out := map[string]int{}
	for _, name := range schedDestTopics {
		for p := range schedDestPartitions {
			var best map[string]int
			bestN := -1
			for _, b := range s.nodes {
				if !b.up {
					continue
				}
				for _, t := range b.node.Metadata([]string{name}) {
					if p < len(t.Partitions) {
						if vs, n := schedPartitionValues(b, name, t.Partitions[p]); n > bestN {
							best, bestN = vs, n
						}
					}
				}
			}
			for v, n := range best {
				out[v] += n
			}
		}
	}
	return out
}

// schedPartitionValues counts the values of partition p's committed
// records on b, and the records it read.
func schedPartitionValues(b *broker, topic string, p wire.PartitionInfo) (map[string]int, int) {
	out, read := map[string]int{}, 0
	for from := p.StartSeq; ; {
		es, err := b.node.Read(topic, p.Partition, from, 1000)
		if gap := (*storage.GapError)(nil); errors.As(err, &gap) && gap.Next > from {
			from = gap.Next // a torn tail's kept seqs, or a repair's drop
			continue
		}
		if err != nil || len(es) == 0 {
			break
		}
		for _, e := range es {
			if len(e.Record.Headers) == 0 {
				out[string(e.Record.Value)]++
			}
			from = e.Seq + 1
		}
		read += len(es)
	}
	return out, read
}

// The scheduled workload's shard compaction: a checkpoint every 16
// records, 2 KiB segments, compaction every 250 ms, so a 30-schedule run
// carries, checkpoints and truncates its shards many times under faults
// (and rebuilds followers from what is left).
const (
	schedCheckpointEvery = 16
	schedSegmentBytes    = 2 << 10
	schedCompactEveryMs  = 250
)
