package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

func init() {
	extraCommands = append(extraCommands, newRepairCmd)
}

func newRepairCmd() *cobra.Command {
	var (
		dataDir, topic            string
		partition                 int
		salvage, truncate, dryRun bool
		asJSON, oneNodeCluster    bool
	)
	cmd := &cobra.Command{
		Use:   "repair --data DIR (--salvage | --truncate) [--topic T] [--partition P] [--one-node-cluster] [--dry-run]",
		Short: "Repair damaged logs of a stopped node's data directory",
		Long: `Check every partition log (and every consumer group's ack ledger) of a stopped
single node's data directory, ignoring the segment indexes, and repair what is
damaged. In a cluster member's data directory only the partitions with one
replica are repaired (the others rebuild from a healthy replica by themselves),
with --salvage only, their damaged seqs becoming lost records readers skip:

  --salvage   drop only the unreadable batches; every later valid record keeps
              its seq, and readers skip the gap (recorded in the log).
  --truncate  cut each damaged log at its first damage.

Either way new records get seqs above everything the log held before, and the
command prints what it dropped (seq ranges, counts). A dropped ack-ledger range
makes those messages be delivered again, never skipped; a KV bucket's or a
schedule shard's log is named as such, with what its dropped seqs cost. With
--one-node-cluster the metadata log of a one-node cluster (its only copy) is
repaired too: its damaged entries become lost records, none it applied is cut
(what they did stays in meta.json). Run it with --dry-run first. The node must
not be running.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir == "" {
				return errors.New("--data is required")
			}
			if salvage == truncate {
				return errors.New("choose exactly one of --salvage and --truncate")
			}
			if partition >= 0 && topic == "" {
				return errors.New("--partition needs --topic")
			}
			mode := storage.RepairSalvage
			if truncate {
				mode = storage.RepairTruncate
			}
			if oneNodeCluster && topic != "" {
				return errors.New("--one-node-cluster repairs every topic: leave out --topic")
			}
			logs, err := node.Repair(vfs.OS(), dataDir, node.RepairOptions{Topic: topic, Partition: partition, Mode: mode, DryRun: dryRun,
				OneNodeCluster: oneNodeCluster})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeRepairJSON(out, logs, mode, dryRun)
			}
			writeRepairText(out, logs, mode, dryRun)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data", "", "the node's data directory")
	f.StringVar(&topic, "topic", "", "repair only this topic")
	f.IntVar(&partition, "partition", -1, "repair only this partition of --topic")
	f.BoolVar(&salvage, "salvage", false, "drop only the damaged batches; keep every later record at its seq")
	f.BoolVar(&truncate, "truncate", false, "cut each log at its first damage")
	f.BoolVar(&dryRun, "dry-run", false, "report what would be dropped; change nothing")
	f.BoolVar(&asJSON, "json", false, "one JSON object per log")
	f.BoolVar(&oneNodeCluster, "one-node-cluster", false, "the directory is a one-node cluster's: repair its metadata log too (it has no other copy)")
	return cmd
}

// repairJSON is the --json form of one repaired log.
type repairJSON struct {
	Topic     string `json:"topic"`
	Partition *int   `json:"partition,omitempty"`
	// Bucket names the KV bucket whose log this is (topic __kv.B);
	// SchedShard is set for a schedule shard's log (topic __sched).
	Bucket              string         `json:"bucket,omitempty"`
	SchedShard          bool           `json:"sched_shard,omitempty"`
	Group               string         `json:"group,omitempty"`
	Dir                 string         `json:"dir"`
	Mode                string         `json:"mode"`
	DryRun              bool           `json:"dry_run"`
	Damage              []damageJSON   `json:"damage"`
	TornTailBytes       int64          `json:"torn_tail_bytes"`
	Dropped             []seqRangeJSON `json:"dropped"`
	DroppedSeqs         uint64         `json:"dropped_seqs"`
	ValidRecordsDropped uint64         `json:"valid_records_dropped"`
	NextSeq             uint64         `json:"next_seq"`
	EpochFileRemoved    bool           `json:"epoch_file_removed,omitempty"`
	HardStateReset      bool           `json:"hard_state_reset,omitempty"`
	SnapshotPointReset  bool           `json:"snapshot_point_reset,omitempty"`
	TopicsRebuilt       int            `json:"topics_rebuilt,omitempty"`
	GroupsReset         bool           `json:"groups_reset,omitempty"`
	// DedupSnapshotRemoved: the partition's dedup snapshots were removed;
	// producers whose every record retention deleted are forgotten there.
	DedupSnapshotRemoved bool `json:"dedup_snapshot_removed,omitempty"`
	// LedgerSnapshotRemoved: a group's damaged ledger-snapshot was
	// removed; the group's acks are forgotten.
	LedgerSnapshotRemoved bool `json:"ledger_snapshot_removed,omitempty"`
}

type damageJSON struct {
	File     string `json:"file"`
	Offset   int64  `json:"offset"`
	Bytes    int64  `json:"bytes"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Cause    string `json:"cause"`
}

type seqRangeJSON struct {
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
}

func writeRepairJSON(w io.Writer, logs []node.RepairedLog, mode storage.RepairMode, dryRun bool) error {
	enc := json.NewEncoder(w)
	for _, l := range logs {
		r := l.Report
		j := repairJSON{Topic: l.Topic, Group: l.Group, Dir: l.Dir, Mode: mode.String(), DryRun: dryRun,
			Damage: []damageJSON{}, Dropped: []seqRangeJSON{}, DroppedSeqs: r.DroppedSeqs,
			ValidRecordsDropped: r.ValidRecordsDropped, NextSeq: r.NextSeq, EpochFileRemoved: l.EpochFileRemoved,
			HardStateReset: l.HardStateReset, SnapshotPointReset: l.SnapshotPointReset,
			TopicsRebuilt: l.TopicsRebuilt, GroupsReset: l.GroupsReset, DedupSnapshotRemoved: l.DedupSnapshotRemoved,
			LedgerSnapshotRemoved: l.LedgerSnapshotRemoved}
		if l.Group == "" && l.TopicsRebuilt == 0 && !l.GroupsReset {
			j.Partition = &l.Partition
			j.Bucket, j.SchedShard = internalLog(l.Topic)
		}
		for _, d := range r.Damage {
			j.Damage = append(j.Damage, damageJSON{File: d.Segment, Offset: d.Offset, Bytes: d.Bytes,
				FirstSeq: d.FirstSeq, LastSeq: d.LastSeq, Cause: d.Cause})
		}
		if r.TornTail != nil {
			j.TornTailBytes = r.TornTail.Bytes
		}
		for _, d := range r.Dropped {
			j.Dropped = append(j.Dropped, seqRangeJSON(d))
		}
		if err := enc.Encode(j); err != nil {
			return err
		}
	}
	return nil
}

// internalLog names the KV bucket whose log the topic is, or reports that
// it is a schedule shard's: their lost records lose a bucket's writes or
// a shard's schedules, which the report says.
func internalLog(topic string) (bucket string, schedShard bool) {
	if wire.IsKVTopic(topic) {
		return strings.TrimPrefix(topic, wire.KVTopicPrefix), false
	}
	return "", topic == wire.SchedTopic
}

func writeRepairText(w io.Writer, logs []node.RepairedLog, mode storage.RepairMode, dryRun bool) {
	verb, damaged := "dropped", 0
	if dryRun {
		verb = "would drop"
	}
	for _, l := range logs {
		if l.GroupsReset {
			damaged++
			fmt.Fprintf(w, "%s: corrupt; %s: the groups' members are forgotten and join again (acks are kept)\n",
				l.Dir, map[bool]string{true: "would be removed", false: "removed"}[dryRun])
			continue
		}
		if l.TopicsRebuilt > 0 {
			damaged++
			fmt.Fprintf(w, "%s: corrupt; %s: rebuilt from the topic directories with %d topics and default settings (retention was lost: set it again)\n",
				l.Dir, map[bool]string{true: "would be", false: "was"}[dryRun], l.TopicsRebuilt)
			continue
		}
		name := fmt.Sprintf("topic %s partition %d", l.Topic, l.Partition)
		bucket, shard := internalLog(l.Topic)
		switch {
		case l.Group != "":
			name = fmt.Sprintf("group %s topic %s ack ledger (%s)", l.Group, l.Topic, l.Dir)
		case bucket != "":
			name = fmt.Sprintf("KV bucket %s (topic %s)", bucket, l.Topic)
		case shard:
			name = fmt.Sprintf("schedule shard %d (topic %s partition %d)", l.Partition, l.Topic, l.Partition)
		case l.Topic == meta.MetaTopic:
			name = fmt.Sprintf("the metadata log (%s)", l.Dir)
		}
		if !l.Damaged() {
			fmt.Fprintf(w, "%s: ok\n", name)
			continue
		}
		damaged++
		r := l.Report
		for _, d := range r.Damage {
			fmt.Fprintf(w, "%s: damage at %s offset %d (%d bytes), seqs %d-%d: %s\n",
				name, d.Segment, d.Offset, d.Bytes, d.FirstSeq, d.LastSeq, d.Cause)
		}
		if t := r.TornTail; t != nil {
			fmt.Fprintf(w, "%s: torn tail at %s offset %d (%d bytes) cut off\n", name, t.Segment, t.Offset, t.Bytes)
		}
		for _, d := range r.Dropped {
			fmt.Fprintf(w, "%s: %s seqs %d-%d\n", name, verb, d.First, d.Last)
		}
		if len(r.Damage) > 0 {
			fmt.Fprintf(w, "%s: %s: %s %d seqs (%d of them readable records); next seq %d\n",
				name, mode, verb, r.DroppedSeqs, r.ValidRecordsDropped, r.NextSeq)
		}
		if r.DroppedSeqs > 0 && l.Group == "" {
			switch {
			case bucket != "":
				fmt.Fprintf(w, "%s: the writes at those seqs are lost unless a later checkpoint in its log holds them (the bucket is then rebuilt from it); watches from before them end CURSOR_EXPIRED and list again; a bucket that lost the only checkpoint it is rebuilt from answers DATA_CORRUPT until it is deleted and created again\n", name)
			case shard:
				fmt.Fprintf(w, "%s: a schedule whose record was at those seqs never fires, one whose cancel was there fires when due, and one whose message was there is resolved unknown\n", name)
			}
		}
		if l.EpochFileRemoved {
			fmt.Fprintf(w, "%s: corrupt epoch file removed\n", name)
		}
		if l.HardStateReset {
			fmt.Fprintf(w, "%s: corrupt hard state rewritten from the log\n", name)
		}
		if l.SnapshotPointReset {
			fmt.Fprintf(w, "%s: corrupt snapshot point rewritten from the log\n", name)
		}
		if l.DedupSnapshotRemoved {
			fmt.Fprintf(w, "%s: dedup snapshot %s: producers whose every record retention deleted are forgotten, and their retries append again\n",
				name, map[bool]string{true: "would be removed", false: "removed"}[dryRun])
		}
		if l.LedgerSnapshotRemoved {
			fmt.Fprintf(w, "%s: corrupt snapshot %s: the group's acks are forgotten and its messages delivered again\n",
				name, map[bool]string{true: "would be removed", false: "removed"}[dryRun])
		}
	}
	fmt.Fprintf(w, "%d of %d logs damaged\n", damaged, len(logs))
}
