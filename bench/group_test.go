package main

import (
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/client"
)

func TestStableAssignment(t *testing.T) {
	holds := func(id string, parts ...int) client.GroupMember {
		m := client.GroupMember{ID: id}
		for _, p := range parts {
			m.Partitions = append(m.Partitions, client.HeldPartition{Topic: "t", Partition: p, Epoch: 1})
		}
		return m
	}
	group := func(pending int, members ...client.GroupMember) client.GroupInfo {
		return client.GroupInfo{Members: members, Pending: make([]client.PendingNotice, pending)}
	}
	tests := []struct {
		name    string
		info    client.GroupInfo
		members int
		want    bool
	}{
		{"one member holds all", group(0, holds("m1", 0, 1, 2, 3, 4, 5)), 1, true},
		{"three balanced", group(0, holds("m1", 0, 1), holds("m2", 2, 3), holds("m3", 4, 5)), 3, true},
		{"two balanced", group(0, holds("m2", 0, 1, 2), holds("m3", 3, 4, 5)), 2, true},
		{"a notice pending", group(1, holds("m1", 0, 1), holds("m2", 2, 3), holds("m3", 4, 5)), 3, false},
		{"a member short", group(0, holds("m1", 0, 1, 2), holds("m2", 3, 4, 5)), 3, false},
		{"unbalanced", group(0, holds("m1", 0, 1, 2, 3), holds("m2", 4), holds("m3", 5)), 3, false},
		{"a new member with nothing yet", group(0, holds("m1", 0, 1, 2), holds("m2", 3, 4, 5), holds("m3")), 3, false},
		{"a partition unheld", group(0, holds("m1", 0, 1), holds("m2", 2, 3), holds("m3", 4)), 3, false},
		{"a partition held twice", group(0, holds("m1", 0, 1), holds("m2", 1, 2, 3), holds("m3", 4, 5)), 3, false},
		{"a partition out of range", group(0, holds("m1", 0, 1, 2, 3, 4, 6)), 1, false},
	}
	for _, tt := range tests {
		if got := stableAssignment(tt.info, "t", 6, tt.members); got != tt.want {
			t.Errorf("%s: stableAssignment = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestComputeGroupSummary(t *testing.T) {
	if computeGroupSummary([]row{{System: systemNereus, Mode: modeR3, Workload: workloadConsume, MsgsPerS: 1}}) != nil {
		t.Fatal("a summary without group rows")
	}
	rows := []row{
		{System: systemNereus, Mode: modeR3, Workload: workloadPubSync, P50Us: 500},
		{System: systemNereus, Mode: modeR3, Workload: workloadGroupConsume1, MsgsPerS: 100},
		{System: systemNereus, Mode: modeR3, Workload: workloadGroupConsume3, MsgsPerS: 150},
		{System: systemJetStream, Mode: modeR3, Workload: workloadGroupConsume1, MsgsPerS: 50},
		{System: systemJetStream, Mode: modeR3, Workload: workloadGroupConsume3, MsgsPerS: 60},
		{System: systemNereus, Mode: modeR3, Workload: workloadGroupJoin, P50Us: 5000, P99Us: 9000, MaxUs: 9000, Messages: 30},
		{System: systemNereus, Mode: modeR1Proc, Workload: workloadGroupLeave, P50Us: 4000, Messages: 10},
	}
	sum := computeGroupSummary(rows)
	if len(sum.ScaleOut) != 2 || sum.ScaleOut[0].ThreeOverOne != 1.5 || sum.ScaleOut[1].System != systemJetStream || sum.ScaleOut[1].ThreeOverOne != 1.2 {
		t.Errorf("scale out: %+v", sum.ScaleOut)
	}
	if len(sum.Versus) != 2 || sum.Versus[0].Members != 1 || sum.Versus[0].Ratio != 2 || sum.Versus[1].Ratio != 2.5 {
		t.Errorf("versus: %+v", sum.Versus)
	}
	if len(sum.Changes) != 2 || sum.Changes[0].Change != "join" || sum.Changes[0].P50OverPubSync != 10 ||
		sum.Changes[1].Change != "leave" || sum.Changes[1].PubSyncP50Us != 0 || sum.Changes[1].P50OverPubSync != 0 {
		t.Errorf("changes: %+v", sum.Changes)
	}
	var b strings.Builder
	writeGroupMarkdown(&b, sum, runConfig{BatchMax: 500, GroupPrefillCountMax: 100, GroupChangeRepeats: 10})
	for _, want := range []string{"| nereus | r3 | 100 | 150 | 1.50× |", "| 3 | 150 | 60.0 | 2.50× |",
		"| nereus | r3 | join | 30 | 5.00 | 9.00 | 9.00 | 0.50 | 10.00× |", "| jetstream | r3 | join, leave |", "each partition's leader delivers it", "no assignment protocol"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the group section lacks %q:\n%s", want, b.String())
		}
	}
}
