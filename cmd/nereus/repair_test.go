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
