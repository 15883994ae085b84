package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// partitionLog records a member's assignment callbacks.
type partitionLog struct {
	mu   sync.Mutex
	held map[int]bool
	log  []string
}

func (l *partitionLog) assigned(ps []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ps {
		l.held[p] = true
	}
	l.log = append(l.log, fmt.Sprintf("+%v", ps))
}

func (l *partitionLog) revoked(ps []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ps {
		delete(l.held, p)
	}
	l.log = append(l.log, fmt.Sprintf("-%v", ps))
}

func (l *partitionLog) holding() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for p := range l.held {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// TestGroupMembersOverTheWire: two SDK members of one group on a real node
// split a 4-partition topic; each is delivered only its partitions; when
// one closes (LEAVE), the other gets its partitions and every message is
// consumed.
func TestGroupMembersOverTheWire(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"tok"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func() *client.Client {
		c, err := client.Dial(ctx, client.Options{Servers: []string{addr}, Token: "tok", RequestTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ca, cb := dial(), dial()
	if _, err := ca.DeclareTopic(ctx, client.TopicConfig{Name: "t", Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	p, err := ca.NewProducer(client.ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	const total = 40
	for i := range total {
		part := i % 4
		if _, err := p.Publish(ctx, client.Message{TargetPartition: &part, Value: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	la, lb := &partitionLog{held: map[int]bool{}}, &partitionLog{held: map[int]bool{}}
	a, err := ca.Subscribe(ctx, "t", "g", client.ConsumerOptions{Member: "a", Credit: 4, OnAssigned: la.assigned, OnRevoked: la.revoked})
	if err != nil {
		t.Fatal(err)
	}
	b, err := cb.Subscribe(ctx, "t", "g", client.ConsumerOptions{Member: "b", Credit: 4, OnAssigned: lb.assigned, OnRevoked: lb.revoked})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Subscribe(ctx, "t", "g", client.ConsumerOptions{}); err == nil {
		t.Fatal("a consumer without membership was admitted to a group with members")
	}
	seen := map[string]string{}
	var mu sync.Mutex
	consume := func(co *client.Consumer, who string, l *partitionLog, until func() bool) {
		for !until() {
			mctx, mcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			m, err := co.Next(mctx)
			mcancel()
			if err != nil {
				continue
			}
			if !slices.Contains(l.holding(), m.Partition) {
				t.Errorf("%s was handed partition %d, holding %v", who, m.Partition, l.holding())
			}
			mu.Lock()
			seen[string(m.Value)] = who
			mu.Unlock()
			if err := m.AckSync(ctx); err != nil {
				t.Errorf("%s ack: %v", who, err)
			}
		}
	}
	// Until the split is done, both consume; then a leaves.
	split := func() bool {
		ha, hb := la.holding(), lb.holding()
		return len(ha) == 2 && len(hb) == 2
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		consume(a, "a", la, func() bool { return split() && count(&mu, seen) >= total/2 })
	}()
	go func() {
		defer wg.Done()
		consume(b, "b", lb, func() bool { return split() && count(&mu, seen) >= total/2 })
	}()
	wg.Wait()
	if !split() {
		t.Fatalf("no 2/2 split: a %v b %v", la.holding(), lb.holding())
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Every message may have been consumed before a left (a alone held
	// every partition until b's assignment landed): wait for b to take
	// a's partitions too, not only for the count.
	consume(b, "b", lb, func() bool { return count(&mu, seen) >= total && len(lb.holding()) == 4 || ctx.Err() != nil })
	if got := lb.holding(); len(got) != 4 {
		t.Fatalf("after a left b holds %v (log %v)", got, lb.log)
	}
	t.Logf("a: %v, b: %v, consumed %d", la.log, lb.log, len(seen))
	if len(seen) != total {
		t.Fatalf("consumed %d of %d", len(seen), total)
	}

	// Shared mode: two members of another group both take messages of the
	// same partition (nothing is assigned; each takes what comes).
	sa, err := ca.Subscribe(ctx, "t", "s", client.ConsumerOptions{Member: "a", Shared: true, Credit: 2})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := cb.Subscribe(ctx, "t", "s", client.ConsumerOptions{Member: "b", Shared: true, Credit: 2})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for len(got) < 2 {
		for who, co := range map[string]*client.Consumer{"a": sa, "b": sb} {
			mctx, mcancel := context.WithTimeout(ctx, 100*time.Millisecond)
			m, err := co.Next(mctx)
			mcancel()
			if err == nil {
				got[who]++
				_ = m.Ack()
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("shared members took %v", got)
		}
	}
}

func count(mu *sync.Mutex, m map[string]string) int {
	mu.Lock()
	defer mu.Unlock()
	return len(m)
}
