package model

import (
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/delivery"
)

// Configurations small enough for every interleaving in seconds, each
// for one part of the consume side.
var (
	// Two messages acked, checkpoints after two records, a change of
	// leader that keeps any prefix of what was proposed.
	consumeAcks = ConsumeConfig{Messages: 2, MaxDeliver: 2, InflightMax: 2, CompactBytes: 24, AckWaits: 1, Acks: 3, Elections: 1, Quiet: true}
	// One message nacked and expired into its dead letter.
	consumeDead = ConsumeConfig{Messages: 1, MaxDeliver: 2, InflightMax: 1, CompactBytes: 24, AckWaits: 2, Acks: 1, Nacks: 1, Elections: 1}
	// Records refused and a quorum lost, acks retried.
	consumeFaults = ConsumeConfig{Messages: 2, MaxDeliver: 2, InflightMax: 2, CompactBytes: 1 << 20, AckWaits: 1, Acks: 2, Drops: 1, Refusals: 1, Degrades: 1, Elections: 1}
)

func runConsume(t *testing.T, name string, cfg ConsumeConfig) ConsumeResult {
	t.Helper()
	start := time.Now()
	r := CheckConsume(cfg)
	t.Logf("%s: %d states, complete=%v, %v; confirmed %d, redeliveries %d, dead letters %d, checkpoints %d, rebuilds %d, settled %d",
		name, r.States, r.Complete, time.Since(start).Round(time.Millisecond), r.Confirmed, r.Redeliveries, r.DeadLetters, r.Checkpoints, r.Rebuilds, r.Settled)
	return r
}

func TestConsumeModelGuarded(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  ConsumeConfig
		// reached asserts the exploration got where the configuration is for.
		reached func(ConsumeResult) bool
	}{
		{"acks and a new leader", consumeAcks, func(r ConsumeResult) bool { return r.Checkpoints > 0 && r.Rebuilds > 0 && r.Settled > 0 }},
		{"dead letters", consumeDead, func(r ConsumeResult) bool { return r.DeadLetters > 0 && r.Rebuilds > 0 && r.Settled > 0 }},
		{"refusals and quorum loss", consumeFaults, func(r ConsumeResult) bool { return r.Redeliveries > 0 && r.Rebuilds > 0 && r.Settled > 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runConsume(t, tc.name, tc.cfg)
			if r.Violation != "" {
				t.Fatalf("%s\ntrace:\n  %s", r.Violation, strings.Join(r.Trace, "\n  "))
			}
			if !r.Complete {
				t.Fatalf("exploration incomplete at %d states", r.States)
			}
			if r.Confirmed == 0 || !tc.reached(r) {
				t.Fatalf("the exploration did not reach what it is for: %+v", r)
			}
		})
	}
}

// Each mutation removes one guard; the model must find the broken
// invariant.
func TestConsumeModelMutations(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		cfg        ConsumeConfig
		set        func(*ConsumeConfig)
	}{
		{"AckBeforeCommit", "RebuildHoldsConfirmedAcks", consumeFaults, func(c *ConsumeConfig) { c.AckLog = acklog.Mutations{AckBeforeCommit: true} }},
		{"ReplayAckKeepsRetry", "AckFloorNeverRedelivered", consumeDead, func(c *ConsumeConfig) { c.Delivery = delivery.Mutations{ReplayAckKeepsRetry: true} }},
		{"DeadOnLastDelivery", "NoDeadLetterOfAnAck", consumeDead, func(c *ConsumeConfig) { c.Delivery = delivery.Mutations{DeadOnLastDelivery: true} }},
		{"ReAckWaitsForAnyRecord", "RebuildHoldsConfirmedAcks", consumeFaults, func(c *ConsumeConfig) { c.AckLog = acklog.Mutations{ReAckWaitsForAnyRecord: true} }},
		{"CheckpointDropsCounts", "RebuildKeepsDeliveryCounts", consumeDead, func(c *ConsumeConfig) { c.AckLog = acklog.Mutations{CheckpointDropsCounts: true} }},
		{"SameIDBase", "DeliveryIDsUnique", consumeAcks, func(c *ConsumeConfig) { c.SameIDBase = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			tc.set(&cfg)
			r := runConsume(t, tc.name, cfg)
			if !strings.HasPrefix(r.Violation, tc.want+":") {
				t.Fatalf("got %q, want %s", r.Violation, tc.want)
			}
			t.Logf("trace:\n  %s", strings.Join(r.Trace, "\n  "))
		})
	}
}
