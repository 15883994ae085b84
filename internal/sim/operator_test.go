package sim

import (
	"strings"
	"testing"
)

// TestN25StateFileFlipsOnASingleNode runs a single node whose bit flips
// hit its state files as well as its partitions' logs: a group's ack
// ledger (a segment or its snapshot), settings.json and both copies of
// its load count, a partition's epoch file and dedup snapshot, and
// topics.json — half the time with a kill -9 at once, beside crashes,
// kill points and fsync errors. The operator repairs the node whenever
// it asks (its ERROR lines, a start that fails), as docs/OPERATIONS.md
// says, and the repair itself may be killed and run again. Every
// invariant holds after every event: nothing acknowledged is lost outside
// a damaged partition's dropped ranges, an ack is forgotten only with a
// damaged ledger's range (and then its message comes again), no producer
// retry appends twice, and delivery ids never repeat.
func TestN25StateFileFlipsOnASingleNode(t *testing.T) {
	seeds := envUint(t, "NEREUS_SIM_SEEDS", 200)
	if testing.Short() {
		seeds = min(seeds, 60)
	}
	flips, repaired, lines := map[string]int{}, map[string]int{}, map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		o := Options{Seed: seed, Faults: Faults{Crash: true, KillPoint: true, Fsync: true, BitFlip: true}}
		r := Run(o)
		if r.Violation != nil {
			failRun(t, o, r)
			return
		}
		addCounts(flips, r.StateFlips)
		addCounts(repaired, r.Repaired)
		addCounts(lines, r.NodeLines)
	}
	t.Logf("%d seeds: state files flipped %v; repairs %v", seeds, flips, repaired)
	if testing.Short() {
		return // too few seeds to meet every kind
	}
	for _, kind := range []string{"ledger segment", "ledger-snapshot", "settings.json", "incarnation", "incarnation.copy", "epoch", "dedup", "topics.json"} {
		if flips[kind] == 0 {
			t.Errorf("no bit flip hit a %s", kind)
		}
	}
	for _, what := range []string{"ledger ranges dropped", "ledger snapshot removed", "epoch file removed", "topics rebuilt", "killed, run again"} {
		if repaired[what] == 0 {
			t.Errorf("no repair: %s", what)
		}
	}
	for _, line := range []string{"group ack ledger corrupt", "group ack ledger snapshot corrupt", "group settings damaged",
		"group incarnation copy damaged", "node: read topics", "ack ledger torn tail truncated", "dedup snapshot unreadable"} {
		logged := false
		for l := range lines {
			logged = logged || strings.HasPrefix(l, line)
		}
		if !logged {
			t.Errorf("the node never logged %q", line)
		}
	}
}

// addCounts adds a run's counts by kind to a campaign's.
func addCounts(total, run map[string]int) {
	for k, n := range run {
		total[k] += n
	}
}
