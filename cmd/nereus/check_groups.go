package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/model"
)

// groupMutations names the group kernel's deliberate bugs for --mutation.
var groupMutations = map[string]func(*group.Mutations){
	"assign-before-revoke":    func(m *group.Mutations) { m.AssignBeforeRevoke = true },
	"no-epoch-fencing":        func(m *group.Mutations) { m.NoEpochFencing = true },
	"non-sticky":              func(m *group.Mutations) { m.NonSticky = true },
	"reassign-unmoved":        func(m *group.Mutations) { m.ReassignUnmoved = true },
	"stale-ack-accepted":      func(m *group.Mutations) { m.StaleAckAccepted = true },
	"ack-ignores-incarnation": func(m *group.Mutations) { m.AckIgnoresIncarnation = true },
}

func newCheckGroupsCmd() *cobra.Command {
	var cfg model.GroupConfig
	var mutation string
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "Run the model checker on the consumer-group kernel",
		Long: `Explore every interleaving of a small consumer group (depth-first, each
distinct state once) with the real group kernel: members join, leave, crash
and are fenced while still running; notices and CONTROL_ACKs are lost,
duplicated and resent; the group, once empty, is deleted and joined again;
partition leaders apply the metadata log at their own pace and move between
nodes. ExclusiveDelivery, MinimalRebalance, EventuallyOwned and
AckFromCurrentOwner are checked in every state. On a
violation it prints the action trace and exits non-zero. --mutation runs a
deliberately broken kernel, which must fail.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mutation == "answer-copy-early" {
				cfg.AnswerCopyEarly = true // the member's, not the kernel's
			} else if mutation != "" {
				set, ok := groupMutations[mutation]
				if !ok {
					names := append(slices.Sorted(maps.Keys(groupMutations)), "answer-copy-early")
					return fmt.Errorf("--mutation %q: want one of %s", mutation, strings.Join(names, ", "))
				}
				set(&cfg.Mutations)
			}
			start := time.Now()
			r := model.CheckGroup(cfg)
			return reportOutcome(cmd.OutOrStdout(), r.Outcome, time.Since(start), fmt.Sprintf("%d deliveries, %d redeliveries, %d stale pulls or acks refused, %d revokes answered, %d members fenced holding deliveries, %d deletes, %d rejoins, %d stale CONTROL_ACKs of a deleted incarnation",
				r.Deliveries, r.Redeliveries, r.Refused, r.Revokes, r.ZombieFenced, r.Deletes, r.Rejoins, r.StaleAcks))
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Members, "members", 2, "members (all subscribed to one topic)")
	f.IntVar(&cfg.Partitions, "partitions", 2, "partitions of the topic")
	f.IntVar(&cfg.Messages, "messages", 1, "messages in each partition")
	f.IntVar(&cfg.Nodes, "nodes", 2, "nodes hosting partition leaders, each applying the metadata log at its own pace")
	f.IntVar(&cfg.Joins, "joins", 2, "JOINs (first joins and restarts)")
	f.IntVar(&cfg.Leaves, "leaves", 0, "graceful LEAVEs")
	f.IntVar(&cfg.Crashes, "crashes", 0, "member crashes")
	f.IntVar(&cfg.Fences, "fences", 1, "members fenced by the coordinator (session or rebalance timeout), possibly while still running")
	f.IntVar(&cfg.Deletes, "deletes", 0, "deletes of the group while it has no members (joined again as its next incarnation)")
	f.IntVar(&cfg.Moves, "moves", 0, "partition leadership moves to another node")
	f.IntVar(&cfg.Resends, "resends", 0, "notices resent")
	f.IntVar(&cfg.Drops, "drops", 0, "notices or CONTROL_ACKs lost")
	f.IntVar(&cfg.Dups, "dups", 0, "notices or CONTROL_ACKs duplicated")
	f.IntVar(&cfg.NetworkMax, "network-max", 4, "messages in flight before a state is not expanded")
	f.IntVar(&cfg.DepthMax, "depth-max", 40, "actions along one path")
	f.IntVar(&cfg.StatesMax, "states-max", 1_000_000, "distinct states before stopping")
	f.StringVar(&mutation, "mutation", "", "a deliberate bug: assign-before-revoke, no-epoch-fencing, non-sticky, stale-ack-accepted, ack-ignores-incarnation (try with --nodes 1 --joins 4 --leaves 1 --deletes 1), or the member's answer-copy-early (try with --resends 1)")
	return cmd
}
