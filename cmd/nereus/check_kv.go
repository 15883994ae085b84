package main

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/kvfold"
	"github.com/nereus-broker/nereus/internal/model"
)

// kvMutations names the KV loop's deliberate bugs for --mutation, with the
// model that catches each.
var kvMutations = map[string]struct {
	set   func(*kvfold.Mutations)
	model string
}{
	"DropFailedBatch":      {func(m *kvfold.Mutations) { m.DropFailedBatch = true }, "applied"},
	"ResumeFromMemApplied": {func(m *kvfold.Mutations) { m.ResumeFromMemApplied = true }, "applied"},
	"NoAckBarrier":         {func(m *kvfold.Mutations) { m.NoAckBarrier = true }, "resync"},
	"UnguardedLiveWatch":   {func(m *kvfold.Mutations) { m.UnguardedLiveWatch = true }, "live"},
}

var kvModels = map[string]func(model.KVConfig) model.KVResult{
	"applied": model.CheckKVApplied,
	"resync":  model.CheckKVResync,
	"live":    model.CheckKVLive,
}

func newCheckKVCmd() *cobra.Command {
	var cfg model.KVConfig
	var only, mutation string
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Run the model checker on the SDK's KV applied loop",
		Long: `Explore every interleaving of the KV applied loop (the real kvfold kernel)
folding a bucket's watch into a store, in three models: applied (delivery,
flush boundaries, store failures and restarts: KVStoreMatchesCursor in every
state), resync (a store behind the floor resyncs while a key is deleted and
recreated around the listing) and live (retention moves the floor past a
live watcher while records are in flight; compaction is not in the applied
model). KVFoldConverges and KVLoopLive
are checked in every model. Without --model all three run. On a violation
it prints the action trace and exits non-zero. --mutation runs a
deliberately broken loop, which must fail (by default in the model that
catches it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names := []string{"applied", "resync", "live"}
			if mutation != "" {
				m, ok := kvMutations[mutation]
				if !ok {
					return fmt.Errorf("--mutation %q: want one of %s", mutation, strings.Join(slices.Sorted(maps.Keys(kvMutations)), ", "))
				}
				m.set(&cfg.Mutations)
				names = []string{m.model}
			}
			if only != "" {
				if kvModels[only] == nil {
					return fmt.Errorf("--model %q: want applied, resync or live", only)
				}
				names = []string{only}
			}
			var errs []error
			for _, name := range names {
				fmt.Fprintf(cmd.OutOrStdout(), "model %s:\n", name)
				start := time.Now()
				r := kvModels[name](cfg)
				errs = append(errs, reportOutcome(cmd.OutOrStdout(), r.Outcome, time.Since(start), fmt.Sprintf("%d applies, %d store failures, %d restarts, %d floor-guard trips, %d benign gaps, %d resyncs, %d stops, %d pauses, %d quiescent states",
					r.Applies, r.StoreFailures, r.Restarts, r.Trips, r.BenignGaps, r.Resyncs, r.Stopped, r.Paused, r.Quiescent)))
			}
			return errors.Join(errs...)
		},
	}
	f := cmd.Flags()
	f.StringVar(&only, "model", "", "run one model: applied, resync or live (default: all three)")
	f.IntVar(&cfg.Failures, "failures", 1, "store applies or key reads that fail")
	f.IntVar(&cfg.Restarts, "restarts", 1, "loop restarts (memory lost, the store's cursor kept)")
	f.IntVar(&cfg.Compactions, "compactions", 3, "retention moves the floor by one")
	f.IntVar(&cfg.Overwrites, "overwrites", 1, "overwritten records compacted above the floor")
	f.IntVar(&cfg.ListingFailures, "listing-failures", 0, "listings that fail (the loop stops)")
	f.IntVar(&cfg.StoreFailuresMax, "store-failures-max", 0, "the loop's consecutive-failure stop (0: its default, 16)")
	f.IntVar(&cfg.PendingOpsMax, "pending-ops-max", 0, "the loop's bound on held ops before it pauses the watch (0: its default, 4096)")
	f.IntVar(&cfg.NetworkMax, "network-max", 3, "records in flight to the loop")
	f.IntVar(&cfg.DepthMax, "depth-max", 80, "actions along one path")
	f.IntVar(&cfg.StatesMax, "states-max", 1_000_000, "distinct states before stopping")
	f.StringVar(&mutation, "mutation", "", "a deliberate bug: DropFailedBatch, ResumeFromMemApplied, NoAckBarrier or UnguardedLiveWatch")
	return cmd
}
