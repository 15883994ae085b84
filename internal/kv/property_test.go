package kv

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Random histories of puts, deletes, CASes (right, stale and create-only),
// compactions, records that are not KV and checkpoints (valid ones, void
// ones whose base another record followed, runs cut by another record),
// under a random HistoryMax. For each: the floor invariant and GET hold
// against the raw log; the log kept from LogRetainFrom() holds every kept
// revision; a snapshot taken anywhere, rebuilt with the log kept after
// truncating below min(LogRetainFrom(), snapshot+1), equals applying
// every record; a replica whose log starts anywhere up to the latest
// complete checkpoint's first chunk loads the bucket from the first
// complete checkpoint it meets (Seeker) and ends equal to applying every
// record (same snapshot encoding, same latest checkpoint); and watches
// from random cursors never skip a revision silently (checkpoint chunks
// hold none).
//
// Replay a failure with: go test ./internal/kv -run TestRandomHistories/seed=N
func TestRandomHistories(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			if err := randomHistory(seed, Mutations{}); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		})
	}
}

var historyKeys = []string{"a", "a/b", "a/c", "b", "c/x"}

// randomHistory returns the first property that fails.
func randomHistory(seed uint64, m Mutations) error {
	rng := rand.New(rand.NewPCG(seed, 0x6b76))
	cfg := testConfig(m)
	cfg.HistoryMax = 1 + rng.IntN(4)
	cfg.WatchScanRevisionsMax = 1 + rng.IntN(8)
	b, err := NewBucket(cfg)
	if err != nil {
		return err
	}
	var log []Entry
	outcomes := map[uint64]Outcome{} // seq → what Apply did
	snapAt := 1 + rng.IntN(150)
	var snap []byte
	nowMs := int64(0)
	applyRec := func(rec Record) error {
		seq := b.Applied() + 1
		res, err := b.Apply(seq, rec)
		if err != nil {
			return err
		}
		log = append(log, Entry{Seq: seq, Record: rec})
		outcomes[seq] = res.Outcome
		return nil
	}
	for len(log) < 150 {
		nowMs += int64(rng.IntN(300)) - 40 // a new leader's clock may be behind
		key := historyKeys[rng.IntN(len(historyKeys))]
		if rng.IntN(100) < 8 {
			if err := randomCheckpoint(b, rng, nowMs, applyRec); err != nil {
				return err
			}
			if len(log) >= snapAt && snap == nil {
				snap = AppendSnapshot(nil, b.Snapshot())
			}
			continue
		}
		var rec Record
		switch x := rng.IntN(100); {
		case x < 45:
			rec = put(key, fmt.Sprint(len(log)), nowMs)
		case x < 60:
			rec = del(key, nowMs)
		case x < 70:
			rec = cas(key, "cas", b.latestSeq(key))
		case x < 80:
			rec = cas(key, "stale", rng.Uint64N(uint64(len(log)+2)))
		case x < 85:
			rec = cas(key, "create", 0)
		case x < 95:
			rec = CompactRecord(nowMs)
		default:
			rec = Record{Key: []byte(key), Headers: []Header{{Key: "nereus-control", Value: []byte("install")}}}
		}
		if err := applyRec(rec); err != nil {
			return err
		}
		seq := b.Applied()
		if len(log) >= snapAt && snap == nil {
			snap = AppendSnapshot(nil, b.Snapshot())
		}
		if rng.IntN(10) == 0 {
			if err := checkAgainstLog(b, log, outcomes, rng); err != nil {
				return fmt.Errorf("after seq %d: %w", seq, err)
			}
		}
	}
	if err := checkAgainstLog(b, log, outcomes, rng); err != nil {
		return fmt.Errorf("at the end: %w", err)
	}
	want := AppendSnapshot(nil, b.Snapshot())
	s, err := DecodeSnapshot(snap)
	if err != nil {
		return err
	}
	truncateBelow := min(b.LogRetainFrom(), s.Applied+1)
	rebuilt, err := Rebuild(cfg, &s, log[truncateBelow-1:])
	if err != nil {
		return fmt.Errorf("rebuild from the snapshot at %d: %w", snapAt, err)
	}
	if got := AppendSnapshot(nil, rebuilt.Snapshot()); !bytes.Equal(got, want) {
		return fmt.Errorf("rebuilt from the snapshot at %d:\n got %x\nwant %x", snapAt, got, want)
	}
	return checkSeekers(b, cfg, log, m)
}

// randomCheckpoint applies the chunks of a checkpoint of b's state, in
// small chunks: as the leader proposes it, or void (a record slipped in
// before its first chunk: its base is not the seq before it), or cut (a
// record between two of its chunks).
func randomCheckpoint(b *Bucket, rng *rand.Rand, nowMs int64, apply func(Record) error) error {
	recs, err := b.CheckpointRecords(16+rng.IntN(200), nowMs)
	if err != nil {
		return err
	}
	slipped := put(historyKeys[rng.IntN(len(historyKeys))], "slipped", nowMs)
	cutAt := -1
	switch x := rng.IntN(10); {
	case x < 2:
		if err := apply(slipped); err != nil { // CheckpointBaseIsPrecedingSeq voids it
			return err
		}
	case x < 4 && len(recs) > 2:
		cutAt = 1 + rng.IntN(len(recs)-2) // CheckpointChunksContiguous voids it
	}
	for i, rec := range recs {
		if i == cutAt {
			if err := apply(slipped); err != nil {
				return err
			}
			continue // the chunk the record took the place of is lost
		}
		if err := apply(rec); err != nil {
			return err
		}
	}
	return nil
}

// checkSeekers rebuilds the bucket as a replica whose log starts at each
// seq up to the latest complete checkpoint's first chunk would: it must
// find a checkpoint, and end equal to b (which applied every record).
func checkSeekers(b *Bucket, cfg Config, log []Entry, m Mutations) error {
	want := AppendSnapshot(nil, b.Snapshot())
	for start := uint64(1); start <= b.LastCheckpoint()+1; start++ {
		s := NewSeeker(m)
		var loaded *Bucket
		for _, e := range log[start-1:] {
			if loaded != nil {
				if _, err := loaded.Apply(e.Seq, e.Record); err != nil {
					return fmt.Errorf("log from %d: %w", start, err)
				}
				continue
			}
			c, err := s.Add(e.Seq, e.Record)
			if err != nil {
				return fmt.Errorf("log from %d: %w", start, err)
			}
			if c != nil {
				if loaded, err = LoadCheckpoint(cfg, *c, e.Seq); err != nil {
					return fmt.Errorf("log from %d: %w", start, err)
				}
			}
		}
		if loaded == nil {
			return fmt.Errorf("log from %d: no complete checkpoint found; the latest has base %d", start, b.LastCheckpoint())
		}
		if got := AppendSnapshot(nil, loaded.Snapshot()); !bytes.Equal(got, want) || loaded.LastCheckpoint() != b.LastCheckpoint() {
			return fmt.Errorf("log from %d: loaded from a checkpoint, latest %d (want %d):\n got %x\nwant %x", start, loaded.LastCheckpoint(), b.LastCheckpoint(), got, want)
		}
	}
	return nil
}

// checkAgainstLog checks the bucket against the raw log it was applied
// from, independently of how it keeps its state.
func checkAgainstLog(b *Bucket, log []Entry, outcomes map[uint64]Outcome, rng *rand.Rand) error {
	written := func(seq uint64) (Write, bool) {
		if outcomes[seq] != Written {
			return Write{}, false
		}
		w, _ := DecodeRecord(log[seq-1].Record)
		return w, true
	}
	// overwritten: HistoryMax newer revisions of its key were written.
	overwritten := func(seq uint64, key string) bool {
		newer := 0
		for s := seq + 1; s <= b.Applied(); s++ {
			if w, ok := written(s); ok && string(w.Key) == key {
				newer++
			}
		}
		return newer >= b.cfg.HistoryMax
	}
	if enc := AppendSnapshot(nil, b.Snapshot()); int64(len(enc)) != b.SnapshotBytes() {
		return fmt.Errorf("SnapshotBytes %d, the encoding takes %d", b.SnapshotBytes(), len(enc))
	}
	// The floor: every revision at or above it is kept or overwritten.
	for seq := b.Floor(); seq <= b.Applied(); seq++ {
		w, ok := written(seq)
		if !ok {
			continue
		}
		if _, err := b.GetRevision(string(w.Key), seq); err != nil && !overwritten(seq, string(w.Key)) {
			return fmt.Errorf("revision %d of %q at or above the floor %d evicted", seq, w.Key, b.Floor())
		}
	}
	// The log kept from LogRetainFrom holds every revision a watch at or
	// above the floor may deliver.
	retain := b.LogRetainFrom()
	if retain > b.Floor() {
		return fmt.Errorf("LogRetainFrom %d above the floor %d", retain, b.Floor())
	}
	for seq := uint64(1); seq < retain; seq++ {
		if w, ok := written(seq); ok {
			if _, err := b.GetRevision(string(w.Key), seq); err == nil {
				return fmt.Errorf("kept revision %d below LogRetainFrom %d", seq, retain)
			}
		}
	}
	// CAS: applied exactly when its condition held against the latest
	// revision written before it (a purge removes only a key whose latest
	// revision is a tombstone, which a create finds as good as absent).
	type revisionOf struct {
		op  Op
		seq uint64
	}
	latestBefore := map[string]revisionOf{}
	for seq := uint64(1); seq <= b.Applied(); seq++ {
		w, err := DecodeRecord(log[seq-1].Record)
		applied := outcomes[seq] == Written
		if err == nil && w.Conditional {
			prev, exists := latestBefore[string(w.Key)]
			holds := !exists || prev.op == OpDelete
			if w.Expected != 0 {
				holds = exists && prev.seq == w.Expected
			}
			// Expecting a tombstone that a compaction purged: refused.
			purged := exists && prev.op == OpDelete && prev.seq == w.Expected && !applied
			if applied != holds && !purged {
				return fmt.Errorf("CAS at %d expecting %d applied %v, latest before it %+v (exists %v)", seq, w.Expected, applied, prev, exists)
			}
		}
		if applied {
			latestBefore[string(w.Key)] = revisionOf{w.Op, seq}
		}
	}
	// GET: a key whose latest written revision is a value has that value.
	latest := map[string]uint64{}
	for seq := uint64(1); seq <= b.Applied(); seq++ {
		if w, ok := written(seq); ok {
			latest[string(w.Key)] = seq
		}
	}
	for key, seq := range latest {
		w, _ := written(seq)
		rev, found := b.Get(key)
		if w.Op == OpPut && (!found || rev.Seq != seq || !bytes.Equal(rev.Value, w.Value)) {
			return fmt.Errorf("Get(%q) = %+v, %v; its latest revision is the put at %d", key, rev, found, seq)
		}
		if w.Op == OpDelete && found {
			return fmt.Errorf("Get(%q) found %d; it was deleted at %d", key, rev.Seq, seq)
		}
	}
	// Watches from random cursors.
	for range 4 {
		c := Cursor{Next: 1 + rng.Uint64N(b.Applied()+1), Prefix: []string{"", "a", "a/", "c/"}[rng.IntN(4)]}
		if err := checkWatch(b, c, 1+rng.IntN(4), written, overwritten); err != nil {
			return fmt.Errorf("watch from %+v: %w", c, err)
		}
	}
	return nil
}

// checkWatch drains a watch and checks that it accounts for every seq:
// delivered as written in the log, or skipped for a reason that holds —
// or the cursor is below the floor and the watch says CURSOR_EXPIRED.
func checkWatch(b *Bucket, c Cursor, credit int, written func(uint64) (Write, bool), overwritten func(uint64, string) bool) error {
	start := c.Next
	for calls := 0; c.Next <= b.Applied(); calls++ {
		if calls > 1000 {
			return fmt.Errorf("no progress at %d", c.Next)
		}
		batch := b.Watch(c, credit)
		if c.Next < b.Floor() {
			if !batch.Expired || len(batch.Events) != 1 || batch.Events[0].Kind != EventCursorExpired || batch.Events[0].Floor != b.Floor() {
				return fmt.Errorf("cursor %d below the floor %d got %v", c.Next, b.Floor(), describe(batch.Events))
			}
			return nil
		}
		deliveries := 0
		for _, e := range batch.Events {
			switch e.Kind {
			case EventPut, EventDelete:
				deliveries++
				w, ok := written(e.Revision.Seq)
				if e.Revision.Seq != c.Next || !ok || string(w.Key) != e.Revision.Key || !bytes.Equal(w.Value, e.Revision.Value) ||
					(w.Op == OpDelete) != (e.Kind == EventDelete) || !strings.HasPrefix(e.Revision.Key, c.Prefix) {
					return fmt.Errorf("at %d delivered %v, log has %+v (written %v)", c.Next, describe([]Event{e}), w, ok)
				}
				c.Next++
			case EventSkipped:
				if e.From != c.Next || e.To < e.From {
					return fmt.Errorf("at %d skipped %d-%d", c.Next, e.From, e.To)
				}
				for seq := e.From; seq <= e.To; seq++ {
					w, ok := written(seq)
					benign := !ok || !strings.HasPrefix(string(w.Key), c.Prefix) || overwritten(seq, string(w.Key))
					if !benign {
						return fmt.Errorf("revision %d of %q skipped silently (%v), floor %d, started at %d", seq, w.Key, e.Reasons, b.Floor(), start)
					}
				}
				c.Next = e.To + 1
			default:
				return fmt.Errorf("at %d: %v above the floor %d", c.Next, describe([]Event{e}), b.Floor())
			}
		}
		if deliveries > credit || c.Next != batch.Next {
			return fmt.Errorf("%d deliveries for credit %d; events end at %d, batch says %d", deliveries, credit, c.Next, batch.Next)
		}
	}
	return nil
}
