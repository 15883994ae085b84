package group

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

func parts(topic string, n int) []Partition {
	out := make([]Partition, n)
	for i := range out {
		out[i] = Partition{Topic: topic, Index: uint32(i)}
	}
	return out
}

func counts(a map[Partition]string) map[string]int {
	c := map[string]int{}
	for _, m := range a {
		c[m]++
	}
	return c
}

func TestAssignSpreadsAndSticks(t *testing.T) {
	ps := parts("t", 6)
	one := Assign([]Subscriber{{ID: "a", Topics: []string{"t"}}}, ps, nil)
	if c := counts(one); c["a"] != 6 {
		t.Fatalf("one member: %v", c)
	}
	subs := []Subscriber{{ID: "a", Topics: []string{"t"}}, {ID: "b", Topics: []string{"t"}}, {ID: "c", Topics: []string{"t"}}}
	three := Assign(subs, ps, one)
	if c := counts(three); c["a"] != 2 || c["b"] != 2 || c["c"] != 2 {
		t.Fatalf("three members: %v", c)
	}
	// Nothing changed: nothing moves.
	if again := Assign(subs, ps, three); !maps.Equal(again, three) {
		t.Fatalf("a stable group moved: %v -> %v", three, again)
	}
	// b leaves: only b's two partitions move, one to a and one to c.
	two := Assign([]Subscriber{subs[0], subs[2]}, ps, three)
	for p, m := range three {
		if m != "b" && two[p] != m {
			t.Fatalf("%v moved from %s to %s though its owner stayed", p, m, two[p])
		}
	}
	if c := counts(two); c["a"] != 3 || c["c"] != 3 {
		t.Fatalf("after b left: %v", c)
	}
}

func TestAssignOnlyToSubscribers(t *testing.T) {
	ps := append(parts("x", 3), parts("y", 2)...)
	subs := []Subscriber{{ID: "a", Topics: []string{"x"}}, {ID: "b", Topics: []string{"x", "y"}}}
	got := Assign(subs, ps, nil)
	for p, m := range got {
		if p.Topic == "y" && m != "b" {
			t.Fatalf("%v given to %s, who does not subscribe to y", p, m)
		}
	}
	if len(got) != 5 {
		t.Fatalf("assigned %d of 5", len(got))
	}
	none := Assign([]Subscriber{{ID: "a", Topics: []string{"z"}}}, ps, nil)
	if len(none) != 0 {
		t.Fatalf("partitions nobody subscribes to were assigned: %v", none)
	}
}

// TestAssignProperties checks, over random groups and histories, that the
// assignment is valid, deterministic, balanced where subscriptions allow
// and — with identical subscriptions — moves exactly MinimalMoves
// partitions away from live owners (CB2).
func TestAssignProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		homogeneous := iter%2 == 0
		topics := []string{"x", "y", "z"}
		var ps []Partition
		for _, tp := range topics {
			ps = append(ps, parts(tp, rng.IntN(5))...)
		}
		var subs []Subscriber
		for i := range rng.IntN(6) {
			s := Subscriber{ID: fmt.Sprintf("m%d", i)}
			for _, tp := range topics {
				if homogeneous || rng.IntN(2) == 0 {
					s.Topics = append(s.Topics, tp)
				}
			}
			subs = append(subs, s)
		}
		// A previous assignment with arbitrary owners, some gone.
		prev := map[Partition]string{}
		for _, p := range ps {
			if rng.IntN(4) > 0 {
				prev[p] = fmt.Sprintf("m%d", rng.IntN(8))
			}
		}
		got := Assign(subs, ps, prev)
		shuffled := slices.Clone(subs)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if again := Assign(shuffled, ps, prev); !maps.Equal(got, again) {
			t.Fatalf("iter %d: member order changed the result", iter)
		}
		sub := map[string]Subscriber{}
		for _, s := range subs {
			sub[s.ID] = s
		}
		owned := map[string][]Partition{}
		for _, p := range ps {
			m, ok := got[p]
			eligible := false
			for _, s := range subs {
				eligible = eligible || slices.Contains(s.Topics, p.Topic)
			}
			if ok != eligible {
				t.Fatalf("iter %d: %v assigned=%v, has subscribers=%v", iter, p, ok, eligible)
			}
			if ok {
				if !slices.Contains(sub[m].Topics, p.Topic) {
					t.Fatalf("iter %d: %v given to %s who does not subscribe", iter, p, m)
				}
				owned[m] = append(owned[m], p)
			}
		}
		// Balanced: no member could take a partition from one holding two more.
		for _, a := range subs {
			for _, b := range subs {
				if len(owned[b.ID]) > len(owned[a.ID])-2 {
					continue
				}
				for _, p := range owned[a.ID] {
					if slices.Contains(b.Topics, p.Topic) {
						t.Fatalf("iter %d: %s holds %d, %s holds %d and could take %v", iter, a.ID, len(owned[a.ID]), b.ID, len(owned[b.ID]), p)
					}
				}
			}
		}
		// Sticky: a member that lost a partition it kept gained none.
		lost, gained := map[string]bool{}, map[string]bool{}
		moved, kept := 0, map[string]int{}
		for _, p := range ps {
			old, ok := sub[prev[p]]
			if !ok || !slices.Contains(old.Topics, p.Topic) {
				if m, ok := got[p]; ok {
					gained[m] = true
				}
				continue
			}
			kept[old.ID]++
			if got[p] != old.ID {
				moved++
				lost[old.ID] = true
				gained[got[p]] = true
			}
		}
		for m := range lost {
			// (With different subscriptions a member may take orphans
			// only it can hold and shed others.)
			if homogeneous && gained[m] {
				t.Fatalf("iter %d: %s both lost and gained partitions", iter, m)
			}
		}
		if homogeneous && len(subs) > 0 {
			var ks []int
			for _, s := range subs {
				ks = append(ks, kept[s.ID])
			}
			if want := MinimalMoves(ks, len(ps)); moved != want {
				t.Fatalf("iter %d: moved %d partitions from live owners, minimal is %d (kept %v of %d)", iter, moved, want, ks, len(ps))
			}
		}
	}
}

func TestMinimalMoves(t *testing.T) {
	for _, c := range []struct {
		kept []int
		n    int
		want int
	}{
		{[]int{6, 0, 0}, 6, 4},
		{[]int{3, 3, 0}, 6, 2},
		{[]int{2, 2, 2, 0}, 6, 1},
		{[]int{2, 2, 0}, 5, 0},
		{[]int{3, 3, 3, 0, 0}, 9, 3},
		{nil, 4, 0},
	} {
		if got := MinimalMoves(c.kept, c.n); got != c.want {
			t.Errorf("MinimalMoves(%v, %d) = %d, want %d", c.kept, c.n, got, c.want)
		}
	}
}

func TestPartitionText(t *testing.T) {
	p := Partition{Topic: "a.b-c", Index: 17}
	b, _ := p.MarshalText()
	var q Partition
	if err := q.UnmarshalText(b); err != nil || q != p {
		t.Fatalf("round trip %q: %v %v", b, q, err)
	}
	for _, bad := range []string{"", "/3", "t/", "t/x", "t/-1", "t/99999999999"} {
		if err := q.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
