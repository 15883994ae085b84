package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/model"
)

// kvBucketMutations names the KV kernel's deliberate bugs for
// --mutation, and the shell's the model plays (a kernel switch the
// shell's guard would hide comes with that guard off).
var kvBucketMutations = map[string]func(*model.KVBucketConfig){
	"cas-against-committed-only": func(c *model.KVBucketConfig) { c.Mutations.CASAgainstCommittedOnly = true },
	"refuse-without-lease":       func(c *model.KVBucketConfig) { c.Mutations.RefuseWithoutLease = true },
	"apply-ignores-condition":    func(c *model.KVBucketConfig) { c.Mutations.ApplyIgnoresCondition = true },
	"evict-live-revision":        func(c *model.KVBucketConfig) { c.Mutations.EvictLiveRevision = true },
	"watch-jumps-floor":          func(c *model.KVBucketConfig) { c.Mutations.WatchJumpsFloor = true },
	"submit-before-reign-start": func(c *model.KVBucketConfig) {
		c.Mutations.SubmitBeforeReignStart, c.Shell.SkipReadyGate = true, true
	},
	"checkpoint-any-base": func(c *model.KVBucketConfig) {
		c.Mutations.CheckpointAnyBase, c.Shell.CheckpointWithoutDrain = true, true
	},
	// The shell's guards alone (the first and last are held by the
	// kernel's: the model stays clean).
	"skip-ready-gate":          func(c *model.KVBucketConfig) { c.Shell.SkipReadyGate = true },
	"read-without-lease":       func(c *model.KVBucketConfig) { c.Shell.ReadWithoutLease = true },
	"failed-as-unavailable":    func(c *model.KVBucketConfig) { c.Shell.FailedAsUnavailable = true },
	"checkpoint-without-drain": func(c *model.KVBucketConfig) { c.Shell.CheckpointWithoutDrain = true },
}

// parseKVWrites reads --writes: comma-separated "OP KEY", OP one of put,
// del, create (a put expecting revision 0), cas (a put expecting the
// latest revision the client heard of the key), KEY a or b.
func parseKVWrites(spec string) ([]model.KVWrite, error) {
	var out []model.KVWrite
	for _, item := range strings.Split(spec, ",") {
		f := strings.Fields(item)
		if len(f) != 2 || (f[1] != "a" && f[1] != "b") {
			return nil, fmt.Errorf("--writes: %q: want OP KEY, KEY a or b", item)
		}
		w := model.KVWrite{Key: int(f[1][0] - 'a'), Op: kv.OpPut}
		switch f[0] {
		case "put":
		case "del":
			w.Op = kv.OpDelete
		case "create":
			w.CAS = model.KVCreate
		case "cas":
			w.CAS = model.KVKnown
		default:
			return nil, fmt.Errorf("--writes: %q: OP is put, del, create or cas", item)
		}
		out = append(out, w)
	}
	if len(out) > 8 {
		return nil, fmt.Errorf("--writes: %d writes, at most 8", len(out))
	}
	return out, nil
}

func newCheckKVBucketCmd() *cobra.Command {
	var cfg model.KVBucketConfig
	var writes, mutation string
	cmd := &cobra.Command{
		Use:   "kv-bucket",
		Short: "Run the model checker on the KV bucket kernel (leader writes, CAS, leases, replicas)",
		Long: `Explore every interleaving of a KV bucket's replicated partition with the
real KV kernel (internal/kv) on every replica — its applied state
(kv.Bucket) on each, the leader's write decisions (kv.Leader: the overlay of
writes in flight, parked CASes, lease-gated refusals, the reign's start) on
the replica that leads — driven as the node's shell drives them. A client
submits --writes (several in flight), retries the ones answered UNAVAILABLE
and may lose answers; records commit in log order, are refused before their
append, or answered failed by a degraded leader while they stay in flight;
the lease lapses and a new leader takes office keeping any prefix of what
was pending; a deposed leader keeps taking writes until its shell notices;
replicas apply and follow the leadership at their own pace. On request:
compaction records, a watcher served by whichever replica leads,
checkpoints, logs truncated through them and followers rebuilt from them.
KVReplyTruthful, KVRefusalLinearizable, KVRefusedNotWritten,
KVLeaderHoldsAcked, KVGetLinearizable, KVStateMatchesLog, KVReplicasAgree,
KVAppliesEveryRecord, KVCASProposedOnlyIfItMayHold and KVWatchNoSilentGap
are checked in every state. On a violation it prints the action trace and
exits non-zero. --mutation runs a deliberately broken kernel or shell.
(The SDK's applied loop is 'check kv'.)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyMutation(mutation, kvBucketMutations, &cfg); err != nil {
				return err
			}
			ws, err := parseKVWrites(writes)
			if err != nil {
				return err
			}
			cfg.Writes = ws
			if cfg.Replicas < 2 || cfg.Replicas > 3 {
				return fmt.Errorf("--replicas %d: want 2 or 3", cfg.Replicas)
			}
			if cfg.InflightMax < 1 {
				return fmt.Errorf("--inflight-max must be at least 1")
			}
			if cfg.HistoryMax < 1 || cfg.HistoryMax > kv.HistoryLimit {
				return fmt.Errorf("--history %d: want 1 to %d", cfg.HistoryMax, kv.HistoryLimit)
			}
			start := time.Now()
			r := model.CheckKVBucket(cfg)
			return reportOutcome(cmd.OutOrStdout(), r.Outcome, time.Since(start), fmt.Sprintf("%d written, %d refused at once, %d refused as applied, %d parked, %d lease lapsed, %d outcome unknown, %d elections, %d writes taken by a deposed leader, %d compactions, %d watch events, %d cursors expired, %d checkpoints, %d rebuilds, %d with every write answered and heard",
				r.Written, r.Mismatches, r.ApplyRefusals, r.Parked, r.LeaseLapsed, r.Unknown, r.Elections, r.ZombieSubmits, r.Compactions, r.WatchEvents, r.CursorExpired, r.Checkpoints, r.Rebuilds, r.Settled))
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Replicas, "replicas", 2, "replicas of the bucket's partition: 2 or 3")
	f.StringVar(&writes, "writes", "put a,create a,cas a", "the client's writes, in order: OP KEY, comma-separated (OP put, del, create: expects revision 0, cas: expects the revision last heard; KEY a or b)")
	f.IntVar(&cfg.InflightMax, "inflight-max", 2, "writes the client has outstanding at once")
	f.IntVar(&cfg.HistoryMax, "history", 1, "revisions kept per key")
	f.IntVar(&cfg.LostReplies, "lost-replies", 0, "answers lost on their way")
	f.IntVar(&cfg.Elections, "elections", 1, "a new leader takes office (once the old one's lease lapsed)")
	f.IntVar(&cfg.Lapses, "lapses", 1, "the leader's lease lapses")
	f.IntVar(&cfg.Refusals, "refusals", 0, "a proposal refused before its append")
	f.IntVar(&cfg.Degrades, "degrades", 0, "the leader degrades: its proposals answered failed, still in flight")
	f.IntVar(&cfg.Compactions, "compactions", 0, "the leader proposes a compaction record (purging tombstones)")
	f.BoolVar(&cfg.Watch, "watch", false, "a watcher from revision 1, served by whichever replica leads")
	f.IntVar(&cfg.Checkpoints, "checkpoints", 0, "the leader proposes a checkpoint")
	f.IntVar(&cfg.CheckpointChunkBytes, "chunk-bytes", 40, "a checkpoint chunk's bytes at most")
	f.IntVar(&cfg.Truncations, "truncations", 0, "a replica's log is truncated through its latest checkpoint")
	f.IntVar(&cfg.Restarts, "restarts", 0, "a follower restarts from its log or is reset to the leader's log start")
	f.IntVar(&cfg.DepthMax, "depth-max", 100, "actions along one path")
	f.IntVar(&cfg.StatesMax, "states-max", 2_000_000, "distinct states before stopping")
	f.StringVar(&mutation, "mutation", "", "a deliberate bug: "+mutationNames(kvBucketMutations))
	return cmd
}
