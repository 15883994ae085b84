package meta

import (
	"fmt"

	"github.com/nereus-broker/nereus/internal/wire"
)

// Topic updates. A topic's retention may change after its declare (its
// partitions, replicas and ack policy may not); every node then gives
// the new retention to the topic's partitions here (internal/node), which
// apply it at their next retention check.

// DecideTopicUpdate returns the entry carrying update u of topic name's
// current incarnation (or u.Incarnation when not 0), and the topic's
// configuration with it. changed is false when the topic already has
// those settings: nothing to propose. Internal topics are refused, as for
// a delete; a topic that does not exist is NOT_FOUND.
func (s *State) DecideTopicUpdate(u wire.TopicUpdate) (cmd Command, updated Topic, changed bool, err error) {
	if err := ValidateUpdatable(u); err != nil {
		return Command{}, Topic{}, false, err
	}
	t, ok := s.Topics[u.Topic]
	switch {
	case !ok:
		return Command{}, Topic{}, false, s.NotFound(u.Topic)
	case u.Incarnation != 0 && u.Incarnation != t.Incarnation:
		return Command{}, Topic{}, false, wire.Errorf(wire.CodeNotFound, "topic %q incarnation %d does not exist (the topic is at incarnation %d)", u.Topic, u.Incarnation, t.Incarnation)
	}
	updated = t
	updated.Config = u.Apply(t.Config)
	if updated.Config == t.Config {
		return Command{}, updated, false, nil
	}
	// The entry carries only what u sets (Set): two updates decided
	// against the same state, each of one setting, both take effect
	// (UpdateSetsOnlyItsSettings).
	return Command{Op: OpTopicUpdate, Topic: wire.TopicConfig{Name: u.Topic, RetentionMs: u.RetentionMs, RetentionBytes: u.RetentionBytes},
		Set: u.Set, Incarnation: t.Incarnation}, updated, true, nil
}

// ValidateUpdatable refuses an update no topic can take and the names a
// client may not update (internal topics, invalid names).
func ValidateUpdatable(u wire.TopicUpdate) error {
	if err := validateClientTopic(u.Topic, "updated"); err != nil {
		return err
	}
	return u.Validate()
}

// applyTopicUpdate applies a committed update to the incarnation it was
// decided against (UpdateNamesItsIncarnation: never to a later one of the
// name, however late it commits).
func (s *State) applyTopicUpdate(seq uint64, cmd Command) (Change, error) {
	u := wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: cmd.Topic.Name, Incarnation: cmd.Incarnation}, Set: cmd.Set,
		RetentionMs: cmd.Topic.RetentionMs, RetentionBytes: cmd.Topic.RetentionBytes}
	if err := ValidateUpdatable(u); err != nil {
		return Change{}, fmt.Errorf("meta: entry %d: %w", seq, err)
	}
	t, ok := s.Topics[u.Topic]
	if !ok || t.Incarnation != cmd.Incarnation {
		return Change{}, nil
	}
	t.Config = u.Apply(t.Config)
	s.Topics[u.Topic] = t
	return Change{Updated: &t}, nil
}
