package storage

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// epochStartsByRead derives what EpochStarts answers from the records.
func epochStartsByRead(t *testing.T, l *Log, from uint64) []EpochStart {
	t.Helper()
	var out []EpochStart
	for seq := from; seq < l.NextSeq(); {
		es, err := l.Read(seq, 1000, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if len(out) == 0 || out[len(out)-1].Epoch != e.Epoch {
				out = append(out, EpochStart{Epoch: e.Epoch, Seq: e.Seq})
			}
		}
		seq = es[len(es)-1].Seq + 1
	}
	return out
}

// EpochStarts, from the batch headers alone, answers what the records
// say, from any seq — across segments, sealed and reopened (their sparse
// index), with epochs changing inside a segment and across one.
func TestEpochStartsAreTheRecordsEpochs(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 3))
		fsys := vfs.NewMem()
		l := openLog(t, fsys, smallOpts())
		epoch, i := uint64(1), 0
		for range 60 {
			if rng.IntN(4) == 0 {
				epoch += 1 + rng.Uint64N(2)
			}
			n := 1 + rng.IntN(5)
			recs := make([]Record, n)
			for j := range recs {
				recs[j] = testRecord(i)
				i++
			}
			if _, err := l.Append(epoch, recs); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		for reopen := range 2 {
			if reopen == 1 {
				l.Close()
				l = openLog(t, fsys, smallOpts())
			}
			for from := l.StartSeq(); from <= l.NextSeq(); from++ {
				got, err := l.EpochStarts(from)
				if err != nil {
					t.Fatalf("seed %d from %d: %v", seed, from, err)
				}
				if want := epochStartsByRead(t, l, from); !slices.Equal(got, want) {
					t.Fatalf("seed %d reopened %d from %d: %v, want %v", seed, reopen, from, got, want)
				}
				if from < l.NextSeq() {
					if e, err := l.EpochAt(from); err != nil || e != got[0].Epoch {
						t.Fatalf("seed %d reopened %d: EpochAt(%d) = %d, %v; want %d", seed, reopen, from, e, err, got[0].Epoch)
					}
				}
			}
		}
		l.Close()
	}
}

// A known damaged range, and a repair's gap, answer as Read does.
func TestEpochStartsStopsAtDamageAndGaps(t *testing.T) {
	fsys := vfs.NewMem()
	l := openLog(t, fsys, smallOpts())
	for i := range 40 {
		if _, err := l.Append(1+uint64(i/10), []Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
	}
	l.Sync()
	l.damage = []Damage{{FirstSeq: 20, LastSeq: 22, Cause: "test"}}
	var ce *CorruptError
	if _, err := l.EpochStarts(5); !errors.As(err, &ce) {
		t.Fatalf("EpochStarts over damage: %v", err)
	}
	if got, err := l.EpochStarts(23); err != nil || fmt.Sprint(got) != "[{3 23} {4 31}]" {
		t.Fatalf("EpochStarts after damage: %v %v", got, err)
	}
	if _, err := l.EpochStarts(l.NextSeq() + 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("EpochStarts past the end: %v", err)
	}
	// EpochAt reads the one entry's batch: damage after it does not
	// concern it, damage at it does; no entry at the log's end.
	if e, err := l.EpochAt(19); err != nil || e != 2 {
		t.Fatalf("EpochAt(19) before damage at 20: %d, %v; want 2", e, err)
	}
	if _, err := l.EpochAt(21); !errors.As(err, &ce) {
		t.Fatalf("EpochAt(21) in damage: %v", err)
	}
	if _, err := l.EpochAt(l.NextSeq()); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("EpochAt at the end: %v", err)
	}
}

// EpochStarts reads batch headers without their checksums, so a bit
// flipped in a header's epoch used to come out as that entry's epoch (a
// replica's kernel took epoch 2^58+1 for seq 42 of its log at open,
// cluster simulator seed 26 with --kv). EpochBoundariesVerified: a
// flipped epoch makes or moves a boundary (a log's epochs never
// decrease, so the flipped batch starts a run or ends one), and the
// batches at and just before each boundary are read whole and checked:
// the error wraps ErrCorrupt, and VerifyAll finds the batch by its
// checksum.
func TestFlippedEpochsAreDamage(t *testing.T) {
	for _, tc := range []struct {
		name string
		seq  uint64 // the batch whose epoch is flipped
		bit  int    // of its epoch, little-endian
	}{
		{"raised above the next", 15, 58},                 // 2 -> 2^58+2
		{"lowered below the previous", 25, 0},             // 3 -> 2, inside epoch 3's run
		{"last of a run raised to the next", 20, 0},       // 2 -> 3
		{"first of a run lowered to the previous", 21, 0}, // 3 -> 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := vfs.NewMem()
			l := openLog(t, fsys, smallOpts())
			for i := range 40 { // seqs 1-10 in epoch 1, 11-20 in 2, 21-30 in 3, 31-40 in 4
				if _, err := l.Append(1+uint64(i/10), []Record{testRecord(i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			l.Close()
			flipped := false
			names, _ := fsys.List(testDir)
			for _, n := range names {
				file := path.Join(testDir, n)
				b, err := fsys.ReadFile(file)
				if err != nil || !strings.HasSuffix(n, ".log") {
					continue
				}
				for _, sb := range SegmentBatches(b) {
					if sb.Entries[0].Seq == tc.seq {
						if err := fsys.FlipBit(file, sb.Offset+18+int64(tc.bit/8), uint(tc.bit%8)); err != nil {
							t.Fatal(err)
						}
						flipped = true
					}
				}
			}
			if !flipped {
				t.Fatalf("no batch at seq %d", tc.seq)
			}
			l = openLog(t, fsys, smallOpts()) // a sealed segment: trusted through its index
			defer l.Close()
			if got, err := l.EpochStarts(l.StartSeq()); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("EpochStarts over the flipped epoch = %v, %v; want damage", got, err)
			}
			if got, err := l.EpochStarts(tc.seq + 2); err != nil || len(got) == 0 {
				t.Fatalf("EpochStarts past the flip = %v, %v", got, err)
			}
			found, err := l.VerifyAll()
			if err != nil || len(found) != 1 || found[0].FirstSeq != tc.seq {
				t.Fatalf("VerifyAll = %v, %v; want the batch at %d", found, err, tc.seq)
			}
		})
	}
}
