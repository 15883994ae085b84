package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/storage"
)

// TestRepairOutputNamesARemovedLedgerSnapshot: a group's damaged
// ledger-snapshot removed by repair is reported — in text, saying the
// group's acks are forgotten, and in --json as ledger_snapshot_removed —
// and counted as damage.
func TestRepairOutputNamesARemovedLedgerSnapshot(t *testing.T) {
	logs := []node.RepairedLog{{Topic: "t", Partition: -1, Group: "g", Dir: "/data/groups/g/t/ledger-snapshot", LedgerSnapshotRemoved: true}}
	for _, dry := range []bool{true, false} {
		var text bytes.Buffer
		writeRepairText(&text, logs, storage.RepairSalvage, dry)
		verb := map[bool]string{true: "would be removed", false: "removed"}[dry]
		if !strings.Contains(text.String(), "group g topic t ack ledger (/data/groups/g/t/ledger-snapshot): corrupt snapshot "+verb+": the group's acks are forgotten") ||
			!strings.Contains(text.String(), "1 of 1 logs damaged") {
			t.Fatalf("dry run %v:\n%s", dry, text.String())
		}
	}
	var out bytes.Buffer
	if err := writeRepairJSON(&out, logs, storage.RepairSalvage, false); err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(out.Bytes(), &j); err != nil || j["ledger_snapshot_removed"] != true || j["group"] != "g" {
		t.Fatalf("json %s (%v)", out.String(), err)
	}
}

// TestRepairOutputNamesARemovedDedupSnapshot: a partition whose dedup
// snapshots the repair removes is reported — in text, saying which
// producers are forgotten, and in --json as dedup_snapshot_removed.
func TestRepairOutputNamesARemovedDedupSnapshot(t *testing.T) {
	report := storage.RepairReport{Dropped: []storage.SeqRange{{First: 5, Last: 5}}, DroppedSeqs: 1, NextSeq: 9,
		Damage: []storage.Damage{{Segment: "00000000000000000001.log", FirstSeq: 5, LastSeq: 5, Cause: "crc"}}}
	for _, removed := range []bool{true, false} {
		logs := []node.RepairedLog{{Topic: "t", Partition: 0, Dir: "/data/topics/t/0", Report: report, DedupSnapshotRemoved: removed}}
		for _, dry := range []bool{true, false} {
			var text bytes.Buffer
			writeRepairText(&text, logs, storage.RepairSalvage, dry)
			verb := map[bool]string{true: "would be removed", false: "removed"}[dry]
			said := strings.Contains(text.String(), "topic t partition 0: dedup snapshot "+verb+": producers whose every record retention deleted are forgotten")
			if said != removed {
				t.Fatalf("removed %v, dry run %v:\n%s", removed, dry, text.String())
			}
		}
		var out bytes.Buffer
		if err := writeRepairJSON(&out, logs, storage.RepairSalvage, false); err != nil {
			t.Fatal(err)
		}
		var j map[string]any
		if err := json.Unmarshal(out.Bytes(), &j); err != nil || (j["dedup_snapshot_removed"] == true) != removed {
			t.Fatalf("removed %v: json %s (%v)", removed, out.String(), err)
		}
	}
}

// TestRepairOutputSaysWhatABucketAndAShardLose: a KV bucket's and a
// schedule shard's logs are internal topics; the report names the bucket
// and the shard and says what their dropped seqs cost (lost writes and
// CURSOR_EXPIRED watches; schedules that never fire or fire though
// cancelled) — in --json as bucket and sched_shard. A user topic's
// report says neither.
func TestRepairOutputSaysWhatABucketAndAShardLose(t *testing.T) {
	report := storage.RepairReport{Dropped: []storage.SeqRange{{First: 5, Last: 6}}, DroppedSeqs: 2, NextSeq: 9,
		Damage: []storage.Damage{{Segment: "00000000000000000001.log", FirstSeq: 5, LastSeq: 6, Cause: "crc"}}}
	for _, c := range []struct {
		topic, name, effect, field string
		value                      any
	}{
		{"__kv.prices", "KV bucket prices (topic __kv.prices)", "watches from before them end CURSOR_EXPIRED", "bucket", "prices"},
		{"__sched", "schedule shard 2 (topic __sched partition 2)", "never fires, one whose cancel was there fires", "sched_shard", true},
		{"orders", "topic orders partition 2", "", "", nil},
		{"__meta", "the metadata log (/data/topics/__meta/2)", "", "", nil}, // --one-node-cluster
	} {
		logs := []node.RepairedLog{{Topic: c.topic, Partition: 2, Dir: "/data/topics/" + c.topic + "/2", Report: report}}
		var text bytes.Buffer
		writeRepairText(&text, logs, storage.RepairSalvage, false)
		out := text.String()
		if !strings.Contains(out, c.name+": dropped seqs 5-6") {
			t.Fatalf("%s: the report does not name %q:\n%s", c.topic, c.name, out)
		}
		effects := strings.Count(out, "never fires") + strings.Count(out, "CURSOR_EXPIRED")
		if c.effect == "" && effects != 0 || c.effect != "" && (effects != 1 || !strings.Contains(out, c.name+": ") || !strings.Contains(out, c.effect)) {
			t.Fatalf("%s: want the effect %q said once:\n%s", c.topic, c.effect, out)
		}
		var js bytes.Buffer
		if err := writeRepairJSON(&js, logs, storage.RepairSalvage, false); err != nil {
			t.Fatal(err)
		}
		var j map[string]any
		if err := json.Unmarshal(js.Bytes(), &j); err != nil {
			t.Fatal(err)
		}
		_, hasBucket := j["bucket"]
		_, hasShard := j["sched_shard"]
		if c.field == "" && (hasBucket || hasShard) || c.field != "" && j[c.field] != c.value {
			t.Fatalf("%s: json %s; want %s %v", c.topic, js.String(), c.field, c.value)
		}
	}
}
