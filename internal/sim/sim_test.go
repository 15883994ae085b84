package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/node"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/golden traces from this run")

func failRun(t *testing.T, o Options, r Result) {
	t.Helper()
	t.Errorf("seed %d: %v\ntrace tail:\n  %s\nreproduce: %s", r.Seed, r.Violation, strings.Join(r.Tail, "\n  "), Reproduce(o))
}

func TestSameSeedSameTrace(t *testing.T) {
	o := Options{Seed: 42, Faults: AllFaults}
	a, b := Run(o), Run(o)
	if a.TraceHash != b.TraceHash || a.Events != b.Events || a.VirtualMs != b.VirtualMs {
		t.Fatalf("seed 42 ran twice differently: %s/%d/%d vs %s/%d/%d", a.TraceHash, a.Events, a.VirtualMs, b.TraceHash, b.Events, b.VirtualMs)
	}
	if c := Run(Options{Seed: 43, Faults: AllFaults}); c.TraceHash == a.TraceHash {
		t.Fatal("seeds 42 and 43 gave the same trace")
	}
	if a.Violation != nil {
		failRun(t, o, a)
	}
}

// TestCampaign runs random seeds with every fault. NEREUS_SIM_SEEDS sets the
// count (default 300) and NEREUS_SIM_FIRST_SEED the first seed, for soaks.
func TestCampaign(t *testing.T) {
	seeds, first := envUint(t, "NEREUS_SIM_SEEDS", 300), envUint(t, "NEREUS_SIM_FIRST_SEED", 1)
	if testing.Short() {
		seeds = min(seeds, 30)
	}
	start := time.Now()
	var events, acked, deliveries, restarts int
	for seed := first; seed < first+seeds; seed++ {
		o := Options{Seed: seed, Faults: AllFaults}
		r := Run(o)
		events, acked, deliveries, restarts = events+r.Events, acked+r.Acked, deliveries+r.Deliveries, restarts+r.Restarts
		if r.Violation != nil {
			failRun(t, o, r)
			return
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d seeds in %v (%.0f seeds/s): %d events, %d acked, %d deliveries, %d broker restarts",
		seeds, elapsed.Round(time.Millisecond), float64(seeds)/elapsed.Seconds(), events, acked, deliveries, restarts)
	if restarts == 0 || deliveries == 0 {
		t.Fatal("the campaign exercised no restarts or no deliveries")
	}
}

// TestCampaignPubBatch runs seeds whose producers publish in PUB_BATCH
// frames (protocol v2) under every fault of a single node: crashes between
// a batch's records' fsyncs, torn writes, failed fsyncs and writes, lost
// connections. Each record must still be answered once, under its own id,
// and every invariant hold after every event.
func TestCampaignPubBatch(t *testing.T) {
	seeds := envUint(t, "NEREUS_SIM_SEEDS", 60)
	if testing.Short() {
		seeds = min(seeds, 10)
	}
	var batches, acked, restarts int
	for seed := uint64(1); seed <= seeds; seed++ {
		o := Options{Seed: seed, Faults: AllFaults, PubBatch: true}
		r := Run(o)
		batches, acked, restarts = batches+r.PubBatches, acked+r.Acked, restarts+r.Restarts
		if r.Violation != nil {
			failRun(t, o, r)
			return
		}
	}
	t.Logf("%d seeds: %d PUB_BATCH frames of more than one record, %d acked, %d broker restarts", seeds, batches, acked, restarts)
	// The answers of a group commit free their slots at one instant: the
	// refill goes out as one batch (about 24 a seed), not only the resends
	// after a reconnect (about 4).
	if batches < 10*int(seeds) || restarts == 0 {
		t.Fatalf("the campaign sent %d PUB_BATCH frames of more than one record (want %d or more) and restarted the broker %d times", batches, 10*seeds, restarts)
	}
	if r := Run(Options{Seed: 1, Faults: AllFaults}); r.PubBatches != 0 {
		t.Fatalf("without PubBatch the producers sent %d PUB_BATCH frames", r.PubBatches)
	}
}

func envUint(t *testing.T, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// TestMutationsAreCaught proves the checkers are load-bearing: each
// deliberate bug is found within a bounded number of seeds.
func TestMutationsAreCaught(t *testing.T) {
	const seedsMax = 30
	cases := []struct {
		name string
		m    node.Mutations
		want []string // invariants that may report it
	}{
		{"PUB_OK before fsync", node.Mutations{AckBeforeFsync: true}, []string{VisibleMonotonic, AckedNeverLost, DeliveredOnlyVisible}},
		{"dedup table not rebuilt on restart", node.Mutations{SkipDedupRebuild: true}, []string{NoDuplicateFromReplay}},
		{"ack ledger not fsynced", node.Mutations{SkipLedgerFsync: true}, []string{AckFloorNeverRedelivered}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			expectCaught(t, seedsMax, c.want, func(seed uint64) *Violation {
				return Run(Options{Seed: seed, Faults: AllFaults, Mutations: c.m}).Violation
			})
		})
	}
	// Bit flips alone: a flipped record a delivery read fails on, never
	// located, keeps its group from ever acking it and asks for no repair.
	t.Run("read damage not located", func(t *testing.T) {
		expectCaught(t, seedsMax, []string{Liveness}, func(seed uint64) *Violation {
			return Run(Options{Seed: seed, Faults: Faults{BitFlip: true}, Mutations: NodeMutations["read-damage-unverified"]}).Violation
		})
	})
}

// expectCaught runs seeds 1..seedsMax until one breaks an invariant and
// requires it to be one of want.
func expectCaught(t *testing.T, seedsMax uint64, want []string, run func(seed uint64) *Violation) {
	t.Helper()
	for seed := uint64(1); seed <= seedsMax; seed++ {
		v := run(seed)
		if v == nil {
			continue
		}
		if !slices.Contains(want, v.Invariant) {
			t.Fatalf("seed %d: caught by %v, want one of %v", seed, v, want)
		}
		t.Logf("caught at seed %d: %v", seed, v)
		return
	}
	t.Fatalf("not caught in %d seeds", seedsMax)
}

// TestGoldenTraces compares each golden run with its recorded trace, byte
// for byte. Regenerate deliberately with: go test ./internal/sim -run Golden -update
func TestGoldenTraces(t *testing.T) {
	for _, v := range GoldenVariants {
		t.Run(v, func(t *testing.T) {
			r, err := RunGolden(v)
			if err != nil {
				t.Fatal(err)
			}
			if r.Violation != nil {
				t.Fatalf("golden run broke %v\n%s", r.Violation, strings.Join(r.Tail, "\n"))
			}
			checkGolden(t, v, r.Trace)
		})
	}
}

// checkGolden compares a trace with testdata/golden/<name>.trace (or
// records it with -update).
func checkGolden(t *testing.T, name string, trace []string) {
	t.Helper()
	got := strings.Join(trace, "\n") + "\n"
	file := filepath.Join("testdata", "golden", name+".trace")
	if *updateGolden {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run with -update to record it)", err)
	}
	if d := firstDifference(string(want), got); d != "" {
		t.Fatalf("trace differs from %s (rerun with -update only if the change is intended):\n%s", file, d)
	}
}

func TestGoldenKillVariantsReallyKill(t *testing.T) {
	for _, v := range GoldenVariants[1:] {
		r, _ := RunGolden(v)
		if r.Restarts == 0 || !strings.Contains(strings.Join(r.Trace, "\n"), "kill -9 at") {
			t.Errorf("%s: no kill happened (restarts %d)", v, r.Restarts)
		}
	}
}

// firstDifference renders the first differing line with context, or "".
func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl == gl {
			continue
		}
		var b strings.Builder
		for j := max(0, i-3); j < i; j++ {
			fmt.Fprintf(&b, "  %4d   %s\n", j+1, w[j])
		}
		fmt.Fprintf(&b, "  %4d - %s\n  %4d + %s\n", i+1, wl, i+1, gl)
		return b.String()
	}
	return ""
}

func TestParseFaults(t *testing.T) {
	f, err := ParseFaults("crash,fsync")
	if err != nil || !f.Crash || !f.Fsync || f.Clock {
		t.Fatalf("%+v %v", f, err)
	}
	if back, _ := ParseFaults(AllFaults.String()); back != AllFaults {
		t.Fatal("String does not round-trip")
	}
	if _, err := ParseFaults("crash,meteor"); err == nil {
		t.Fatal("unknown fault accepted")
	}
}
