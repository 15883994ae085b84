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
