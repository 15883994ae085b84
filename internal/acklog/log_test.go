package acklog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/delivery"
)

// The events of an ack-log scenario, each with the decision it must
// produce written as text (see harness.step).
type (
	// ack acks seq of partition 0 (delivering it first if needed) and
	// batches the reply; it yields "new record", "record again" (an
	// undurable ack) or "no record".
	ack struct {
		seq   uint64
		reply string
	}
	// dead batches a count record of seq that used up MaxDeliver.
	dead uint64
	// flush completes the proposals done (by id) and flushes; it yields
	// the effects, "; "-separated: "<Outcome> [replies]", "propose #id
	// kind…", "ready [seqs]", "retry [seqs]", "floors", "too large N",
	// or "-" for none.
	flush struct {
		done     []fin
		degraded bool
		compact  int64
		quiet    bool
	}
	// retire yields the replies answered at retirement.
	retire struct{}
)

// fin is one completion: proposal id, and its error (nil: committed).
type fin struct {
	id  uint64
	err error
}

type step struct {
	event any
	want  string
}

var errLost = errors.New("lost")

// harness plays the shell: one partition's cursor, the batches, and the
// records that committed, in log order (for rebuilds).
type harness struct {
	log       *Log[string]
	cursor    *delivery.Cursor
	delivered map[uint64]uint64 // seq → delivery id in flight
	acks      []byte
	counts    []byte
	dead      []Key
	replies   []string
	proposed  map[uint64]Proposal
	committed []Proposal
	// checkpoints: the test codec stores a checkpoint and encodes its
	// number.
	checkpoints []Checkpoint
}

const overheadBytes = 10

func newHarness(recordBytesMax int, mut Mutations) *harness {
	h := &harness{delivered: map[uint64]uint64{}, proposed: map[uint64]Proposal{}}
	h.cursor = newCursors()[0]
	h.log = New[string](Config{RecordOverheadBytes: overheadBytes, RecordBytesMax: recordBytesMax,
		EncodeCheckpoint: h.encode, Mutations: mut}, 0)
	return h
}

func newCursors() []*delivery.Cursor {
	c, err := delivery.NewCursor(delivery.Config{AckWaitMs: 1000, MaxDeliver: 5, InflightMax: 1 << 20}, 1, 0)
	if err != nil {
		panic(err)
	}
	return []*delivery.Cursor{c}
}

func (h *harness) encode(cp Checkpoint) []byte {
	h.checkpoints = append(h.checkpoints, cp)
	s := cp.States[0]
	return fmt.Appendf(nil, "cp%d floor=%d ranges=%v", len(h.checkpoints)-1, s.Floor, s.Ranges)
}

func (h *harness) decode(value []byte) Checkpoint {
	var n int
	fmt.Sscanf(string(value), "cp%d", &n)
	return h.checkpoints[n]
}

func (h *harness) step(ev any) string {
	switch e := ev.(type) {
	case ack:
		for h.delivered[e.seq] == 0 && !h.isDone(e.seq) {
			d, ok := h.cursor.Next(0, e.seq, 1)
			if !ok {
				panic(fmt.Sprintf("seq %d cannot be delivered", e.seq))
			}
			h.delivered[d.Seq] = d.DeliveryID
		}
		isNew, err := h.cursor.Ack(e.seq, h.delivered[e.seq])
		if err != nil {
			panic(err)
		}
		delete(h.delivered, e.seq)
		h.replies = append(h.replies, e.reply)
		k := Key{0, e.seq}
		switch {
		case !h.log.NeedsRecord(isNew, k):
			return "no record"
		case isNew:
			h.acks = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(h.acks, 0), e.seq)
			return "new record"
		default:
			h.acks = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(h.acks, 0), e.seq)
			return "record again"
		}
	case dead:
		h.counts = binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(h.counts, 0), uint64(e)), 5)
		h.dead = append(h.dead, Key{0, uint64(e)})
		return ""
	case flush:
		var done []Completion
		for _, f := range e.done {
			done = append(done, Completion{ID: f.id, Err: f.err})
			if f.err == nil {
				h.committed = append(h.committed, h.proposed[f.id])
			}
		}
		eff := h.log.Flush(Input[string]{Done: done, Degraded: e.degraded, Acks: h.acks, Counts: h.counts,
			Dead: h.dead, Replies: h.replies, CompactBytes: e.compact, Cursors: []*delivery.Cursor{h.cursor}, Quiet: e.quiet})
		h.acks, h.counts, h.dead, h.replies = nil, nil, nil, h.replies[:0]
		return h.render(eff)
	case retire:
		return fmt.Sprint(h.log.Retire())
	}
	panic(fmt.Sprintf("unknown event %T", ev))
}

func (h *harness) isDone(seq uint64) bool {
	isNew, err := h.cursor.Ack(seq, 0) // a no-op unless done
	return err == nil && !isNew
}

func (h *harness) render(eff Effects[string]) string {
	var parts []string
	for _, a := range eff.Answers {
		if a.Err != nil {
			parts = append(parts, fmt.Sprintf("%v %v %v", a.Outcome, a.Err, a.Replies))
		} else {
			parts = append(parts, fmt.Sprintf("%v %v", a.Outcome, a.Replies))
		}
	}
	for _, p := range eff.Propose {
		h.proposed[p.ID] = p
		switch p.Kind {
		case KindAck:
			var seqs []uint64
			ForEachAck(p.Value, func(k Key) { seqs = append(seqs, k.Seq) })
			parts = append(parts, fmt.Sprintf("propose #%d ack%v", p.ID, seqs))
		case KindCount:
			parts = append(parts, fmt.Sprintf("propose #%d count", p.ID))
		case KindCheckpoint:
			parts = append(parts, fmt.Sprintf("propose #%d checkpoint %s", p.ID, strings.SplitN(string(p.Value), " ", 2)[1]))
		}
	}
	if len(eff.DeadReady) > 0 {
		parts = append(parts, fmt.Sprintf("ready %v", seqsOf(eff.DeadReady)))
	}
	if len(eff.DeadRetry) > 0 {
		var keys []Key
		for _, r := range eff.DeadRetry {
			keys = append(keys, r.Key)
		}
		parts = append(parts, fmt.Sprintf("retry %v %v", seqsOf(keys), eff.DeadRetry[0].Err))
	}
	if eff.FloorsDurable {
		parts = append(parts, "floors")
	}
	if eff.CheckpointTooLargeBytes > 0 {
		parts = append(parts, fmt.Sprintf("too large %d", eff.CheckpointTooLargeBytes))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

func seqsOf(keys []Key) []uint64 {
	var seqs []uint64
	for _, k := range keys {
		seqs = append(seqs, k.Seq)
	}
	return seqs
}

// rebuild folds the committed records into fresh cursors, as a new
// coordinator does.
func (h *harness) rebuild() (*Rebuild, error) {
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return newCursors(), nil }, overheadBytes)
	if err != nil {
		return nil, err
	}
	for i, p := range h.committed {
		if p.Kind == KindCheckpoint {
			err = rb.Checkpoint(uint64(i+1), h.decode(p.Value))
		} else {
			err = rb.Record(uint64(i+1), p.Kind, p.Value)
		}
		if err != nil {
			return nil, err
		}
	}
	return rb, nil
}

func runLog(recordBytesMax int, mut Mutations, steps []step) error {
	h := newHarness(recordBytesMax, mut)
	for i, s := range steps {
		if got := h.step(s.event); got != s.want {
			return fmt.Errorf("step %d %T%+v: got %q, want %q", i, s.event, s.event, got, s.want)
		}
	}
	return nil
}

var logScenarios = []struct {
	name           string
	recordBytesMax int
	steps          []step
}{
	{"an ack is answered only after its record commits", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{ack{2, "a2"}, "new record"},
		{flush{}, "propose #1 ack[1 2]"},
		{flush{}, "-"},
		{flush{done: []fin{{1, nil}}}, "Durable [a a2]; floors"},
	}},
	{"a re-ack of a seq whose first ack is in flight waits for a record of its own", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{ack{1, "b"}, "record again"},
		{flush{}, "propose #2 ack[1]"},
		{flush{done: []fin{{1, nil}}}, "Durable [a]; floors"},
		{flush{done: []fin{{2, nil}}}, "Durable [b]; floors"},
		{ack{1, "c"}, "no record"}, // durable
		{flush{}, "Durable [c]"},   // nothing in flight to wait for
		{ack{2, "d"}, "new record"},
		{flush{}, "propose #3 ack[2]"},
		{ack{1, "e"}, "no record"},
		{flush{}, "-"}, // durable, yet answered with the record in flight, never before it
		{flush{done: []fin{{3, nil}}}, "Durable [d e]; floors"},
	}},
	{"a re-ack whose first record then fails is not answered durable", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{ack{1, "b"}, "record again"}, // its record is in flight, not durable
		{flush{done: []fin{{1, errLost}}}, "NotCommitted lost [a]; propose #2 ack[1]"},
		{flush{done: []fin{{2, nil}}}, "Durable [b]; floors"},
	}},
	{"a re-ack does not wait for a record that does not hold it", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{ack{1, "b"}, "record again"},
		{dead(2), ""},
		{flush{}, "propose #2 count; propose #3 ack[1]"},
		{flush{done: []fin{{1, errLost}, {2, nil}}}, "NotCommitted lost [a]; ready [2]"},
		{flush{done: []fin{{3, nil}}}, "Durable [b]; floors"},
	}},
	{"a record that fails leaves its acks undurable until a later record commits", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, errLost}}}, "NotCommitted lost [a]"},
		{ack{1, "b"}, "record again"},
		{flush{}, "propose #2 ack[1]"},
		{flush{done: []fin{{2, nil}}}, "Durable [b]; floors"},
		{ack{1, "c"}, "no record"},
	}},
	{"quorum lost answers the acks in flight, which may still commit", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{degraded: true}, "QuorumLost [a]"},
		{ack{1, "b"}, "record again"},
		{flush{degraded: true}, "propose #2 ack[1]"},
		{flush{degraded: true}, "QuorumLost [b]"},
		{flush{done: []fin{{1, nil}, {2, nil}}}, "floors"},
		{ack{1, "c"}, "no record"},
	}},
	{"checkpoint when the records pass the threshold, behind the records before it", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{ack{2, "b"}, "new record"},
		// 10 + 24 bytes: the checkpoint follows the record in the log and
		// covers it (it commits only if the record does).
		{flush{compact: 30}, "propose #1 ack[1 2]; propose #2 checkpoint floor=3 ranges=[]"},
		{flush{compact: 30}, "-"}, // at most one checkpoint in flight
		{flush{done: []fin{{1, nil}}, compact: 30}, "Durable [a b]; floors"},
		{ack{4, "c"}, "new record"},
		{flush{compact: 1}, "propose #3 ack[4]"}, // acks go on while it is in flight
		{flush{done: []fin{{2, nil}}, compact: 30}, "floors"},
		{flush{done: []fin{{3, nil}}, compact: 30}, "Durable [c]; floors"}, // the ack after it counts toward the next
		{flush{compact: 22}, "propose #4 checkpoint floor=3 ranges=[{4 4}]"},
	}},
	{"a quiet group checkpoints below the threshold, once", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{compact: 1000}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, nil}}, compact: 1000}, "Durable [a]; floors"},
		{flush{compact: 1000}, "-"}, // below the threshold
		{flush{compact: 1000, quiet: true}, "propose #2 checkpoint floor=2 ranges=[]"},
		{flush{done: []fin{{2, nil}}, compact: 1000, quiet: true}, "floors"},
		{flush{compact: 1000, quiet: true}, "-"}, // nothing since
		{ack{3, "b"}, "new record"},
		{flush{compact: -1}, "propose #3 ack[3]"},
		{flush{done: []fin{{3, nil}}, compact: -1, quiet: true}, "Durable [b]; floors"}, // checkpoints off
	}},
	{"no checkpoint while an ack is undurable", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, errLost}}, compact: 1}, "NotCommitted lost [a]"},
		{flush{compact: 1}, "-"},
		{ack{1, "b"}, "record again"},
		{flush{compact: 1}, "propose #2 ack[1]"},
		{flush{done: []fin{{2, nil}}, compact: 1}, "Durable [b]; propose #3 checkpoint floor=2 ranges=[]; floors"},
	}},
	{"a checkpoint too large waits for another threshold of records", 10, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, nil}}, compact: 20}, "Durable [a]; floors; too large 21"},
		{flush{compact: 20}, "-"},
		{ack{2, "b"}, "new record"},
		{flush{compact: 20}, "propose #2 ack[2]; too large 21"},
		{flush{done: []fin{{2, nil}}, compact: 20}, "Durable [b]; floors"},
	}},
	{"dead letters start once their count record commits", 1 << 20, []step{
		{dead(2), ""},
		{dead(3), ""},
		{flush{}, "propose #1 count"},
		{flush{done: []fin{{1, nil}}}, "ready [2 3]; floors"},
		{dead(4), ""},
		{flush{}, "propose #2 count"},
		{flush{done: []fin{{2, errLost}}}, "retry [4] lost; floors"},
	}},
	{"a retired group's records answer nothing as durable", 1 << 20, []step{
		{ack{1, "a"}, "new record"},
		{flush{}, "propose #1 ack[1]"},
		{flush{done: []fin{{1, nil}}}, "Durable [a]; floors"},
		{ack{2, "b"}, "new record"},
		{flush{}, "propose #2 ack[2]"},
		{retire{}, "[b]"},
		{ack{1, "c"}, "no record"},
		{flush{}, "-"},
		{flush{done: []fin{{2, nil}}}, "Superseded [c]; floors"},
	}},
}

func TestLogScenarios(t *testing.T) {
	for _, sc := range logScenarios {
		t.Run(sc.name, func(t *testing.T) {
			if err := runLog(sc.recordBytesMax, Mutations{}, sc.steps); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Each mutation breaks the guard the named scenarios check.
func TestLogMutationIsCaught(t *testing.T) {
	for _, tc := range []struct {
		mut       Mutations
		scenarios []string
	}{
		{Mutations{AckBeforeCommit: true}, []string{"an ack is answered only after its record commits",
			"a re-ack of a seq whose first ack is in flight waits for a record of its own"}},
		{Mutations{ReAckWaitsForAnyRecord: true}, []string{"a re-ack whose first record then fails is not answered durable",
			"a re-ack does not wait for a record that does not hold it"}},
	} {
		for _, name := range tc.scenarios {
			found := false
			for _, sc := range logScenarios {
				if sc.name == name {
					found = true
					if err := runLog(sc.recordBytesMax, tc.mut, sc.steps); err == nil {
						t.Errorf("%+v: scenario %q passed", tc.mut, name)
					}
				}
			}
			if !found {
				t.Fatalf("no scenario %q", name)
			}
		}
	}
}

// A new coordinator rebuilds from the latest checkpoint and the records
// after it: acked seqs before and after the checkpoint are done, the one
// whose record failed is not.
func TestRebuildFromCheckpointAndLaterAcks(t *testing.T) {
	h := newHarness(1<<20, Mutations{})
	for _, s := range []step{
		{ack{1, "a"}, "new record"},
		{ack{2, "a"}, "new record"},
		{flush{}, "propose #1 ack[1 2]"},
		{flush{done: []fin{{1, nil}}, compact: 1}, "Durable [a a]; propose #2 checkpoint floor=3 ranges=[]; floors"},
		{ack{5, "b"}, "new record"},
		{flush{}, "propose #3 ack[5]"},
		{ack{4, "c"}, "new record"},
		{flush{done: []fin{{2, nil}, {3, nil}}}, "Durable [b]; propose #4 ack[4]; floors"},
		{flush{done: []fin{{4, errLost}}}, "NotCommitted lost [c]"},
	} {
		if got := h.step(s.event); got != s.want {
			t.Fatalf("%T%+v: got %q, want %q", s.event, s.event, got, s.want)
		}
	}
	// Partition 0 compacted through its limit: the log starts at the
	// checkpoint.
	h.committed = h.committed[slices.IndexFunc(h.committed, func(p Proposal) bool { return p.Kind == KindCheckpoint }):]
	rb, err := h.rebuild()
	if err != nil {
		t.Fatal(err)
	}
	got := rb.Cursors()[0].Snapshot()
	want := delivery.DoneState{Floor: 3, Ranges: []delivery.SeqRange{{First: 5, Last: 5}}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("rebuilt done state %+v, want %+v", got, want)
	}
	if rb.RecordBytes() != overheadBytes+AckEntryBytes {
		t.Fatalf("record bytes after the checkpoint = %d, want %d", rb.RecordBytes(), overheadBytes+AckEntryBytes)
	}
}

func TestRebuildRefusesBadRecords(t *testing.T) {
	rb, err := NewRebuild(func() ([]*delivery.Cursor, error) { return newCursors(), nil }, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		kind  Kind
		value []byte
	}{{KindAck, make([]byte, 13)}, {KindCount, make([]byte, 15)}, {KindCheckpoint, nil}} {
		if err := rb.Record(1, c.kind, c.value); err == nil {
			t.Errorf("Record(%v, %d bytes) took it", c.kind, len(c.value))
		}
	}
}
