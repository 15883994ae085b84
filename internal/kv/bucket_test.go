package kv

import (
	"errors"
	"slices"
	"testing"
)

func TestBucketPutGetHistoryKeys(t *testing.T) {
	r := newRun(Mutations{})
	for i, v := range []string{"1", "2", "3", "4"} {
		if seq, res := r.mustApply(t, put("a", v, 0)); res.Outcome != Written || seq != uint64(i+1) {
			t.Fatalf("put %s: seq %d %v", v, seq, res.Outcome)
		}
	}
	r.mustApply(t, put("ab", "x", 0)) // 5
	r.mustApply(t, put("b", "y", 0))  // 6
	r.mustApply(t, del("b", 0))       // 7
	if rev, ok := r.b.Get("a"); !ok || string(rev.Value) != "4" || rev.Seq != 4 {
		t.Fatalf("Get a = %+v, %v", rev, ok)
	}
	if got := seqsOf(r.b.History("a")); !slices.Equal(got, []uint64{2, 3, 4}) {
		t.Fatalf("History a = %v, want the last 3", got)
	}
	if _, ok := r.b.Get("b"); ok {
		t.Fatal("deleted key b found")
	}
	if got := seqsOf(r.b.History("b")); !slices.Equal(got, []uint64{6, 7}) {
		t.Fatalf("History b = %v (tombstone kept)", got)
	}
	if got := r.b.Keys("a"); !slices.Equal(got, []string{"a", "ab"}) {
		t.Fatalf("Keys(a) = %v", got)
	}
	if got := r.b.Keys(""); !slices.Equal(got, []string{"a", "ab"}) {
		t.Fatalf("Keys() = %v (b is deleted)", got)
	}
	if rev, err := r.b.GetRevision("a", 3); err != nil || string(rev.Value) != "3" {
		t.Fatalf("GetRevision(a, 3) = %+v, %v", rev, err)
	}
	if _, err := r.b.GetRevision("a", 1); !errors.Is(err, ErrRevisionNotKept) {
		t.Fatalf("GetRevision(a, 1) (overwritten): %v", err)
	}
	if _, err := r.b.GetRevision("a", 5); !errors.Is(err, ErrRevisionNotKept) {
		t.Fatalf("GetRevision(a, 5) (another key's): %v", err)
	}
	if r.b.Floor() != 1 {
		t.Fatalf("floor %d: nothing was evicted", r.b.Floor())
	}
}

func TestApplyRefusesOutOfOrder(t *testing.T) {
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 0))
	for _, seq := range []uint64{1, 3, 0} {
		if _, err := r.b.Apply(seq, put("a", "2", 0)); !errors.Is(err, ErrOutOfOrder) {
			t.Errorf("Apply(%d) after 1: %v", seq, err)
		}
	}
	if r.b.Applied() != 1 || string(must(r.b.Get("a")).Value) != "1" {
		t.Fatal("a refused Apply changed the state")
	}
	// A malformed KV record is corruption: refused, the cursor stays.
	bad := Record{Headers: []Header{{Key: OpHeader, Value: []byte("put")}}}
	if _, err := r.b.Apply(2, bad); !errors.Is(err, ErrMalformed) || r.b.Applied() != 1 {
		t.Fatalf("malformed: %v, applied %d", err, r.b.Applied())
	}
	// A record that is not KV advances the cursor only.
	if res, err := r.b.Apply(2, Record{Headers: []Header{{Key: "nereus-control", Value: []byte("install")}}}); err != nil || res.Outcome != NotRevision || r.b.Applied() != 2 {
		t.Fatalf("install entry: %+v, %v, applied %d", res, err, r.b.Applied())
	}
}

func must(rev Revision, ok bool) Revision {
	if !ok {
		panic("not found")
	}
	return rev
}

func TestApplyChecksCASCondition(t *testing.T) { applyChecksCASCondition(t, Mutations{}) }

func applyChecksCASCondition(t tb, m Mutations) {
	r := newRun(m)
	if _, res := r.mustApply(t, cas("a", "1", 0)); res.Outcome != Written {
		t.Fatalf("create of an absent key: %v", res.Outcome)
	}
	if _, res := r.mustApply(t, cas("a", "2", 0)); res.Outcome != Refused || res.Current != 1 {
		t.Fatalf("create of a live key: %+v", res)
	}
	if _, res := r.mustApply(t, cas("a", "3", 1)); res.Outcome != Written {
		t.Fatalf("update at the current revision: %v", res.Outcome)
	}
	if _, res := r.mustApply(t, cas("a", "4", 1)); res.Outcome != Refused || res.Current != 3 {
		t.Fatalf("update at a stale revision: %+v", res)
	}
	r.mustApply(t, del("a", 0)) // 5
	if _, res := r.mustApply(t, cas("a", "5", 0)); res.Outcome != Written {
		t.Fatalf("create of a deleted key: %v", res.Outcome)
	}
	if got := seqsOf(r.b.History("a")); !slices.Equal(got, []uint64{3, 5, 6}) {
		t.Fatalf("History a = %v: a refused CAS is no revision", got)
	}
}

// TestCompactionPurgesExpiredTombstones: a tombstone is kept for its TTL,
// then a compaction record purges it with its key's history and raises
// the floor above it; live keys stay whatever their age.
func TestCompactionPurgesExpiredTombstones(t *testing.T) {
	compactionPurgesExpiredTombstones(t, Mutations{})
}

func compactionPurgesExpiredTombstones(t tb, m Mutations) {
	r := newRun(m)
	r.mustApply(t, put("live", "v", 0))  // 1: old, live
	r.mustApply(t, put("gone", "v", 0))  // 2
	r.mustApply(t, del("gone", 100))     // 3: tombstone at 100 ms
	r.mustApply(t, put("later", "v", 0)) // 4
	r.mustApply(t, del("later", 900))    // 5: tombstone at 900 ms
	if r.b.PurgeDue(100 + testTTLms - 1) {
		t.Fatal("purge due before the TTL")
	}
	if !r.b.PurgeDue(100 + testTTLms) {
		t.Fatal("purge not due at the TTL")
	}
	if _, res := r.mustApply(t, CompactRecord(100+testTTLms)); res.Outcome != Compacted || res.PurgedKeys != 1 {
		t.Fatalf("compaction: %+v", res)
	}
	if r.b.History("gone") != nil || r.b.Floor() != 4 {
		t.Fatalf("gone: %v, floor %d; want purged and floor 4", r.b.History("gone"), r.b.Floor())
	}
	if _, ok := r.b.Get("live"); !ok {
		t.Fatal("the live key's only revision was evicted")
	}
	if got := seqsOf(r.b.History("later")); !slices.Equal(got, []uint64{4, 5}) {
		t.Fatalf("later: %v, its tombstone is not expired", got)
	}
	if got := r.b.LogRetainFrom(); got != 1 {
		t.Fatalf("LogRetainFrom = %d: the live key's revision 1 pins the log", got)
	}
	r.mustApply(t, put("live", "v2", 0)) // 7
	r.mustApply(t, put("live", "v3", 0)) // 8
	r.mustApply(t, put("live", "v4", 0)) // 9: revision 1 overwritten
	if got := r.b.LogRetainFrom(); got != 4 {
		t.Fatalf("LogRetainFrom = %d, want the floor 4", got)
	}
	r.mustApply(t, CompactRecord(900+testTTLms))
	if r.b.Floor() != 6 || r.b.LogRetainFrom() != 6 {
		t.Fatalf("floor %d, retain from %d; want 6 after purging later@5", r.b.Floor(), r.b.LogRetainFrom())
	}
	if _, err := r.b.GetRevision("later", 5); !errors.Is(err, ErrRevisionNotKept) {
		t.Fatalf("purged tombstone: %v", err)
	}
}

func TestExpiredNeverOverflows(t *testing.T) {
	const minMs, maxMs = -1 << 63, 1<<63 - 1
	for _, tc := range []struct {
		written, now, ttl int64
		want              bool
	}{
		{0, 999, 1000, false}, {0, 1000, 1000, true}, {minMs, maxMs, maxMs, true},
		{maxMs, minMs, 1, false}, {maxMs - 1, maxMs, 2, false}, {10, 5, 1, false},
	} {
		if got := expired(tc.written, tc.now, tc.ttl); got != tc.want {
			t.Errorf("expired(%d, %d, %d) = %v", tc.written, tc.now, tc.ttl, got)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := testConfig(Mutations{}).Validate(); err != nil {
		t.Fatal(err)
	}
	for _, breakIt := range []func(*Config){
		func(c *Config) { c.HistoryMax = 0 },
		func(c *Config) { c.HistoryMax = HistoryLimit + 1 },
		func(c *Config) { c.TombstoneTTLms = 0 },
		func(c *Config) { c.KeyBytesMax = KeyBytesLimit + 1 },
		func(c *Config) { c.ValueBytesMax = -1 },
		func(c *Config) { c.WatchScanRevisionsMax = 0 },
		func(c *Config) { c.InflightWritesMax = 0 },
	} {
		c := testConfig(Mutations{})
		breakIt(&c)
		if _, err := NewBucket(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// TestOverwrittenRevisionsDoNotAccumulate: the seq index drops what
// history trimming removed, so a hot key does not grow what a watcher
// scans.
func TestOverwrittenRevisionsDoNotAccumulate(t *testing.T) {
	r := newRun(Mutations{})
	for range 1000 {
		r.mustApply(t, put("hot", "v", 0))
	}
	if n := len(r.b.order); n > 2*r.b.cfg.HistoryMax+1 {
		t.Fatalf("%d seqs indexed for %d kept revisions", n, len(r.b.bySeq))
	}
}
