package kv

import (
	"bytes"
	"errors"
	"testing"
)

func sampleBucket(t testing.TB) *bucketRun {
	r := newRun(Mutations{})
	r.mustApply(t, put("a", "1", 5))
	r.mustApply(t, put("b", "", 6))
	r.mustApply(t, del("a", 7))
	r.mustApply(t, put("c", "3", 8))
	r.mustApply(t, del("c", 9))
	r.mustApply(t, CompactRecord(7+testTTLms)) // purges a
	r.mustApply(t, put("b", "2", 10))
	return r
}

func TestSnapshotRoundTrip(t *testing.T) {
	r := sampleBucket(t)
	enc := AppendSnapshot(nil, r.b.Snapshot())
	snap, err := DecodeSnapshot(enc)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Applied != 7 || snap.Floor != 4 || len(snap.Revisions) != 4 {
		t.Fatalf("snapshot %+v", snap)
	}
	restored, err := Restore(testConfig(Mutations{}), snap)
	if err != nil {
		t.Fatal(err)
	}
	if again := AppendSnapshot(nil, restored.Snapshot()); !bytes.Equal(again, enc) {
		t.Fatalf("restored state differs:\n%x\n%x", again, enc)
	}
	// The restored bucket goes on like the original.
	for _, b := range []*Bucket{r.b, restored} {
		if _, err := b.Apply(8, put("b", "3", 11)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(AppendSnapshot(nil, r.b.Snapshot()), AppendSnapshot(nil, restored.Snapshot())) {
		t.Fatal("restored bucket diverged after one more record")
	}
}

func TestDecodeSnapshotRefusesDamage(t *testing.T) {
	enc := AppendSnapshot(nil, sampleBucket(t).b.Snapshot())
	damaged := func(f func([]byte) []byte) []byte { return f(bytes.Clone(enc)) }
	for name, b := range map[string][]byte{
		"empty":          nil,
		"wrong magic":    damaged(func(b []byte) []byte { b[0] = 'X'; return b }),
		"wrong version":  damaged(func(b []byte) []byte { b[1] = 2; return b }),
		"truncated":      enc[:len(enc)-1],
		"trailing byte":  append(bytes.Clone(enc), 0),
		"floor 0":        damaged(func(b []byte) []byte { copy(b[10:18], make([]byte, 8)); return b }),
		"floor above":    damaged(func(b []byte) []byte { b[17] = 9; return b }),
		"huge count":     damaged(func(b []byte) []byte { b[18] = 0xff; return b }),
		"op 3":           damaged(func(b []byte) []byte { b[snapshotHeaderBytes+8] = 3; return b }),
		"seq above":      damaged(func(b []byte) []byte { b[snapshotHeaderBytes+7] = 8; return b }),
		"seq not rising": damaged(func(b []byte) []byte { b[snapshotHeaderBytes+7] = 7; return b }),
		"empty key":      damaged(func(b []byte) []byte { b[snapshotHeaderBytes+18] = 0; return b }),
	} {
		if _, err := DecodeSnapshot(b); !errors.Is(err, ErrSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Well-formed bytes of states no bucket holds.
	for name, rev := range map[string]Revision{
		"empty key":         {Seq: 1, Op: OpPut},
		"key too long":      {Seq: 1, Op: OpPut, Key: string(make([]byte, KeyBytesLimit+1))},
		"value too long":    {Seq: 1, Op: OpPut, Key: "k", Value: make([]byte, ValueBytesLimit+1)},
		"delete with value": {Seq: 1, Op: OpDelete, Key: "k", Value: []byte("v")},
	} {
		b := AppendSnapshot(nil, Snapshot{Applied: 1, Floor: 1, Revisions: []Revision{rev}})
		if _, err := DecodeSnapshot(b); !errors.Is(err, ErrSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestRestoreRefusesNonsense(t *testing.T) {
	cfg := testConfig(Mutations{})
	for name, s := range map[string]Snapshot{
		"floor 0":        {Applied: 3},
		"floor too high": {Applied: 3, Floor: 5},
		"seq above":      {Applied: 3, Floor: 1, Revisions: []Revision{{Seq: 4, Op: OpPut, Key: "k"}}},
		"bad op":         {Applied: 3, Floor: 1, Revisions: []Revision{{Seq: 2, Op: OpCompact, Key: "k"}}},
		"no key":         {Applied: 3, Floor: 1, Revisions: []Revision{{Seq: 2, Op: OpPut}}},
	} {
		if _, err := Restore(cfg, s); !errors.Is(err, ErrSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeSnapshot: garbage never panics and fails with ErrSnapshot;
// what decodes is canonical (encodes back to the same bytes) and
// restores.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(AppendSnapshot(nil, sampleBucket(f).b.Snapshot()))
	f.Add(AppendSnapshot(nil, Snapshot{Applied: 0, Floor: 1}))
	f.Add([]byte{snapshotMagic, snapshotVersion})
	cfg := testConfig(Mutations{})
	cfg.HistoryMax = HistoryLimit
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b)
		if err != nil {
			if !errors.Is(err, ErrSnapshot) {
				t.Fatalf("error %v is not ErrSnapshot", err)
			}
			return
		}
		if again := AppendSnapshot(nil, s); !bytes.Equal(again, b) {
			t.Fatalf("not canonical:\n in %x\nout %x", b, again)
		}
		if _, err := Restore(cfg, s); err != nil {
			t.Fatalf("decoded snapshot does not restore: %v", err)
		}
	})
}
