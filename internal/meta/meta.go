// Package meta is the metadata state machine of a cluster: the topics and
// the placement of their partitions, applied in order from the committed
// entries of the single-writer `__meta` log. It is a kernel (DESIGN §3):
// no I/O, no clock, no goroutines. The metadata leader decides a DECLARE
// against its state (Decide), proposes the resulting Command, and every
// node applies the committed commands in log order (Apply), so all nodes
// reach the same topics and placement.
package meta

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

// MetaTopic names the metadata log's replica group on the peer transport.
const MetaTopic = "__meta"

// MembersMax bounds the metadata group: the first five members of the
// initial cluster hold it.
const MembersMax = 5

// The metadata log's operations.
const (
	OpDeclare     = "declare"
	OpGroup       = "group"        // a consumer-group command (JOIN, LEAVE, fence, CONTROL_ACK)
	OpGroupDelete = "group_delete" // remove a group without members
	OpTopicDelete = "topic_delete" // delete one incarnation of a topic
	OpTopicUpdate = "topic_update" // change the retention of one incarnation of a topic
	// OpGroupSettings (groupsettings.go) sets a group's ack wait and max deliveries.
)

// Command is one entry of the metadata log.
type Command struct {
	Op    string           `json:"op"`
	Topic wire.TopicConfig `json:"topic"`
	// Placement lists, per partition, the replica group's node numbers
	// (1-based positions in the sorted initial cluster).
	Placement [][]uint32 `json:"placement"`
	// Group is the command of OpGroup; OpGroupDelete names its group in
	// Group.Group.
	Group *group.Command `json:"group,omitempty"`
	// Incarnation is, for OpTopicDelete, the incarnation of Topic.Name the
	// delete was decided against (TopicDeleteNamesItsIncarnation), and for
	// OpGroupDelete the group's (GroupDeleteNamesItsIncarnation; 0 in
	// entries of before forced deletes). A declare's incarnation is not
	// carried: Apply numbers it.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Set is, for OpTopicUpdate, which of Topic's settings it changes
	// (wire.SetRetentionMs, wire.SetRetentionBytes); it names its
	// incarnation in Incarnation.
	Set uint8 `json:"set,omitempty"`
	// GroupUpdate is the update of OpGroupSettings, naming the group
	// incarnation it was decided against.
	GroupUpdate *wire.GroupUpdate `json:"group_update,omitempty"`
}

// Topic is a declared topic and where its partitions live.
type Topic struct {
	Config    wire.TopicConfig `json:"config"`
	Placement [][]uint32       `json:"placement"`
	// Incarnation numbers the lives of a topic name: 1 for its first
	// declare, the last deleted incarnation + 1 for a declare after a
	// delete (IncarnationNeverReused). A topic saved before incarnations
	// existed reads as 1.
	Incarnation uint64 `json:"incarnation"`
}

// UnmarshalJSON reads a topic, one saved before incarnations as
// incarnation 1.
func (t *Topic) UnmarshalJSON(b []byte) error {
	type plain Topic
	if err := json.Unmarshal(b, (*plain)(t)); err != nil {
		return err
	}
	if t.Incarnation == 0 {
		t.Incarnation = 1
	}
	return nil
}

// Change is what applying one entry did: the topic a declare created,
// the topic incarnation a delete removed (nil: neither), or the group
// incarnation a group delete removed ("": none).
type Change struct {
	Created *Topic
	Deleted *Topic
	Updated *Topic // the topic with its new settings
	// GroupDeleted names the group a group delete removed, and
	// GroupIncarnation the incarnation it removed (GroupKey).
	GroupDeleted     string
	GroupIncarnation uint64
	// GroupSettings are a group's settings after a group update.
	GroupSettings *GroupSettings
}

// State is the applied metadata. The zero value is not usable; use New.
type State struct {
	Applied uint64           `json:"applied"` // last applied log seq
	Topics  map[string]Topic `json:"topics"`
	// Deleted remembers, per deleted topic name, the last incarnation
	// deleted, so that a declare of the name again numbers the next one
	// (IncarnationNeverReused). A name declared again keeps its entry.
	Deleted map[string]uint64 `json:"deleted,omitempty"`
	// Groups are the consumer groups with assignment (internal/group).
	Groups map[string]*group.State `json:"groups,omitempty"`
	// GroupsDeleted remembers, per deleted group name, the last
	// incarnation deleted: the group's records and directories are named
	// by GroupKey, so a group of the name again starts with no acks
	// (GroupIncarnationStartsEmpty).
	GroupsDeleted map[string]uint64 `json:"groups_deleted,omitempty"`
	// GroupSettings are the settings group updates gave, by group name
	// (SettingsOf: only those of the name's current incarnation count).
	GroupSettings map[string]GroupSettings `json:"group_settings,omitempty"`
	// GroupMutations break the group kernel on purpose (simulator
	// mutation tests only; never persisted).
	GroupMutations group.Mutations `json:"-"`
}

// New returns an empty state.
func New() *State { return &State{Topics: map[string]Topic{}, Groups: map[string]*group.State{}} }

// Normalize fills a DECLARE's defaults for a cluster of nodes members and
// validates replication: Replicas 0 means 3 (1 when the cluster has fewer
// than three nodes); it must be 1, 3 or 5 and at most the cluster size.
func Normalize(tc wire.TopicConfig, nodes int) (wire.TopicConfig, error) {
	if tc.Replicas == 0 {
		tc.Replicas = 3
		if nodes < 3 {
			tc.Replicas = 1
		}
	}
	switch tc.Replicas {
	case 1, 3, 5:
	default:
		return tc, wire.Errorf(wire.CodeInvalidArgument, "replicas must be 1, 3 or 5, got %d", tc.Replicas)
	}
	if int(tc.Replicas) > nodes {
		return tc, wire.Errorf(wire.CodeInvalidArgument, "replicas %d exceeds the %d node(s) of the cluster", tc.Replicas, nodes)
	}
	if tc.Ack > wire.AckAll {
		return tc, wire.Errorf(wire.CodeInvalidArgument, "unknown ack policy %d", tc.Ack)
	}
	return tc, nil
}

// Decide answers a normalized DECLARE on the metadata leader: exists when
// an identical topic is already applied (nothing to propose), an error
// when a different one is, else the command to propose.
func (s *State) Decide(tc wire.TopicConfig, nodes int) (cmd Command, exists bool, err error) {
	if err := wire.ValidateTopicOrInternal(tc.Name); err != nil {
		return Command{}, false, err // `__meta` would share the metadata log's replica group
	}
	if t, ok := s.Topics[tc.Name]; ok {
		if t.Config != tc {
			return Command{}, false, conflict(t.Config)
		}
		return Command{}, true, nil
	}
	return Command{Op: OpDeclare, Topic: tc, Placement: s.place(tc, nodes)}, false, nil
}

func conflict(c wire.TopicConfig) error {
	return wire.Errorf(wire.CodeTopicConflict, "topic %q exists with partitions=%d replicas=%d ack=%s retention_ms=%d retention_bytes=%d",
		c.Name, c.Partitions, c.Replicas, c.Ack, c.RetentionMs, c.RetentionBytes)
}

// place puts partition p's replicas on R consecutive nodes starting at
// node (base+p) mod N, base counting the partitions of earlier topics. The
// first replica — the partition's preferred leader, the member that
// campaigns first — thus rotates over the nodes, and the replicas with
// it, even when R = N (stepping by R per partition would put every
// partition's first replica on one node then).
func (s *State) place(tc wire.TopicConfig, nodes int) [][]uint32 {
	base := 0
	for _, t := range s.Topics {
		base += len(t.Placement)
	}
	out := make([][]uint32, tc.Partitions)
	for p := range out {
		for i := range int(tc.Replicas) {
			out[p] = append(out[p], uint32((base+p+i)%nodes)+1)
		}
	}
	return out
}

// Apply applies the committed entry at seq. Entries are applied once, in
// order; a DECLARE of an existing topic changes nothing (two nodes may
// race to declare it: the first committed wins), nor does a delete of an
// incarnation that is not the topic's current one. It returns the topic
// a declare created or a delete removed, if any.
func (s *State) Apply(seq uint64, data []byte) (Change, error) {
	if seq <= s.Applied {
		return Change{}, fmt.Errorf("meta: entry %d applied twice (applied %d)", seq, s.Applied)
	}
	s.Applied = seq
	var cmd Command
	if err := json.Unmarshal(data, &cmd); err != nil {
		return Change{}, fmt.Errorf("meta: entry %d: %w", seq, err)
	}
	if s.Groups == nil {
		s.Groups = map[string]*group.State{} // a state saved before groups
	}
	switch cmd.Op {
	case OpDeclare:
	case OpTopicDelete:
		return s.applyTopicDelete(seq, cmd)
	case OpTopicUpdate:
		return s.applyTopicUpdate(seq, cmd)
	case OpGroupSettings:
		return s.applyGroupSettings(seq, cmd)
	case OpGroup, OpGroupDelete:
		if cmd.Group == nil {
			return Change{}, fmt.Errorf("meta: entry %d: %s without a group command", seq, cmd.Op)
		}
		return s.applyGroup(seq, cmd.Op, *cmd.Group, cmd.Incarnation)
	default:
		return Change{}, fmt.Errorf("meta: entry %d: unknown op %q", seq, cmd.Op)
	}
	if err := wire.ValidateTopicOrInternal(cmd.Topic.Name); err != nil {
		return Change{}, fmt.Errorf("meta: entry %d: %w", seq, err) // decided before names were checked
	}
	if _, ok := s.Topics[cmd.Topic.Name]; ok {
		return Change{}, nil
	}
	if len(cmd.Placement) != int(cmd.Topic.Partitions) {
		return Change{}, fmt.Errorf("meta: entry %d: %d placements for %d partitions", seq, len(cmd.Placement), cmd.Topic.Partitions)
	}
	t := Topic{Config: cmd.Topic, Placement: cmd.Placement, Incarnation: s.NextIncarnation(cmd.Topic.Name)}
	s.AddTopic(t)
	return Change{Created: &t}, nil
}

// NextIncarnation is the incarnation a declare of name gets now: one
// more than the last deleted incarnation of the name, 1 for a name never
// deleted (IncarnationNeverReused: data, dedup state and schedules of a
// deleted incarnation can never be taken for the new one's).
func (s *State) NextIncarnation(name string) uint64 {
	return s.Deleted[name] + 1
}

// AddTopic records a declared topic and gives its partitions to the
// groups' members waiting for it. Apply calls it for a committed declare;
// a single node, whose topics are not in a metadata log, calls it itself
// (an Incarnation of 0 is numbered by NextIncarnation).
func (s *State) AddTopic(t Topic) {
	if t.Incarnation == 0 {
		t.Incarnation = s.NextIncarnation(t.Config.Name)
	}
	s.Topics[t.Config.Name] = t
	s.rebalanceGroups()
}

func (s *State) rebalanceGroups() {
	for _, name := range slices.Sorted(maps.Keys(s.Groups)) {
		s.Groups[name].Rebalance(s.partitions, s.GroupMutations)
	}
}

// partitions is the group kernel's view of the declared topics.
func (s *State) partitions(topic string) int {
	return int(s.Topics[topic].Config.Partitions)
}

// Sorted returns the topics by name.
func (s *State) Sorted() []Topic {
	out := make([]Topic, 0, len(s.Topics))
	for _, t := range s.Topics {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Topic) int {
		switch {
		case a.Config.Name < b.Config.Name:
			return -1
		case a.Config.Name > b.Config.Name:
			return 1
		}
		return 0
	})
	return out
}

// Hosts reports whether node holds a replica of the partition.
func (t *Topic) Hosts(partition int, node uint32) bool {
	return slices.Contains(t.Placement[partition], node)
}
