package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/model"
)

// consumeMutations names the consume side's deliberate bugs for
// --mutation: the ack log's and the delivery cursor's, and one of the
// shell the model plays.
var consumeMutations = map[string]func(*model.ConsumeConfig){
	"ack-before-commit":           func(c *model.ConsumeConfig) { c.AckLog.AckBeforeCommit = true },
	"re-ack-waits-for-any-record": func(c *model.ConsumeConfig) { c.AckLog.ReAckWaitsForAnyRecord = true },
	"replay-ack-keeps-retry":      func(c *model.ConsumeConfig) { c.Delivery.ReplayAckKeepsRetry = true },
	"same-id-base":                func(c *model.ConsumeConfig) { c.SameIDBase = true },
}

func newCheckConsumeCmd() *cobra.Command {
	var cfg model.ConsumeConfig
	var maxDeliver uint32
	var mutation string
	cmd := &cobra.Command{
		Use:   "consume",
		Short: "Run the model checker on the consume side (delivery cursor and ack log)",
		Long: `Explore every interleaving of one consumer group on one partition of a
cluster with the real delivery cursor (internal/delivery) and ack log
(internal/acklog), driven as a partition leader's node drives them: the
consumer receives, loses, acks (again), nacks; ack waits pass; the group
flushes its acks, counts and dead letters into records of the partition's
log, which commit in order, are refused, or wait while the leader lost its
quorum; a new leader takes office with any prefix of the old one's records
and rebuilds the group from the committed log. AckFloorNeverRedelivered,
DeliveryIDsUnique, DeadLetterAfterItsCount, NoDeadLetterOfAnAck,
RebuildHoldsConfirmedAcks and NoMessageLost are checked in every state. On a
violation it prints the action trace and exits non-zero. --mutation runs a
deliberately broken kernel or shell, which must fail.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyMutation(mutation, consumeMutations, &cfg); err != nil {
				return err
			}
			if cfg.Messages < 1 || cfg.Messages > 8 {
				return fmt.Errorf("--messages %d: want 1 to 8", cfg.Messages)
			}
			if maxDeliver < 1 || cfg.InflightMax < 1 {
				return fmt.Errorf("--max-deliver and --inflight-max must be at least 1")
			}
			cfg.MaxDeliver = maxDeliver
			start := time.Now()
			r := model.CheckConsume(cfg)
			return reportOutcome(cmd.OutOrStdout(), r.Outcome, time.Since(start), fmt.Sprintf("%d with an ACK confirmed, %d redeliveries, %d dead letters, %d checkpoints, %d rebuilds, %d with every message settled",
				r.Confirmed, r.Redeliveries, r.DeadLetters, r.Checkpoints, r.Rebuilds, r.Settled))
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Messages, "messages", 2, "messages in the partition, all visible")
	f.Uint32Var(&maxDeliver, "max-deliver", 2, "deliveries before a message is dead-lettered")
	f.IntVar(&cfg.InflightMax, "inflight-max", 2, "deliveries outstanding at once")
	f.Int64Var(&cfg.CompactBytes, "compact-bytes", 24, "checkpoint threshold (an ack record of one seq is 12 bytes)")
	f.IntVar(&cfg.AckWaits, "ack-waits", 1, "an ack wait passes")
	f.IntVar(&cfg.Acks, "acks", 2, "ACKs the consumer sends, retries included")
	f.IntVar(&cfg.Nacks, "nacks", 0, "NACKs the consumer sends")
	f.IntVar(&cfg.Drops, "drops", 0, "MSGs lost on their way")
	f.IntVar(&cfg.Refusals, "refusals", 1, "records refused before they were appended")
	f.IntVar(&cfg.Degrades, "degrades", 1, "the leader loses its quorum")
	f.IntVar(&cfg.Elections, "elections", 1, "a new leader takes office")
	f.BoolVar(&cfg.Quiet, "quiet", false, "the group may also flush as one that was quiet a while (checkpoints below the threshold)")
	f.IntVar(&cfg.DepthMax, "depth-max", 60, "actions along one path")
	f.IntVar(&cfg.StatesMax, "states-max", 2_000_000, "distinct states before stopping")
	f.StringVar(&mutation, "mutation", "", "a deliberate bug: "+mutationNames(consumeMutations))
	return cmd
}
