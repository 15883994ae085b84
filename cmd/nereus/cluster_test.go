package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/client"
)

// partitionOf builds what a node answered for one partition of topic t.
func partitionOf(leader string, epoch uint64, states ...string) client.TopicInfo {
	p := client.PartitionInfo{Partition: 0, Epoch: epoch, Leader: leader}
	for i, s := range states {
		p.Replicas = append(p.Replicas, client.ReplicaInfo{Node: []string{"n1", "n2", "n3"}[i], State: s})
	}
	return client.TopicInfo{Config: client.TopicConfig{Name: "t", Partitions: 1, Replicas: 3}, Partitions: []client.PartitionInfo{p}}
}

// corrupt marks t's partition DATA_CORRUPT, as its node reports it.
func corrupt(t client.TopicInfo) client.TopicInfo {
	t.Partitions[0].Corrupt = true
	return t
}

// cluster status reports what the nodes that answered can vouch for: a
// leader only when it answered itself (followers may still name a dead
// one), a replica's state as its leader sees it, and the verdict (exit
// status 2) whenever a node, a leader or an in-sync replica is missing.
func TestClusterStatusShowsOnlyWhatAnsweringNodesObserve(t *testing.T) {
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name     string
		views    []nodeView
		mode     string
		leader   string
		degraded []string // substrings of the reasons, in order
	}{
		{"healthy", []nodeView{
			{addr: "a1", topics: []client.TopicInfo{partitionOf("n1", 2, "InSync", "InSync", "InSync")}},
			{addr: "a2", topics: []client.TopicInfo{partitionOf("n1", 2, "", "", "")}},
			{addr: "a3", topics: []client.TopicInfo{partitionOf("n1", 2, "", "", "")}},
		}, modeReadWrite, "n1", nil},
		{"the leader's node is dead, the followers still name it", []nodeView{
			{addr: "a1", err: down},
			{addr: "a2", topics: []client.TopicInfo{partitionOf("n1", 2, "", "", "")}},
			{addr: "a3", topics: []client.TopicInfo{partitionOf("n1", 2, "", "", "")}},
		}, modeNoLeader, "", []string{"node a1 unreachable", "t/0 has no reachable leader"}},
		{"a follower is dead", []nodeView{
			{addr: "a1", topics: []client.TopicInfo{partitionOf("n1", 2, "InSync", "InSync", "Unreachable")}},
			{addr: "a2", topics: []client.TopicInfo{partitionOf("n1", 2, "", "", "")}},
			{addr: "a3", err: down},
		}, modeReadWrite, "n1", []string{"node a3 unreachable", "t/0 replica n3 is Unreachable"}},
		{"a deposed leader's view loses to its successor's", []nodeView{
			{addr: "a1", topics: []client.TopicInfo{partitionOf("n1", 2, "InSync", "Unreachable", "Unreachable")}},
			{addr: "a2", topics: []client.TopicInfo{partitionOf("n2", 3, "CatchingUp", "InSync", "InSync")}},
			{addr: "a3", topics: []client.TopicInfo{partitionOf("n2", 3, "", "", "")}},
		}, modeReadWrite, "n2", []string{"t/0 replica n1 is CatchingUp"}},
		{"a single node's partition is corrupt", []nodeView{
			{addr: "a1", topics: []client.TopicInfo{corrupt(partitionOf("n1", 1))}},
		}, modeCorrupt, "n1", []string{"t/0 is DATA_CORRUPT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parts := mergeViews(tc.views)
			if len(parts) != 1 {
				t.Fatalf("merged %d partitions, want 1", len(parts))
			}
			if p := parts[0]; p.Mode != tc.mode || p.Leader != tc.leader {
				t.Fatalf("partition shown as %s led by %q, want %s led by %q", p.Mode, p.Leader, tc.mode, tc.leader)
			}
			reasons := degradedReasons(tc.views, parts)
			if len(reasons) != len(tc.degraded) || !slices.EqualFunc(reasons, tc.degraded, strings.Contains) {
				t.Fatalf("degraded reasons %q, want %q", reasons, tc.degraded)
			}
			var table strings.Builder
			if err := writeClusterTable(&table, tc.views, parts); err != nil {
				t.Fatal(err)
			}
			if tc.mode == modeNoLeader && strings.Contains(table.String(), modeReadWrite) {
				t.Fatalf("a partition without a reachable leader is shown %s:\n%s", modeReadWrite, table.String())
			}
		})
	}
}

// The table counts the partitions each node leads (0 for a replica node
// that leads none), so an unbalanced cluster shows.
func TestClusterStatusCountsLeadersPerNode(t *testing.T) {
	parts := []partitionView{
		{Topic: "a", partitionJSON: partitionJSON{Partition: 0, Leader: "n1", Replicas: []replicaJSON{{Node: "n1"}, {Node: "n2"}, {Node: "n3"}}}},
		{Topic: "a", partitionJSON: partitionJSON{Partition: 1, Leader: "n1", Replicas: []replicaJSON{{Node: "n2"}, {Node: "n3"}, {Node: "n1"}}}},
		{Topic: "b", partitionJSON: partitionJSON{Partition: 0, Leader: "n2", Replicas: []replicaJSON{{Node: "n3"}, {Node: "n1"}, {Node: "n2"}}}},
		{Topic: "b", partitionJSON: partitionJSON{Partition: 1, Leader: "", Replicas: []replicaJSON{{Node: "n1"}, {Node: "n2"}, {Node: "n3"}}}},
	}
	got := leaderCounts(parts)
	want := []leaderCount{{"n1", 2}, {"n2", 1}, {"n3", 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("leader counts %v, want %v", got, want)
	}
	var table strings.Builder
	if err := writeClusterTable(&table, nil, parts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "NODE_ID  LEADS") || !strings.Contains(table.String(), "n3       0") {
		t.Fatalf("table:\n%s", table.String())
	}
}

// cluster status given one address asks the leaders that node names, once
// each: the partitions' leader addresses find the other nodes, and the
// address a node advertises for the partitions it leads is the node
// already asked, whatever name it was asked by.
func TestClusterStatusAsksTheLeadersItIsTold(t *testing.T) {
	led := func(topic, leader, addr string, states ...string) client.TopicInfo {
		ti := partitionOf(leader, 2, states...)
		ti.Config.Name = topic
		ti.Partitions[0].LeaderAddr = addr
		return ti
	}
	answers := map[string]nodeView{
		"localhost:1": {topics: []client.TopicInfo{
			led("a", "n1", "127.0.0.1:1", "InSync", "InSync", "InSync"),
			led("b", "n2", "127.0.0.1:2", "", "", ""),
			led("c", "n3", "127.0.0.1:3", "", "", ""),
		}},
		"127.0.0.1:2": {topics: []client.TopicInfo{
			led("a", "n1", "127.0.0.1:1", "", "", ""),
			led("b", "n2", "127.0.0.1:2", "InSync", "InSync", "InSync"),
		}},
		"127.0.0.1:3": {err: errors.New("connection refused")},
	}
	var asked []string
	views := gatherViews([]string{"localhost:1"}, func(addr string) nodeView {
		asked = append(asked, addr)
		v := answers[addr]
		v.addr = addr
		return v
	})
	if want := []string{"localhost:1", "127.0.0.1:2", "127.0.0.1:3"}; fmt.Sprint(asked) != fmt.Sprint(want) {
		t.Fatalf("asked %v, want %v", asked, want)
	}
	if len(views) != 3 || views[2].err == nil {
		t.Fatalf("views %+v: want three, the last unreachable", views)
	}
	reasons := degradedReasons(views, mergeViews(views))
	if len(reasons) == 0 || reasons[0] != "node 127.0.0.1:3 unreachable" {
		t.Fatalf("reasons %q: want the unreachable leader first", reasons)
	}
}
