package kv

import (
	"fmt"
)

const testTTLms = 1000

func testConfig(m Mutations) Config {
	return Config{HistoryMax: 3, TombstoneTTLms: testTTLms, KeyBytesMax: 64, ValueBytesMax: 1024,
		WatchScanRevisionsMax: 1000, InflightWritesMax: 16, ParkedWritesMax: 16, Mutations: m}
}

// bucketRun applies writes to a bucket in seq order, as a replica does.
type bucketRun struct {
	b   *Bucket
	log []Entry // every record applied, for rebuilds and checks
}

func newRun(m Mutations) *bucketRun {
	b, err := NewBucket(testConfig(m))
	if err != nil {
		panic(err)
	}
	return &bucketRun{b: b}
}

func (r *bucketRun) apply(rec Record) (uint64, ApplyResult, error) {
	seq := r.b.Applied() + 1
	res, err := r.b.Apply(seq, rec)
	if err != nil {
		return 0, res, err
	}
	r.log = append(r.log, Entry{Seq: seq, Record: rec})
	return seq, res, nil
}

func (r *bucketRun) mustApply(t tb, rec Record) (uint64, ApplyResult) {
	t.Helper()
	seq, res, err := r.apply(rec)
	if err != nil {
		t.Fatal(err)
	}
	return seq, res
}

func put(key, value string, atMs int64) Record {
	return EncodeRecord(Write{Op: OpPut, Key: []byte(key), Value: []byte(value), TimestampMs: atMs})
}

func del(key string, atMs int64) Record {
	return EncodeRecord(Write{Op: OpDelete, Key: []byte(key), TimestampMs: atMs})
}

func cas(key, value string, expected uint64) Record {
	return EncodeRecord(Write{Op: OpPut, Key: []byte(key), Value: []byte(value), Conditional: true, Expected: expected})
}

// seqsOf lists the revisions' seqs.
func seqsOf(revs []Revision) []uint64 {
	var seqs []uint64
	for _, r := range revs {
		seqs = append(seqs, r.Seq)
	}
	return seqs
}

// describe renders watch events compactly: "PUT a@3", "SKIP 4-5 overwritten".
func describe(events []Event) []string {
	var out []string
	for _, e := range events {
		switch e.Kind {
		case EventPut, EventDelete:
			out = append(out, fmt.Sprintf("%v %s@%d", e.Kind, e.Revision.Key, e.Revision.Seq))
		case EventSkipped:
			out = append(out, fmt.Sprintf("SKIP %d-%d %v", e.From, e.To, e.Reasons))
		case EventCursorExpired:
			out = append(out, fmt.Sprintf("CURSOR_EXPIRED floor=%d", e.Floor))
		}
	}
	return out
}

// tb is the part of testing.TB the scenarios use, so that a mutation test
// can run a scenario and see it fail (failureRecorder).
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
}
