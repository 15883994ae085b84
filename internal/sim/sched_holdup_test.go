package sim

import (
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/wire"
)

// TestSchedHeldUpOwnerFenced (LeaseOnTheClock): a shard's owner whose
// member of the shard's replica group is held up (a hung fsync) while the
// rest of its node runs on stops publishing once its lease ran out on the
// clock, though the status its member last published still counts lease
// ticks. To give it a publish to make then, the destination of one of its
// publishes is cut off at that publish's instant: the publish is lost,
// and its owner would send it again after the forward timeout (2 s), long
// after its lease ran out and another node took office. With
// SchedGuardFromTicks (the guard taken from those ticks) it does, and
// NoPublishWithoutBothGates fails the run.
func TestSchedHeldUpOwnerFenced(t *testing.T) {
	for seed := uint64(1); seed <= 2; seed++ {
		r, st := schedHeldUpOwner(seed, node.Mutations{})
		switch {
		case st.held == "":
			t.Fatalf("seed %d: no schedule was published after 800 ms", seed)
		case r.Violation != nil:
			t.Fatalf("seed %d: %v\ntrace tail:\n%s", seed, r.Violation, strings.Join(r.Tail, "\n"))
		case st.again == "" || st.again == st.held:
			t.Fatalf("seed %d: schedule %d, lost as %s published it, was not published again by another owner (%q)", seed, st.schedule, st.held, st.again)
		}
		t.Logf("seed %d: %s held up as it published schedule %d; %s published it again", seed, st.held, st.schedule, st.again)
		r, _ = schedHeldUpOwner(seed, node.Mutations{SchedGuardFromTicks: true})
		if r.Violation == nil || r.Violation.Invariant != "NoPublishWithoutBothGates" || !strings.Contains(r.Violation.Detail, st.held+" published") {
			t.Fatalf("seed %d: mutated (SchedGuardFromTicks), %s held up: got %v, want %s publishing against NoPublishWithoutBothGates", seed, st.held, r.Violation, st.held)
		}
		t.Logf("seed %d: mutation found: %v", seed, r.Violation)
	}
}

// schedHeldUp is what one run of the script saw: the node held up, the
// schedule whose publish was lost, and the first node that published it
// again.
type schedHeldUp struct {
	held, again string
	schedule    uint64
}

// schedHeldUpOwner runs the script on one seed with mutation m.
func schedHeldUpOwner(seed uint64, m node.Mutations) (Result, schedHeldUp) {
	const holdMs = 3000
	s := newClusterSim(ClusterOptions{Seed: seed, Schedules: 150, Mutations: m})
	t0 := s.w.nowMs
	var st schedHeldUp
	s.schedPublished = func(b *broker, shard uint32, p sched.Publish) {
		switch {
		case st.held != "":
			if p.ID == st.schedule && st.again == "" {
				st.again = b.id
			}
			return
		case s.w.nowMs < t0+800:
			return
		}
		st.held, st.schedule = b.id, p.ID
		s.w.tracef("scenario: %s publishes schedule %d of shard %d: cut %s off and hold up %s's member of the shard", b.id, p.ID, shard, p.Topic, b.id)
		s.net.outTopic = p.Topic
		b.node.HoldUpReplica(wire.SchedTopic, shard, s.w.nowMs+holdMs)
		s.w.after(holdMs, func() {
			s.net.outTopic = ""
			s.w.tracef("scenario: heal %s", p.Topic)
		})
	}
	return s.runPhases(), st
}
