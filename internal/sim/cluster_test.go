package sim

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/partition"
)

func TestMutDebug(t *testing.T) {
	for name, m := range map[string]node.Mutations{
		"installgate": {Partition: partition.Mutations{SkipInstallGate: true}},
		"dedupseal":   {Partition: partition.Mutations{SkipDedupSeal: true}},
		"ackbefore":   {AckLog: acklog.Mutations{AckBeforeCommit: true}},
	} {
		caught := 0
		for seed := uint64(1); seed <= 20; seed++ {
			r := RunCluster(ClusterOptions{Seed: seed, Steps: 20000, Faults: AllClusterFaults, Mutations: m})
			if r.Violation != nil {
				caught++
				if caught == 1 {
					t.Logf("%s seed %d: %v", name, seed, r.Violation)
				}
			}
		}
		t.Logf("%s: %d/20", name, caught)
	}
}
