package sim

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

// An IntakeNeverBlocked probe is judged by its own send's answer: the
// refusal of an earlier send of the same schedule — sent before the node
// took office, still on its way — is no verdict on it (seed 11134 with
// --members --pub-batch --schedules 30 reported one as a violation), and a
// SCHEDULE_OK of another send ends it unjudged.
func TestIntakeProbeIsItsOwnSendsAnswer(t *testing.T) {
	w := newWorld(1, false)
	s := &sim{w: w, chk: newChecker(w, nil), net: &peerNet{}, nodes: make([]*broker, 3)}
	sc := &schedClient{s: s, total: 8}
	g := newSchedGhost(s, sc)
	g.quiet = true
	const i, n3 = 4, 2
	shard := sc.shardOf(i)
	refused := &wire.Err{Code: wire.CodeNotLeader, Message: "not the owner"}

	g.intakeSent(i, n3, 1) // n3 does not own the shard yet: no probe
	g.owner[shard] = schedOffice{node: n3 + 1, epoch: 1}
	g.intakeSent(i, n3, 2) // the probe
	g.intakeAnswered(i, 1, refused)
	if v := s.chk.violation; v != nil {
		t.Fatalf("the first send's refusal judged the second's probe: %v", v)
	}
	g.intakeAnswered(i, 2, refused)
	if v := s.chk.violation; v == nil || v.Invariant != "IntakeNeverBlocked" {
		t.Fatalf("the probe's own refusal: %v, want IntakeNeverBlocked", v)
	}

	s.chk.violation = nil
	g.intakeSent(i, n3, 3)
	g.intakeAnswered(i, 2, nil) // taken by the earlier send
	w.nowMs += 2 * schedIntakeMsMax
	g.checkIntake()
	if v := s.chk.violation; v != nil {
		t.Fatalf("a probe whose schedule another send placed: %v", v)
	}
}
