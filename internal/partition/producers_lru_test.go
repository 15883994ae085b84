package partition

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The recency list evicts exactly what a scan for the lowest (lastSeq, id)
// evicts — with entries in log order, and out of order or at one seq.
func TestProducersEvictTheLeastRecentlyUsed(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		p := NewProducers(4, 1+rng.IntN(8))
		last := map[uint64]uint64{} // the reference: id → lastSeq
		seq := uint64(100)
		for step := range 2000 {
			id := 1 + rng.Uint64N(20)
			switch rng.IntN(10) {
			case 0:
				seq -= rng.Uint64N(min(seq, 5)) // out of order
			case 1: // the same seq again
			default:
				seq++
			}
			if _, ok := last[id]; !ok && len(last) >= p.producersMax {
				victim, oldest := uint64(0), ^uint64(0)
				for vid, s := range last {
					if s < oldest || s == oldest && vid < victim {
						victim, oldest = vid, s
					}
				}
				delete(last, victim)
			}
			last[id] = seq
			p.Record(id, uint64(step), seq, 1)
			var ids, want []uint64
			for w := p.oldest; w != nil; w = w.newer {
				ids = append(ids, w.id)
				if w.newer != nil && (w.newer.older != w || w.lastSeq > w.newer.lastSeq) {
					t.Fatalf("seed %d step %d: the list is out of order at %d", seed, step, w.id)
				}
			}
			for id := range last {
				want = append(want, id)
			}
			slices.SortFunc(want, func(a, b uint64) int {
				if last[a] != last[b] {
					return int(int64(last[a] - last[b]))
				}
				return int(int64(a - b))
			})
			if !slices.Equal(ids, want) || len(p.byID) != len(want) {
				t.Fatalf("seed %d step %d: producers %v, want %v", seed, step, ids, want)
			}
		}
	}
}

// A new producer past the bound costs the same whatever the bound (it was
// a scan of every producer).
func BenchmarkRecordNewProducerPastTheBound(b *testing.B) {
	p := NewProducers(8, 100_000)
	seq := uint64(0)
	for range 100_000 {
		seq++
		p.Record(seq, 1, seq, 1)
	}
	for b.Loop() {
		seq++
		p.Record(seq, 1, seq, 1)
	}
}

// One producer publishing in order with its window full: the common case
// of every applied publish, on every replica.
func BenchmarkRecordInOrderFullWindow(b *testing.B) {
	p := NewProducers(DefaultConfig.DedupWindowMax, DefaultConfig.ProducersMax)
	seq := uint64(0)
	for range 2 * DefaultConfig.DedupWindowMax {
		seq++
		p.Record(7, seq, seq, 1)
	}
	for b.Loop() {
		seq++
		p.Record(7, seq, seq, 1)
	}
}
