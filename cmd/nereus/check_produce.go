package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/model"
	"github.com/nereus-broker/nereus/internal/partition"
)

// produceMutations names the publish kernel's deliberate bugs for
// --mutation.
var produceMutations = map[string]func(*partition.Mutations){
	"skip-install-gate":            func(m *partition.Mutations) { m.SkipInstallGate = true },
	"skip-dedup-seal":              func(m *partition.Mutations) { m.SkipDedupSeal = true },
	"compact-forgets-producers":    func(m *partition.Mutations) { m.CompactForgetsProducers = true },
	"carry-ignores-inflight":       func(m *partition.Mutations) { m.CarryIgnoresInflight = true },
	"not-applied-forgets-inflight": func(m *partition.Mutations) { m.NotAppliedForgetsInflight = true },
	"out-of-order-moves-mention":   func(m *partition.Mutations) { m.OutOfOrderMovesMention = true },
	"seal-at-lowest":               func(m *partition.Mutations) { m.SealAtLowest = true },
}

func newCheckProduceCmd() *cobra.Command {
	var cfg model.ProduceConfig
	var mutation string
	cmd := &cobra.Command{
		Use:   "produce",
		Short: "Run the model checker on the produce side (idempotent producers on a replicated partition)",
		Long: `Explore every interleaving of one idempotent producer publishing to a
replicated partition with the real publish kernel (internal/partition's
Member) on every replica, driven as the node drives it: the producer
publishes, retries and loses replies; proposals commit in order, wait while
the leader lost its quorum, or at a change of leader commit as any prefix;
replicas apply at their own pace (a read of what committed may fail);
retention compacts a log to its kernel's limit, a follower restarts from its
kept log or is rebuilt from the leader's snapshot point; the leader proposes
dedup carries. NoDuplicateFromReplay, PubOKTruthful, DedupTableTruthful,
DedupTableComplete and OneProposalInFlight are checked in every state. On a
violation it prints the action trace and exits non-zero. --mutation runs a
deliberately broken kernel, which must fail.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyMutation(mutation, produceMutations, &cfg.Mutations); err != nil {
				return err
			}
			if cfg.Replicas < 2 || cfg.Replicas > 3 {
				return fmt.Errorf("--replicas %d: want 2 or 3", cfg.Replicas)
			}
			if cfg.Messages < 1 || cfg.Messages > 8 {
				return fmt.Errorf("--messages %d: want 1 to 8", cfg.Messages)
			}
			if cfg.InflightMax < 1 {
				return fmt.Errorf("--inflight-max must be at least 1")
			}
			start := time.Now()
			r := model.CheckProduce(cfg)
			return reportOutcome(cmd.OutOrStdout(), r.Outcome, time.Since(start), fmt.Sprintf("%d duplicates answered (%d by a rebuilt leader), %d waits, %d refused while taking office, %d too old, %d rebuilds, %d carries, %d elections, %d with every seq answered",
				r.Duplicates, r.RebuiltDuplicates, r.Waits, r.TakingOffice, r.TooOld, r.Rebuilds, r.Carries, r.Elections, r.Settled))
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Replicas, "replicas", 2, "replicas of the partition: 2 or 3")
	f.IntVar(&cfg.Messages, "messages", 2, "producer seqs published")
	f.IntVar(&cfg.InflightMax, "inflight-max", 2, "seqs the producer has outstanding at once")
	f.IntVar(&cfg.Retries, "retries", 2, "publishes sent again with the same identity")
	f.IntVar(&cfg.LostReplies, "lost-replies", 1, "replies lost on their way")
	f.IntVar(&cfg.Elections, "elections", 1, "a new leader takes office")
	f.IntVar(&cfg.Degrades, "degrades", 0, "the leader loses its quorum")
	f.IntVar(&cfg.Compactions, "compactions", 0, "retention compacts a replica's log")
	f.IntVar(&cfg.Restarts, "restarts", 0, "a follower restarts from its kept log (or is rebuilt)")
	f.IntVar(&cfg.Carries, "carries", 0, "the leader proposes a dedup carry")
	f.IntVar(&cfg.ApplyErrors, "apply-errors", 0, "a shell pass fails to read what committed (NotApplied)")
	f.IntVar(&cfg.DepthMax, "depth-max", 80, "actions along one path")
	f.IntVar(&cfg.StatesMax, "states-max", 2_000_000, "distinct states before stopping")
	f.StringVar(&mutation, "mutation", "", "a deliberate bug: "+mutationNames(produceMutations))
	return cmd
}
