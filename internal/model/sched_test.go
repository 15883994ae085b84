package model

import (
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/sched"
)

// schedBase: two schedules admitted latest-due first, one leadership
// move, one owner crash; small enough for every interleaving in seconds.
var schedBase = SchedConfig{Due: []int64{2, 1}, TimeMax: 2, Moves: 1, Crashes: 1, Window: 2, EvidenceTicks: 1, LeaseTicks: 1,
	NetworkMax: 4, DepthMax: 60, StatesMax: 2_000_000}

func runSched(t *testing.T, name string, cfg SchedConfig) SchedResult {
	t.Helper()
	start := time.Now()
	r := CheckSched(cfg)
	t.Logf("%s: %d states, %d pruned, complete=%v, %v; landed %d, retries %d, unknown %d, breaks %d, takeovers %d, all resolved %d, paused held %d, cancelled %d, too late %d, refused %d, retired %d",
		name, r.States, r.Pruned, r.Complete, time.Since(start).Round(time.Millisecond), r.Landed, r.Retries, r.Unknown, r.Breaks, r.Takeovers, r.AllResolved,
		r.PausedHeld, r.Cancelled, r.TooLate, r.Refused, r.Retired)
	return r
}

func TestSchedModelGuarded(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*SchedConfig)
		// reached asserts the exploration got where the configuration is for.
		reached func(SchedResult) bool
	}{
		{"move and crash", func(c *SchedConfig) {}, func(r SchedResult) bool { return r.Retries > 0 && r.Takeovers > 0 && r.AllResolved > 0 }},
		{"lost replies", func(c *SchedConfig) { c.Crashes, c.LostReplies = 0, 1 }, func(r SchedResult) bool { return r.Retries > 0 && r.AllResolved > 0 }},
		{"clock jumps", func(c *SchedConfig) { c.Due, c.Crashes, c.ClockJumps = []int64{2}, 0, 1 }, func(r SchedResult) bool { return r.AllResolved > 0 }},
		{"outage", func(c *SchedConfig) { c.Due, c.Crashes, c.Moves, c.Outages, c.TimeMax = []int64{1}, 0, 0, 1, 3 }, func(r SchedResult) bool { return r.AllResolved > 0 }},
		{"pause and resume", func(c *SchedConfig) {
			c.Due, c.Crashes, c.Pauses, c.Resumes, c.TimeMax = []int64{1}, 0, 1, 1, 2
		}, func(r SchedResult) bool { return r.PausedHeld > 0 && r.Takeovers > 0 && r.AllResolved > 0 }},
		{"cancels", func(c *SchedConfig) {
			c.Due, c.Cancels, c.TimeMax = []int64{1}, 1, 2
		}, func(r SchedResult) bool {
			return r.Cancelled > 0 && r.TooLate > 0 && r.Takeovers > 0 && r.AllResolved > 0
		}},
		{"close against intake, resume", func(c *SchedConfig) {
			c.Due, c.Crashes, c.IntakeRaces, c.Closes, c.Resumes, c.TimeMax = []int64{1}, 0, true, 1, 1, 2
		}, func(r SchedResult) bool {
			return r.Refused > 0 && r.PausedHeld > 0 && r.Takeovers > 0 && r.AllResolved > 0
		}},
		{"retire asked twice", func(c *SchedConfig) {
			c.Due, c.Crashes, c.IntakeRaces, c.Retires, c.TimeMax = []int64{1, 1}, 0, true, 2, 1
		}, func(r SchedResult) bool { return r.Retired > 0 && r.Refused > 0 && r.AllResolved > 0 }},
		{"re-created destination", func(c *SchedConfig) {
			c.Due, c.Moves, c.Crashes, c.Recreates, c.Resumes, c.TimeMax = []int64{1}, 0, 0, 1, 1, 3
		}, func(r SchedResult) bool { return r.Breaks > 0 && r.Unknown > 0 && r.AllResolved > 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := schedBase
			tc.set(&cfg)
			r := runSched(t, tc.name, cfg)
			if r.Violation != "" {
				t.Fatalf("%s\ntrace:\n  %s", r.Violation, strings.Join(r.Trace, "\n  "))
			}
			if !r.Complete {
				t.Fatalf("exploration incomplete at %d states", r.States)
			}
			if !tc.reached(r) {
				t.Fatalf("the exploration did not reach what it is for: %+v", r)
			}
		})
	}
}

// Each mutation removes one guard of the owner; the model must find the
// broken invariant.
func TestSchedModelMutations(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		set        func(*SchedConfig)
	}{
		{"PublishWithoutLease", "NoPublishWithoutBothGates", func(c *SchedConfig) { c.Mutations.PublishWithoutLease, c.Crashes = true, 0 }},
		{"PublishBeforeIntent", "NoPublishBeforeIntent", func(c *SchedConfig) { c.Mutations.PublishBeforeIntent, c.Moves = true, 0 }},
		{"FencedStillFires", "NoPublishWithoutBothGates", func(c *SchedConfig) { c.Mutations.FencedStillFires, c.Crashes = true, 0 }},
		{"PauseIgnored", "PauseHolds", func(c *SchedConfig) {
			c.Mutations.PauseIgnored, c.Due, c.Crashes, c.Moves, c.Pauses, c.Resumes, c.TimeMax = true, []int64{1}, 0, 0, 1, 1, 3
		}},
		{"GateNotRecheckedAtTake", "PauseHolds", func(c *SchedConfig) {
			c.Mutations.GateNotRecheckedAtTake, c.Due, c.Crashes, c.Moves, c.Pauses, c.Resumes, c.TimeMax = true, []int64{1}, 0, 0, 1, 1, 3
		}},
		{"GateNotRecheckedAtTake/retire", "RetireHolds", func(c *SchedConfig) {
			c.Mutations.GateNotRecheckedAtTake, c.Due, c.Crashes, c.Moves, c.Retires, c.TimeMax = true, []int64{1}, 0, 0, 1, 3
		}},
		{"ClaimsBeforeDue", "NeverEarly", func(c *SchedConfig) { c.Mutations.ClaimsBeforeDue, c.Moves, c.Crashes = true, 0, 0 }},
		{"CancelFiring", "CancelledNeverPublished", func(c *SchedConfig) {
			c.StateMutations.CancelFiring, c.Due, c.Crashes, c.Moves, c.Cancels, c.TimeMax = true, []int64{1}, 0, 0, 1, 1
		}},
		{"ClosedLaneAdmits", "ClosedAdmitsNone", func(c *SchedConfig) {
			c.StateMutations.ClosedLaneAdmits, c.Due, c.Crashes, c.Moves, c.IntakeRaces, c.Closes, c.TimeMax = true, []int64{1}, 0, 0, true, 1, 1
		}},
		{"RetireRetriedRefused", "RetireAnsweredOK", func(c *SchedConfig) {
			c.StateMutations.RetireRetriedRefused, c.Due, c.Crashes, c.Moves, c.Retires, c.TimeMax = true, []int64{1}, 0, 0, 2, 1
		}},
		{"ReadyNotRevalidated", "NoPublishOnStaleEvidence", func(c *SchedConfig) {
			c.Mutations.ReadyNotRevalidated, c.Recreates, c.Moves, c.Crashes, c.TimeMax = true, 1, 0, 0, 3
		}},
		{"LaterIncarnationAdmitted", "NoClaimForAnEarlierIncarnation", func(c *SchedConfig) {
			c.StateMutations.LaterIncarnationAdmitted, c.Due, c.Recreates, c.Moves, c.Crashes, c.TimeMax = true, []int64{1, 2}, 1, 0, 0, 3
		}},
		{"FollowsRecreatedDestination", "ExactlyOnce", func(c *SchedConfig) {
			c.Mutations.FollowsRecreatedDestination, c.Recreates, c.Moves, c.Crashes, c.TimeMax = true, 1, 0, 0, 3
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := schedBase
			tc.set(&cfg)
			r := runSched(t, tc.name, cfg)
			if !strings.HasPrefix(r.Violation, tc.want) {
				t.Fatalf("violation %q, want %s", r.Violation, tc.want)
			}
			t.Logf("counterexample (%d actions): %s", len(r.Trace), r.Violation)
		})
	}
	_ = sched.Landed
}
