package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sim"
)

func init() {
	extraCommands = append(extraCommands, newSimCmd)
}

func newSimCmd() *cobra.Command {
	var (
		seed, seeds  uint64
		steps        int
		faults       string
		asJSON       bool
		trace        bool
		logs         bool
		golden       string
		replicas     int
		policy       string
		compact      bool
		shortReads   bool
		diskFaults   bool
		clockFaults  bool
		nodes        int
		mutation     string
		listMut      bool
		members      bool
		pubBatch     bool
		deadLetters  bool
		retention    bool
		retentionAge int64
		retentionUps int
		schedules    int
		lanePauses   int
		laneRetire   bool
		laneRecreate bool
		schedCancels int
		kvOps        int
		churn        int
		groupDels    int
		groupUpdates int
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run the deterministic simulator for a seed (or a range of seeds)",
		Long: `Run the real broker code on one goroutine with virtual time, a simulated network
and a crashable disk, under seeded faults, and check its invariants. The same
seed always gives the same run. On a violation it prints the invariant, the
end of the trace and the command that reproduces it, and exits non-zero.

Faults: all, none, or a comma-separated list of ` + strings.Join(sim.FaultNames, ", ") + `;
with --nodes: ` + strings.Join(sim.ClusterFaultNames, ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if golden != "" && replicas > 0 {
				r, err := sim.RunReplicatedGolden(golden)
				if err != nil {
					return err
				}
				fmt.Fprintln(out, strings.Join(r.Trace, "\n"))
				if r.Violation != nil {
					return fmt.Errorf("replicated golden %s: %v", golden, r.Violation)
				}
				return nil
			}
			if golden != "" {
				r, err := sim.RunGolden(golden)
				if err != nil {
					return err
				}
				fmt.Fprintln(out, strings.Join(r.Trace, "\n"))
				if r.Violation != nil {
					return fmt.Errorf("golden %s: %v", golden, r.Violation)
				}
				return nil
			}
			if replicas == 0 || nodes > 0 {
				for _, f := range []struct {
					name string
					set  bool
				}{{"compact", compact}, {"short-reads", shortReads}, {"disk-faults", diskFaults}, {"clock-faults", clockFaults}} {
					if f.set {
						return fmt.Errorf("--%s needs --replicas without --nodes", f.name)
					}
				}
			}
			if retentionAge < 0 || retentionAge > 0 && !retention {
				return errors.New("--retention-age needs --retention and a positive age in virtual ms")
			}
			if retentionUps < 0 || retentionUps > 0 && !retention {
				return errors.New("--retention-updates needs --retention and a positive count")
			}
			if listMut {
				names := slices.Sorted(maps.Keys(sim.NodeMutations))
				if nodes > 0 {
					names = slices.Sorted(maps.Keys(sim.ClusterMutations))
				}
				fmt.Fprintln(out, strings.Join(names, "\n"))
				return nil
			}
			if nodes > 0 {
				f, err := sim.ParseClusterFaults(faults)
				if err != nil {
					return err
				}
				o := sim.ClusterOptions{Nodes: nodes, Steps: steps, Faults: f, KeepTrace: trace, Members: members, Schedules: schedules, LanePauses: lanePauses, LaneRetire: laneRetire, LaneRecreate: laneRecreate, SchedCancels: schedCancels, KV: kvOps, TopicChurn: churn, GroupDeletes: groupDels, GroupUpdates: groupUpdates, PubBatch: pubBatch, DeadLetters: deadLetters}
				if deadLetters && groupDels > 0 {
					return errors.New("--dead-letters and --group-deletes cannot be combined: each group incarnation dead-letters anew")
				}
				if replicas < 0 || replicas > 5 {
					return fmt.Errorf("--replicas %d: want 1, 3 or 5", replicas)
				}
				o.Replicas = uint8(replicas)
				if err := o.Validate(); err != nil {
					return fmt.Errorf("--nodes %d: %w", nodes, err)
				}
				if retention {
					o.Retention = sim.RetentionPreset
					o.Retention.AgeMs, o.Retention.Updates = retentionAge, retentionUps
				}
				if logs {
					o.Logs = cmd.ErrOrStderr()
				}
				switch policy {
				case "quorum", "sync_quorum":
				case "all", "sync_all":
					o.SyncAll = true
				default:
					return fmt.Errorf("--policy %q: want quorum or all", policy)
				}
				if mutation != "" {
					m, ok := sim.ClusterMutations[mutation]
					if !ok {
						return fmt.Errorf("--mutation %q: unknown (see --list-mutations)", mutation)
					}
					o.Mutations = m
				}
				return runClusterSim(cmd.Context(), out, seed, seeds, o)
			}
			if replicas > 0 {
				if mutation != "" || retention {
					return errors.New("--mutation and --retention need --nodes or a single node, not --replicas")
				}
				o := sim.GroupOptions{Steps: steps, GroupSize: replicas, Faults: faults != "none", Compact: compact,
					ShortReads: shortReads, DiskFaults: diskFaults, ClockFaults: clockFaults, KeepTrace: trace}
				return runGroupSim(cmd.Context(), out, seed, seeds, policy, o)
			}
			f, err := sim.ParseFaults(faults)
			if err != nil {
				return err
			}
			mutations, ok := sim.NodeMutations[mutation]
			if mutation != "" && !ok {
				return fmt.Errorf("--mutation %q: unknown without --nodes (see --list-mutations)", mutation)
			}
			if seeds == 0 {
				return errors.New("--seeds must be at least 1")
			}
			start := time.Now()
			for s := seed; s < seed+seeds; s++ {
				if err := interrupted(cmd.Context(), seed, s); err != nil {
					return err
				}
				o := sim.Options{Seed: s, Steps: steps, Faults: f, KeepTrace: trace, PubBatch: pubBatch, Members: members, DeadLetters: deadLetters, Mutations: mutations}
				if retention {
					o.Retention = sim.RetentionPreset
					o.Retention.AgeMs, o.Retention.Updates = retentionAge, retentionUps
				}
				if logs {
					o.Logs = cmd.ErrOrStderr()
				}
				r := sim.Run(o)
				if trace {
					fmt.Fprintln(out, strings.Join(r.Trace, "\n"))
				}
				if asJSON {
					line := map[string]any{"seed": r.Seed, "events": r.Events, "virtual_ms": r.VirtualMs,
						"trace_hash": r.TraceHash, "acked": r.Acked, "deliveries": r.Deliveries, "restarts": r.Restarts, "ok": r.Violation == nil,
						"state_flips": sumCounts(r.StateFlips), "repairs": r.Repairs}
					if r.Violation != nil {
						line["invariant"], line["detail"] = r.Violation.Invariant, r.Violation.Detail
					}
					b, _ := json.Marshal(line)
					fmt.Fprintln(out, string(b))
				} else {
					fmt.Fprintf(out, "seed %d: %d events, %dms virtual, %d acked, %d deliveries, %d restarts, ",
						r.Seed, r.Events, r.VirtualMs, r.Acked, r.Deliveries, r.Restarts)
					if o.DeadLetters {
						fmt.Fprintf(out, "%d dead letters, ", r.DeadLetters)
					}
					if flips := sumCounts(r.StateFlips); flips > 0 || r.Repairs > 0 {
						fmt.Fprintf(out, "%d state-file flips, %d repairs, ", flips, r.Repairs)
					}
					if o.Retention.Updates > 0 {
						fmt.Fprintf(out, "%d retention updates, ", r.RetentionUpdates)
					}
					fmt.Fprintf(out, "trace %s: ", r.TraceHash)
					if r.Violation == nil {
						fmt.Fprintln(out, "ok")
					}
				}
				if r.Violation != nil {
					if !asJSON {
						fmt.Fprintf(out, "VIOLATION %v\n", r.Violation)
						fmt.Fprintf(out, "trace tail:\n  %s\n", strings.Join(r.Tail, "\n  "))
					}
					return fmt.Errorf("seed %d broke %s; reproduce: %s", r.Seed, r.Violation.Invariant, sim.Reproduce(o))
				}
			}
			if seeds > 1 && !asJSON {
				el := time.Since(start)
				fmt.Fprintf(out, "%d seeds ok in %v (%.0f seeds/s)\n", seeds, el.Round(time.Millisecond), float64(seeds)/el.Seconds())
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.Uint64Var(&seed, "seed", 1, "seed (first seed with --seeds)")
	fl.Uint64Var(&seeds, "seeds", 1, "number of consecutive seeds to run")
	fl.IntVar(&steps, "steps", 20_000, "events in the fault phase")
	fl.StringVar(&faults, "faults", "all", "faults to inject")
	fl.BoolVar(&asJSON, "json", false, "one JSON object per seed")
	fl.BoolVar(&trace, "trace", false, "print the whole trace")
	fl.BoolVar(&logs, "logs", false, "write the node's log lines (virtual time t in ms; with --nodes every node's, sim_node) to stderr")
	fl.IntVar(&nodes, "nodes", 0, "simulate a cluster of this many complete nodes (server, node, replication, metadata) instead of one node")
	fl.StringVar(&mutation, "mutation", "", "run with a deliberate bug (see --list-mutations, with or without --nodes)")
	fl.BoolVar(&members, "members", false, "the consumers JOIN the group as members (assignment, notices, fencing; ExclusiveDelivery checked); a single node keeps them in groups.json, which bit flips then hit")
	fl.BoolVar(&deadLetters, "dead-letters", false, "the consumers subscribe with max_deliver 3 and NACK one message in eight until it is dead-lettered; the dead-letter topic is watched at every node (DeadLetterOnce, NoDeadLetterOfAnAck, DeadLetterIsTheRecord; not with --group-deletes)")
	fl.BoolVar(&pubBatch, "pub-batch", false, "the producers publish in PUB_BATCH frames (protocol v2), a retry of one message as a PUB (a single node, or with --nodes)")
	fl.IntVar(&schedules, "schedules", 0, "with --nodes: also schedule this many messages (scheduled delivery; NeverEarly and ExactlyOnce checked)")
	fl.IntVar(&lanePauses, "lane-pauses", 0, "with --schedules: also pause or close a destination's lane this many times under the faults and resume it 0.3-1.5 s later (PauseHolds: nothing of a held lane published; RefusedNeverPublished: nothing a closed lane refused)")
	fl.BoolVar(&laneRetire, "lane-retire", false, "with --lane-pauses: the last hold retires the lane for good (its pending schedules cancelled, firing ones UNKNOWN; nothing of it published after the RETIRE's answer)")
	fl.BoolVar(&laneRecreate, "lane-recreate", false, "with --lane-pauses: half the holds delete the destination topic and declare it again, then resume its lanes (LaneFiresOnlyIntoItsIncarnation: nothing published into the new topic before a RESUME; nothing lands in both)")
	fl.IntVar(&schedCancels, "sched-cancels", 0, "with --schedules: also cancel this many acknowledged schedules under the faults (CancelledNeverPublished: one whose cancel was answered OK is never published)")
	fl.IntVar(&groupUpdates, "group-updates", 0, "with --nodes: also set the consumers' group's ack wait with a group update this many times under the faults; at the end every runner of the group holds the last (GroupSettingsOnEveryNode; not with --group-deletes)")
	fl.IntVar(&groupDels, "group-deletes", 0, "with --nodes: also delete the consumers' group this many times under the faults (with force without --members), the consumers coming back as its next incarnation (GroupIncarnationStartsEmpty, CoordinatorAnswersCurrent)")
	fl.IntVar(&churn, "topic-churn", 0, "with --nodes: also delete and re-declare a topic of its own this many times under the faults (DeletedNeverResurrected, DeletedDataRemoved, CoordinatorAnswersCurrent)")
	fl.IntVar(&retentionUps, "retention-updates", 0, "with --retention: also change the topic's retention (size, and age with --retention-age) this many times under the faults with topic updates (SettingsKept)")
	fl.Int64Var(&retentionAge, "retention-age", 0, "with --retention: the topic's records also expire this many virtual ms after they were written, an idle partition's last ones included")
	fl.BoolVar(&retention, "retention", false, "the workload's topic keeps 4 KiB a partition (1 KiB segments): retention compacts it all the time, past producers' records (with --nodes: dedup carries, lagging replicas rebuilt; a single node: its dedup snapshot and copy, 300 messages a producer)")
	fl.IntVar(&kvOps, "kv", 0, "with --nodes: also run 3 KV clients doing this many put/get/cas/del each on one bucket, check the history for linearizability (porcupine), and watch the bucket from revision 1")
	fl.BoolVar(&listMut, "list-mutations", false, "list the mutations a single node's runs can carry (with --nodes: a cluster's)")
	fl.IntVar(&replicas, "replicas", 0, "simulate the replication kernel of one replica group of this size instead of a node; with --nodes: the replication factor of the workload's topics and bucket, 1, 3 or 5 (default: the number of nodes; bit flips hit only the last (R-1)/2 nodes; with 1 they hit the partitions' only copies, which the operator repairs with nereus repair --salvage)")
	fl.StringVar(&policy, "policy", "quorum", "ack policy with --replicas or --nodes: quorum or all")
	fl.BoolVar(&compact, "compact", false, "with --replicas: compact logs into snapshots (lagging replicas rebuild)")
	fl.BoolVar(&shortReads, "short-reads", false, "with --replicas: every read of a log for an APPEND stops after a few entries (catch-ups send less than the kernel asked for)")
	fl.BoolVar(&diskFaults, "disk-faults", false, "with --replicas: failing disks (a write or fsync fails, or the process dies just before one: unsynced writes lost)")
	fl.BoolVar(&clockFaults, "clock-faults", false, "with --replicas: stalled processes and fast clocks")
	fl.StringVar(&golden, "golden", "", "print the golden trace of a variant ("+strings.Join(sim.GoldenVariants, ", ")+
		"; with --replicas 3: "+strings.Join(sim.ReplicatedGoldenVariants, ", ")+")")
	return cmd
}

// runClusterSim runs the cluster simulator (`sim --nodes N`).
func runClusterSim(ctx context.Context, out io.Writer, seed, seeds uint64, o sim.ClusterOptions) error {
	start := time.Now()
	for s := seed; s < seed+max(seeds, 1); s++ {
		if err := interrupted(ctx, seed, s); err != nil {
			return err
		}
		o.Seed = s
		r := sim.RunCluster(o)
		if o.KeepTrace {
			fmt.Fprintln(out, strings.Join(r.Trace, "\n"))
		}
		fmt.Fprintf(out, "seed %d: %d nodes, %d events, %dms virtual, %d faults, %d restarts, %d acked, %d deliveries, trace %s: ",
			s, cmp.Or(o.Nodes, 3), r.Events, r.VirtualMs, r.Faults, r.Restarts, r.Acked, r.Deliveries, r.TraceHash)
		if o.Members {
			fmt.Fprintf(out, "members %v: ", r.Members)
		}
		if o.Schedules > 0 {
			fmt.Fprintf(out, "%d scheduled, %d published, ghost %v: ", r.Scheduled, r.SchedPublished, r.SchedStats)
		}
		if o.TopicChurn > 0 {
			fmt.Fprintf(out, "%d topic deletes, %d declares: ", r.TopicDeletes, r.TopicDeclares)
		}
		if o.GroupDeletes > 0 {
			fmt.Fprintf(out, "%d group deletes: ", r.GroupDeletes)
		}
		if o.GroupUpdates > 0 {
			fmt.Fprintf(out, "%d group updates, %d runners checked: ", r.GroupUpdates, r.GroupRunnersChecked)
		}
		if o.DeadLetters {
			fmt.Fprintf(out, "%d dead letters: ", r.DeadLetters)
		}
		if o.Retention.Updates > 0 {
			fmt.Fprintf(out, "%d retention updates: ", r.RetentionUpdates)
		}
		if r.Repairs > 0 {
			fmt.Fprintf(out, "%d repairs %v: ", r.Repairs, r.Repaired)
		}
		if len(r.AcksForgotten) > 0 {
			fmt.Fprintf(out, "acks forgotten %v: ", r.AcksForgotten)
		}
		if r.Coordinator != nil {
			fmt.Fprintf(out, "coordinator %v: ", r.Coordinator)
		}
		if r.MinorityPromiseLosses > 0 {
			fmt.Fprintf(out, "%d promise losses on two nodes at once: ", r.MinorityPromiseLosses)
		}
		if o.KV > 0 {
			fmt.Fprintf(out, "%d kv ops (%d unknown outcomes), %d watches (%d CURSOR_EXPIRED), log from %d, checkpoint %d, %d rebuilds from a checkpoint (%d of a running replica): ",
				r.KVOps, r.KVUnknown, r.KVWatches, r.KVExpired, r.KVLogStartMax, r.KVCheckpointMax, r.KVRebuilds, r.KVResets)
		}
		if r.Violation == nil {
			fmt.Fprintln(out, "ok")
			continue
		}
		fmt.Fprintf(out, "VIOLATION %v\ntrace tail:\n  %s\n", r.Violation, strings.Join(r.Tail, "\n  "))
		return fmt.Errorf("seed %d broke %s; reproduce: %s", s, r.Violation.Invariant, sim.ClusterReproduce(o))
	}
	if seeds > 1 {
		el := time.Since(start)
		fmt.Fprintf(out, "%d seeds ok in %v (%.1f seeds/s)\n", seeds, el.Round(time.Millisecond), float64(seeds)/el.Seconds())
	}
	return nil
}

// runGroupSim runs the replication-kernel simulator (`sim --replicas N`).
func runGroupSim(ctx context.Context, out io.Writer, seed, seeds uint64, policy string, o sim.GroupOptions) error {
	switch policy {
	case "quorum", "sync_quorum":
		o.Policy = replica.SyncQuorum
	case "all", "sync_all":
		o.Policy = replica.SyncAll
	default:
		return fmt.Errorf("--policy %q: want quorum or all", policy)
	}
	for s := seed; s < seed+max(seeds, 1); s++ {
		if err := interrupted(ctx, seed, s); err != nil {
			return err
		}
		o.Seed = s
		r := sim.RunGroup(o)
		if o.KeepTrace {
			fmt.Fprintln(out, strings.Join(r.Trace, "\n"))
		}
		fmt.Fprintf(out, "seed %d: R=%d %s, %d events, %d elections, %d values acked, %d rebuilds, %d short reads, trace %s: ", s, o.GroupSize, o.Policy, r.Events, r.Elections, r.Acked, r.Rebuilds, r.ShortReads, r.TraceHash)
		if r.Violation == nil {
			fmt.Fprintln(out, "ok")
			continue
		}
		fmt.Fprintf(out, "VIOLATION %v\ntrace tail:\n  %s\n", r.Violation, strings.Join(r.Tail, "\n  "))
		return fmt.Errorf("seed %d broke %s; reproduce: %s", s, r.Violation.Invariant, sim.GroupReproduce(o))
	}
	return nil
}

// interrupted stops a campaign between seeds once ctx is done (Ctrl-C or
// SIGTERM: the root command's context), saying where to resume: a seed
// runs to its end, a few seconds at most.
func interrupted(ctx context.Context, first, next uint64) error {
	switch {
	case ctx.Err() == nil:
		return nil
	case next == first:
		return fmt.Errorf("interrupted before seed %d", next)
	}
	return fmt.Errorf("interrupted: seeds %d to %d ran, resume with --seed %d", first, next-1, next)
}

// sumCounts adds up a result's counts by kind.
func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
