package meta

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Bounds and defaults of a JOIN.
const (
	SessionTimeoutMsDefault   = 10_000
	RebalanceTimeoutMsDefault = 30_000
	TimeoutMsMin              = 1_000
	TimeoutMsMax              = 600_000
	MemberIDBytesMax          = 200
	JoinTopicsMax             = 64
)

// DecideGroup validates a group command on the metadata leader, fills a
// JOIN's defaults, and returns the entry to propose. A JOIN in a mode
// other than the group's, and a delete of a group with members, are
// refused; so are names the topic rules refuse.
func (s *State) DecideGroup(c group.Command) (Command, error) {
	if err := wire.ValidateName("group", c.Group); err != nil {
		return Command{}, err
	}
	g := s.Groups[c.Group]
	switch c.Op {
	case group.OpJoin:
		if c.Member == "" || len(c.Member) > MemberIDBytesMax {
			return Command{}, wire.Errorf(wire.CodeInvalidArgument, "member id must be 1-%d bytes", MemberIDBytesMax)
		}
		if len(c.Topics) == 0 || len(c.Topics) > JoinTopicsMax {
			return Command{}, wire.Errorf(wire.CodeInvalidArgument, "a member subscribes to 1-%d topics, got %d", JoinTopicsMax, len(c.Topics))
		}
		for _, t := range c.Topics {
			if err := wire.ValidateName("topic", t); err != nil {
				return Command{}, err
			}
		}
		if c.JoinID == 0 {
			return Command{}, wire.Errorf(wire.CodeInvalidArgument, "join id 0 is reserved")
		}
		if c.Mode > group.Shared {
			return Command{}, wire.Errorf(wire.CodeInvalidArgument, "unknown group mode %d", c.Mode)
		}
		if g != nil && g.Mode != c.Mode && len(g.Members) > 0 {
			return Command{}, wire.Errorf(wire.CodeInvalidArgument, "group %s is %s, not %s", c.Group, g.Mode, c.Mode)
		}
		var err error
		if c.SessionTimeoutMs, err = timeout("session", c.SessionTimeoutMs, SessionTimeoutMsDefault); err != nil {
			return Command{}, err
		}
		if c.RebalanceTimeoutMs, err = timeout("rebalance", c.RebalanceTimeoutMs, RebalanceTimeoutMsDefault); err != nil {
			return Command{}, err
		}
		return Command{Op: OpGroup, Group: &c}, nil
	case group.OpLeave, group.OpFence, group.OpControlAck:
		if g == nil {
			return Command{}, wire.Errorf(wire.CodeNotFound, "group %s does not exist", c.Group)
		}
		return Command{Op: OpGroup, Group: &c}, nil
	}
	return Command{}, wire.Errorf(wire.CodeInvalidArgument, "unknown group operation %q", c.Op)
}

// DecideGroupDelete returns the entry deleting group name's current
// incarnation, refused while the group has members. A name the metadata
// does not know — a group consumed only by consumers without a
// membership, which exists as its records in the partitions — is
// deleted only with force: the coordinator cannot tell it from a typo.
//
// incarnation, when not 0, is the one the caller means to delete (it
// learnt it first, and sends it again on every retry of one call):
// one already deleted is ErrGroupAlreadyDeleted — answered OK, nothing
// proposed — so a retry of a delete that was applied never deletes the
// incarnation that followed (GroupDeleteRetryDeletesOnce); one above the
// current is NOT_FOUND. 0 (a client of before incarnations) deletes
// whichever incarnation is current, as such a client always did.
func (s *State) DecideGroupDelete(name string, force bool, incarnation uint64) (Command, error) {
	inc := s.GroupIncarnation(name)
	switch {
	case incarnation > inc:
		return Command{}, wire.Errorf(wire.CodeNotFound, "group %s incarnation %d does not exist (the group is at incarnation %d)", name, incarnation, inc)
	case incarnation != 0 && incarnation < inc && !s.GroupMutations.DeleteRetryIgnoresIncarnation:
		// GroupDeleteRetryDeletesOnce: a retry of a delete that applied.
		return Command{}, fmt.Errorf("group %s incarnation %d (now at %d): %w", name, incarnation, inc, ErrGroupAlreadyDeleted)
	}
	g := s.Groups[name]
	if g == nil && !force {
		return Command{}, wire.Errorf(wire.CodeNotFound, "group %s is not known to the coordinator (no member ever joined it); a group consumed only without membership is deleted with force", name)
	}
	if g != nil && len(g.Members) > 0 {
		return Command{}, wire.Errorf(wire.CodeInvalidArgument, "group %s has %d member(s); they must leave first", name, len(g.Members))
	}
	return Command{Op: OpGroupDelete, Group: &group.Command{Group: name}, Incarnation: inc}, nil
}

// ErrGroupAlreadyDeleted is DecideGroupDelete's answer to a delete naming
// an incarnation deleted before: there is nothing to propose, and the
// caller answers the delete as done (GroupDeleteRetryDeletesOnce).
var ErrGroupAlreadyDeleted = errors.New("group incarnation already deleted")

func timeout(what string, ms, def int64) (int64, error) {
	if ms == 0 {
		return def, nil
	}
	if ms < TimeoutMsMin || ms > TimeoutMsMax {
		return 0, wire.Errorf(wire.CodeInvalidArgument, "%s timeout %d ms: want %d-%d", what, ms, TimeoutMsMin, TimeoutMsMax)
	}
	return ms, nil
}

// applyGroup applies a committed group entry. Entries decided against an
// older state may no longer fit (a group deleted in between, a mode
// changed): they change nothing.
func (s *State) applyGroup(seq uint64, op string, c group.Command, incarnation uint64) (Change, error) {
	if err := wire.ValidateName("group", c.Group); err != nil {
		return Change{}, fmt.Errorf("meta: entry %d: %w", seq, err)
	}
	g := s.Groups[c.Group]
	if op == OpGroupDelete {
		inc := s.GroupIncarnation(c.Group)
		switch {
		case g != nil && len(g.Members) > 0:
			return Change{}, nil // joined since it was decided
		case incarnation != 0 && incarnation != inc && !s.GroupMutations.DeleteIgnoresIncarnation:
			return Change{}, nil // decided against an incarnation deleted since (GroupDeleteNamesItsIncarnation)
		case g == nil && incarnation == 0:
			return Change{}, nil // an entry of before forced deletes deletes only a group the metadata knows
		}
		delete(s.Groups, c.Group)
		delete(s.GroupSettings, c.Group) // SettingsBelongToTheirIncarnation: the next starts with the defaults
		if s.GroupsDeleted == nil {
			s.GroupsDeleted = map[string]uint64{}
		}
		s.GroupsDeleted[c.Group] = inc
		return Change{GroupDeleted: c.Group, GroupIncarnation: inc}, nil
	}
	if g == nil {
		if c.Op != group.OpJoin {
			return Change{}, nil
		}
		g = group.NewState(c.Group, c.Mode)
		s.Groups[c.Group] = g
	}
	if c.Op == group.OpJoin && g.Mode != c.Mode {
		if len(g.Members) > 0 {
			return Change{}, nil // a raced JOIN in another mode: the first committed wins
		}
		g.Mode = c.Mode
	}
	if _, err := g.Apply(seq, c, s.partitions, s.GroupMutations); err != nil {
		return Change{}, fmt.Errorf("meta: entry %d: %w", seq, err)
	}
	return Change{}, nil
}

// Group incarnations. A group name lives again after a delete: the
// incarnation after the last one deleted (State.GroupsDeleted). Every
// node names a group's acks, checkpoints and directories by GroupKey,
// so an incarnation never reads another's records
// (GroupIncarnationStartsEmpty), and the records of a deleted one bound
// no partition's compaction (DeletedGroupPinsNothing).

// GroupIncarnation is the current incarnation of group name: 1 until the
// name is first deleted.
func (s *State) GroupIncarnation(name string) uint64 { return s.GroupsDeleted[name] + 1 }

// GroupKey names the current incarnation of group name (GroupKeyOf).
func (s *State) GroupKey(name string) string { return GroupKeyOf(name, s.GroupIncarnation(name)) }

// GroupKeyOf names one incarnation of a group in its records and
// directories: the bare name for incarnation 1 (the records of before
// incarnations), name@incarnation after, as TopicKey.
func GroupKeyOf(name string, incarnation uint64) string { return TopicKey(name, incarnation) }

// DeletedGroup reports whether key names a group incarnation the state
// says is deleted (as DeletedKey for topics).
func (s *State) DeletedGroup(key string) bool { return DeletedGroupKey(key, s.GroupsDeleted) }

// DeletedGroupKey reports whether key names a group incarnation that
// deleted (name → the last incarnation deleted) says is deleted.
func DeletedGroupKey(key string, deleted map[string]uint64) bool {
	name, inc, ok := ParseTopicKey(key)
	return ok && inc <= deleted[name]
}

// SortedGroups returns the groups by name.
func (s *State) SortedGroups() []*group.State {
	out := make([]*group.State, 0, len(s.Groups))
	for _, g := range s.Groups {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *group.State) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Clone returns a deep copy.
func (s *State) Clone() *State {
	c := &State{Applied: s.Applied, Topics: make(map[string]Topic, len(s.Topics)), Groups: make(map[string]*group.State, len(s.Groups)),
		GroupMutations: s.GroupMutations, Deleted: maps.Clone(s.Deleted), GroupsDeleted: maps.Clone(s.GroupsDeleted),
		GroupSettings: maps.Clone(s.GroupSettings)}
	for name, t := range s.Topics {
		t.Placement = slices.Clone(t.Placement)
		c.Topics[name] = t
	}
	for name, g := range s.Groups {
		c.Groups[name] = g.Clone()
	}
	return c
}
