package meta

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

func (n *nodes) declare(name string, partitions uint32) *Topic {
	n.t.Helper()
	cmd, exists, err := n.leader().Decide(wire.TopicConfig{Name: name, Partitions: partitions, Replicas: 1}, 3)
	if err != nil || exists {
		n.t.Fatalf("declare %s: exists=%v %v", name, exists, err)
	}
	n.commit(cmd)
	t := n.leader().Topics[name]
	return &t
}

func (n *nodes) deleteTopic(name string) Command {
	n.t.Helper()
	cmd, err := n.leader().DecideTopicDelete(name, 0)
	if err != nil {
		n.t.Fatalf("delete %s: %v", name, err)
	}
	n.commit(cmd)
	return cmd
}

func wantCode(t *testing.T, what string, err error, code wire.Code) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
}

// IncarnationNeverReused: every declare of a name after a delete is the
// next incarnation, on every node, and the numbering survives the state's
// JSON form (meta.json) and a state saved before incarnations.
func TestTopicIncarnationNeverReused(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	for want := uint64(1); want <= 3; want++ {
		if got := n.declare("orders", 2).Incarnation; got != want {
			t.Fatalf("declare #%d: incarnation %d", want, got)
		}
		n.deleteTopic("orders")
		if cur, del := n.leader().Incarnation("orders"); cur != 0 || del != want {
			t.Fatalf("after delete #%d: current %d, deleted %d", want, cur, del)
		}
		// meta.json round trip keeps the name's last incarnation.
		b, _ := json.Marshal(n.all[1])
		back := New()
		if err := json.Unmarshal(b, back); err != nil {
			t.Fatal(err)
		}
		n.all[1] = back
	}
	n.same()
	old := New()
	if err := json.Unmarshal([]byte(`{"applied":1,"topics":{"a":{"config":{"Name":"a","Partitions":1},"placement":[[1]]}}}`), old); err != nil {
		t.Fatal(err)
	}
	if cur, _ := old.Incarnation("a"); cur != 1 {
		t.Fatalf("a topic saved before incarnations reads as incarnation %d", cur)
	}
}

// Deleting a missing topic is NOT_FOUND, deleting twice is not a second
// change, and TopicDeleteNamesItsIncarnation: a delete decided against
// incarnation 1 that commits again after the name was declared anew
// removes nothing.
func TestTopicDeleteIsIdempotent(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	_, err := n.leader().DecideTopicDelete("orders", 0)
	wantCode(t, "delete of a never-declared topic", err, wire.CodeNotFound)
	n.declare("orders", 2)
	if _, err := n.leader().DecideTopicDelete("orders", 2); err == nil {
		t.Fatal("delete of incarnation 2 accepted while the topic is at 1")
	}
	del := n.deleteTopic("orders")
	_, err = n.leader().DecideTopicDelete("orders", 0)
	wantCode(t, "second delete", err, wire.CodeNotFound)
	if we := err.(*wire.Error); we.Message != `topic "orders" was deleted (incarnation 1)` {
		t.Fatalf("second delete says %q", we.Message)
	}
	// The same delete committed twice (two askers raced): no change.
	n.seq++
	for _, s := range n.all {
		if ch, err := s.Apply(n.seq, mustJSON(t, del)); err != nil || ch.Deleted != nil {
			t.Fatalf("repeated delete: %+v %v", ch, err)
		}
	}
	n.declare("orders", 3)
	n.seq++
	for _, s := range n.all {
		if ch, err := s.Apply(n.seq, mustJSON(t, del)); err != nil || ch.Deleted != nil {
			t.Fatalf("a stale delete of incarnation 1 applied to incarnation 2: %+v %v", ch, err)
		}
		if cur, _ := s.Incarnation("orders"); cur != 2 {
			t.Fatalf("orders at incarnation %d after a stale delete, want 2", cur)
		}
	}
	n.same()
}

// TopicDeleteRefusesInternal: the metadata log, the schedule shards and
// KV buckets' logs are never deleted, neither decided nor applied.
func TestTopicDeleteRefusesInternal(t *testing.T) {
	s := New()
	for _, name := range []string{MetaTopic, wire.SchedTopic, "__kv.config", "__x"} {
		s.Topics[name] = Topic{Config: wire.TopicConfig{Name: name, Partitions: 1}, Incarnation: 1}
		_, err := s.DecideTopicDelete(name, 0)
		wantCode(t, "delete "+name, err, wire.CodeInvalidArgument)
		entry := mustJSON(t, Command{Op: OpTopicDelete, Topic: wire.TopicConfig{Name: name}, Incarnation: 1})
		if _, err := s.Apply(s.Applied+1, entry); err == nil {
			t.Fatalf("an entry deleting %s applied", name)
		}
		if _, ok := s.Topics[name]; !ok {
			t.Fatalf("%s deleted", name)
		}
	}
	_, err := s.DecideTopicDelete("..", 0)
	wantCode(t, "delete ..", err, wire.CodeInvalidArgument)
}

// GroupsOwnNoDeletedPartition: a delete takes the topic's partitions from
// every member (owners, targets, pending notices) and the group stays
// consistent; the name declared again is assigned afresh.
func TestTopicDeleteDropsGroupPartitions(t *testing.T) {
	n := &nodes{t: t, all: []*State{New(), New()}}
	n.declare("orders", 4)
	n.declare("audit", 2)
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "a", Topics: []string{"orders", "audit"}, JoinID: 1})
	// b's JOIN leaves REVOKE notices pending for a's partitions.
	n.group(group.Command{Op: group.OpJoin, Group: "g", Member: "b", Topics: []string{"orders", "audit"}, JoinID: 2})
	if len(n.leader().Groups["g"].Notices) == 0 {
		t.Fatal("no notice pending before the delete: the test proves nothing")
	}
	n.deleteTopic("orders")
	for _, s := range n.all {
		g := s.Groups["g"]
		for p := range g.Owners {
			if p.Topic == "orders" {
				t.Fatalf("%v of the deleted topic still owned: %+v", p, g.Owners[p])
			}
		}
		for p := range g.Target {
			if p.Topic == "orders" {
				t.Fatalf("%v of the deleted topic still a target", p)
			}
		}
		for _, nt := range g.Notices {
			for _, h := range nt.Partitions {
				if h.Partition.Topic == "orders" {
					t.Fatalf("notice #%d still names %v", nt.ID, h.Partition)
				}
			}
		}
		if v := g.Check(s.partitions); v != nil {
			t.Fatalf("group after the delete: %v", v)
		}
	}
	n.declare("orders", 2)
	g := n.leader().Groups["g"]
	if got := len(g.Target); got != 4 {
		t.Fatalf("targets after the re-declare: %v (want audit's 2 and orders' 2)", g.Target)
	}
	n.same()
}

func TestTopicKeyRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name string
		inc  uint64
		key  string
	}{{"orders", 1, "orders"}, {"orders", 2, "orders@2"}, {"a.b-c_d", 17, "a.b-c_d@17"}} {
		if got := TopicKey(c.name, c.inc); got != c.key {
			t.Fatalf("TopicKey(%s, %d) = %s", c.name, c.inc, got)
		}
		if name, inc, ok := ParseTopicKey(c.key); !ok || name != c.name || inc != c.inc {
			t.Fatalf("ParseTopicKey(%s) = %s %d %v", c.key, name, inc, ok)
		}
	}
	for _, bad := range []string{"", "a@", "a@1", "a@0", "a@02", "@3", "a@x", "a@2@3"} {
		if _, _, ok := ParseTopicKey(bad); ok {
			t.Fatalf("ParseTopicKey(%q) accepted", bad)
		}
	}
	s := New()
	s.Deleted = map[string]uint64{"orders": 2}
	for key, want := range map[string]bool{"orders": true, "orders@2": true, "orders@3": false, "audit": false, "a@x": false} {
		if s.DeletedKey(key) != want {
			t.Fatalf("DeletedKey(%s) = %v", key, !want)
		}
	}
}
