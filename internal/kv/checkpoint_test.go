package kv

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

func TestCheckpointRecordRoundTrip(t *testing.T) {
	w := Write{Op: OpCheckpoint, Value: []byte("body"), TimestampMs: 5, Chunk: CheckpointChunk{Base: 41, Index: 2, Count: 3}}
	got, err := DecodeRecord(EncodeRecord(w))
	if err != nil {
		t.Fatal(err)
	}
	if got.Op != OpCheckpoint || got.Chunk != w.Chunk || string(got.Value) != "body" || got.TimestampMs != 5 {
		t.Fatalf("round trip of %+v gave %+v", w, got)
	}
}

func TestDecodeRecordRefusesMalformedChunks(t *testing.T) {
	chunk := func(base uint64, index, count uint32) Header {
		return Header{Key: CheckpointHeader, Value: CheckpointChunk{Base: base, Index: index, Count: count}.append(nil)}
	}
	op := Header{Key: OpHeader, Value: []byte("checkpoint")}
	for _, tc := range []struct {
		name string
		r    Record
	}{
		{"no chunk header", Record{Value: []byte("x"), Headers: []Header{op}}},
		{"expect header instead", Record{Value: []byte("x"), Headers: []Header{op, {Key: ExpectHeader, Value: make([]byte, 8)}}}},
		{"short chunk header", Record{Value: []byte("x"), Headers: []Header{op, {Key: CheckpointHeader, Value: make([]byte, 15)}}}},
		{"three headers", Record{Value: []byte("x"), Headers: []Header{op, chunk(1, 0, 1), chunk(1, 0, 1)}}},
		{"no chunks", Record{Value: []byte("x"), Headers: []Header{op, chunk(1, 0, 0)}}},
		{"index past count", Record{Value: []byte("x"), Headers: []Header{op, chunk(1, 2, 2)}}},
		{"too many chunks", Record{Value: []byte("x"), Headers: []Header{op, chunk(1, 0, CheckpointChunksMax+1)}}},
		{"base overflows", Record{Value: []byte("x"), Headers: []Header{op, chunk(1<<64-1, 0, 1)}}},
		{"with a key", Record{Key: []byte("k"), Value: []byte("x"), Headers: []Header{op, chunk(1, 0, 1)}}},
		{"empty", Record{Headers: []Header{op, chunk(1, 0, 1)}}},
		{"too large", Record{Value: make([]byte, ValueBytesLimit+1), Headers: []Header{op, chunk(1, 0, 1)}}},
	} {
		if _, err := DecodeRecord(tc.r); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", tc.name, err)
		}
	}
}

func TestDecodeCheckpointRefusesDamage(t *testing.T) {
	good := AppendCheckpoint(nil, Checkpoint{HistoryMax: 3, TombstoneTTLms: testTTLms, Snapshot: sampleBucket(t).b.Snapshot()})
	if _, err := DecodeCheckpoint(good); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"empty":          func([]byte) []byte { return nil },
		"bad magic":      func(b []byte) []byte { b[0] = 'X'; return b },
		"bad version":    func(b []byte) []byte { b[1] = 2; return b },
		"history 0":      func(b []byte) []byte { b[2] = 0; return b },
		"history 65":     func(b []byte) []byte { b[2] = HistoryLimit + 1; return b },
		"ttl 0":          func(b []byte) []byte { copy(b[3:11], make([]byte, 8)); return b },
		"truncated":      func(b []byte) []byte { return b[:len(b)-1] },
		"trailing bytes": func(b []byte) []byte { return append(b, 0) },
	} {
		if _, err := DecodeCheckpoint(mutate(bytes.Clone(good))); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("%s: got %v, want ErrCheckpoint", name, err)
		}
	}
}

// FuzzDecodeCheckpoint: any body decodes or fails with ErrCheckpoint,
// never panics, and what decodes encodes back to the same bytes.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add(AppendCheckpoint(nil, Checkpoint{HistoryMax: 3, TombstoneTTLms: testTTLms, Snapshot: sampleBucket(f).b.Snapshot()}))
	f.Add([]byte{checkpointMagic, checkpointVersion, 1, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCheckpoint(b)
		if err != nil {
			if !errors.Is(err, ErrCheckpoint) {
				t.Fatalf("error %v is not ErrCheckpoint", err)
			}
			return
		}
		if again := AppendCheckpoint(nil, c); !bytes.Equal(again, b) {
			t.Fatalf("%x decoded to %+v, encoded back to %x", b, c, again)
		}
	})
}

// FuzzSeeker: a Seeker fed any records never panics, and a checkpoint it
// returns loads into a bucket whose encoding is the checkpoint's state.
func FuzzSeeker(f *testing.F) {
	r := sampleBucket(f)
	recs, err := r.b.CheckpointRecords(20, 1)
	if err != nil {
		f.Fatal(err)
	}
	var stream []byte
	for _, rec := range recs {
		stream = append(stream, byte(len(rec.Value)))
		stream = append(stream, rec.Headers[1].Value...)
		stream = append(stream, rec.Value...)
	}
	f.Add(uint64(r.b.Applied()+1), stream)
	f.Fuzz(func(t *testing.T, start uint64, stream []byte) {
		s := NewSeeker(Mutations{})
		seq := start
		for len(stream) > 1+chunkHeaderBytes {
			n := int(stream[0])
			header, rest := stream[1:1+chunkHeaderBytes], stream[1+chunkHeaderBytes:]
			n = min(n, len(rest))
			rec := Record{Value: rest[:n], Headers: []Header{{Key: OpHeader, Value: []byte("checkpoint")}, {Key: CheckpointHeader, Value: header}}}
			stream = rest[n:]
			c, err := s.Add(seq, rec)
			if err != nil {
				if !errors.Is(err, ErrCheckpoint) && !errors.Is(err, ErrSnapshot) && !errors.Is(err, ErrMalformed) {
					t.Fatalf("error %v", err)
				}
				return
			}
			if c != nil {
				cfg := testConfig(Mutations{})
				cfg.HistoryMax, cfg.TombstoneTTLms = c.HistoryMax, c.TombstoneTTLms
				b, err := LoadCheckpoint(cfg, *c, seq)
				if err != nil {
					if !errors.Is(err, ErrSnapshot) && !errors.Is(err, ErrCheckpoint) {
						t.Fatalf("load: %v", err)
					}
					return
				}
				if b.Applied() != seq || b.LastCheckpoint() != c.Snapshot.Applied {
					t.Fatalf("loaded at %d with checkpoint %d, want %d and %d", b.Applied(), b.LastCheckpoint(), seq, c.Snapshot.Applied)
				}
			}
			seq++
		}
	})
}

// checkpointScenario applies a few writes, then the chunks of a
// checkpoint (chunks of 24 bytes: several) placed by place, and returns
// the run and the checkpoint's declared base.
func checkpointScenario(t tb, m Mutations, place func(r *bucketRun, chunks []Record)) (*bucketRun, uint64) {
	r := newRun(m)
	r.mustApply(t, put("a", "1", 1))
	r.mustApply(t, put("b", "2", 2))
	r.mustApply(t, put("a", "3", 3))
	base := r.b.Applied()
	chunks, err := r.b.CheckpointRecords(24, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) < 3 {
		t.Fatalf("%d chunks, want 3 or more", len(chunks))
	}
	place(r, chunks)
	return r, base
}

// seekFrom rebuilds r's bucket as a replica whose log starts at start:
// nil when it finds no complete checkpoint.
func seekFrom(t tb, r *bucketRun, m Mutations, start uint64) *Bucket {
	t.Helper()
	s := NewSeeker(m)
	var b *Bucket
	for _, e := range r.log[start-1:] {
		if b != nil {
			if _, err := b.Apply(e.Seq, e.Record); err != nil {
				t.Fatal(err)
			}
			continue
		}
		c, err := s.Add(e.Seq, e.Record)
		if err != nil {
			t.Fatalf("seeking from %d: %v", start, err)
		}
		if c != nil {
			if b, err = LoadCheckpoint(testConfig(m), *c, e.Seq); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b
}

// voidCheckpointChangesNothing (CheckpointBaseIsPrecedingSeq): a
// checkpoint whose first chunk another record preceded declares a base
// that is not the seq before it; it is void on every replica — the
// bucket's state and latest checkpoint stay, and a replica rebuilding
// from the log passes it over rather than load a state that misses the
// record in between.
func voidCheckpointChangesNothing(t tb, m Mutations) {
	r, _ := checkpointScenario(t, m, func(r *bucketRun, chunks []Record) {
		r.mustApply(t, put("c", "slipped in", 4))
		before := AppendSnapshot(nil, r.b.Snapshot())
		for _, c := range chunks {
			if _, res := r.mustApply(t, c); res.Outcome != Checkpointed {
				t.Fatalf("chunk applied as %v", res.Outcome)
			}
		}
		after := AppendSnapshot(nil, r.b.Snapshot())
		if !bytes.Equal(before[10:], after[10:]) { // all but the applied seq
			t.Fatalf("a void checkpoint changed the state")
		}
	})
	if got := r.b.LastCheckpoint(); got != 0 {
		t.Fatalf("a void checkpoint became the latest (base %d)", got)
	}
	if b := seekFrom(t, r, m, 1); b != nil {
		got, _ := b.Get("c")
		t.Fatalf("a replica rebuilt from the void checkpoint: c is %q", got.Value)
	}
}

// cutCheckpointCompletesNothing (CheckpointChunksContiguous): a run of
// chunks another record cut (its leader lost office mid-run; a chunk is
// lost) completes no checkpoint.
func cutCheckpointCompletesNothing(t tb, m Mutations) {
	r, _ := checkpointScenario(t, m, func(r *bucketRun, chunks []Record) {
		r.mustApply(t, chunks[0])
		r.mustApply(t, put("c", "cut", 4)) // in chunk 1's place
		for _, c := range chunks[2:] {
			r.mustApply(t, c)
		}
	})
	if got := r.b.LastCheckpoint(); got != 0 {
		t.Fatalf("a cut checkpoint completed (base %d)", got)
	}
	if b := seekFrom(t, r, m, 1); b != nil {
		t.Fatalf("a replica rebuilt from a cut checkpoint")
	}
}

// divergedReplicaStopsAtCheckpoint (CheckpointMatchesState): a replica
// whose state differs from the leader's (here: one write applied
// differently) refuses the leader's checkpoint as it completes — an
// error, its cursor and latest checkpoint unchanged — instead of
// recording as the truncation point a checkpoint whose state it does not
// hold. The leader's own replica completes it.
func divergedReplicaStopsAtCheckpoint(t tb, m Mutations) {
	leader, diverged := newRun(m), newRun(m)
	for _, r := range []*bucketRun{leader, diverged} {
		r.mustApply(t, put("a", "1", 1))
		r.mustApply(t, put("b", "2", 2))
	}
	leader.mustApply(t, put("a", "3", 3))
	diverged.mustApply(t, put("a", "damaged", 3))
	chunks, err := leader.b.CheckpointRecords(24, 4)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range chunks {
		leader.mustApply(t, c)
		_, _, err := diverged.apply(c)
		switch {
		case i < len(chunks)-1 && err != nil:
			t.Fatalf("chunk %d: %v", i, err)
		case i == len(chunks)-1 && !errors.Is(err, ErrCheckpointMismatch):
			t.Fatalf("the last chunk applied to a diverged replica: %v, want ErrCheckpointMismatch", err)
		}
	}
	if leader.b.LastCheckpoint() != 3 {
		t.Fatalf("the leader's replica did not complete its checkpoint: %d", leader.b.LastCheckpoint())
	}
	if diverged.b.LastCheckpoint() != 0 || diverged.b.Applied() != 3+uint64(len(chunks))-1 {
		t.Fatalf("diverged replica: latest checkpoint %d, applied %d", diverged.b.LastCheckpoint(), diverged.b.Applied())
	}
}

func TestDivergedReplicaStopsAtCheckpoint(t *testing.T) {
	divergedReplicaStopsAtCheckpoint(t, Mutations{})
}

func TestVoidCheckpointChangesNothing(t *testing.T)  { voidCheckpointChangesNothing(t, Mutations{}) }
func TestCutCheckpointCompletesNothing(t *testing.T) { cutCheckpointCompletesNothing(t, Mutations{}) }

// TestCheckpointRebuildsTheBucket: a valid checkpoint completes, and a
// replica whose log starts at its first chunk (the log before it
// truncated) rebuilds the bucket equal to one that applied everything,
// watches from every cursor included.
func TestCheckpointRebuildsTheBucket(t *testing.T) {
	r, base := checkpointScenario(t, Mutations{}, func(r *bucketRun, chunks []Record) {
		for _, c := range chunks {
			r.mustApply(t, c)
		}
	})
	r.mustApply(t, del("b", 9))
	r.mustApply(t, put("a", "4", 10))
	if r.b.LastCheckpoint() != base {
		t.Fatalf("latest checkpoint %d, want %d", r.b.LastCheckpoint(), base)
	}
	b := seekFrom(t, r, Mutations{}, base+1)
	if b == nil {
		t.Fatal("no checkpoint found")
	}
	if !bytes.Equal(AppendSnapshot(nil, b.Snapshot()), AppendSnapshot(nil, r.b.Snapshot())) || b.LastCheckpoint() != base {
		t.Fatalf("rebuilt bucket differs")
	}
	for next := uint64(1); next <= r.b.Applied()+1; next++ {
		want, got := r.b.Watch(Cursor{Next: next}, 100), b.Watch(Cursor{Next: next}, 100)
		if fmt.Sprint(describe(want.Events), want.Next) != fmt.Sprint(describe(got.Events), got.Next) {
			t.Fatalf("watch from %d: %v on the rebuilt bucket, %v on the original", next, describe(got.Events), describe(want.Events))
		}
	}
}

// TestCheckpointWriteAmplification: a leader that checkpoints whenever
// CheckpointDue says writes, over many overwrites of a few keys, at most
// about as many checkpoint bytes as log bytes (amortized write
// amplification at most about 2x), and the log since the latest
// checkpoint stays bounded by the state (or the minimum).
func TestCheckpointWriteAmplification(t *testing.T) {
	const minBytes = 512
	r := newRun(Mutations{})
	var logBytes, checkpointBytes, checkpoints int64
	for i := range 20_000 {
		rec := put(fmt.Sprintf("key-%d", i%20), fmt.Sprintf("value %d of a run of overwrites", i), int64(i))
		r.mustApply(t, rec)
		logBytes += recordBytes(rec)
		if r.b.CheckpointDue(minBytes) {
			state := r.b.SnapshotBytes()
			chunks, err := r.b.CheckpointRecords(256, int64(i))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range chunks {
				r.mustApply(t, c)
				checkpointBytes += recordBytes(c)
			}
			checkpoints++
			if r.b.LastCheckpoint() != r.b.Applied()-uint64(len(chunks)) || r.b.LogBytesSinceCheckpoint() != 0 {
				t.Fatalf("checkpoint %d did not complete", checkpoints)
			}
			if since := r.b.SnapshotBytes(); since != state {
				t.Fatalf("a checkpoint changed the state's size: %d, was %d", since, state)
			}
		}
		if since := r.b.LogBytesSinceCheckpoint(); since > max(minBytes, r.b.SnapshotBytes())+recordBytes(rec) {
			t.Fatalf("%d log bytes since the latest checkpoint, state %d", since, r.b.SnapshotBytes())
		}
	}
	t.Logf("%d log bytes of writes, %d checkpoints of %d bytes in all (state %d bytes)", logBytes, checkpoints, checkpointBytes, r.b.SnapshotBytes())
	if checkpoints < 10 {
		t.Fatalf("only %d checkpoints", checkpoints)
	}
	// Each checkpoint costs the state plus per-chunk overhead, and is due
	// only once the log since the previous one outgrew the state.
	if checkpointBytes > logBytes*3/2 {
		t.Fatalf("%d checkpoint bytes for %d log bytes: more than 1.5x", checkpointBytes, logBytes)
	}
}

// BenchmarkCheckpoint: a bucket of 10,000 keys with 100-byte values (about
// 1.4 MB encoded): the leader's encoding into 1 MiB chunks, a replica's
// applying of them (the CRC check encodes its own state), and a
// rebuilding replica's seek and load.
func BenchmarkCheckpoint(b *testing.B) {
	cfg := testConfig(Mutations{})
	cfg.KeyBytesMax = KeyBytesLimit
	bucket, err := NewBucket(cfg)
	if err != nil {
		b.Fatal(err)
	}
	value := string(bytes.Repeat([]byte("v"), 100))
	for i := range 10_000 {
		if _, err := bucket.Apply(uint64(i+1), put(fmt.Sprintf("key-%05d", i), value, int64(i))); err != nil {
			b.Fatal(err)
		}
	}
	chunks, err := bucket.CheckpointRecords(ValueBytesLimit, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("state %d bytes in %d chunks", bucket.SnapshotBytes(), len(chunks))
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := bucket.CheckpointRecords(ValueBytesLimit, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("apply-verified", func(b *testing.B) {
		for b.Loop() {
			replica := *bucket // shares the maps: the chunks change no state
			for i, c := range chunks {
				if _, err := replica.Apply(bucket.Applied()+1+uint64(i), c); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("seek-and-load", func(b *testing.B) {
		for b.Loop() {
			s := NewSeeker(Mutations{})
			for i, c := range chunks {
				seq := bucket.Applied() + 1 + uint64(i)
				cp, err := s.Add(seq, c)
				if err != nil {
					b.Fatal(err)
				}
				if cp != nil {
					if _, err := LoadCheckpoint(cfg, *cp, seq); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
	})
}
