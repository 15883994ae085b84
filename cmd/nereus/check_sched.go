package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/model"
)

// schedMutations names the scheduler kernel's deliberate bugs for
// --mutation: the owner's and the applied state's.
var schedMutations = map[string]func(*model.SchedConfig){
	"publish-without-lease":      func(c *model.SchedConfig) { c.Mutations.PublishWithoutLease = true },
	"publish-before-intent":      func(c *model.SchedConfig) { c.Mutations.PublishBeforeIntent = true },
	"fenced-still-fires":         func(c *model.SchedConfig) { c.Mutations.FencedStillFires = true },
	"ready-not-revalidated":      func(c *model.SchedConfig) { c.Mutations.ReadyNotRevalidated = true },
	"claims-before-due":          func(c *model.SchedConfig) { c.Mutations.ClaimsBeforeDue = true },
	"pause-ignored":              func(c *model.SchedConfig) { c.Mutations.PauseIgnored = true },
	"gate-not-rechecked-at-take": func(c *model.SchedConfig) { c.Mutations.GateNotRecheckedAtTake = true },
	"cancel-firing":              func(c *model.SchedConfig) { c.StateMutations.CancelFiring = true },
	"closed-lane-admits":         func(c *model.SchedConfig) { c.StateMutations.ClosedLaneAdmits = true },
	"retire-retried-refused":     func(c *model.SchedConfig) { c.StateMutations.RetireRetriedRefused = true },
	"later-incarnation-admitted": func(c *model.SchedConfig) { c.StateMutations.LaterIncarnationAdmitted = true },
	"follows-recreated-destination": func(c *model.SchedConfig) {
		c.Mutations.FollowsRecreatedDestination = true
	},
}

func newCheckSchedCmd() *cobra.Command {
	cfg := model.SchedConfig{Window: 2, EvidenceTicks: 1, LeaseTicks: 1}
	var due []int64
	var mutation string
	cmd := &cobra.Command{
		Use:   "sched",
		Short: "Run the model checker on the scheduled-delivery kernel",
		Long: `Explore every interleaving of one schedule shard on two nodes with the real
scheduler kernel (internal/sched): leadership moves once the old lease guard
closed, owners restart, clocks jump back, nodes apply the shard's log at their
own pace, the destination refuses writes or is deleted and re-created, publish
replies are lost. The destination deduplicates with the real producer table;
an operator pauses, closes or retires the lane and resumes it, a client
cancels a schedule, a schedule's append commits after a lane command
(--intake-races), a node ends its proposals in one pass.
NoPublishWithoutBothGates, NoPublishBeforeIntent, NeverEarly,
NoPublishOnStaleEvidence, NoClaimForAnEarlierIncarnation, PauseHolds,
RetireHolds, RetireAnsweredOK, ClosedAdmitsNone, CancelledNeverPublished
and ExactlyOnce are checked in every state. On a violation it prints the action trace and exits non-zero.
--mutation runs a deliberately broken kernel, which must fail (each needs
the action it breaks: ready-not-revalidated --recreates 1 --time-max 3,
cancel-firing --cancels 1, closed-lane-admits --closes 1 --intake-races,
retire-retried-refused --retires 2, later-incarnation-admitted --due 1,2
--recreates 1 --time-max 3, follows-recreated-destination --recreates 1
--time-max 3).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyMutation(mutation, schedMutations, &cfg); err != nil {
				return err
			}
			if len(due) == 0 {
				return fmt.Errorf("--due: at least one schedule")
			}
			cfg.Due = due
			start := time.Now()
			r := model.CheckSched(cfg)
			return reportOutcome(cmd.OutOrStdout(), r.Outcome, time.Since(start), fmt.Sprintf("%d landed, %d retries deduplicated, %d unknown, %d ordering breaks, %d takeovers, %d with every schedule resolved, %d with a due schedule held by a pause or close, %d cancelled, %d cancels too late, %d schedules refused as they applied, %d retired",
				r.Landed, r.Retries, r.Unknown, r.Breaks, r.Takeovers, r.AllResolved, r.PausedHeld, r.Cancelled, r.TooLate, r.Refused, r.Retired))
		},
	}
	f := cmd.Flags()
	f.Int64SliceVar(&due, "due", []int64{2, 1}, "the schedules' deliver_at ticks, in admission order")
	f.Int64Var(&cfg.TimeMax, "time-max", 2, "ticks run 0..time-max")
	f.IntVar(&cfg.Moves, "moves", 1, "leadership moves to the other node (after the lease guard closed)")
	f.IntVar(&cfg.Crashes, "crashes", 1, "owner restarts")
	f.IntVar(&cfg.ClockJumps, "clock-jumps", 0, "a node's clock jumps one tick back")
	f.IntVar(&cfg.Recreates, "recreates", 0, "the destination is deleted and re-created")
	f.IntVar(&cfg.Resumes, "resumes", 0, "an operator resumes the lane")
	f.IntVar(&cfg.Pauses, "pauses", 0, "an operator pauses the lane (with --resumes to open it again)")
	f.IntVar(&cfg.Closes, "closes", 0, "an operator closes the lane (with --resumes to open it again)")
	f.IntVar(&cfg.Retires, "retires", 0, "an operator retires the lane (2: asks again)")
	f.IntVar(&cfg.Cancels, "cancels", 0, "a client cancels an admitted schedule")
	f.BoolVar(&cfg.IntakeRaces, "intake-races", false, "an admitted schedule's append commits at any later point (after a lane command)")
	f.IntVar(&cfg.Outages, "outages", 0, "the destination refuses writes until it recovers")
	f.IntVar(&cfg.LostReplies, "lost-replies", 0, "a publish lands and its reply is lost")
	f.IntVar(&cfg.NetworkMax, "network-max", 4, "publishes and proposals in flight before a state is not expanded")
	f.IntVar(&cfg.DepthMax, "depth-max", 60, "actions along one path")
	f.IntVar(&cfg.StatesMax, "states-max", 2_000_000, "distinct states before stopping")
	f.StringVar(&mutation, "mutation", "", "a deliberate bug: "+mutationNames(schedMutations))
	return cmd
}
