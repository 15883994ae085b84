package node

// Consumer groups on a single node: credit, fencing, redelivery, dead
// letters, durability of acks and recovery from ledger failures.

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

func TestCreditBoundsDeliveries(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 2)
	for i := 0; i < 30; i++ {
		h.mustPublish(&wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Value: []byte("x")})
	}
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(7)
	s.waitFor(t, 7)
	h.sync("t", "g")
	if n := s.count(); n != 7 {
		t.Fatalf("delivered %d with credit 7", n)
	}
	sub.AddCredit(100)
	got := s.waitFor(t, 30)
	seen := map[[2]uint64]bool{}
	for _, m := range got {
		k := [2]uint64{uint64(m.Partition), m.Seq}
		if seen[k] {
			t.Fatalf("%v delivered twice", k)
		}
		seen[k] = true
	}
}

func TestAckFencingRedeliveryAndDeadLetter(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("poison")})
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("good")})
	s := newSink()
	sub, err := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000, MaxDeliver: 2}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(100)
	first := s.waitFor(t, 2)
	if res := h.ack("t", "g", false, wire.AckEntry{Partition: 0, Seq: 2, DeliveryID: first[1].DeliveryID}); res[0] != wire.CodeOK {
		t.Fatalf("ack of current delivery: %v", res)
	}
	// Ack wait passes: seq 1 is redelivered with a new delivery id, and the
	// old id is now stale.
	h.nowMs.Add(1001)
	h.sync("t", "g")
	second := s.waitFor(t, 3)[2]
	if second.Seq != 1 || second.DeliveryID == first[0].DeliveryID || second.DeliveryCount != 2 {
		t.Fatalf("redelivery %+v after %+v", second, first[0])
	}
	if res := h.ack("t", "g", false, wire.AckEntry{Partition: 0, Seq: 1, DeliveryID: first[0].DeliveryID}); res[0] != wire.CodeStaleDelivery {
		t.Fatalf("ack with stale delivery id: %v", res)
	}
	// Second ack wait passes: max deliveries reached, so it goes to the
	// dead-letter topic instead of a third delivery.
	h.nowMs.Add(1001)
	h.sync("t", "g")
	dlq := dlqTopicName("g", "t")
	deadline := time.Now().Add(waitMax)
	for {
		meta := h.node.Metadata([]string{dlq})
		if len(meta) == 1 && meta[0].Partitions[0].CommitSeq == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no dead letter")
		}
		h.sync("t", "g")
	}
	ds := newSink()
	dsub, err := h.node.Subscribe(dlq, "inspect", GroupOptions{}, ds)
	if err != nil {
		t.Fatal(err)
	}
	dsub.AddCredit(10)
	dm := ds.waitFor(t, 1)[0]
	if string(dm.Value) != "poison" || headerValue(dm, "nereus-dlq-seq") != "1" {
		t.Fatalf("dead letter %+v", dm)
	}
	h.sync("t", "g")
	if n := s.count(); n != 3 {
		t.Fatalf("%d deliveries, want 3 (no delivery after max)", n)
	}
	// The dead-lettered seq is done for the group: not redelivered after a
	// restart either.
	h.restart()
	s2 := newSink()
	sub2, _ := h.node.Subscribe("t", "g", GroupOptions{}, s2)
	sub2.AddCredit(10)
	h.sync("t", "g")
	if n := s2.count(); n != 0 {
		t.Fatalf("after restart %d deliveries of done seqs", n)
	}
}

func TestAcksAreDurableAndUnackedAreRedeliveredAfterRestart(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	for i := 0; i < 10; i++ {
		h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte{byte(i)}})
	}
	s := newSink()
	sub, _ := h.node.Subscribe("t", "g", GroupOptions{}, s)
	sub.AddCredit(10)
	msgs := s.waitFor(t, 10)
	for _, m := range msgs {
		if m.Seq%2 == 0 {
			if res := h.ack("t", "g", false, wire.AckEntry{Partition: 0, Seq: m.Seq, DeliveryID: m.DeliveryID}); res[0] != wire.CodeOK {
				t.Fatalf("ack %d: %v", m.Seq, res)
			}
		}
	}
	// Crash: only what the ledger fsynced survives, and every ACK_OK was
	// sent after that fsync.
	h.fs.CrashClean()
	h.node.Close()
	h.open()
	s2 := newSink()
	sub2, _ := h.node.Subscribe("t", "g", GroupOptions{}, s2)
	sub2.AddCredit(100)
	got := s2.waitFor(t, 5)
	h.sync("t", "g")
	if s2.count() != 5 {
		t.Fatalf("redelivered %d, want the 5 unacked", s2.count())
	}
	for _, m := range got {
		if m.Seq%2 == 0 {
			t.Fatalf("acked seq %d redelivered", m.Seq)
		}
		for _, old := range msgs {
			if old.DeliveryID == m.DeliveryID {
				t.Fatalf("delivery id %d reused after restart", m.DeliveryID)
			}
		}
	}
}

func headerValue(m *wire.Msg, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func TestClosedSubscriptionReleasesItsDeliveriesAtOnce(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	for i := 0; i < 3; i++ {
		h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte{byte(i)}})
	}
	first := newSink()
	sub1, _ := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 3_600_000}, first)
	sub1.AddCredit(3)
	got := first.waitFor(t, 3)
	second := newSink()
	sub2, _ := h.node.Subscribe("t", "g", GroupOptions{}, second)
	sub2.AddCredit(10)
	h.sync("t", "g")
	if n := second.count(); n != 0 {
		t.Fatalf("second member got %d messages still in flight to the first", n)
	}
	// No clock advance: only the release can make them due.
	sub1.Close()
	again := second.waitFor(t, 3)
	for i, m := range again {
		if m.DeliveryCount != 2 || m.DeliveryID == got[i].DeliveryID {
			t.Fatalf("released delivery %+v after %+v", m, got[i])
		}
	}
}

// Found by the simulator (seed 4): a ledger fsync failure followed by a
// failed reload (its incarnation file could not be synced) left the group
// without a ledger, and the next flush dereferenced nil. Now the old state
// stays, acks are refused until a reload succeeds, and nothing is lost.
func TestLedgerFailureWithFailedReloadRecovers(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("a")})
	s := newSink()
	sub, _ := h.node.Subscribe("t", "g", GroupOptions{}, s)
	sub.AddCredit(10)
	m := s.waitFor(t, 1)[0]
	var ledgerFails, incarnationFails atomic.Int32
	ledgerFails.Store(1)
	incarnationFails.Store(3)
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op != vfs.OpSync {
			return nil
		}
		if strings.Contains(name, "ledger") && ledgerFails.Add(-1) >= 0 {
			return errors.New("injected ledger fsync error")
		}
		if strings.Contains(name, "incarnation") && incarnationFails.Add(-1) >= 0 {
			return errors.New("injected incarnation fsync error")
		}
		return nil
	})
	entry := wire.AckEntry{Partition: 0, Seq: m.Seq, DeliveryID: m.DeliveryID}
	ch := make(chan *wire.Error, 1)
	h.node.Ack("t", "g", []wire.AckEntry{entry}, func(_ []wire.Code, err *wire.Error) { ch <- err })
	if err := <-ch; !errors.Is(err, wire.ErrStorage) {
		t.Fatalf("ack during ledger failure: %v", err)
	}
	// The group reloads once the incarnation file can be written; then the
	// message (whose ack may or may not have reached the disk) is either
	// done or delivered again, and a fresh ack succeeds.
	deadline := time.Now().Add(waitMax)
	for {
		res := make(chan []wire.Code, 1)
		errc := make(chan *wire.Error, 1)
		h.node.Ack("t", "g", []wire.AckEntry{entry}, func(r []wire.Code, err *wire.Error) { res <- r; errc <- err })
		r, err := <-res, <-errc
		if err == nil && r[0] == wire.CodeOK {
			break
		}
		if err == nil && r[0] == wire.CodeStaleDelivery {
			again := s.waitFor(t, 2)[1]
			entry.DeliveryID = again.DeliveryID
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("group never recovered: %v %v", r, err)
		}
		<-time.After(10 * time.Millisecond) // the group retries its reload on a 100 ms timer
	}
}

// SettingsAskedAreNotSilent: a group's ack wait and max deliveries are
// fixed when the group is created on a node; a later subscriber asking
// others gets the group's, and the node warns of each distinct ask, not
// again within the repeat window (it used to say nothing: a changed
// AckWait in a client's code was ignored without a trace).
func TestGroupSettingsAskedOtherAreWarned(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	h.declare("t", 1)
	for _, opts := range []GroupOptions{
		{AckWaitMs: 5000, MaxDeliver: 3}, // creates the group
		{AckWaitMs: 7000, MaxDeliver: 3}, // warned
		{AckWaitMs: 7000, MaxDeliver: 3}, // once
		{AckWaitMs: 5000, MaxDeliver: 3},
		{},                // the group's, whatever they are
		{MaxDeliver: 9},   // warned
		{AckWaitMs: 5000}, // its own ack wait, no max deliver asked
	} {
		sub, err := h.node.Subscribe("t", "g", opts, newSink())
		if err != nil {
			t.Fatal(err)
		}
		sub.Close()
	}
	h.node.mu.Lock()
	g := h.node.groups[groupKey{group: "g", topic: "t"}]
	h.node.mu.Unlock()
	if g.cfg.AckWaitMs != 5000 || g.cfg.MaxDeliver != 3 {
		t.Fatalf("the group's settings %d ms, %d: want the first subscriber's 5000 ms, 3", g.cfg.AckWaitMs, g.cfg.MaxDeliver)
	}
	out := logs.String()
	if n := strings.Count(out, "asks other settings"); n != 2 ||
		!strings.Contains(out, "asked_ack_wait_ms=7000 asked_max_deliver=3 ack_wait_ms=5000 max_deliver=3") ||
		!strings.Contains(out, "asked_ack_wait_ms=0 asked_max_deliver=9") {
		t.Fatalf("%d warnings, want 2 (7000 ms once, max deliver 9 once):\n%s", n, out)
	}
}
