package sim

import (
	"slices"
	"testing"
	"time"
)

// The broker's clock is the World's: skewed virtual time, and AfterFunc
// callbacks that are World events on the simulator's goroutine.
func TestBrokerClockIsTheWorldsSkewedVirtualTimeAndEvents(t *testing.T) {
	w := newWorld(1, false)
	clock := w.brokerEnv(nil).Clock
	w.skewMs = -250
	if got := clock.NowMs(); got != epochMs-250 {
		t.Fatalf("NowMs = %d, want virtual time plus skew (%d)", got, epochMs-250)
	}
	if got := clock.NowNanos(); got != (epochMs-250)*1_000_000 {
		t.Fatalf("NowNanos = %d, want %d", got, (epochMs-250)*1_000_000)
	}

	var ran []string
	at := func(name string) func() {
		return func() { ran = append(ran, name+"@"+time.Duration((w.nowMs-epochMs)*int64(time.Millisecond)).String()) }
	}
	clock.AfterFunc(1500*time.Microsecond, at("timer")) // rounded up: never early
	w.after(2, at("event"))                             // same ms, scheduled later
	w.after(1, at("earlier"))
	stopped := clock.AfterFunc(time.Millisecond, at("stopped"))
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer returned false")
	}
	for w.next() {
	}
	if want := []string{"earlier@1ms", "timer@2ms", "event@2ms"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
	if stopped.Stop() {
		t.Fatal("second Stop returned true")
	}
}
