package sim

import (
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/partition"
)

func failClusterRun(t *testing.T, o ClusterOptions, r Result) {
	t.Helper()
	t.Errorf("seed %d: %v\nreproduce: %s", r.Seed, r.Violation, ClusterReproduce(o))
}

// TestClusterCampaign runs three complete nodes under every cluster fault
// — kill -9 of a node, coordinated power loss, kill points before disk
// writes and fsyncs, symmetric and one-way partitions of a node, peer
// frames dropped and duplicated, failing fsyncs, broken client
// connections — with idempotent producers and a consumer group, checks
// the invariants after every event, heals, requires every message to be
// acknowledged and consumed, then cuts the power to every node once more
// and reads every partition back.
func TestClusterCampaign(t *testing.T) {
	for _, c := range []struct {
		name    string
		syncAll bool
		seeds   uint64
	}{
		{"sync_quorum", false, 30},
		{"sync_all", true, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			seeds := c.seeds
			if testing.Short() {
				seeds = min(seeds, 5)
			}
			start := time.Now()
			var acked, deliveries, restarts, faults int
			for seed := uint64(1); seed <= seeds; seed++ {
				o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, SyncAll: c.syncAll}
				r := RunCluster(o)
				if r.Violation != nil {
					failClusterRun(t, o, r)
					return
				}
				acked, deliveries, restarts, faults = acked+r.Acked, deliveries+r.Deliveries, restarts+r.Restarts, faults+r.Faults
			}
			el := time.Since(start)
			t.Logf("%d seeds in %v (%.1f seeds/s): %d faults, %d node restarts, %d messages acked, %d deliveries",
				seeds, el.Round(time.Millisecond), float64(seeds)/el.Seconds(), faults, restarts, acked, deliveries)
			if faults < 10*int(seeds) || restarts < 4*int(seeds) {
				t.Fatalf("campaign too tame: %d faults, %d restarts in %d seeds", faults, restarts, seeds)
			}
		})
	}
}

func TestClusterSameSeedSameTrace(t *testing.T) {
	o := ClusterOptions{Seed: 24, Faults: AllClusterFaults}
	a, b := RunCluster(o), RunCluster(o)
	if a.TraceHash != b.TraceHash || a.Events != b.Events {
		t.Fatalf("seed 24 ran twice differently: %s/%d vs %s/%d", a.TraceHash, a.Events, b.TraceHash, b.Events)
	}
}

// TestClusterMutationsAreCaught: guards of the real node and its kernels,
// each removed, are caught by the cluster campaign within 20 seeds.
func TestClusterMutationsAreCaught(t *testing.T) {
	for _, c := range []struct {
		name string
		m    node.Mutations
		want []string
	}{
		{"new leader takes publishes before its install entry is applied",
			node.Mutations{Partition: partition.Mutations{SkipInstallGate: true}}, []string{NoDuplicateFromReplay}},
		{"ack answered before its record commits",
			node.Mutations{AckLog: acklog.Mutations{AckBeforeCommit: true}}, []string{AckFloorNeverRedelivered}},
		{"groups coordinated before the install entry is applied",
			node.Mutations{CoordinateBeforeInstall: true}, []string{AckFloorNeverRedelivered}},
	} {
		t.Run(c.name, func(t *testing.T) {
			expectCaught(t, 20, c.want, func(seed uint64) *Violation {
				return RunCluster(ClusterOptions{Seed: seed, Faults: AllClusterFaults, Mutations: c.m}).Violation
			})
		})
	}
}

// TestClusterRegressionSeeds replays seeds that once found bugs.
func TestClusterRegressionSeeds(t *testing.T) {
	before := ClusterFaults{Crash: true, PowerLoss: true, KillPoint: true, Partition: true, Network: true, Fsync: true, Clients: true}
	for _, o := range []ClusterOptions{
		// A node whose topic failed to start (a kill point while opening
		// its replicas) answered NOT_FOUND for good: a producer's PUB
		// failed permanently (PublishAnswered). Starts are retried now,
		// with UNAVAILABLE meanwhile.
		{Seed: 1213, Faults: before},
		{Seed: 1256, Faults: before},
	} {
		if r := RunCluster(o); r.Violation != nil {
			failClusterRun(t, o, r)
		}
	}
}
