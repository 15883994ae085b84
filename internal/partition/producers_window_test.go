package partition

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// The sorted ring remembers and forgets exactly what lowest-first eviction
// over a plain set does — for in-order producers, retries out of order,
// and every small window size, across the ring's growth and wrap-around.
func TestProducerWindowMatchesItsReference(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 2))
		windowMax := 1 + rng.IntN(9)
		if seed%4 == 0 {
			windowMax = 64
		}
		var (
			w     producerWindow
			ref   []dedupEntry // the reference: an unordered set
			floor uint64
			next  uint64 = 1
			used         = map[uint64]bool{}
		)
		for step := range 500 {
			ps := next
			if rng.IntN(5) == 0 && next > 1 { // a lower one, late (a retry, a leader change)
				ps = 1 + rng.Uint64N(next-1)
			} else {
				next += 1 + rng.Uint64N(2)
			}
			if used[ps] {
				continue // a producer_seq is appended once
			}
			used[ps] = true
			e := dedupEntry{producerSeq: ps, seq: uint64(step + 1), epoch: 1 + uint64(step/100)}
			w.add(e, windowMax, false)
			ref = append(ref, e)
			if len(ref) > windowMax {
				lowest := slices.MinFunc(ref, func(a, b dedupEntry) int { return cmp.Compare(a.producerSeq, b.producerSeq) })
				ref = slices.DeleteFunc(ref, func(x dedupEntry) bool { return x == lowest })
				floor = max(floor, lowest.producerSeq+1)
			}
			want := slices.SortedFunc(slices.Values(ref), func(a, b dedupEntry) int { return cmp.Compare(a.producerSeq, b.producerSeq) })
			if got := w.entries(); !slices.Equal(got, want) || w.floor != floor {
				t.Fatalf("seed %d (window %d) step %d: entries %v floor %d, want %v floor %d", seed, windowMax, step, got, w.floor, want, floor)
			}
			for q := uint64(0); q <= next+1; q++ {
				i := slices.IndexFunc(ref, func(x dedupEntry) bool { return x.producerSeq == q })
				got, ok := w.find(q)
				if ok != (i >= 0) || ok && got != ref[i] {
					t.Fatalf("seed %d (window %d) step %d: find(%d) = %v %v, want %v", seed, windowMax, step, q, got, ok, i >= 0)
				}
			}
		}
	}
}

// entries returns the window's entries, lowest producer_seq first.
func (w *producerWindow) entries() []dedupEntry {
	out := make([]dedupEntry, w.n)
	for i := range out {
		out[i] = *w.at(i)
	}
	return out
}
