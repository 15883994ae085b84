package budget

import (
	"testing"
	"time"
)

// notYet is how long a test watches for something that must not happen;
// waitMax how long it waits for something that must.
const (
	notYet  = 50 * time.Millisecond
	waitMax = 10 * time.Second
)

func TestBytesWaitsForRoom(t *testing.T) {
	q := NewBytes(100)
	done := make(chan struct{})
	if !q.Acquire(60, done) || !q.Acquire(40, done) {
		t.Fatal("100 bytes did not fit a bound of 100")
	}
	got := make(chan bool, 1)
	go func() { got <- q.Acquire(1, done) }()
	select {
	case <-got:
		t.Fatalf("a byte went in past the bound (%d held)", q.Held())
	case <-time.After(notYet):
	}
	q.Release(60)
	select {
	case ok := <-got:
		if !ok || q.Held() != 41 {
			t.Fatalf("after a release: acquire %v, %d held, want true and 41", ok, q.Held())
		}
	case <-time.After(waitMax):
		t.Fatal("a release let no waiter in")
	}
	q.Release(41)
	if !q.Acquire(500, done) {
		t.Fatal("a hand-off larger than the bound did not go in alone")
	}
	go func() { got <- q.Acquire(1, done) }()
	select {
	case <-got:
		t.Fatal("a byte went in beside a hand-off larger than the bound")
	case <-time.After(notYet):
	}
	q.Release(500)
	select {
	case <-got:
	case <-time.After(waitMax):
		t.Fatal("emptying the queue let no waiter in")
	}
	// One release that makes room for two waiters lets both in.
	if !q.Acquire(99, done) {
		t.Fatal("99 bytes did not fit beside 1 under a bound of 100")
	}
	for range 2 {
		go func() { got <- q.Acquire(30, done) }()
	}
	time.Sleep(notYet)
	q.Release(99)
	for i := range 2 {
		select {
		case <-got:
		case <-time.After(waitMax):
			t.Fatalf("one release made room for two waiters; %d got in", i)
		}
	}
	// Held: the 1 let in above, 30 and 30; fill to the bound.
	if !q.Acquire(39, done) {
		t.Fatal("39 bytes did not fit beside 61 under a bound of 100")
	}
	go func() { got <- q.Acquire(1, done) }()
	close(done)
	select {
	case ok := <-got:
		if ok || q.Held() != 100 {
			t.Fatalf("after done: acquire %v, %d held, want false and 100", ok, q.Held())
		}
	case <-time.After(waitMax):
		t.Fatal("done did not end the wait")
	}
}

// A release wakes every waiter: one that fits goes in even when another,
// which does not, is waiting too (a single wake-up could go to the
// latter and be spent).
func TestReleaseWakesAWaiterThatFits(t *testing.T) {
	for round := range 20 {
		b := NewBytes(100)
		done := make(chan struct{})
		b.Acquire(95, done)
		big, small := make(chan bool, 1), make(chan bool, 1)
		go func() { big <- b.Acquire(50, done) }()
		time.Sleep(2 * time.Millisecond)
		go func() { small <- b.Acquire(10, done) }()
		time.Sleep(2 * time.Millisecond) // both waiting, the big one first
		b.Release(20)                    // 75 held: 10 fits, 50 does not
		select {
		case <-small:
		case <-time.After(waitMax):
			t.Fatalf("round %d: a waiter that fit after a release was not let in", round)
		}
		select {
		case <-big:
			t.Fatalf("round %d: 50 bytes went in beside 85 under a bound of 100", round)
		default:
		}
		close(done)
		if ok := <-big; ok {
			t.Fatalf("round %d: the waiter that never fit got in", round)
		}
	}
}

// A bound within another waits for room in both: one child's holdings
// keep its sibling out, a release lets it in, and a wait ended by done
// leaves nothing taken in either.
func TestBytesWithinWaitsForBoth(t *testing.T) {
	all := NewBytes(100)
	a, b := NewBytesWithin(100, all), NewBytesWithin(100, all)
	done := make(chan struct{})
	if !a.Acquire(80, done) {
		t.Fatal("80 bytes did not fit bounds of 100")
	}
	got := make(chan bool, 1)
	go func() { got <- b.Acquire(30, done) }()
	select {
	case <-got:
		t.Fatalf("30 bytes went in beside 80 under a shared bound of 100 (%d held in all)", all.Held())
	case <-time.After(notYet):
	}
	a.Release(80)
	select {
	case ok := <-got:
		if !ok || all.Held() != 30 || a.Held() != 0 || b.Held() != 30 {
			t.Fatalf("after a release: acquire %v, held %d in all, %d in a, %d in b; want true, 30, 0, 30", ok, all.Held(), a.Held(), b.Held())
		}
	case <-time.After(waitMax):
		t.Fatal("a release in a sibling let no waiter in")
	}
	if !a.Acquire(70, done) {
		t.Fatal("70 bytes did not fit beside 30 under a shared bound of 100")
	}
	go func() { got <- b.Acquire(1, done) }()
	time.Sleep(notYet)
	close(done)
	select {
	case ok := <-got:
		if ok || b.Held() != 30 || all.Held() != 100 {
			t.Fatalf("after done: acquire %v, %d held in b, %d in all; want false, 30, 100", ok, b.Held(), all.Held())
		}
	case <-time.After(waitMax):
		t.Fatal("done did not end the wait for the shared bound")
	}
}
