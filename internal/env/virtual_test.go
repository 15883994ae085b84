package env

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

const startMs = 1_700_000_000_000

func TestVirtualRunsCallbacksInDueThenInsertionOrderAtTheirDueTime(t *testing.T) {
	v := NewVirtual(startMs)
	var got []string
	at := func(name string) func() {
		return func() { got = append(got, fmt.Sprintf("%s@%d", name, v.NowMs()-startMs)) }
	}
	v.AfterFunc(30*time.Millisecond, at("c"))
	for i := range 8 { // equal due times keep their insertion order
		v.AfterFunc(10*time.Millisecond, at(fmt.Sprint("b", i)))
	}
	v.AfterFunc(5*time.Millisecond, at("a"))
	v.AfterFunc(31*time.Millisecond, at("d"))

	if ran := v.Advance(30 * time.Millisecond); ran != 10 {
		t.Fatalf("Advance(30ms) ran %d callbacks, want 10", ran)
	}
	want := []string{"a@5", "b0@10", "b1@10", "b2@10", "b3@10", "b4@10", "b5@10", "b6@10", "b7@10", "c@30"}
	if !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
	if now := v.NowMs() - startMs; now != 30 {
		t.Fatalf("clock reads +%d ms after Advance(30ms), want +30", now)
	}
	if v.Pending() != 1 {
		t.Fatalf("Pending = %d, want 1 (d at +31)", v.Pending())
	}
	v.Advance(time.Millisecond)
	if got[len(got)-1] != "d@31" {
		t.Fatalf("last ran %q, want d@31", got[len(got)-1])
	}
}

func TestVirtualAdvanceRunsWhatCallbacksScheduleInsideTheWindowOnly(t *testing.T) {
	v := NewVirtual(startMs)
	var got []int64
	var chain func()
	chain = func() {
		got = append(got, v.NowMs()-startMs)
		v.AfterFunc(4*time.Millisecond, chain)
	}
	v.AfterFunc(4*time.Millisecond, chain)
	v.Advance(10 * time.Millisecond)
	if !slices.Equal(got, []int64{4, 8}) {
		t.Fatalf("chain ran at %v, want [4 8]", got)
	}
	if v.Pending() != 1 {
		t.Fatalf("Pending = %d, want the link due at +12", v.Pending())
	}
}

func TestVirtualAfterFuncNeverRunsSynchronously(t *testing.T) {
	v := NewVirtual(startMs)
	ran := 0
	v.AfterFunc(0, func() { ran++ })
	v.AfterFunc(-time.Second, func() { ran++ }) // negative: due now
	if ran != 0 {
		t.Fatal("AfterFunc ran its callback itself")
	}
	if n := v.RunDue(); n != 2 || ran != 2 {
		t.Fatalf("RunDue ran %d (callbacks saw %d), want 2", n, ran)
	}
	if now := v.NowMs(); now != startMs {
		t.Fatalf("RunDue moved the clock to %d", now)
	}
}

func TestVirtualStop(t *testing.T) {
	v := NewVirtual(startMs)
	ran := false
	stopped := v.AfterFunc(time.Millisecond, func() { t.Error("a stopped timer ran") })
	kept := v.AfterFunc(time.Millisecond, func() { ran = true })
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer returned false")
	}
	if stopped.Stop() {
		t.Fatal("second Stop returned true")
	}
	v.Advance(time.Millisecond)
	if !ran {
		t.Fatal("the timer that was not stopped did not run")
	}
	if kept.Stop() {
		t.Fatal("Stop after the timer ran returned true")
	}
}

func TestVirtualTickerTicksEachPeriodDropsUntakenTicksAndStops(t *testing.T) {
	v := NewVirtual(startMs)
	tk := v.NewTicker(10 * time.Millisecond)
	v.Advance(9 * time.Millisecond)
	select {
	case <-tk.C():
		t.Fatal("ticked before its period")
	default:
	}
	v.Advance(time.Millisecond)
	if at := <-tk.C(); at.UnixMilli() != startMs+10 {
		t.Fatalf("tick carries %d, want %d", at.UnixMilli(), startMs+10)
	}
	v.Advance(50 * time.Millisecond) // five ticks, one slot: four dropped
	if at := <-tk.C(); at.UnixMilli() != startMs+20 {
		t.Fatalf("kept tick carries %d, want the first untaken one (%d)", at.UnixMilli(), startMs+20)
	}
	select {
	case <-tk.C():
		t.Fatal("ticker queued more than one untaken tick")
	default:
	}
	tk.Stop()
	v.Advance(time.Second)
	select {
	case <-tk.C():
		t.Fatal("ticked after Stop")
	default:
	}
	if v.Pending() != 0 {
		t.Fatalf("a stopped ticker left %d callbacks pending", v.Pending())
	}
}

// A node's goroutines schedule and read while the driver advances.
func TestVirtualConcurrentScheduling(t *testing.T) {
	v := NewVirtual(startMs)
	var mu sync.Mutex
	ran := 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				v.AfterFunc(time.Duration(i%7)*time.Millisecond, func() { mu.Lock(); ran++; mu.Unlock() })
				_ = v.NowNanos()
			}
		}()
	}
	for range 50 {
		v.Advance(time.Millisecond)
	}
	wg.Wait()
	v.Advance(time.Second)
	if ran != 800 {
		t.Fatalf("%d callbacks ran, want 800", ran)
	}
}

// A tick already taken off the queue when Stop ran (the driver popped it
// on its goroutine) must not schedule the next one.
func TestVirtualTickerStoppedWhileItsTickRunsStaysStopped(t *testing.T) {
	v := NewVirtual(startMs)
	tk := v.NewTicker(10 * time.Millisecond).(*virtualTicker)
	tk.Stop()
	v.tick(tk) // the popped tick, running late
	if v.Pending() != 0 {
		t.Fatalf("a tick that ran after Stop left %d callbacks pending", v.Pending())
	}
	select {
	case <-tk.C():
		t.Fatal("a tick that ran after Stop was delivered")
	default:
	}
}

// Stop may come from another goroutine while the driver runs ticks (run
// under -race).
func TestVirtualTickerStopWhileTheDriverAdvances(t *testing.T) {
	v := NewVirtual(startMs)
	tk := v.NewTicker(time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			v.Advance(time.Millisecond)
		}
	}()
	tk.Stop()
	<-done
	if v.Pending() != 0 {
		t.Fatalf("a stopped ticker left %d callbacks pending", v.Pending())
	}
}

func TestVirtualTickerCoalescesTheTicksOfOneLongAdvance(t *testing.T) {
	v := NewVirtual(startMs)
	tk := v.NewTicker(time.Millisecond)
	if ran := v.Advance(10 * time.Second); ran != 2 {
		t.Fatalf("a 10 s Advance ran %d ticker callbacks, want 2 (the first tick and the last)", ran)
	}
	if at := <-tk.C(); at.UnixMilli() != startMs+1 {
		t.Fatalf("kept tick carries +%d ms, want the first (+1)", at.UnixMilli()-startMs)
	}
	v.Advance(time.Millisecond) // back to one tick a period
	if at := <-tk.C(); at.UnixMilli() != startMs+10_001 {
		t.Fatalf("next tick at +%d ms", at.UnixMilli()-startMs)
	}
}
