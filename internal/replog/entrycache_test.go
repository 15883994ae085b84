package replog

import (
	"fmt"
	"testing"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// openTestMember opens member 1 of a three-member group on a fresh
// in-memory file system; nothing steps it, the tests drive its store.
func openTestMember(t *testing.T) *Member {
	t.Helper()
	m, err := OpenMember(Config{ID: 1, Members: []replica.NodeID{1, 2, 3}, Dir: "/n1", FS: vfs.NewMem(), Logger: quiet, Clock: env.Wall{},
		Send: func(replica.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// entriesOf builds entries first.. of one epoch whose values name them.
func entriesOf(first, epoch uint64, values ...string) []replica.Entry {
	var out []replica.Entry
	for i, v := range values {
		out = append(out, replica.Entry{Seq: first + uint64(i), Epoch: epoch, Data: storage.AppendRecord(nil, &storage.Record{Value: []byte(v)})})
	}
	return out
}

// describe renders entries as seq/epoch:value.
func describe(t *testing.T, entries []replica.Entry) string {
	t.Helper()
	var out []string
	for _, e := range entries {
		rec, err := storage.DecodeRecord(e.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d/%d:%s", e.Seq, e.Epoch, rec.Value))
	}
	return fmt.Sprint(out)
}

// expectEntries checks that the store returns first..last as want.
func expectEntries(t *testing.T, m *Member, first, last uint64, want string) {
	t.Helper()
	got, err := memberStore{m}.Entries(first, last)
	if err != nil {
		t.Fatal(err)
	}
	if s := describe(t, got); s != want {
		t.Fatalf("Entries(%d, %d) = %s, want %s", first, last, s, want)
	}
}

// TestCachedEntriesNeverOutliveATruncation: the store answers Entries
// from its cache of recent entries, and what it answers is always what the
// log holds — after a truncation, after a truncation and new entries of a
// later epoch, after a snapshot install. Each step fails if the cache's
// corresponding rule (entrycache.go) is removed: the cut at the log's end,
// the replacement of a run an add does not continue, the refusal below
// the log's start.
func TestCachedEntriesNeverOutliveATruncation(t *testing.T) {
	m := openTestMember(t)
	s := memberStore{m}
	if err := s.Append(entriesOf(1, 1, "a", "b", "c", "d", "e")); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.cache.read(m.log, 2, 5); !ok {
		t.Fatal("fresh entries are not cached")
	}
	expectEntries(t, m, 2, 5, "[2/1:b 3/1:c 4/1:d 5/1:e]")

	// A new leader's truncation: 4 and 5 are gone.
	if err := s.TruncateAfter(3); err != nil {
		t.Fatal(err)
	}
	expectEntries(t, m, 3, 5, "[3/1:c]")

	// Its entries of epoch 2 replace them.
	if err := s.Append(entriesOf(4, 2, "D", "E")); err != nil {
		t.Fatal(err)
	}
	expectEntries(t, m, 3, 5, "[3/1:c 4/2:D 5/2:E]")
	if _, ok := m.cache.read(m.log, 4, 5); !ok {
		t.Fatal("the new entries are not cached")
	}

	// A snapshot install at 5 empties the log after it: nothing before 6
	// may be answered, from the cache or not.
	if err := s.InstallSnapshot(replica.SnapshotMeta{Seq: 5, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(entriesOf(6, 2, "f")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Entries(4, 6); err == nil {
		t.Fatalf("Entries(4, 6) after the install at 5 = %s, want an error", describe(t, got))
	}
	expectEntries(t, m, 6, 6, "[6/2:f]")
}

// TestCommittedEntriesComeFromTheCacheUntilTaken: the applier reads
// committed entries through the cache (decoded as the log would give
// them), the cache keeps committed entries until the applier took them,
// and evicts them then.
func TestCommittedEntriesComeFromTheCacheUntilTaken(t *testing.T) {
	m := openTestMember(t)
	l := &Log{m: m}
	if err := (memberStore{m}).Append(entriesOf(1, 1, "a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	if err := m.log.Sync(); err != nil {
		t.Fatal(err)
	}
	m.commitSeq.Store(2)
	got, err := l.Committed(nil, 1, 10)
	if err != nil || len(got) != 2 || string(got[0].Record.Value) != "a" || string(got[1].Record.Value) != "b" || got[1].Epoch != 1 {
		t.Fatalf("Committed(1, 10) = %+v, %v; want a and b (3 is not committed)", got, err)
	}
	fromLog, err := m.Read(1, 10)
	if err != nil || fmt.Sprint(fromLog) != fmt.Sprint(got) {
		t.Fatalf("the cache answered %+v, the log holds %+v (%v)", got, fromLog, err)
	}
	m.cache.evict(3) // 3 committed meanwhile, not taken yet
	if _, ok := m.cache.read(m.log, 3, 3); !ok {
		t.Fatal("a committed entry the applier has not taken was evicted")
	}
	if _, ok := m.cache.read(m.log, 2, 3); ok {
		t.Fatal("an entry the applier took is still cached")
	}
}

// TestCacheKeepsItsBounds: the cache holds at most cacheBytesMax of data,
// dropping the oldest entries first, and what it drops is read back from
// the log.
func TestCacheKeepsItsBounds(t *testing.T) {
	m := openTestMember(t)
	big := string(make([]byte, cacheBytesMax/4))
	for seq := uint64(1); seq <= 6; seq++ {
		if err := (memberStore{m}).Append(entriesOf(seq, 1, big)); err != nil {
			t.Fatal(err)
		}
	}
	if m.cache.bytes > cacheBytesMax {
		t.Fatalf("the cache holds %d bytes, over %d", m.cache.bytes, cacheBytesMax)
	}
	if _, ok := m.cache.read(m.log, 2, 2); ok {
		t.Fatal("entry 2 is still cached: the bound was not kept")
	}
	if _, ok := m.cache.read(m.log, 6, 6); !ok {
		t.Fatal("the newest entry is not cached")
	}
	got, err := memberStore{m}.Entries(2, 2)
	if err != nil || len(got) != 1 || got[0].Seq != 2 {
		t.Fatalf("Entries(2, 2) from the log = %v, %v", got, err)
	}
}

// TestLargeAppendsAreSplitUnderTheFrameLimit: an Append whose entries
// carry more than appendBytesMax goes out as consecutive Appends of at
// most that much each, chained by PrevSeq/PrevEpoch, and a follower's
// kernel takes them as the whole.
func TestLargeAppendsAreSplitUnderTheFrameLimit(t *testing.T) {
	var sent []replica.Message
	m := &Member{cfg: Config{Send: func(msg replica.Message) { sent = append(sent, msg) }}}
	data := make([]byte, 64<<10)
	msg := replica.Message{Type: replica.MsgAppend, From: 1, To: 2, Epoch: 3, PrevSeq: 10, PrevEpoch: 2, CommitSeq: 9, FirstSeq: 11, LastSeqSent: 210}
	for seq := uint64(11); seq <= 210; seq++ {
		epoch := uint64(2)
		if seq > 100 {
			epoch = 3
		}
		msg.Entries = append(msg.Entries, replica.Entry{Seq: seq, Epoch: epoch, Data: data})
	}
	m.send(msg)
	if len(sent) != 4 { // 200 × 64 KiB in chunks of 64 (4 MiB)
		t.Fatalf("%d messages, want 4", len(sent))
	}
	prevSeq, prevEpoch := uint64(10), uint64(2)
	for i, s := range sent {
		bytes := 0
		for _, e := range s.Entries {
			bytes += len(e.Data)
		}
		first, last := s.Entries[0], s.Entries[len(s.Entries)-1]
		if bytes > appendBytesMax || s.PrevSeq != prevSeq || s.PrevEpoch != prevEpoch || s.FirstSeq != first.Seq ||
			s.LastSeqSent != last.Seq || s.CommitSeq != 9 || s.Epoch != 3 || s.To != 2 {
			t.Fatalf("message %d: %d bytes, prev (%d, %d), first %d, last sent %d, entries %d..%d; want prev (%d, %d)",
				i, bytes, s.PrevSeq, s.PrevEpoch, s.FirstSeq, s.LastSeqSent, first.Seq, last.Seq, prevSeq, prevEpoch)
		}
		prevSeq, prevEpoch = last.Seq, last.Epoch
	}
	if prevSeq != 210 {
		t.Fatalf("the messages end at %d, want 210", prevSeq)
	}

	// A follower takes the parts in order as it would the whole.
	follower, err := replica.New(replica.Config{ID: 2, Replicas: []replica.NodeID{1, 2, 3}},
		replica.Persisted{Hard: replica.HardState{Promised: 3, PromisedTo: 1}, Last: 10,
			Epochs: []replica.EpochStart{{Epoch: 2, StartSeq: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sent {
		follower.Step(s)
	}
	if st := follower.Status(); st.Last != 210 || st.CommitSeq != 9 {
		t.Fatalf("follower holds up to %d, commit %d; want 210 and 9", st.Last, st.CommitSeq)
	}
}
