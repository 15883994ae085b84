package meta

import (
	"fmt"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Group settings. A group's ack wait and max deliveries are fixed on
// each node by the PULL that first creates the group's runner there —
// per node, so two nodes could deliver one group's partitions with
// different settings. A group update (GROUP_UPDATE) records them in the
// metadata log instead: every node gives them to its runners of the
// group, and a runner started later (a new partition leader) starts with
// them (GroupSettingsOnEveryNode). They belong to one incarnation of the
// group: a delete drops them with it.

// OpGroupSettings sets a group incarnation's settings.
const OpGroupSettings = "group_settings"

// GroupSettings are the settings of one group incarnation. A zero field
// is the node's default (a group update gave only the other).
type GroupSettings struct {
	Group       string `json:"group"`
	Incarnation uint64 `json:"incarnation"`
	AckWaitMs   uint32 `json:"ack_wait_ms,omitempty"`
	MaxDeliver  uint32 `json:"max_deliver,omitempty"`
}

// apply returns s with what u sets.
func (s GroupSettings) apply(u wire.GroupUpdate) GroupSettings {
	if u.Set&wire.SetAckWaitMs != 0 {
		s.AckWaitMs = u.AckWaitMs
	}
	if u.Set&wire.SetMaxDeliver != 0 {
		s.MaxDeliver = u.MaxDeliver
	}
	return s
}

// SettingsOf returns the settings group name's current incarnation has
// in the metadata, ok false when no group update set any (a group's
// delete drops them: SettingsBelongToTheirIncarnation).
func (s *State) SettingsOf(name string) (GroupSettings, bool) {
	st, ok := s.GroupSettings[name]
	if !ok {
		return GroupSettings{Group: name, Incarnation: s.GroupIncarnation(name)}, false
	}
	return st, true
}

// DecideGroupUpdate returns the entry carrying update u of group u.Group
// (its current incarnation; u.Incarnation, when not 0, must be it), and
// the group's settings with it. changed is false when the group already
// has them: nothing to propose. A group the metadata does not know may be
// updated: a group consumed without membership has no other record here.
func (s *State) DecideGroupUpdate(u wire.GroupUpdate) (cmd Command, updated GroupSettings, changed bool, err error) {
	if err := ValidateGroupUpdate(u); err != nil {
		return Command{}, GroupSettings{}, false, err
	}
	cur, _ := s.SettingsOf(u.Group)
	if u.Incarnation != 0 && u.Incarnation != cur.Incarnation {
		return Command{}, GroupSettings{}, false, wire.Errorf(wire.CodeNotFound, "group %s incarnation %d does not exist (the group is at incarnation %d)",
			u.Group, u.Incarnation, cur.Incarnation)
	}
	updated = cur.apply(u)
	if updated == cur {
		return Command{}, updated, false, nil
	}
	// The entry carries only what u sets: two updates decided against
	// the same state, each of one setting, both take effect.
	return Command{Op: OpGroupSettings, GroupUpdate: &wire.GroupUpdate{GroupRef: wire.GroupRef{Group: u.Group, Incarnation: cur.Incarnation},
		Set: u.Set, AckWaitMs: u.AckWaitMs, MaxDeliver: u.MaxDeliver}}, updated, true, nil
}

// ValidateGroupUpdate refuses an update no group can take.
func ValidateGroupUpdate(u wire.GroupUpdate) error {
	if err := wire.ValidateName("group", u.Group); err != nil {
		return err
	}
	return u.Validate()
}

// applyGroupSettings applies a committed group update to the incarnation
// it was decided against (never to a later one of the name).
func (s *State) applyGroupSettings(seq uint64, cmd Command) (Change, error) {
	if cmd.GroupUpdate == nil {
		return Change{}, fmt.Errorf("meta: entry %d: %s without its update", seq, cmd.Op)
	}
	u := *cmd.GroupUpdate
	if err := ValidateGroupUpdate(u); err != nil {
		return Change{}, fmt.Errorf("meta: entry %d: %w", seq, err)
	}
	cur, _ := s.SettingsOf(u.Group)
	if u.Incarnation != cur.Incarnation {
		return Change{}, nil // decided against an incarnation deleted since
	}
	st := cur.apply(u)
	if s.GroupSettings == nil {
		s.GroupSettings = map[string]GroupSettings{}
	}
	s.GroupSettings[u.Group] = st
	return Change{GroupSettings: &st}, nil
}
