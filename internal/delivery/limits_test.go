package delivery

import (
	"slices"
	"testing"
)

// SetLimits: the new ack wait holds from the next delivery (one in
// flight keeps its deadline), and LoweredMaxDeliverNotExceeded — a retry
// that has used up a lowered max deliveries is dead at once instead of
// going out once more; with the guard mutated it is delivered a third
// time under a max of 2. A raised max gives a message more deliveries.
func TestSetLimitsTakesEffectAtOnce(t *testing.T) {
	for _, mutation := range []bool{false, true} {
		c, err := NewCursor(Config{AckWaitMs: 100, MaxDeliver: 5, InflightMax: 3, Mutations: Mutations{LoweredMaxKeepsRetries: mutation}}, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := c.Next(0, 2, 0)
		c.Expire(100) // seq 1 delivered once: a retry of count 1
		a, _ = c.Next(100, 2, 0)
		b, _ := c.Next(100, 2, 0) // seq 2, in flight until 200
		if a.Seq != 1 || a.Count != 2 || b.Seq != 2 {
			t.Fatalf("deliveries %+v %+v", a, b)
		}
		c.Expire(200) // seq 1 (count 2) and seq 2 (count 1) to retry
		if err := c.SetLimits(1_000, 2); err != nil {
			t.Fatal(err)
		}
		dead := c.TakeDead()
		var again []Delivery
		for {
			d, ok := c.Next(200, 2, 0)
			if !ok {
				break
			}
			again = append(again, d)
		}
		if mutation {
			if len(dead) != 0 || len(again) != 2 || again[0].Count != 3 {
				t.Fatalf("mutated: dead %v, redelivered %+v, want seq 1 out a third time", dead, again)
			}
			continue
		}
		if !slices.Equal(dead, []uint64{1}) {
			t.Fatalf("dead after lowering the max to 2: %v, want [1]", dead)
		}
		if len(again) != 1 || again[0].Seq != 2 || again[0].Count != 2 {
			t.Fatalf("redelivered %+v, want seq 2 a second time", again)
		}
		c.Expire(1_199)
		if _, ok := c.Next(1_199, 2, 0); ok {
			t.Fatal("redelivered before the new ack wait of 1,000 ms passed")
		}
		c.Expire(1_200) // count 2 of 2: dead
		if got := c.TakeDead(); !slices.Equal(got, []uint64{2}) {
			t.Fatalf("dead %v, want [2]", got)
		}
	}
	c := newTestCursor(t, 1)
	c.Next(0, 1, 0)
	if err := c.SetLimits(100, 3); err != nil {
		t.Fatal(err)
	}
	c.Expire(100)
	if d, ok := c.Next(100, 1, 0); !ok || d.Count != 2 || len(c.TakeDead()) != 0 {
		t.Fatalf("a raised max: %+v %v, want a second delivery", d, ok)
	}
	if c.SetLimits(0, 3) == nil || c.SetLimits(100, 0) == nil {
		t.Fatal("limits of 0 taken")
	}
}
