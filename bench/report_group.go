package main

import (
	"fmt"
	"slices"
	"strings"
)

// groupSummary compares the consumer-group rows of one run: the scale-out
// from one member to three per system, Nereus r3 against JetStream R3 at
// each member count, and the join and leave times against each system's
// own sync publish latency in the same run.
type groupSummary struct {
	ScaleOut []groupScaleOut `json:"scale_out"`
	// Versus compares Nereus r3 members with JetStream R3 workers.
	Versus  []groupVersus        `json:"r3_versus_jetstream_r3"`
	Changes []groupChangeSummary `json:"join_leave"`
	// JetStreamJoinLeave says why JetStream has no join or leave row.
	JetStreamJoinLeave string `json:"jetstream_join_leave"`
}

// groupScaleOut is one system's consume throughput with one member and
// with three, and ThreeOverOne = three ÷ one (0 when either is missing).
type groupScaleOut struct {
	System       string  `json:"system"`
	Mode         string  `json:"mode"`
	OneMember    float64 `json:"one_member_msgs_per_s"`
	ThreeMembers float64 `json:"three_members_msgs_per_s"`
	ThreeOverOne float64 `json:"three_over_one"`
}

// groupVersus is Nereus r3's group consume throughput ÷ JetStream R3's at
// one member count.
type groupVersus struct {
	Members   int     `json:"members"`
	Nereus    float64 `json:"nereus_r3_msgs_per_s"`
	JetStream float64 `json:"jetstream_r3_msgs_per_s"`
	Ratio     float64 `json:"ratio"`
}

// groupChangeSummary is one join or leave row and its anchor: the same
// system's pub_sync p50 in the same run (one acknowledged publish, which
// in a cluster is one quorum-fsynced commit, as a membership change is one
// commit of the metadata log).
type groupChangeSummary struct {
	System  string  `json:"system"`
	Mode    string  `json:"mode"`
	Change  string  `json:"change"` // join or leave
	Samples int64   `json:"samples"`
	P50Us   float64 `json:"p50_us"`
	P99Us   float64 `json:"p99_us"`
	MaxUs   float64 `json:"max_us"`
	// PubSyncP50Us is the anchor (0 when pub_sync did not run), and
	// P50OverPubSync the join or leave p50 ÷ it.
	PubSyncP50Us   float64 `json:"pub_sync_p50_us,omitempty"`
	P50OverPubSync float64 `json:"p50_over_pub_sync_p50,omitempty"`
}

const jetStreamNoAssignment = "JetStream has no assignment protocol: the workers of a pull consumer are assigned nothing, each simply fetches from the one consumer, so there is no join or leave to settle and no row."

// computeGroupSummary returns the group summary of rows, nil when no
// group row ran.
func computeGroupSummary(rows []row) *groupSummary {
	type key struct {
		system, mode string
		w            workload
	}
	byKey := map[key]row{}
	var systems []key // system/mode of group rows, in row order
	for _, r := range rows {
		byKey[key{r.System, r.Mode, r.Workload}] = r
		if r.Workload.groupMembers() > 0 || r.Workload == workloadGroupJoin || r.Workload == workloadGroupLeave {
			if k := (key{system: r.System, mode: r.Mode}); !slices.Contains(systems, k) {
				systems = append(systems, k)
			}
		}
	}
	if len(systems) == 0 {
		return nil
	}
	get := func(system, mode string, w workload) (row, bool) {
		r, ok := byKey[key{system, mode, w}]
		return r, ok
	}
	sum := &groupSummary{ScaleOut: []groupScaleOut{}, Versus: []groupVersus{}, Changes: []groupChangeSummary{}, JetStreamJoinLeave: jetStreamNoAssignment}
	for _, k := range systems {
		one, ok1 := get(k.system, k.mode, workloadGroupConsume1)
		three, ok3 := get(k.system, k.mode, workloadGroupConsume3)
		if ok1 || ok3 {
			so := groupScaleOut{System: k.system, Mode: k.mode, OneMember: one.MsgsPerS, ThreeMembers: three.MsgsPerS}
			so.ThreeOverOne, _ = ratio(so.ThreeMembers, so.OneMember)
			sum.ScaleOut = append(sum.ScaleOut, so)
		}
		for _, change := range []workload{workloadGroupJoin, workloadGroupLeave} {
			r, ok := get(k.system, k.mode, change)
			if !ok {
				continue
			}
			cs := groupChangeSummary{System: k.system, Mode: k.mode, Change: strings.TrimPrefix(string(change), "group_"),
				Samples: r.Messages, P50Us: r.P50Us, P99Us: r.P99Us, MaxUs: r.MaxUs}
			if ps, ok := get(k.system, k.mode, workloadPubSync); ok {
				cs.PubSyncP50Us = ps.P50Us
				cs.P50OverPubSync, _ = ratio(cs.P50Us, ps.P50Us)
			}
			sum.Changes = append(sum.Changes, cs)
		}
	}
	for _, w := range []workload{workloadGroupConsume1, workloadGroupConsume3} {
		n, okN := get(systemNereus, modeR3, w)
		j, okJ := get(systemJetStream, modeR3, w)
		if okN || okJ {
			v := groupVersus{Members: w.groupMembers(), Nereus: n.MsgsPerS, JetStream: j.MsgsPerS}
			v.Ratio, _ = ratio(v.Nereus, v.JetStream)
			sum.Versus = append(sum.Versus, v)
		}
	}
	return sum
}

// writeGroupMarkdown writes the consumer-group section of the report.
func writeGroupMarkdown(b *strings.Builder, sum *groupSummary, cfg runConfig) {
	if sum == nil {
		return
	}
	b.WriteString("## Consumer groups: 1 against 3 members, join and leave\n\n")
	fmt.Fprintf(b, "A stream pre-filled (untimed) with up to %d numbered 1 KiB messages — for Nereus a topic of %d partitions (3 replicas on r3), filled round-robin — is consumed with acks by one group of 1, then (on a new stream) of 3 members, each with its own connection and credit %d, all opened at once; the timed part runs from before the first member opens (JOIN and rebalances included) to the last new message, and counts distinct messages. JetStream's equivalent is 1 or 3 workers fetching (`Fetch(%d)`) from one durable pull consumer of an R3 stream. ",
		cfg.GroupPrefillCountMax, groupPartitions, cfg.BatchMax, cfg.BatchMax)
	b.WriteString("In a Nereus cluster each partition's leader delivers it: every member, 1 or 3, pulls from each of the three nodes, so even one member reads from all leaders at once. All members and brokers share this machine's cores: consumption is bound by CPU, and 3 members cannot be 3× one on any system.\n\n")
	if len(sum.ScaleOut) > 0 {
		b.WriteString("| system | mode | 1 member msgs/s | 3 members msgs/s | 3 ÷ 1 |\n|---|---|---:|---:|---:|\n")
		for _, so := range sum.ScaleOut {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", so.System, so.Mode, formatNumber(so.OneMember), formatNumber(so.ThreeMembers), formatRatio(so.ThreeOverOne))
		}
		b.WriteString("\n")
	}
	if len(sum.Versus) > 0 {
		b.WriteString("| members | nereus r3 msgs/s | jetstream r3 msgs/s | nereus ÷ jetstream |\n|---:|---:|---:|---:|\n")
		for _, v := range sum.Versus {
			fmt.Fprintf(b, "| %d | %s | %s | %s |\n", v.Members, formatNumber(v.Nereus), formatNumber(v.JetStream), formatRatio(v.Ratio))
		}
		b.WriteString("\n")
	}
	if len(sum.Changes) > 0 {
		fmt.Fprintf(b, "Join: %d fresh groups per run, each on an empty %d-partition topic; %d members join one after another, and each sample runs from the start of a member's Subscribe (its connection already open) until the coordinator's description of the group (`Groups`, polled every %.0f ms) shows the expected members holding every partition once, counts differing by at most one, and no notice pending. Leave: the same, then the first member's Close (LEAVE) until the 2 others hold all partitions, stable. The anchor is the same system's pub_sync p50 in this run (one acknowledged publish; a membership change is a commit of the metadata log).\n\n",
			cfg.GroupChangeRepeats, groupPartitions, groupMembersMax, float64(groupPollInterval.Milliseconds()))
		b.WriteString("| system | mode | change | samples | p50 ms | p99 ms | max ms | pub_sync p50 ms | p50 ÷ pub_sync p50 |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range sum.Changes {
			fmt.Fprintf(b, "| %s | %s | %s | %d | %s | %s | %s | %s | %s |\n", c.System, c.Mode, c.Change, c.Samples,
				formatNumber(c.P50Us/1e3), formatNumber(c.P99Us/1e3), formatNumber(c.MaxUs/1e3), formatNumber(c.PubSyncP50Us/1e3), formatRatio(c.P50OverPubSync))
		}
		fmt.Fprintf(b, "| jetstream | r3 | join, leave | – | – | – | – | – | – |\n\n%s\n\n", sum.JetStreamJoinLeave)
	}
}
