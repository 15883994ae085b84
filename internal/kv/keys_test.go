package kv

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// Keys answers from a cache of the sorted live keys; through random puts,
// deletes, re-creations, overwrites past HistoryMax and compactions it
// always answers what a scan of the bucket does, for every prefix (also
// when compaction purges live keys: the mutation EvictLiveRevision).
func TestKeysCacheAnswersLikeAScan(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 3))
		r := newRun(Mutations{EvictLiveRevision: seed%2 == 1})
		names := []string{"a", "ab", "abc", "b", "ba", "c", "cab", "d"}
		now := int64(0)
		for step := range 400 {
			now += rng.Int64N(200)
			key := names[rng.IntN(len(names))]
			switch x := rng.IntN(10); {
			case x < 5:
				r.mustApply(t, put(key, "v", now))
			case x < 8:
				r.mustApply(t, del(key, now))
			default:
				r.mustApply(t, EncodeRecord(Write{Op: OpCompact, TimestampMs: now}))
			}
			for _, prefix := range []string{"", "a", "ab", "b", "c", "x"} {
				var want []string
				for key, history := range r.b.keys {
					if strings.HasPrefix(key, prefix) && history[len(history)-1].Op != OpDelete {
						want = append(want, key)
					}
				}
				sort.Strings(want)
				if got := r.b.Keys(prefix); !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: Keys(%q) = %v, want %v", seed, step, prefix, got, want)
				}
			}
			// A page after a key: what follows it, at most limit, and
			// whether more does.
			after, prefix, limit := names[rng.IntN(len(names))], []string{"", "a", "b"}[rng.IntN(3)], 1+rng.IntN(3)
			var rest []string
			for _, k := range r.b.Keys(prefix) {
				if k > after {
					rest = append(rest, k)
				}
			}
			page, more := r.b.KeysAfter(prefix, after, limit)
			if !slices.Equal(page, rest[:min(limit, len(rest))]) || more != (len(rest) > limit) {
				t.Fatalf("seed %d step %d: KeysAfter(%q, %q, %d) = %v %v, want the first of %v", seed, step, prefix, after, limit, page, more, rest)
			}
			if n, want := r.b.LiveKeys(), len(r.b.Keys("")); n != want {
				t.Fatalf("seed %d step %d: LiveKeys %d, want %d", seed, step, n, want)
			}
		}
	}
}

// A listing of a 100,000-key bucket between overwrites of existing keys
// (the live keys do not change).
func BenchmarkKeysBetweenOverwrites(b *testing.B) {
	r := newRun(Mutations{})
	for i := range 100_000 {
		if _, _, err := r.apply(put(fmt.Sprintf("k%06d", i), "v", 0)); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		if _, _, err := r.apply(put(fmt.Sprintf("k%06d", i%100_000), "w", 0)); err != nil {
			b.Fatal(err)
		}
		i++
		if len(r.b.Keys("")) != 100_000 {
			b.Fatal("keys")
		}
	}
}
