package node

import (
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// laneOf waits until topic's lane (on the shard that holds its pending
// schedules) shows gate and readiness.
func (h *harness) waitLane(topic, gate, readiness string) wire.LaneInfo {
	h.t.Helper()
	var last []wire.LaneInfo
	deadline := time.Now().Add(waitMax)
	for {
		st, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus, Topic: topic})
		if err != nil {
			h.t.Fatal(err)
		}
		last = st.Lanes
		for _, l := range st.Lanes {
			if l.Topic == topic && l.Pending > 0 && l.Gate == gate && l.Readiness == readiness {
				return l
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("lane of %s never %s/%s: %+v", topic, gate, readiness, last)
		}
		h.at(h.nowMs.Load() + 1000) // the next probe of the destination
		time.Sleep(5 * time.Millisecond)
	}
}

// A lane pinned to a topic's incarnation 1: while the topic is deleted it
// is BLOCKED (the runner does not fail), and once the name is declared
// again (incarnation 2) it is ORDERING_BROKEN and nothing fires into the
// new topic (LaneFiresOnlyIntoItsIncarnation, with the node's evidence
// reporting the destination's real incarnation).
func TestScheduleLaneOfADeletedAndRecreatedTopic(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	now := h.nowMs.Load()
	h.mustSchedule("t", "first", now)
	h.waitValues("t", "first") // the lane is pinned to incarnation 1 and READY
	h.mustSchedule("t", "later", now+60_000)
	if _, err := deleteTopic(t, h.node, "t", 0); err != nil {
		t.Fatal(err)
	}
	h.waitLane("t", "OPEN", "BLOCKED")
	h.declare("t", 1)
	l := h.waitLane("t", "ORDERING_BROKEN", "BLOCKED")
	if l.Incarnation != 1 {
		t.Fatalf("broken lane pinned to incarnation %d, want 1", l.Incarnation)
	}
	h.at(now + 120_000) // "later" is due
	h.stays("t")        // nothing in incarnation 2

	// The operator resumes: the lane pins incarnation 2, the held
	// schedule and a new one fire into it, each once.
	h.mustSchedule("t", "new", now+120_000)
	if _, err := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedLane, Topic: "t", LaneOp: wire.LaneResume}); err != nil {
		t.Fatal(err)
	}
	h.at(now + 121_000)
	h.waitValues("t", "later", "new")
	h.stays("t", "later", "new")
}

// A lane created after its topic was deleted and declared again pins the
// new incarnation: its schedules fire, the lane never breaks.
func TestScheduleIntoARecreatedTopicFires(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	if _, err := deleteTopic(t, h.node, "t", 0); err != nil {
		t.Fatal(err)
	}
	h.declare("t", 1)
	now := h.nowMs.Load()
	h.mustSchedule("t", "a", now)
	h.waitValues("t", "a")
	st, _ := h.schedAdminAll(wire.SchedAdmin{Op: wire.SchedStatus, Topic: "t"})
	for _, l := range st.Lanes {
		if l.Topic == "t" && (l.Gate != "OPEN" || l.Incarnation != 2) {
			t.Fatalf("lane %+v, want OPEN at incarnation 2", l)
		}
	}
}
