package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/model"
	"github.com/nereus-broker/nereus/internal/replica"
)

func init() {
	extraCommands = append(extraCommands, newCheckCmd)
}

func newCheckCmd() *cobra.Command {
	var cfg model.Config
	var policy string
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Run the model checker on the replication kernel",
		Long: `Explore every interleaving of a small replica-group configuration (depth-first,
visiting each distinct state once) with the real replication kernel, checking
OneLeaderPerEpoch, InstallNeedsQuorumPromise, CommittedPrefixAgreement,
VisibleImpliesQuorumFlushed, VisibleMonotonic and ReadOnlyRefusesWrites in every
state. Crashes in the middle of a Ready (--crash-partial), ack timeouts into
read-only mode (--ack-timeouts), compactions with snapshot installs
(--compactions), a node whose last durable entry goes bad (--damages: it
restarts uncertain), one whose log goes bad inside (--rebuilds: it drops the
entry and what follows and stays out of elections until a leader made it whole)
and one whose hard state goes bad (--promise-losses: it asks every peer for its
promise before it takes part) are in the explored space on request. On a violation
it prints the action trace that leads to it and exits non-zero.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch policy {
			case "quorum":
				cfg.Policy = replica.SyncQuorum
			case "all":
				cfg.Policy = replica.SyncAll
			default:
				return fmt.Errorf("--policy %q: want quorum or all", policy)
			}
			start := time.Now()
			r := model.Check(cfg)
			return reportOutcome(cmd.OutOrStdout(), r.Outcome, time.Since(start), fmt.Sprintf("max epoch %d, %d committed, %d mid-Ready crashes, %d of them undoing a truncation, %d read-only, %d back from read-only, %d compactions, %d snapshot installs, %d appends below a snapshot, %d uncertain grants, %d campaigns on TIMEOUT_NOW, %d hand-offs completed, %d abandoned, %d promises recovered, %d damaged refusals, %d nodes rebuilt",
				r.MaxEpoch, r.Committed, r.MidReadyCrashes, r.TruncationsUndone, r.ReadOnly, r.ReadOnlyBack, r.Compactions, r.SnapshotInstalls, r.AppendsBelowSnapshot, r.UncertainGrants,
				r.TransferCampaigns, r.TransferLeaders, r.TransfersAbandoned, r.PromisesRecovered, r.DamagedRefusals, r.Rebuilt))
		},
	}
	cmd.AddCommand(newCheckGroupsCmd())
	cmd.AddCommand(newCheckSchedCmd())
	cmd.AddCommand(newCheckConsumeCmd())
	cmd.AddCommand(newCheckProduceCmd())
	cmd.AddCommand(newCheckKVCmd())
	cmd.AddCommand(newCheckKVBucketCmd())
	f := cmd.Flags()
	f.IntVar(&cfg.Replicas, "replicas", 3, "replicas in the group")
	f.StringVar(&policy, "policy", "quorum", "ack policy: quorum or all")
	f.IntVar(&cfg.Proposals, "proposals", 1, "values proposed")
	f.IntVar(&cfg.Campaigns, "campaigns", 1, "election timeouts")
	f.BoolVar(&cfg.PreVote, "pre-vote", false, "election timeouts start pre-vote rounds (as in production) instead of campaigning at once")
	f.IntVar(&cfg.Heartbeats, "heartbeats", 0, "leader heartbeats")
	f.IntVar(&cfg.Crashes, "crashes", 1, "kill -9 and restart")
	f.BoolVar(&cfg.EarlyAppends, "early-appends", false, "a leader sends its APPENDs before its own fsync (as production does) and can be killed between the two")
	f.BoolVar(&cfg.CrashPartial, "crash-partial", false, "a kill -9 may land in the middle of a Ready's writes and keep any prefix of them (snapshot, hard state, truncation, entries one by one)")
	f.IntVar(&cfg.AckTimeouts, "ack-timeouts", 0, "ack timeouts: a leader hears no follower for its ack timeout and goes READ_ONLY_DEGRADED (its reservations expire too)")
	f.IntVar(&cfg.Compactions, "compactions", 0, "compactions: a node compacts its log to its RetainFloor; followers behind a leader's snapshot install it")
	f.IntVar(&cfg.Transfers, "transfers", 0, "leadership transfers: a leader hands leadership to another node (TIMEOUT_NOW once it flushed the leader's log; the target campaigns at once)")
	f.IntVar(&cfg.Damages, "damages", 0, "damaged tails: a node's last durable entry goes bad and it restarts uncertain (keep within a minority of nodes)")
	f.IntVar(&cfg.Rebuilds, "rebuilds", 0, "damaged logs: an entry of a node's log goes bad and is found as damage; it drops it and what follows and restarts rebuilding (keep within a minority of nodes)")
	f.IntVar(&cfg.PromiseLosses, "promise-losses", 0, "lost hard states: a node's hard state goes bad and it restarts not knowing its promise (keep within a minority of nodes)")
	f.IntVar(&cfg.Drops, "drops", 1, "lost messages")
	f.IntVar(&cfg.Dups, "dups", 0, "duplicated messages")
	f.IntVar(&cfg.NetworkMax, "network-max", 8, "messages in flight before a state is not expanded")
	f.IntVar(&cfg.DepthMax, "depth-max", 60, "actions along one path")
	f.IntVar(&cfg.StatesMax, "states-max", 1_000_000, "distinct states before stopping")
	return cmd
}

// reportOutcome prints an exploration's outcome and what it reached, and
// fails on a violation.
func reportOutcome(out io.Writer, o model.Outcome, took time.Duration, reached string) error {
	fmt.Fprintf(out, "%d states (%d not expanded: network or depth bound), complete=%v, %v\n",
		o.States, o.Pruned, o.Complete, took.Round(time.Millisecond))
	fmt.Fprintf(out, "reached: %s\n", reached)
	if o.Violation != "" {
		fmt.Fprintf(out, "VIOLATION %s\ntrace:\n  %s\n", o.Violation, strings.Join(o.Trace, "\n  "))
		return fmt.Errorf("model check failed: %s", o.Violation)
	}
	if !o.Complete {
		fmt.Fprintln(out, "no violation in the states explored; raise --states-max to explore further")
	}
	return nil
}

// applyMutation sets the deliberate bug name names in a model's
// configuration (nothing for ""), or says which names there are.
func applyMutation[T any](name string, table map[string]func(*T), into *T) error {
	if name == "" {
		return nil
	}
	set, ok := table[name]
	if !ok {
		return fmt.Errorf("--mutation %q: want one of %s", name, mutationNames(table))
	}
	set(into)
	return nil
}

// mutationNames lists a table's mutations, sorted, for help and errors.
func mutationNames[T any](table map[string]func(*T)) string {
	return strings.Join(slices.Sorted(maps.Keys(table)), ", ")
}
