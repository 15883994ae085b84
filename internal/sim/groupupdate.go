package sim

import (
	"fmt"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Group updates (ClusterOptions.GroupUpdates, `--group-updates N`): at
// random moments of the fault phase the operator sets the consumers'
// group's ack wait — half, twice or four times the one its consumers
// ask —
// with a group update that keeps their max deliveries, asked at every
// node that is up every groupUpdateTryMs until one (the coordinator)
// answers it. The consumers go on asking their own ack wait in every
// PULL: the group's holds. Every invariant holds across the changes (a
// shorter ack wait redelivers more, nothing acknowledged is lost), and
// at the end every runner of the group on every node — those running
// when an update applied, those a new leader, a crash or a power loss
// started since — holds the last answered settings
// (GroupSettingsOnEveryNode).

const (
	groupUpdateTryMs    = 50
	groupUpdateGapMinMs = 200
	groupUpdateGapMaxMs = 1_500
)

type groupUpdater struct {
	s    *sim
	left int // updates still to start
	// want is the update being asked (nil: none); last the settings of
	// the last one answered; answered counts those.
	want     *wire.GroupUpdate
	last     *wire.GroupUpdate
	answered int
	// checked counts the runners the final check compared.
	checked int
}

func newGroupUpdater(s *sim, updates int) *groupUpdater {
	u := &groupUpdater{s: s, left: updates}
	s.w.after(s.w.between(groupUpdateGapMinMs, groupUpdateGapMaxMs), u.start)
	return u
}

// start picks the next ack wait and asks for it; none once healed.
func (u *groupUpdater) start() {
	s := u.s
	if s.healed || u.left == 0 {
		return
	}
	u.left--
	maxDeliver := u.maxDeliver()
	ackWait := []int64{s.opts.AckWaitMs / 2, 2 * s.opts.AckWaitMs, 4 * s.opts.AckWaitMs}[s.w.rng.IntN(3)]
	u.want = &wire.GroupUpdate{GroupRef: wire.GroupRef{Group: simGroup}, Set: wire.SetAckWaitMs | wire.SetMaxDeliver,
		AckWaitMs: uint32(ackWait), MaxDeliver: maxDeliver}
	s.w.tracef("group update: ack wait %d ms asked", ackWait)
	u.try()
}

// try asks every node that is up for the update wanted, again every
// groupUpdateTryMs until one answered it (after the heal too).
func (u *groupUpdater) try() {
	s, w := u.s, u.want
	if w == nil {
		return
	}
	for _, b := range s.nodes {
		if b.up {
			b.node.UpdateGroup(*w, func(ok wire.GroupUpdateOK, err error) {
				if err != nil || u.want != w {
					return
				}
				if ok.AckWaitMs != w.AckWaitMs || ok.MaxDeliver != w.MaxDeliver {
					s.chk.violate(GroupSettingsOnEveryNode, "%s answered the group update %d ms, %d with %d ms, %d",
						b.id, w.AckWaitMs, w.MaxDeliver, ok.AckWaitMs, ok.MaxDeliver)
					return
				}
				u.want, u.last = nil, w
				u.answered++
				s.w.tracef("group update: ack wait %d ms answered by %s", w.AckWaitMs, b.id)
				s.w.after(s.w.between(groupUpdateGapMinMs, groupUpdateGapMaxMs), u.start)
			})
		}
	}
	s.w.after(groupUpdateTryMs, u.try)
}

// final waits, after the final power loss, for the update in flight to
// be answered and for every runner of the group on every node to hold
// the last answered settings. It first subscribes at every node as a
// consumer asking the consumers' settings, so that each node runs the
// group — a runner that starts only now, after the power loss, must
// take the update from the metadata (a members run refuses a consumer
// without membership: there the consumers' runners are checked alone).
func (u *groupUpdater) final(deadline int64) {
	s := u.s
	for _, b := range s.nodes {
		if !b.up {
			continue
		}
		sub, err := b.node.Subscribe(simTopic, simGroup, node.GroupOptions{AckWaitMs: s.opts.AckWaitMs, MaxDeliver: u.maxDeliver()}, nopSink{})
		if err != nil {
			s.w.tracef("group update: a subscription at %s for the check refused: %v", b.id, err)
			continue
		}
		sub.Close()
	}
	for s.chk.violation == nil {
		if u.want == nil && u.everyRunnerHolds() {
			return
		}
		if s.w.nowMs > deadline || !s.step() {
			s.chk.violate(GroupSettingsOnEveryNode, "not every runner of group %s holds its last update (%+v; an update in flight: %v): %s",
				simGroup, u.last, u.want != nil, fmt.Sprint(u.runners()))
			return
		}
	}
}

// everyRunnerHolds reports whether every node is up and every runner of
// the group there holds the last answered settings (true with none
// answered); it counts the runners it compared.
func (u *groupUpdater) everyRunnerHolds() bool {
	u.checked = 0
	for _, b := range u.s.nodes {
		if !b.up {
			return false
		}
		for _, st := range b.node.GroupSettings() {
			if st.Group != simGroup {
				continue
			}
			if u.last != nil && (st.AckWaitMs != int64(u.last.AckWaitMs) || st.MaxDeliver != u.last.MaxDeliver) {
				return false
			}
			u.checked++
		}
	}
	return true
}

// runners lists the group's runners and their settings, by node.
func (u *groupUpdater) runners() map[string][]node.GroupSettingsInfo {
	out := map[string][]node.GroupSettingsInfo{}
	for _, b := range u.s.nodes {
		if b.up {
			out[b.id] = b.node.GroupSettings()
		}
	}
	return out
}

// maxDeliver is the consumers' max deliveries.
func (u *groupUpdater) maxDeliver() uint32 { return consumersMaxDeliver(u.s.opts) }

// nopSink is a subscription sink that drops what it is sent (the
// check's subscriptions have no credit).
type nopSink struct{}

func (nopSink) SendMsg(*wire.Msg) {}
func (nopSink) End(*wire.Error)   {}
