package meta

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

// fuzzEntriesMax bounds the entries one input applies.
const fuzzEntriesMax = 16

// FuzzApply applies each line of the input as a committed metadata entry,
// on two states, after a prefix that declares a topic and lets a member
// join a group. Whatever the entries hold, Apply answers an error or
// changes the state; it never panics; every group keeps its own
// invariants (group.State.Check) after each entry applied; and two nodes
// applying the same entries reach the same state (every node's metadata
// is the same function of the log: map order must not leak into it).
func FuzzApply(f *testing.F) {
	seed := func(cmds ...Command) []byte {
		var b []byte
		for _, c := range cmds {
			line, err := json.Marshal(c)
			if err != nil {
				f.Fatal(err)
			}
			b = append(append(b, line...), '\n')
		}
		return b
	}
	join := func(member string, join uint64, topics ...string) Command {
		return Command{Op: OpGroup, Group: &group.Command{Op: group.OpJoin, Group: "g", Member: member, Topics: topics,
			JoinID: join, SessionTimeoutMs: SessionTimeoutMsDefault, RebalanceTimeoutMs: RebalanceTimeoutMsDefault}}
	}
	declare := Command{Op: OpDeclare, Topic: wire.TopicConfig{Name: "u", Partitions: 2, Replicas: 1}, Placement: [][]uint32{{1}, {2}}}
	f.Add(seed(join("m2", 7, "t", "u"), declare, Command{Op: OpGroup, Group: &group.Command{Op: group.OpControlAck, Group: "g", Member: "m1", Notice: 2}}))
	f.Add(seed(Command{Op: OpGroup, Group: &group.Command{Op: group.OpLeave, Group: "g", Member: "m1"}},
		Command{Op: OpGroupDelete, Group: &group.Command{Group: "g"}, Incarnation: 1}, join("m1", 9, "t")))
	f.Add(seed(Command{Op: OpTopicDelete, Topic: wire.TopicConfig{Name: "t"}, Incarnation: 1},
		Command{Op: OpDeclare, Topic: wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 1}, Placement: [][]uint32{{3}}}))
	f.Add(seed(Command{Op: OpGroup, Group: &group.Command{Op: group.OpFence, Group: "g", Member: "m1", Incarnation: 2}}))
	f.Add(seed(Command{Op: OpTopicUpdate, Topic: wire.TopicConfig{Name: "t", RetentionMs: 5}, Set: wire.SetRetentionMs, Incarnation: 1},
		Command{Op: OpTopicUpdate, Topic: wire.TopicConfig{Name: "t", RetentionBytes: -1}, Set: wire.SetRetentionBytes, Incarnation: 1}))
	f.Add(seed(Command{Op: OpGroupSettings, GroupUpdate: &wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "g", Incarnation: 1}, Set: wire.SetAckWaitMs, AckWaitMs: 5}},
		Command{Op: OpGroupDelete, Group: &group.Command{Group: "g"}, Incarnation: 1},
		Command{Op: OpGroupSettings, GroupUpdate: &wire.GroupUpdate{GroupRef: wire.GroupRef{Group: "g", Incarnation: 1}, Set: wire.SetMaxDeliver}},
		Command{Op: OpGroupSettings}))
	f.Add([]byte("{\"op\":\"group\"}\n{\"op\":\"declare\",\"topic\":{\"name\":\"\"}}\nnot json\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := fuzzState(t), fuzzState(t)
		seq := a.Applied
		for i, line := range bytes.Split(data, []byte{'\n'}) {
			if i == fuzzEntriesMax {
				break
			}
			seq++
			chA, errA := a.Apply(seq, line)
			chB, errB := b.Apply(seq, line)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("entry %d %q: the nodes disagree: %v / %v", seq, line, errA, errB)
			}
			if (chA.Created == nil) != (chB.Created == nil) || (chA.Deleted == nil) != (chB.Deleted == nil) || (chA.Updated == nil) != (chB.Updated == nil) ||
				chA.GroupDeleted != chB.GroupDeleted {
				t.Fatalf("entry %d %q: changes differ: %+v / %+v", seq, line, chA, chB)
			}
			if errA != nil {
				continue
			}
			for name, g := range a.Groups {
				if v := g.Check(a.partitions); v != nil {
					t.Fatalf("entry %d %q: group %s: %v", seq, line, name, v)
				}
			}
			ja, errA := json.Marshal(a)
			jb, errB := json.Marshal(b)
			if errA != nil || errB != nil || !bytes.Equal(ja, jb) {
				t.Fatalf("entry %d %q: the nodes diverged (%v, %v):\n%s\n%s", seq, line, errA, errB, ja, jb)
			}
		}
	})
}

// fuzzState is a state that applied a declare of topic t (3 partitions)
// and member m1's JOIN of group g.
func fuzzState(t *testing.T) *State {
	s := New()
	tc := wire.TopicConfig{Name: "t", Partitions: 3, Replicas: 3}
	cmd, _, err := s.Decide(tc, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(1, mustJSON(t, cmd)); err != nil {
		t.Fatal(err)
	}
	join, err := s.DecideGroup(group.Command{Op: group.OpJoin, Group: "g", Member: "m1", Topics: []string{"t"}, JoinID: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(2, mustJSON(t, join)); err != nil {
		t.Fatal(err)
	}
	return s
}
