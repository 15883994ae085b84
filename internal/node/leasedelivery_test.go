package node

import (
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// DeliverUnderLease: a partition's leader whose lease ran out on its clock,
// and that is not READ_ONLY_DEGRADED (yet), hands out nothing — not even a redelivery that fell due — for another
// replica may have taken office and confirmed acks this leader's cursor
// does not hold (sim seed 51003); meanwhile its group looks again every
// leaseRetryMs, not in a 1 ms spin over the due redelivery; once a quorum
// answers it again, the redelivery goes out.
func TestClusterLeaderDeliversOnlyUnderItsLease(t *testing.T) {
	tc, clock, peers := newVirtualCluster(t)
	declareAdvancing(t, tc.nodes["n2"], clock, wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})
	var id string
	advanceCampaigns(t, clock, "t/0 has a leader in office", func() bool {
		id = tc.inOffice("t", 0)
		return id != ""
	})
	leader := tc.nodes[id]
	tp, err := leader.topic("t")
	if err != nil {
		t.Fatal(err)
	}
	store := tp.partitions[0].replica()
	advanceUntil(t, clock, 5*time.Millisecond, "the leader holds its lease", store.repl.HoldsLease)
	if ok, err := publishOn(t, leader, &wire.Pub{Topic: "t", Partition: 0, Value: []byte("m1")}); err != nil || ok.Seq == 0 {
		t.Fatalf("publish on leader %s: %+v %v", id, ok, err)
	}
	s := newSink()
	sub, err := leader.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000 * 1000, MaxDeliver: 100}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(10)
	advanceUntil(t, clock, 5*time.Millisecond, "the first delivery, under the lease", func() bool { return s.count() >= 1 })
	first := s.waitFor(t, 1)[0]

	// Cut off, the leader's lease runs out (2,500 s) long before an
	// election timeout (5,000 s) could let another replica campaign, or
	// its ack timeout could make it READ_ONLY_DEGRADED.
	// Redeliveries go out while it holds (the ack wait is 1,000 s); none
	// may once it ran out, though the next falls due.
	peers.setCut(true)
	advanceUntil(t, clock, 100*time.Second, "the leader's lease ran out", func() bool { return !store.repl.HoldsLease() })
	before := s.count()
	clock.mu.Lock()
	clock.afterFunc = nil
	clock.mu.Unlock()
	for range 11 {
		clock.Advance(100 * time.Second)
	}
	advanceUntil(t, clock, 5*time.Millisecond, "a pass of the group with a redelivery due and the lease out", func() bool {
		return clock.scheduled(leaseRetryMs * time.Millisecond)
	})
	for range 20 {
		clock.Advance(5 * time.Millisecond)
	}
	if clock.scheduled(time.Millisecond) {
		t.Error("the group woke every millisecond for a redelivery it may not send")
	}
	if n := s.count(); n != before {
		t.Fatalf("%d deliveries after the leader's lease ran out, want none", n-before)
	}
	if st := store.repl.Status(); st.Role != replica.Leader || st.ReadOnly {
		t.Fatalf("the cut-off leader is %v (read-only %v), want still leading, not degraded: the scenario's premise", st.Role, st.ReadOnly)
	}

	// A quorum's answer to the next Append renews the lease (an idle
	// leader's heartbeat would, 500 s on at this election timeout).
	peers.setCut(false)
	if ok, err := publishOn(t, leader, &wire.Pub{Topic: "t", Partition: 0, Value: []byte("m2")}); err != nil || ok.Seq == 0 {
		t.Fatalf("publish on leader %s after the cut: %+v %v", id, ok, err)
	}
	advanceUntil(t, clock, 5*time.Millisecond, "the redelivery once the lease is back", func() bool {
		for _, m := range s.waitFor(t, before)[before:] {
			if m.Seq == first.Seq {
				return true
			}
		}
		return false
	})
	if !store.repl.HoldsLease() {
		t.Error("redelivered while the leader's lease was out")
	}
	for _, m := range s.waitFor(t, before)[before:] {
		if m.Seq == first.Seq && (m.DeliveryCount != uint32(before+1) || m.DeliveryID == first.DeliveryID) {
			t.Fatalf("redelivery %+v after %d deliveries of %+v", m, before, first)
		}
	}
}
