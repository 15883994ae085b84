package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/replica"
)

func failGroupRun(t *testing.T, o GroupOptions, r GroupResult) {
	t.Helper()
	t.Errorf("seed %d: %v\ntrace tail:\n  %s\nreproduce: %s", r.Seed, r.Violation, strings.Join(r.Tail, "\n  "), GroupReproduce(o))
}

// TestGroupCampaign runs the replication kernel of one replica group under
// crashes, symmetric and one-way partitions, message loss and duplication,
// for R=3 and R=5 under sync_quorum, R=3 under sync_all, and R=1.
func TestGroupCampaign(t *testing.T) {
	cases := []struct {
		o     GroupOptions
		seeds uint64
	}{
		{GroupOptions{GroupSize: 3}, 150},
		{GroupOptions{GroupSize: 5}, 50},
		{GroupOptions{GroupSize: 3, Policy: replica.SyncAll}, 50},
		{GroupOptions{GroupSize: 1}, 20},
		{GroupOptions{GroupSize: 3, Compact: true}, 100},
		{GroupOptions{GroupSize: 5, Compact: true}, 30},
		{GroupOptions{GroupSize: 3, Policy: replica.SyncAll, Compact: true}, 50},
		{GroupOptions{GroupSize: 3, DiskFaults: true, ClockFaults: true}, 100},
		{GroupOptions{GroupSize: 5, DiskFaults: true, ClockFaults: true}, 30},
		{GroupOptions{GroupSize: 3, Policy: replica.SyncAll, DiskFaults: true, ClockFaults: true}, 30},
		{GroupOptions{GroupSize: 3, Compact: true, DiskFaults: true, ClockFaults: true}, 50},
		{GroupOptions{GroupSize: 3, ShortReads: true}, 100},
		{GroupOptions{GroupSize: 3, Policy: replica.SyncAll, ShortReads: true}, 50},
		{GroupOptions{GroupSize: 3, Compact: true, ShortReads: true, DiskFaults: true, ClockFaults: true}, 50},
	}
	for _, c := range cases {
		name := fmt.Sprintf("R%d-%s", c.o.GroupSize, c.o.Policy)
		if c.o.Compact {
			name += "-compacting"
		}
		if c.o.DiskFaults {
			name += "-disk-clock"
		}
		if c.o.ShortReads {
			name += "-short-reads"
		}
		t.Run(name, func(t *testing.T) {
			seeds := c.seeds
			if testing.Short() {
				seeds = min(seeds, 10)
			}
			start := time.Now()
			elections, acked, rebuilds, shortReads := 0, 0, 0, 0
			var midWrite, stalls, fast int
			for seed := uint64(1); seed <= seeds; seed++ {
				o := c.o
				o.Seed, o.Faults = seed, true
				r := RunGroup(o)
				if r.Violation != nil {
					failGroupRun(t, o, r)
					return
				}
				elections, acked, rebuilds, shortReads = elections+r.Elections, acked+r.Acked, rebuilds+r.Rebuilds, shortReads+r.ShortReads
				midWrite, stalls, fast = midWrite+r.MidWriteDeaths, stalls+r.Stalls, fast+r.FastClocks
			}
			el := time.Since(start)
			t.Logf("%d seeds in %v (%.0f seeds/s): %d elections, %d values acked, %d snapshot rebuilds, %d short catch-up reads; %d deaths mid-write, %d stalls, %d fast clocks",
				seeds, el.Round(time.Millisecond), float64(seeds)/el.Seconds(), elections, acked, rebuilds, shortReads, midWrite, stalls, fast)
			if c.o.ShortReads && shortReads == 0 {
				t.Fatal("no catch-up read stopped short")
			}
			if c.o.DiskFaults && (midWrite == 0 || stalls == 0 || fast == 0) {
				t.Fatal("the disk and clock faults never struck")
			}
			// Under sync_all nobody lags past the commit point, so only
			// sync_quorum campaigns must exercise rebuilds.
			if c.o.Compact && c.o.Policy == replica.SyncQuorum && rebuilds == 0 {
				t.Fatal("compacting campaign rebuilt no replica from a snapshot")
			}
			if acked == 0 || (c.o.GroupSize > 1 && elections <= int(seeds)) {
				t.Fatalf("campaign too tame: %d elections, %d acked", elections, acked)
			}
		})
	}
}

// TestGroupRegressionSeeds replays seeds that once found bugs.
func TestGroupRegressionSeeds(t *testing.T) {
	for _, o := range []GroupOptions{
		// A snapshot below acknowledged entries was installed and dropped
		// them; sync_all then committed an entry held by 2 of 3 replicas.
		{Seed: 40071, GroupSize: 3, Policy: replica.SyncAll, Compact: true, Faults: true},
		// A follower answered its leader's heartbeat, took a later epoch
		// from a pre-vote refusal and granted another candidate's PREPARE
		// at once: a new leader within the old one's lease
		// (LeaseOnTheClock; LeaseOutlivesTheEpoch).
		{Seed: 16071, GroupSize: 3, Faults: true},
	} {
		if r := RunGroup(o); r.Violation != nil {
			failGroupRun(t, o, r)
		}
	}
}

func TestGroupSameSeedSameTrace(t *testing.T) {
	o := GroupOptions{Seed: 9, Faults: true}
	a, b := RunGroup(o), RunGroup(o)
	if a.TraceHash != b.TraceHash || a.Events != b.Events {
		t.Fatalf("seed 9 ran twice differently: %s/%d vs %s/%d", a.TraceHash, a.Events, b.TraceHash, b.Events)
	}
}

// TestGroupMutationsAreCaught: each guard of the replication kernel is
// load-bearing — removing it makes the campaign fail within 30 seeds.
func TestGroupMutationsAreCaught(t *testing.T) {
	cases := []struct {
		name  string
		m     replica.Mutations
		want  []string
		clock bool // with ClockFaults (stalls)
	}{
		{"commit on the leader's own fsync alone", replica.Mutations{CommitOnLeaderFlushAlone: true}, []string{VisibleImpliesQuorumFlushed}, false},
		{"install without a promise majority", replica.Mutations{InstallWithoutQuorum: true}, []string{InstallNeedsQuorumPromise, OneLeaderPerEpoch}, false},
		{"accept a stale-epoch APPEND", replica.Mutations{AcceptStaleAppend: true}, []string{CommittedPrefixAgreement, KernelAssertion, VisibleImpliesQuorumFlushed, AckedNeverLost}, false},
		{"sleep past the tick a follower stops vouching for its leader", replica.Mutations{QuietThroughSilence: true}, []string{QuietTicks}, false},
		{"date the published lease from the current tick", replica.Mutations{LeaseFromCurrentTick: true}, []string{LeaseOnTheClock}, true},
		{"promise an election timeout's PREPARE while holding the leader's lease", replica.Mutations{PrepareIgnoresLease: true}, []string{LeaseOnTheClock}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			expectCaught(t, 30, c.want, func(seed uint64) *Violation {
				return RunGroup(GroupOptions{Seed: seed, Faults: true, ClockFaults: c.clock, DiskFaults: c.clock, Mutations: c.m}).Violation
			})
		})
	}
}

// TestGroupDiskFaultsCatchAnEarlyFlushed: the disk-fault model has teeth. A
// shell that sends a Ready's messages before its writes are durable (so a
// follower reports FLUSHED for entries it then loses) breaks the
// invariants within a bounded number of seeds — and only with DiskFaults,
// which is what makes such a shell lose writes.
func TestGroupDiskFaultsCatchAnEarlyFlushed(t *testing.T) {
	expectCaught(t, 40, []string{VisibleImpliesQuorumFlushed, AckedNeverLost, CommittedPrefixAgreement, InstallNeedsQuorumPromise, OneLeaderPerEpoch}, func(seed uint64) *Violation {
		return RunGroup(GroupOptions{Seed: seed, Faults: true, DiskFaults: true, SendBeforePersist: true}).Violation
	})
	for seed := uint64(1); seed <= 10; seed++ {
		if r := RunGroup(GroupOptions{Seed: seed, Faults: true, SendBeforePersist: true}); r.Violation != nil {
			t.Fatalf("seed %d without disk faults: %v", seed, r.Violation)
		}
	}
}

// TestReplicatedGoldenTraces compares each replicated golden run with its
// recorded trace, byte for byte, and checks the value's fate: acknowledged
// and committed on the clean path; never visible when the leader died
// before writing it; committed after the failover once every replica held
// it; and in every variant the replicas agree and the probe commits.
// Regenerate deliberately with: go test ./internal/sim -run Golden -update
func TestReplicatedGoldenTraces(t *testing.T) {
	for _, v := range ReplicatedGoldenVariants {
		t.Run(v, func(t *testing.T) {
			r, err := RunReplicatedGolden(v)
			if err != nil {
				t.Fatal(err)
			}
			if r.Violation != nil {
				t.Fatalf("golden run broke %v\n%s", r.Violation, strings.Join(r.Trace, "\n"))
			}
			has := func(value string) bool { return slices.Contains(r.Committed, value) }
			switch {
			case !r.Agree || !has("m2"):
				t.Fatalf("replicas disagree or the probe never committed: %v", r.Committed)
			case v == "clean" && (!r.Acked || !has("m1") || r.Killed):
				t.Fatalf("clean run: acked %v, committed %v", r.Acked, r.Committed)
			case v != "clean" && (!r.Killed || r.Acked):
				t.Fatalf("the kill did not happen before the ack: killed %v, acked %v", r.Killed, r.Acked)
			case v == "kill-leader-before-append" && has("m1"):
				t.Fatalf("a value the leader never wrote became visible: %v", r.Committed)
			case (v == "kill-leader-before-commit" || v == "kill-leader-before-ack") && !has("m1"):
				t.Fatalf("a value every replica held was lost: %v", r.Committed)
			}
			checkGolden(t, "replicated-"+v, r.Trace)
		})
	}
}
