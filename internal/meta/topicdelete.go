package meta

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Topic deletion. A delete removes one incarnation of a topic name from
// the metadata; every node then stops the topic's partitions and removes
// their data (internal/node). The name remembers its last incarnation
// (State.Deleted), so a declare of it again is a new, empty topic with the
// next incarnation.

// DecideTopicDelete returns the entry deleting the current incarnation of
// topic name, or incarnation when it is not 0 (a client that deletes what
// it described). Internal topics (names starting with `__`: the metadata
// log, the schedule shards, KV buckets' logs) are refused
// (TopicDeleteRefusesInternal); a topic that does not exist — never
// declared, already deleted, or at another incarnation — is NOT_FOUND, so
// deleting twice is never a second change.
func (s *State) DecideTopicDelete(name string, incarnation uint64) (Command, error) {
	if err := ValidateDeletable(name); err != nil {
		return Command{}, err
	}
	t, ok := s.Topics[name]
	switch {
	case !ok:
		return Command{}, s.NotFound(name)
	case incarnation != 0 && incarnation != t.Incarnation:
		return Command{}, wire.Errorf(wire.CodeNotFound, "topic %q incarnation %d does not exist (the topic is at incarnation %d)", name, incarnation, t.Incarnation)
	}
	return Command{Op: OpTopicDelete, Topic: wire.TopicConfig{Name: name}, Incarnation: t.Incarnation}, nil
}

// ValidateDeletable refuses the names a client may not delete: internal
// topics (TopicDeleteRefusesInternal) and invalid names.
func ValidateDeletable(name string) error { return validateClientTopic(name, "deleted") }

// validateClientTopic refuses internal topics and invalid names for a
// change a client asks of a topic (what: "deleted", "updated").
func validateClientTopic(name, what string) error {
	if strings.HasPrefix(name, wire.ReservedPrefix) {
		return wire.Errorf(wire.CodeInvalidArgument, "topic %q is internal to Nereus and cannot be %s", name, what)
	}
	return wire.ValidateName("topic", name)
}

// NotFound is the NOT_FOUND answer for a topic name that is not declared
// now: "deleted" when the name was deleted and not declared again.
func (s *State) NotFound(name string) error {
	if inc := s.Deleted[name]; inc != 0 {
		return wire.Errorf(wire.CodeNotFound, "topic %q was deleted (incarnation %d)", name, inc)
	}
	return wire.Errorf(wire.CodeNotFound, "topic %q does not exist", name)
}

// applyTopicDelete applies a committed delete: it removes the topic only
// when the entry names its current incarnation
// (TopicDeleteNamesItsIncarnation: a delete decided against incarnation i
// never removes a later one, however late it commits), records the
// incarnation as the name's last, and takes the topic's partitions from
// every group (GroupsOwnNoDeletedPartition).
func (s *State) applyTopicDelete(seq uint64, cmd Command) (Change, error) {
	name := cmd.Topic.Name
	if err := ValidateDeletable(name); err != nil {
		return Change{}, fmt.Errorf("meta: entry %d: %w", seq, err)
	}
	t, ok := s.Topics[name]
	if !ok || t.Incarnation != cmd.Incarnation {
		return Change{}, nil
	}
	delete(s.Topics, name)
	if s.Deleted == nil {
		s.Deleted = map[string]uint64{}
	}
	s.Deleted[name] = t.Incarnation
	s.RemoveTopicFromGroups(name)
	return Change{Deleted: &t}, nil
}

// RemoveTopicFromGroups takes a deleted topic's partitions from every
// group — owners, targets and pending notices — and rebalances what is
// left. A single node, whose topics are not in a metadata log, calls it
// itself after a delete.
func (s *State) RemoveTopicFromGroups(name string) {
	for _, g := range s.Groups {
		g.DropTopic(name)
	}
	s.rebalanceGroups()
}

// Incarnation reports the current incarnation of topic name (0: not
// declared) and the last deleted one (0: never deleted).
func (s *State) Incarnation(name string) (current, deleted uint64) {
	if t, ok := s.Topics[name]; ok {
		current = t.Incarnation
	}
	return current, s.Deleted[name]
}

// keySeparator joins a topic name and its incarnation in a TopicKey; no
// topic name contains it.
const keySeparator = "@"

// TopicKey names one incarnation of a topic where incarnations must not
// meet: its data directories and its replica groups on the peer
// transport. Incarnation 1 is the bare name (the directories and groups
// of before incarnations); a later one is name@incarnation, so a late
// REPLICATE of a deleted incarnation never reaches the new one's group
// and a new incarnation never opens an old one's files.
func TopicKey(name string, incarnation uint64) string {
	if incarnation <= 1 {
		return name
	}
	return name + keySeparator + strconv.FormatUint(incarnation, 10)
}

// ParseTopicKey splits a TopicKey; ok is false for a string no TopicKey
// call returns.
func ParseTopicKey(key string) (name string, incarnation uint64, ok bool) {
	name, inc, cut := strings.Cut(key, keySeparator)
	if !cut {
		return key, 1, key != ""
	}
	n, err := strconv.ParseUint(inc, 10, 64)
	if err != nil || n < 2 || name == "" || strconv.FormatUint(n, 10) != inc {
		return "", 0, false
	}
	return name, n, true
}

// DeletedKey reports whether key names an incarnation of a topic that was
// deleted — whose leftover data may be removed (a node that crashed while
// removing it finishes at its next start).
func (s *State) DeletedKey(key string) bool {
	name, inc, ok := ParseTopicKey(key)
	return ok && inc <= s.Deleted[name]
}
