package sched

import (
	"hash/fnv"
	"testing"

	"github.com/nereus-broker/nereus/internal/partition"
)

// world drives one shard's State and Owner against destinations that
// deduplicate with the real producer table (internal/partition): the
// shell's part, done by hand.
type world struct {
	t     *testing.T
	st    *State
	o     *Owner
	now   int64
	auth  Authority
	queue []Proposal // proposed, not committed
	dests map[string]*destTopic
	// hold keeps publishes in flight instead of answering them.
	hold      bool
	inFlight  []Publish
	published []Publish // every publish effect, in order
	probes    int
}

// destTopic is a destination: its incarnation, partitions and logs.
type destTopic struct {
	incarnation uint64
	writable    bool
	parts       []*destPartition
}

type destPartition struct {
	producers *partition.Producers
	log       []uint64 // schedule ids, in append order
}

func newDest(incarnation uint64, partitions, window int) *destTopic {
	d := &destTopic{incarnation: incarnation, writable: true}
	for range partitions {
		d.parts = append(d.parts, &destPartition{producers: partition.NewProducers(window, 16)})
	}
	return d
}

var testConfig = Config{ClaimMax: 4, FireWindow: 8, ProbeEveryMs: 50}

func newWorld(t *testing.T, cfg Config) *world {
	st := NewState()
	st.MarkLoaded()
	w := &world{t: t, st: st, o: NewOwner(cfg, st), now: 1000, dests: map[string]*destTopic{}}
	w.dests["a"] = newDest(7, 2, 16)
	w.dests["b"] = newDest(9, 1, 16)
	return w
}

// activeWorld is a world whose owner runs with mut and took office in
// epoch 1.
func activeWorld(t *testing.T, mut Mutations) *world {
	cfg := testConfig
	cfg.Mutations = mut
	w := newWorld(t, cfg)
	w.activate(1)
	return w
}

// heldPublish schedules a message for topic's partition p at atMs and
// settles until its publish is in flight, held (w.hold): its intent
// committed, its outcome not reported yet.
func (w *world) heldPublish(topic string, atMs int64, p uint32) uint64 {
	w.t.Helper()
	id := w.schedule(topic, atMs, p)
	w.hold = true
	w.settle(true)
	return id
}

// append applies a record at the shard log's next seq, as a committed
// entry written by whoever leads.
func (w *world) append(r *Record) Result {
	w.t.Helper()
	res, err := w.st.Apply(w.st.Applied()+1, r)
	if err != nil {
		w.t.Fatal(err)
	}
	w.o.Step(w.now) // the shell steps the owner after applying
	return res
}

// schedule admits a schedule at the owner and appends it; it returns its id.
func (w *world) schedule(topic string, at int64, part uint32) uint64 {
	w.t.Helper()
	sc := Schedule{DeliverAtMs: at, Topic: topic, Incarnation: w.dests[topic].incarnation, Partition: part}
	if err := w.o.Admit(w.now, sc); err != nil {
		w.t.Fatalf("admit %+v: %v", sc, err)
	}
	if res := w.append(&Record{Kind: KindSchedule, Schedule: sc}); res.Err != nil {
		w.t.Fatalf("schedule %+v: %v", sc, res.Err)
	}
	return w.st.Applied()
}

// activate gives the owner both gates under epoch, installed at the
// shard log's next entry.
func (w *world) activate(epoch uint64) {
	w.t.Helper()
	w.append(nil) // the install entry
	w.auth = Authority{Assigned: true, Leader: true, Epoch: epoch, GuardUntilMs: w.now + 1_000_000, Barrier: w.st.Applied()}
	w.o.SetAuthority(w.now, w.auth)
	if got := w.o.Lifecycle(); got != Active {
		w.t.Fatalf("lifecycle %v after activation, want ACTIVE", got)
	}
}

func producerID(topic string, p uint32) uint64 {
	h := fnv.New64a()
	h.Write([]byte(topic))
	return h.Sum64() ^ uint64(p)
}

// settle carries out effects until there are none: proposals commit at
// once (unless commit is false), publishes reach the destinations
// (unless held), probes are answered from the destinations.
func (w *world) settle(commit bool) {
	w.t.Helper()
	for range 1000 {
		effects := w.o.TakeEffects()
		if len(effects) == 0 && (!commit || len(w.queue) == 0) {
			return
		}
		for _, e := range effects {
			switch {
			case e.Propose != nil:
				w.queue = append(w.queue, *e.Propose)
			case e.Publish != nil:
				w.published = append(w.published, *e.Publish)
				if w.hold {
					w.inFlight = append(w.inFlight, *e.Publish)
				} else {
					w.deliver(*e.Publish)
				}
			case e.Probe != "":
				w.probes++
				w.answerProbe(e.Probe)
			}
		}
		if commit {
			w.commitAll()
		}
	}
	w.t.Fatal("world does not settle")
}

func (w *world) commitAll() {
	q := w.queue
	w.queue = nil
	for _, p := range q {
		w.append(&p.Record)
		w.o.Proposed(w.now, p.Ref, nil)
	}
}

func (w *world) answerProbe(topic string) {
	d := w.dests[topic]
	ev := Evidence{Topic: topic, ValidUntilMs: w.now + 10_000}
	if d != nil {
		ev.Incarnation, ev.Partitions, ev.Writable = d.incarnation, uint32(len(d.parts)), d.writable
	}
	w.o.Evidence(w.now, ev)
}

// deliver carries out a publish at its destination with the producer
// table's verdict, reports the outcome, and steps the owner (as the shell
// does after a batch of outcomes).
func (w *world) deliver(p Publish) {
	w.publishAt(p)
	w.o.Step(w.now)
}

func (w *world) publishAt(p Publish) {
	d := w.dests[p.Topic]
	if d == nil || !d.writable || d.incarnation != p.Incarnation {
		w.o.Published(w.now, p, Refused, 0)
		return
	}
	dp := d.parts[p.Partition]
	pid := producerID(p.Topic, p.Partition)
	switch v, seq, _ := dp.producers.Check(pid, p.FireSeq); v {
	case partition.VerdictDuplicate:
		w.o.Published(w.now, p, Landed, seq)
	case partition.VerdictTooOld:
		w.o.Published(w.now, p, Unprovable, 0)
	default:
		dp.log = append(dp.log, p.ID)
		seq := uint64(len(dp.log))
		dp.producers.Record(pid, p.FireSeq, seq, 1)
		w.o.Published(w.now, p, Landed, seq)
	}
}

// release answers the publishes held in flight.
func (w *world) release() {
	held := w.inFlight
	w.inFlight, w.hold = nil, false
	for _, p := range held {
		w.deliver(p)
	}
}

// at moves the owner's clock and steps it.
func (w *world) at(now int64) {
	w.now = now
	w.o.Step(now)
}

// delivered counts each schedule id in a destination's partitions.
func (w *world) delivered(topic string) map[uint64]int {
	n := map[uint64]int{}
	for _, dp := range w.dests[topic].parts {
		for _, id := range dp.log {
			n[id]++
		}
	}
	return n
}

func (w *world) expectDelivered(topic string, want ...uint64) {
	w.t.Helper()
	got := w.delivered(topic)
	if len(got) != len(want) {
		w.t.Fatalf("%s holds %v, want each of %v once", topic, got, want)
	}
	for _, id := range want {
		if got[id] != 1 {
			w.t.Fatalf("%s holds %v, want each of %v once", topic, got, want)
		}
	}
}
