package meta

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

func mustJSON(t *testing.T, c Command) []byte {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNormalizeDefaultsAndBounds(t *testing.T) {
	tc, err := Normalize(wire.TopicConfig{Name: "a", Partitions: 1}, 3)
	if err != nil || tc.Replicas != 3 {
		t.Fatalf("3 nodes: replicas %d, %v", tc.Replicas, err)
	}
	tc, err = Normalize(wire.TopicConfig{Name: "a", Partitions: 1}, 1)
	if err != nil || tc.Replicas != 1 {
		t.Fatalf("1 node: replicas %d, %v", tc.Replicas, err)
	}
	for _, bad := range []struct {
		r     uint8
		nodes int
	}{{2, 3}, {5, 3}, {3, 2}, {7, 9}} {
		_, err := Normalize(wire.TopicConfig{Name: "a", Partitions: 1, Replicas: bad.r}, bad.nodes)
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeInvalidArgument {
			t.Fatalf("replicas %d on %d nodes: %v", bad.r, bad.nodes, err)
		}
	}
}

// Every node applying the same entries reaches the same state; DECLARE is
// idempotent and a conflicting one is refused.
func TestDecideApplyIdempotentAndConflict(t *testing.T) {
	leader, follower := New(), New()
	tc := wire.TopicConfig{Name: "orders", Partitions: 3, Replicas: 3}
	cmd, exists, err := leader.Decide(tc, 5)
	if err != nil || exists {
		t.Fatalf("first declare: %v exists=%v", err, exists)
	}
	data := mustJSON(t, cmd)
	for _, s := range []*State{leader, follower} {
		ch, err := s.Apply(1, data)
		if err != nil || ch.Created == nil || ch.Created.Incarnation != 1 {
			t.Fatalf("apply: %+v %v", ch, err)
		}
		// A raced second declare of the same topic commits but changes nothing.
		if ch, err := s.Apply(2, data); err != nil || ch.Created != nil {
			t.Fatalf("duplicate apply created %v, %v", ch.Created, err)
		}
	}
	if _, exists, err := leader.Decide(tc, 5); err != nil || !exists {
		t.Fatalf("identical declare: exists=%v err=%v", exists, err)
	}
	other := tc
	other.Partitions = 4
	_, _, err = leader.Decide(other, 5)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeTopicConflict {
		t.Fatalf("conflicting declare: %v", err)
	}
	if _, err := follower.Apply(2, data); err == nil {
		t.Fatal("applying a seq twice was accepted")
	}
	a, _ := json.Marshal(leader)
	b, _ := json.Marshal(follower)
	if string(a) != string(b) {
		t.Fatalf("nodes diverged:\n%s\n%s", a, b)
	}
}

// Placement gives each partition R distinct nodes and spreads both the
// replicas and the first replicas (the preferred leaders) evenly over the
// cluster, for every replication factor up to the cluster's size.
func TestPlacementIsDistinctAndSpread(t *testing.T) {
	for _, c := range []struct{ nodes, replicas int }{{1, 1}, {3, 1}, {3, 3}, {5, 1}, {5, 3}, {5, 5}} {
		s := New()
		load, leads := map[uint32]int{}, map[uint32]int{}
		for i, name := range []string{"a", "b", "c", "d", "e"} {
			cmd, _, err := s.Decide(wire.TopicConfig{Name: name, Partitions: 4, Replicas: uint8(c.replicas)}, c.nodes)
			if err != nil {
				t.Fatal(err)
			}
			for p, g := range cmd.Placement {
				seen := map[uint32]bool{}
				for _, n := range g {
					if n < 1 || n > uint32(c.nodes) || seen[n] {
						t.Fatalf("%d nodes: %s/%d placement %v", c.nodes, name, p, g)
					}
					seen[n] = true
					load[n]++
				}
				leads[g[0]]++
			}
			if _, err := s.Apply(uint64(i+1), mustJSON(t, cmd)); err != nil {
				t.Fatal(err)
			}
		}
		// 5 topics × 4 partitions: every node leads and holds its share,
		// within one partition's worth.
		for n := uint32(1); n <= uint32(c.nodes); n++ {
			if l := leads[n]; l < 20/c.nodes || l > (20+c.nodes-1)/c.nodes {
				t.Fatalf("%d nodes, R=%d: node %d is first replica of %d of 20 partitions: %v", c.nodes, c.replicas, n, l, leads)
			}
			if l := load[n]; l < 20*c.replicas/c.nodes || l > (20*c.replicas+c.nodes-1)/c.nodes {
				t.Fatalf("%d nodes, R=%d: node %d holds %d replicas: %v", c.nodes, c.replicas, n, l, load)
			}
		}
	}
}

func TestApplyRejectsMalformed(t *testing.T) {
	s := New()
	for i, data := range [][]byte{[]byte("{"), []byte(`{"op":"drop"}`),
		mustJSON(t, Command{Op: "declare", Topic: wire.TopicConfig{Name: "x", Partitions: 2}, Placement: [][]uint32{{1}}})} {
		if _, err := s.Apply(uint64(i+1), data); err == nil {
			t.Fatalf("entry %q accepted", data)
		}
	}
	if len(s.Topics) != 0 {
		t.Fatalf("malformed entries created %v", s.Topics)
	}
}

// The metadata leader refuses a reserved or path-like name even when a
// peer forwards it, and an entry decided before names were checked creates
// nothing: a user topic `__meta` would share the metadata log's replica
// group on the peer transport. A dead-letter topic name is valid here (the
// group machinery declares it through the metadata log).
func TestReservedNamesAreNeverDecidedOrApplied(t *testing.T) {
	s := New()
	for _, name := range []string{"__meta", "__x", ".", ".."} {
		tc := wire.TopicConfig{Name: name, Partitions: 1, Replicas: 3}
		_, _, err := s.Decide(tc, 3)
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.CodeInvalidArgument {
			t.Errorf("Decide(%q) = %v, want INVALID_ARGUMENT", name, err)
		}
		old := mustJSON(t, Command{Op: "declare", Topic: tc, Placement: [][]uint32{{1, 2, 3}}})
		ch, err := s.Apply(s.Applied+1, old)
		if err == nil || ch.Created != nil || len(s.Topics) != 0 {
			t.Errorf("Apply(%q) created %v, err %v", name, ch.Created, err)
		}
	}
	if _, _, err := s.Decide(wire.TopicConfig{Name: "dlq.g.orders", Partitions: 1, Replicas: 3}, 3); err != nil {
		t.Fatalf("dead-letter topic refused: %v", err)
	}
}
