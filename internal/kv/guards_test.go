package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// A page of limit 0 holds no key, and says whether any follow. Pins
// KeysAfter's limit >= 0 (a limit of 0 is a limit, not "all").
func TestKeysAfterALimitOfZeroReturnsNoKey(t *testing.T) {
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 0))
	r.mustApply(t, put("b", "2", 0))
	if keys, more := r.b.KeysAfter("", "", 0); len(keys) != 0 || !more {
		t.Fatalf("KeysAfter limit 0: %q, more %v; want none, more", keys, more)
	}
	if keys, more := r.b.KeysAfter("", "a", 1); !slices.Equal(keys, []string{"b"}) || more {
		t.Fatalf("KeysAfter a, limit 1: %q, more %v; want [b], no more", keys, more)
	}
}

// A leader is not made from an invalid Config. Pins NewLeader's
// cfg.Validate.
func TestNewLeaderRefusesAnInvalidConfig(t *testing.T) {
	cfg := testConfig(Mutations{})
	cfg.HistoryMax = 0
	if l, err := NewLeader(cfg, 1); !errors.Is(err, ErrConfig) || l != nil {
		t.Fatalf("NewLeader with HistoryMax 0: %v, %v; want ErrConfig", l, err)
	}
}

// A value of exactly ValueBytesMax is proposed; one byte more is
// refused. Pins check's len(w.Value) > ValueBytesMax.
func TestAValueOfValueBytesMaxIsProposed(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	limit := testConfig(Mutations{}).ValueBytesMax
	if _, ok := lr.submit(Write{Op: OpPut, Key: []byte("k"), Value: []byte(strings.Repeat("v", limit))}); !ok {
		t.Fatalf("a value of %d bytes (ValueBytesMax) not proposed: %v", limit, lr.replies)
	}
	id, ok := lr.submit(Write{Op: OpPut, Key: []byte("k"), Value: []byte(strings.Repeat("v", limit+1))})
	if ok || !errors.Is(lr.replies[id].Err, ErrValueTooLarge) {
		t.Fatalf("a value of %d bytes: proposed %v, %v; want ErrValueTooLarge", limit+1, ok, lr.replies[id].Err)
	}
}

// A CAS on a key with a write in flight is proposed behind it only when
// that write makes its condition hold (a create behind a delete) — even
// without the lease, as nothing is refused; otherwise it is parked.
// Pins decide's pending == nil (the lease case) and
// !(w.Expected == 0 && pending.op == OpDelete).
func TestACASBehindAWriteInFlightIsProposedOnlyWhenThatWriteMakesItHold(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inflight Op
		expected uint64
		proposed bool
	}{
		{"a create behind a delete", OpDelete, 0, true},
		{"a CAS of a revision behind a delete", OpDelete, 1, false},
		{"a create behind a put", OpPut, 0, false},
	} {
		lr := newLeaderRun(Mutations{})
		id, _ := lr.submit(Write{Op: OpPut, Key: []byte("k"), Value: []byte("v")})
		lr.commit(t, id) // k@1
		lr.l.SetLease(false)
		if _, ok := lr.submit(Write{Op: tc.inflight, Key: []byte("k")}); !ok {
			t.Fatalf("%s: the %v not proposed", tc.name, tc.inflight)
		}
		id, ok := lr.casPut("k", "w", tc.expected)
		if ok != tc.proposed {
			t.Errorf("%s: proposed %v, want %v (reply %v)", tc.name, ok, tc.proposed, lr.replies[id])
		}
		if _, answered := lr.replies[id]; answered || lr.l.Parked() != map[bool]int{true: 0, false: 1}[tc.proposed] {
			t.Errorf("%s: answered %v, %d parked", tc.name, lr.replies[id], lr.l.Parked())
		}
	}
}

// A CAS is held back only by a write in flight on its own key. Pins
// lastInflight's key match.
func TestACASIsNotHeldByAWriteInFlightOnAnotherKey(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	id, _ := lr.submit(Write{Op: OpPut, Key: []byte("k"), Value: []byte("v")})
	lr.commit(t, id) // k@1
	if _, ok := lr.submit(Write{Op: OpPut, Key: []byte("j"), Value: []byte("v")}); !ok {
		t.Fatal("the put of j not proposed")
	}
	if id, ok := lr.casPut("k", "w", 1); !ok || lr.l.Parked() != 0 {
		t.Fatalf("a CAS of k@1 with only j in flight: proposed %v, %d parked, reply %v", ok, lr.l.Parked(), lr.replies[id])
	}
}

// A failure reported for a write the leader no longer holds (answered at
// a leadership loss) answers nothing again. Pins Failed's !ok return.
func TestFailedOfAWriteNotHeldAnswersNothing(t *testing.T) {
	lr := newLeaderRun(Mutations{})
	id, ok := lr.submit(Write{Op: OpPut, Key: []byte("k"), Value: []byte("v")})
	if !ok {
		t.Fatal("not proposed")
	}
	if eff := lr.l.LeadershipLost(); len(eff.Replies) != 1 || eff.Replies[0].ID != id {
		t.Fatalf("leadership lost: %v", eff.Replies)
	}
	if eff := lr.l.Failed(lr.b, id, errors.New("truncated")); len(eff.Replies) != 0 || len(eff.Propose) != 0 {
		t.Fatalf("a failure of write %d, answered already: %v", id, eff)
	}
}

// A fresh cursor (Next 0) reads from seq 1; it is not below the floor.
// Pins Watch's max(c.Next, 1).
func TestAWatchFromCursorZeroStartsAtSeqOne(t *testing.T) {
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 0))
	batch := r.b.Watch(Cursor{Next: 0}, 10)
	if batch.Expired || !slices.Equal(describe(batch.Events), []string{"PUT a@1"}) || batch.Next != 2 {
		t.Fatalf("watch from cursor 0: %v, next %d, expired %v; want PUT a@1, next 2", describe(batch.Events), batch.Next, batch.Expired)
	}
}

// A checkpoint chunk's second header must be CheckpointHeader: another
// of the right size is malformed. Pins decodeChunk's header key check.
func TestAChunkUnderAnotherHeaderIsMalformed(t *testing.T) {
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 0))
	recs, err := r.b.CheckpointRecords(1<<20, 0)
	if err != nil || len(recs) == 0 {
		t.Fatalf("checkpoint records: %d, %v", len(recs), err)
	}
	if _, err := DecodeRecord(recs[0]); err != nil {
		t.Fatalf("the chunk as made: %v", err)
	}
	bad := recs[0]
	bad.Headers = slices.Clone(bad.Headers)
	bad.Headers[1].Key = strings.Repeat("x", len(CheckpointHeader))
	if _, err := DecodeRecord(bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a chunk under header %q: %v, want ErrMalformed", bad.Headers[1].Key, err)
	}
}

// chunkRecord is a checkpoint chunk record with the header fields given.
func chunkRecord(base uint64, index, count uint32, value []byte) Record {
	h := binary.BigEndian.AppendUint64(nil, base)
	h = binary.BigEndian.AppendUint32(h, index)
	h = binary.BigEndian.AppendUint32(h, count)
	r := EncodeRecord(Write{Op: OpCheckpoint, Value: value, Chunk: CheckpointChunk{Base: 1, Index: 0, Count: 1}})
	r.Headers = slices.Clone(r.Headers)
	r.Headers[1].Value = h
	return r
}

// A chunk's bounds are inclusive: CheckpointChunksMax chunks, a base
// whose run ends at math.MaxUint64, a value of ValueBytesLimit bytes
// decode; one more of each is malformed. Pins decodeChunk's
// c.Count > CheckpointChunksMax, c.Base > math.MaxUint64-c.Count and
// len(r.Value) > ValueBytesLimit.
func TestAChunkAtItsBoundsDecodes(t *testing.T) {
	v := []byte("x")
	for _, tc := range []struct {
		name string
		r    Record
		ok   bool
	}{
		{"CheckpointChunksMax chunks", chunkRecord(1, 0, CheckpointChunksMax, v), true},
		{"one chunk more", chunkRecord(1, 0, CheckpointChunksMax+1, v), false},
		{"a run ending at MaxUint64", chunkRecord(math.MaxUint64-2, 0, 2, v), true},
		{"a run past MaxUint64", chunkRecord(math.MaxUint64-1, 0, 2, v), false},
		{"a value of ValueBytesLimit", chunkRecord(1, 0, 1, make([]byte, ValueBytesLimit)), true},
		{"a value of one byte more", chunkRecord(1, 0, 1, make([]byte, ValueBytesLimit+1)), false},
	} {
		_, err := DecodeRecord(tc.r)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// A checkpoint body's bounds are inclusive: HistoryMax up to
// HistoryLimit, a tombstone TTL from 1 ms. Pins DecodeCheckpoint's
// c.HistoryMax > HistoryLimit and c.TombstoneTTLms <= 0.
func TestACheckpointAtItsBoundsDecodes(t *testing.T) {
	for _, tc := range []struct {
		history int
		ttl     int64
		ok      bool
	}{{HistoryLimit, 1, true}, {HistoryLimit + 1, 1, false}, {1, 0, false}} {
		b := AppendCheckpoint(nil, Checkpoint{HistoryMax: tc.history, TombstoneTTLms: tc.ttl, Snapshot: Snapshot{Applied: 0, Floor: 1}})
		if _, err := DecodeCheckpoint(b); (err == nil) != tc.ok {
			t.Errorf("a checkpoint of HistoryMax %d, a TTL of %d ms: %v", tc.history, tc.ttl, err)
		}
	}
}

// Checkpoint chunks are at least one byte and at most ValueBytesLimit,
// whatever is asked. Pins CheckpointRecords's chunkBytesMax < 1 and its
// min(chunkBytesMax, ValueBytesLimit).
func TestCheckpointChunksStayWithinTheirBounds(t *testing.T) {
	r := newRun(Mutations{})
	if _, err := r.b.CheckpointRecords(0, 0); !errors.Is(err, ErrConfig) {
		t.Fatalf("chunks of 0 bytes: %v, want ErrConfig", err)
	}
	if recs, err := r.b.CheckpointRecords(1, 0); err != nil || len(recs) < 2 {
		t.Fatalf("chunks of 1 byte: %d, %v", len(recs), err)
	}
	cfg := testConfig(Mutations{})
	cfg.ValueBytesMax = ValueBytesLimit
	b, err := NewBucket(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"a", "b"} {
		rec := EncodeRecord(Write{Op: OpPut, Key: []byte(key), Value: make([]byte, ValueBytesLimit*3/4)})
		if _, err := b.Apply(uint64(1+i), rec); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := b.CheckpointRecords(2*ValueBytesLimit, 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("a checkpoint of 1.5 MiB in chunks of at most 2 MiB asked: %d chunks, %v; want 2", len(recs), err)
	}
	for _, rec := range recs {
		if _, err := DecodeRecord(rec); err != nil {
			t.Fatalf("a chunk of %d bytes: %v", len(rec.Value), err)
		}
	}
}

// A checkpoint needs at most CheckpointChunksMax chunks: a body of
// exactly that many chunk-sized pieces is cut, one byte more is refused.
// Pins CheckpointRecords's count > CheckpointChunksMax.
func TestACheckpointOfCheckpointChunksMaxChunks(t *testing.T) {
	cfg := testConfig(Mutations{})
	cfg.ValueBytesMax = ValueBytesLimit
	bodyOf := func(n int) (*Bucket, int) {
		b, err := NewBucket(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Apply(1, EncodeRecord(Write{Op: OpPut, Key: []byte("a"), Value: make([]byte, n)})); err != nil {
			t.Fatal(err)
		}
		recs, err := b.CheckpointRecords(ValueBytesLimit, 0)
		if err != nil {
			t.Fatal(err)
		}
		size := 0
		for _, r := range recs {
			size += len(r.Value)
		}
		return b, size
	}
	_, base := bodyOf(0)
	for _, extra := range []int{0, 1} {
		b, size := bodyOf(CheckpointChunksMax - base + extra)
		recs, err := b.CheckpointRecords(1, 0)
		switch {
		case extra == 0 && (err != nil || len(recs) != CheckpointChunksMax):
			t.Errorf("a body of %d bytes in 1-byte chunks: %d chunks, %v", size, len(recs), err)
		case extra == 1 && (err == nil || recs != nil):
			t.Errorf("a body of %d bytes in 1-byte chunks: %d chunks, no error", size, len(recs))
		}
	}
}

// A checkpoint is due once the log since the last one outgrew both
// minBytes and the state: strictly. Pins CheckpointDue's > and its
// max(minBytes, snapshotBytes).
func TestACheckpointIsDueOnceTheLogOutgrewMinBytes(t *testing.T) {
	r := newRun(Mutations{})
	for i := range 10 {
		r.mustApply(t, put("a", fmt.Sprint(i), 0)) // the state stays 3 revisions
	}
	logBytes, state := r.b.LogBytesSinceCheckpoint(), r.b.SnapshotBytes()
	if logBytes <= state {
		t.Fatalf("log %d bytes, state %d: the scenario needs the log larger", logBytes, state)
	}
	for minBytes, due := range map[int64]bool{logBytes - 1: true, logBytes: false, logBytes + 100: false, 0: true} {
		if got := r.b.CheckpointDue(minBytes); got != due {
			t.Errorf("log %d bytes, state %d, CheckpointDue(%d) = %v, want %v", logBytes, state, minBytes, got, due)
		}
	}
}

// A chunk continues the pending checkpoint only if it is of the same run:
// the same base and the same count. Pins step's t.base == c.Base and
// t.count == c.Count.
func TestAChunkOfAnotherRunDoesNotContinueThePendingOne(t *testing.T) {
	for _, tc := range []struct {
		name    string
		between bool // a put between the two chunks
		base    uint64
		count   uint32
		index   uint32
	}{
		{"another base", true, 2, 2, 1},
		{"another count", false, 1, 3, 1},
	} {
		r := newRun(Mutations{})
		r.mustApply(t, put("a", "1", 0))
		recs, err := r.b.CheckpointRecords(8, 0)
		if err != nil || len(recs) < 2 {
			t.Fatalf("%s: %d chunks, %v", tc.name, len(recs), err)
		}
		first := chunkRecord(1, 0, 2, recs[0].Value)
		if _, res := r.mustApply(t, first); !res.ChunkCounted {
			t.Fatalf("%s: the first chunk did not count", tc.name)
		}
		if tc.between {
			r.mustApply(t, put("b", "1", 0))
		}
		_, res, err := r.apply(chunkRecord(tc.base, tc.index, tc.count, recs[1].Value))
		if err != nil || res.ChunkCounted || res.CheckpointComplete {
			t.Errorf("%s: the chunk of base %d, %d of %d counted %v, complete %v, %v; want void", tc.name, tc.base, tc.index, tc.count, res.ChunkCounted, res.CheckpointComplete, err)
		}
	}
}

// A malformed KV record in the log a Seeker reads is corruption, not a
// record to pass over. Pins Seeker.Add's error return.
func TestASeekerReportsAMalformedRecord(t *testing.T) {
	s := NewSeeker(Mutations{})
	if c, err := s.Add(1, chunkRecord(0, 0, 0, []byte("x"))); !errors.Is(err, ErrMalformed) || c != nil {
		t.Fatalf("a chunk of count 0: %v, %v; want ErrMalformed", c, err)
	}
}

// A complete checkpoint the Seeker finds must decode and carry the state
// at the base its chunks name. Pins Seeker.Add's DecodeCheckpoint error
// and c.Snapshot.Applied != w.Chunk.Base.
func TestASeekerRefusesACheckpointThatIsNotOfItsBase(t *testing.T) {
	if c, err := NewSeeker(Mutations{}).Add(1, chunkRecord(0, 0, 1, []byte("not a checkpoint"))); !errors.Is(err, ErrCheckpoint) || c != nil {
		t.Fatalf("a complete checkpoint that does not decode: %v, %v; want ErrCheckpoint", c, err)
	}
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 0))
	recs, err := r.b.CheckpointRecords(ValueBytesLimit, 0) // the state at 1, one chunk
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d chunks, %v", len(recs), err)
	}
	if c, err := NewSeeker(Mutations{}).Add(2, recs[0]); err != nil || c == nil || c.Snapshot.Applied != 1 {
		t.Fatalf("the checkpoint at its base: %v, %v", c, err)
	}
	if c, err := NewSeeker(Mutations{}).Add(3, chunkRecord(2, 0, 1, recs[0].Value)); !errors.Is(err, ErrCheckpoint) || c != nil {
		t.Fatalf("the state at 1 under base 2: %v, %v; want ErrCheckpoint", c, err)
	}
}

// LoadCheckpoint takes a checkpoint only under its Config, after its
// base, and of a state Restore accepts. Pins its HistoryMax and
// TombstoneTTLms checks, lastSeq <= c.Snapshot.Applied and Restore's
// error.
func TestLoadCheckpointRefusesWhatDoesNotFit(t *testing.T) {
	cfg := testConfig(Mutations{})
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 0))
	good := Checkpoint{HistoryMax: cfg.HistoryMax, TombstoneTTLms: cfg.TombstoneTTLms, Snapshot: r.b.Snapshot()}
	if b, err := LoadCheckpoint(cfg, good, 2); err != nil || b.Applied() != 2 || b.LastCheckpoint() != 1 {
		t.Fatalf("the good checkpoint: %v", err)
	}
	otherHistory, otherTTL, bad := good, good, good
	otherHistory.HistoryMax++
	otherTTL.TombstoneTTLms++
	bad.Snapshot.Floor = 0
	for _, tc := range []struct {
		name    string
		c       Checkpoint
		lastSeq uint64
		want    error
	}{
		{"another HistoryMax", otherHistory, 2, ErrConfig},
		{"another TTL", otherTTL, 2, ErrConfig},
		{"the last chunk at the base", good, 1, ErrCheckpoint},
		{"a state Restore refuses", bad, 2, ErrSnapshot},
	} {
		if b, err := LoadCheckpoint(cfg, tc.c, tc.lastSeq); !errors.Is(err, tc.want) || b != nil {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// A Seeker passes over a run of chunks cut short (its leader lost office
// mid-run) and loads the next checkpoint from its own chunks alone,
// whether a record sits between the two runs (the pass-over keeps what
// the cut run left) or the next run follows at once. Pins Seeker.Add's
// reset of the checkpoint body at a first chunk.
func TestASeekerLoadsTheCheckpointAfterACutRun(t *testing.T) {
	for _, between := range []bool{true, false} {
		r, _ := checkpointScenario(t, Mutations{}, func(r *bucketRun, chunks []Record) {
			r.mustApply(t, chunks[0])
			if between {
				r.mustApply(t, put("c", "after the cut", 4))
			}
			again, err := r.b.CheckpointRecords(24, 5)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range again {
				r.mustApply(t, c)
			}
		})
		r.mustApply(t, put("a", "4", 6))
		b := seekFrom(t, r, Mutations{}, 1)
		if b == nil {
			t.Fatalf("a record between the runs %v: no checkpoint found", between)
		}
		if !bytes.Equal(AppendSnapshot(nil, b.Snapshot()), AppendSnapshot(nil, r.b.Snapshot())) || b.LastCheckpoint() != r.b.LastCheckpoint() {
			t.Fatalf("a record between the runs %v: the rebuilt bucket differs (checkpoint %d, want %d)", between, b.LastCheckpoint(), r.b.LastCheckpoint())
		}
	}
}

// The record and snapshot layouts name their ops as the format comments
// say — "put", "del", "compact", "checkpoint" in OpHeader, op byte 1 put
// and 2 del in a snapshot — so that replicas of other builds read them.
// Pins Op.String's cases and OpPut = iota + 1.
func TestTheLayoutsNameTheirOpsAsDocumented(t *testing.T) {
	for op, name := range map[Op]string{OpPut: "put", OpDelete: "del", OpCompact: "compact", OpCheckpoint: "checkpoint"} {
		w := Write{Op: op, Key: []byte("k")}
		switch op {
		case OpCompact:
			w.Key = nil
		case OpCheckpoint:
			w.Key, w.Value, w.Chunk = nil, []byte("x"), CheckpointChunk{Base: 1, Count: 1}
		}
		r := EncodeRecord(w)
		if got := string(r.Headers[0].Value); got != name {
			t.Errorf("%v is written %q, want %q", op, got, name)
		}
		r.Headers[0].Value = []byte(name)
		if got, err := DecodeRecord(r); err != nil || got.Op != op {
			t.Errorf("%q reads as %v, %v; want %v", name, got.Op, err, op)
		}
	}
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 5))
	r.mustApply(t, del("a", 7))
	want := []byte{'K', 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2,
		0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 1, 'a', 0, 0, 0, 1, '1',
		0, 0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 7, 0, 1, 'a', 0, 0, 0, 0}
	if got := AppendSnapshot(nil, r.b.Snapshot()); !bytes.Equal(got, want) {
		t.Errorf("the snapshot of a@1 put, a@2 deleted:\n got %x\nwant %x", got, want)
	}
	if s, err := DecodeSnapshot(want); err != nil || len(s.Revisions) != 2 || s.Revisions[0].Op != OpPut || s.Revisions[1].Op != OpDelete {
		t.Errorf("the documented snapshot decodes to %+v, %v", s, err)
	}
}

// A record's bounds are inclusive: a key of KeyBytesLimit bytes and a
// value of ValueBytesLimit decode, one byte more of either is malformed;
// a compaction carries neither a key nor a value. Pins checkKey's
// len(key) > keyBytesMax, DecodeRecord's len(r.Value) > ValueBytesLimit
// and its len(r.Value) != 0 for a compaction.
func TestARecordAtItsBoundsDecodes(t *testing.T) {
	op := func(name string) []Header { return []Header{{Key: OpHeader, Value: []byte(name)}} }
	for _, tc := range []struct {
		name string
		r    Record
		ok   bool
	}{
		{"a key of KeyBytesLimit", Record{Key: make([]byte, KeyBytesLimit), Headers: op("put")}, true},
		{"a key of one byte more", Record{Key: make([]byte, KeyBytesLimit+1), Headers: op("put")}, false},
		{"a value of ValueBytesLimit", Record{Key: []byte("k"), Value: make([]byte, ValueBytesLimit), Headers: op("put")}, true},
		{"a value of one byte more", Record{Key: []byte("k"), Value: make([]byte, ValueBytesLimit+1), Headers: op("put")}, false},
		{"a compaction", Record{Headers: op("compact")}, true},
		{"a compaction with a value", Record{Value: []byte("v"), Headers: op("compact")}, false},
	} {
		_, err := DecodeRecord(tc.r)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// A snapshot's bounds are inclusive: a key of KeyBytesLimit bytes and a
// value of ValueBytesLimit decode (one byte more of either is refused:
// TestDecodeSnapshotRefusesDamage). Pins DecodeSnapshot's
// keyBytes > KeyBytesLimit and valueBytes > ValueBytesLimit.
func TestASnapshotAtItsBoundsDecodes(t *testing.T) {
	s := Snapshot{Applied: 2, Floor: 1, Revisions: []Revision{
		{Seq: 1, Op: OpPut, Key: strings.Repeat("k", KeyBytesLimit), Value: []byte("v")},
		{Seq: 2, Op: OpPut, Key: "v", Value: make([]byte, ValueBytesLimit)},
	}}
	got, err := DecodeSnapshot(AppendSnapshot(nil, s))
	if err != nil || len(got.Revisions) != 2 || len(got.Revisions[0].Key) != KeyBytesLimit || len(got.Revisions[1].Value) != ValueBytesLimit {
		t.Fatalf("a key of %d bytes, a value of %d: %v", KeyBytesLimit, ValueBytesLimit, err)
	}
}

// No proper prefix of a snapshot decodes: one cut anywhere, in a key or
// a value length included, is refused, never read past its end. Pins
// DecodeSnapshot's len(rest) < keyBytes+4.
func TestNoPrefixOfASnapshotDecodes(t *testing.T) {
	r := newRun(Mutations{})
	r.mustApply(t, put("abc", "1", 5))
	r.mustApply(t, del("abc", 7))
	enc := AppendSnapshot(nil, r.b.Snapshot())
	for n := range len(enc) {
		if _, err := DecodeSnapshot(enc[:n:n]); !errors.Is(err, ErrSnapshot) {
			t.Errorf("the first %d of %d bytes: %v, want ErrSnapshot", n, len(enc), err)
		}
	}
}

// A snapshot's revisions have strictly ascending seqs, none above the
// applied seq, and its floor is at least 1 — also where floor-1 would
// wrap around to an applied seq of MaxUint64; DecodeSnapshot and Restore
// both refuse anything else with ErrSnapshot. Pins DecodeSnapshot's
// s.Floor == 0, rev.Seq <= prev (not <) and rev.Seq > s.Applied, and
// Restore's s.Floor == 0, rev.Seq <= prev (not <) and prev = rev.Seq.
func TestASnapshotsSeqsAscendWithinItsFloorAndApplied(t *testing.T) {
	rev := func(seq uint64, key string) Revision {
		return Revision{Seq: seq, Op: OpPut, Key: key, Value: []byte("v")}
	}
	for _, tc := range []struct {
		name string
		s    Snapshot
	}{
		{"a seq twice", Snapshot{Applied: 3, Floor: 1, Revisions: []Revision{rev(2, "a"), rev(2, "b")}}},
		{"a seq going back", Snapshot{Applied: 3, Floor: 1, Revisions: []Revision{rev(1, "a"), rev(3, "b"), rev(2, "c")}}},
		{"the last seq above applied", Snapshot{Applied: 3, Floor: 1, Revisions: []Revision{rev(1, "a"), rev(4, "b")}}},
		{"floor 0 at applied MaxUint64", Snapshot{Applied: math.MaxUint64, Floor: 0}},
	} {
		if _, err := DecodeSnapshot(AppendSnapshot(nil, tc.s)); !errors.Is(err, ErrSnapshot) {
			t.Errorf("%s: DecodeSnapshot: %v, want ErrSnapshot", tc.name, err)
		}
		if b, err := Restore(testConfig(Mutations{}), tc.s); !errors.Is(err, ErrSnapshot) || b != nil {
			t.Errorf("%s: Restore: %v, want ErrSnapshot", tc.name, err)
		}
	}
}

// Restore copies the values it is given: a bucket restored from a
// decoded snapshot keeps its values when the bytes it was decoded from
// are reused. Pins Restore's cloneValue.
func TestRestoreCopiesTheValues(t *testing.T) {
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "value", 5))
	enc := AppendSnapshot(nil, r.b.Snapshot())
	s, err := DecodeSnapshot(enc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Restore(testConfig(Mutations{}), s)
	if err != nil {
		t.Fatal(err)
	}
	clear(enc)
	if got, ok := b.Get("a"); !ok || string(got.Value) != "value" {
		t.Fatalf("a after its snapshot's bytes were reused: %q, %v; want \"value\"", got.Value, ok)
	}
}

// Restore, and Rebuild through it, take an invalid Config as ErrConfig.
// Pins Restore's error from newBucketAt.
func TestRestoreRefusesAnInvalidConfig(t *testing.T) {
	cfg := testConfig(Mutations{})
	cfg.HistoryMax = 0
	s := Snapshot{Applied: 1, Floor: 1}
	if b, err := Restore(cfg, s); !errors.Is(err, ErrConfig) || b != nil {
		t.Fatalf("Restore under HistoryMax 0: %v, want ErrConfig", err)
	}
	if b, err := Rebuild(cfg, &s, nil); !errors.Is(err, ErrConfig) || b != nil {
		t.Fatalf("Rebuild under HistoryMax 0: %v, want ErrConfig", err)
	}
}

// Rebuild without a snapshot applies the log from seq 1 to an empty
// bucket: the bucket that applied it. It fails when the snapshot does not
// restore or the tail does not apply (a gap after the snapshot), rather
// than hand back a bucket that is not the log's. Pins Rebuild's
// snapshot == nil, its error from Restore and its error from Apply.
func TestRebuildIsTheBucketThatAppliedTheLog(t *testing.T) {
	r := sampleBucket(t)
	b, err := Rebuild(testConfig(Mutations{}), nil, r.log)
	if err != nil || !bytes.Equal(AppendSnapshot(nil, b.Snapshot()), AppendSnapshot(nil, r.b.Snapshot())) {
		t.Fatalf("Rebuild of the whole log without a snapshot: %v", err)
	}
	snap := r.b.Snapshot()
	bad := Snapshot{Applied: snap.Applied, Floor: 0}
	if b, err := Rebuild(testConfig(Mutations{}), &bad, r.log); !errors.Is(err, ErrSnapshot) || b != nil {
		t.Fatalf("Rebuild from a snapshot of floor 0: %v, want ErrSnapshot", err)
	}
	gap := []Entry{{Seq: snap.Applied + 2, Record: put("a", "9", 20)}}
	if b, err := Rebuild(testConfig(Mutations{}), &snap, gap); !errors.Is(err, ErrOutOfOrder) || b != nil {
		t.Fatalf("Rebuild of a tail with a gap after the snapshot: %v, want ErrOutOfOrder", err)
	}
}
