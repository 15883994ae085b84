package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// RepairOptions selects what Repair repairs and how.
type RepairOptions struct {
	// Topic limits the repair to one topic ("" = every topic); Partition
	// to one of its partitions (< 0 = all).
	Topic     string
	Partition int
	Mode      storage.RepairMode
	// DryRun reports what would be dropped and changes nothing.
	DryRun bool
	// OneNodeCluster: the directory is a one-node cluster member's, whose
	// metadata log has no other copy: it is repaired too, below what
	// meta.json applied (MetaNotCutBelowApplied). Only with every topic.
	OneNodeCluster bool
}

// RepairedLog is what Repair found in one log and did with it.
type RepairedLog struct {
	// Topic and Partition name a partition log; Group is set (with Topic)
	// for a consumer group's ack ledger.
	Topic     string
	Partition int
	Group     string
	Dir       string
	Report    storage.RepairReport
	// EpochFileRemoved: the partition's epoch file was corrupt and was
	// removed (the next open starts one past the log's last epoch).
	EpochFileRemoved bool
	// TopicsRebuilt is set on the entry of a corrupt topics.json, rebuilt
	// from the topic directories: how many topics it lists now.
	TopicsRebuilt int
	// GroupsReset is set on the entry of a corrupt groups.json, removed:
	// the groups' members are forgotten and JOIN again (their heartbeats
	// get STALE_ASSIGNMENT); acks live in the ledgers and are kept.
	GroupsReset bool
	// HardStateReset and SnapshotPointReset: a cluster partition's only
	// replica had its hard state or snapshot point damaged; each is
	// rewritten from its repaired log (replog.AloneRepair).
	HardStateReset, SnapshotPointReset bool
	// DedupSnapshotRemoved: the partition's dedup snapshot and its copy
	// were removed (their point was dropped, or a torn tail cut with the
	// epoch file or hard state rebuilt; or they were unreadable): after
	// retention, the producers whose every record was deleted are
	// forgotten there, and their retries append again.
	DedupSnapshotRemoved bool
	// LedgerSnapshotRemoved is set (with Group and Topic) on the entry of
	// a group's damaged ledger-snapshot, removed: the group's acks are
	// forgotten and its messages delivered again.
	LedgerSnapshotRemoved bool
}

// Damaged reports whether the log needed a repair.
func (r RepairedLog) Damaged() bool {
	return len(r.Report.Damage) > 0 || r.Report.TornTail != nil || r.EpochFileRemoved || r.TopicsRebuilt > 0 || r.GroupsReset ||
		r.HardStateReset || r.SnapshotPointReset || r.LedgerSnapshotRemoved
}

// topicsFromDirectories lists the topics of topics/<key>/<partition>/
// (key = meta.TopicKey) with their partition counts and default settings:
// of a name, the highest incarnation found.
func topicsFromDirectories(fsys vfs.FS, dataDir string) ([]storedTopic, error) {
	names, err := fsys.List(path.Join(dataDir, "topics"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node: repair: list topics: %w", err)
	}
	var out []storedTopic
	for _, key := range names {
		name, inc, ok := meta.ParseTopicKey(key)
		if !ok {
			continue
		}
		parts, err := fsys.List(path.Join(dataDir, "topics", key))
		if err != nil {
			continue // not a directory
		}
		count := 0
		for _, p := range parts {
			if i, err := strconv.Atoi(p); err == nil && i >= 0 && i+1 > count {
				count = i + 1
			}
		}
		if count == 0 {
			continue
		}
		st := storedTopic{TopicConfig: wire.TopicConfig{Name: name, Partitions: uint32(count), Replicas: 1}, Incarnation: inc}
		if i := slices.IndexFunc(out, func(o storedTopic) bool { return o.Name == name }); i >= 0 {
			if out[i].Incarnation < inc {
				out[i] = st
			}
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// Repair checks every log of the single-node data directory dataDir (which
// no node may have open) and repairs what is damaged (storage.Repair):
// partition logs, their epoch files and consumer groups' ack ledgers. A
// salvaged ledger forgets the acks it lost: those messages are delivered
// again (at least once), never skipped. In a cluster member's data
// directory it repairs the partitions this node holds alone
// (repairMembersAlone).
func Repair(fsys vfs.FS, dataDir string, o RepairOptions) ([]RepairedLog, error) {
	lock, err := lockDataDir(fsys, dataDir)
	if err != nil {
		return nil, fmt.Errorf("repair: %w; stop the node first", err)
	}
	defer lock.Close()
	if _, err := fsys.List(path.Join(dataDir, "meta")); err == nil {
		return repairMembersAlone(fsys, dataDir, o)
	}
	n := &Node{cfg: Config{Env: env.Env{FS: fsys}.WithDefaults(), DataDir: dataDir}}
	var out []RepairedLog
	configs, _, err := n.loadTopics() // a damaged file's copy: the node writes both again at start
	if errors.Is(err, storage.ErrCorrupt) {
		// The topic list is lost; the partition directories remain. Each
		// topic comes back with its partition count and default settings
		// (its retention is forgotten: reported, to be set again).
		if configs, err = topicsFromDirectories(fsys, dataDir); err == nil {
			out = append(out, RepairedLog{Partition: -1, Dir: path.Join(dataDir, topicsFile), TopicsRebuilt: len(configs)})
			if !o.DryRun {
				n.topics = map[string]*topic{}
				for _, tc := range configs {
					n.topics[tc.Name] = &topic{cfg: tc.TopicConfig, incarnation: tc.Incarnation}
				}
				err = n.saveTopicsLocked()
			}
		}
	}
	if err != nil {
		return nil, err
	}
	found := o.Topic == ""
	for _, tc := range configs {
		if o.Topic != "" && tc.Name != o.Topic {
			continue
		}
		found = true
		if o.Partition >= int(tc.Partitions) {
			return nil, fmt.Errorf("node: repair: topic %s has %d partitions, no partition %d", tc.Name, tc.Partitions, o.Partition)
		}
		for p := 0; p < int(tc.Partitions); p++ {
			if o.Partition >= 0 && p != o.Partition {
				continue
			}
			dir := path.Join(dataDir, "topics", meta.TopicKey(tc.Name, tc.Incarnation), strconv.Itoa(p))
			// What the repair will drop is read first (a dry run), and the
			// dedup snapshots forget it before the log changes: a repair
			// interrupted after the log's rewrite finds no damage when run
			// again, and would leave them answering for records gone.
			// A log ending below its dedup snapshot's point lost durable
			// records: those seqs are dropped, never handed out again
			// (DurableTailNotTorn). Read once: the snapshot may go below.
			logOpts := storage.Options{DurableThrough: DurablePoint(fsys, dir), KeepTornSeqs: true}
			r := RepairedLog{Topic: tc.Name, Partition: p, Dir: dir}
			if r.Report, err = storage.Repair(fsys, dir, logOpts, o.Mode, true); err != nil {
				return out, fmt.Errorf("node: repair %s: %w", dir, err)
			}
			epochFile := path.Join(dir, "epoch")
			if _, err := storage.ReadFileAtomic(fsys, epochFile); errors.Is(err, storage.ErrCorrupt) {
				r.EpochFileRemoved = true
			}
			if r.dedupSnapshotStale() {
				if err := forgetDedupSnapshot(fsys, &r, o); err != nil {
					return out, err
				}
			}
			if !o.DryRun {
				if len(r.Report.Damage) > 0 || r.Report.TornTail != nil {
					if r.Report, err = storage.Repair(fsys, dir, logOpts, o.Mode, false); err != nil {
						return out, fmt.Errorf("node: repair %s: %w", dir, err)
					}
				}
				if r.EpochFileRemoved {
					if err := removeDurably(fsys, epochFile); err != nil {
						return out, fmt.Errorf("node: repair: remove %s: %w", epochFile, err)
					}
				}
			}
			out = append(out, r)
		}
	}
	if !found {
		return nil, fmt.Errorf("node: repair: no topic %q in %s", o.Topic, dataDir)
	}
	if o.Partition >= 0 {
		return out, nil // a partition was named: its log only
	}
	if o.Topic == "" {
		// One damaged copy is the node's to write again at start
		// (GroupsKeptTwice); with both damaged the state is lost.
		file := path.Join(dataDir, groupsFile)
		if _, _, err := storage.ReadFileEither(fsys, file); errors.Is(err, storage.ErrCorrupt) {
			out = append(out, RepairedLog{Partition: -1, Dir: file, GroupsReset: true})
			if !o.DryRun {
				for _, f := range []string{file, file + storage.CopySuffix} {
					if err := removeDurably(fsys, f); err != nil && !errors.Is(err, fs.ErrNotExist) {
						return out, fmt.Errorf("node: repair: remove %s: %w", f, err)
					}
				}
			}
		}
	}
	ledgers, err := ledgerDirs(fsys, path.Join(dataDir, "groups"))
	if err != nil {
		return out, err
	}
	for _, l := range ledgers {
		if o.Topic != "" && l.topic != o.Topic {
			continue
		}
		r := RepairedLog{Topic: l.topic, Partition: -1, Group: l.group, Dir: l.dir}
		if l.snapshot {
			if !ledgerSnapshotDamaged(fsys, l.dir) {
				continue
			}
			// The group's done state is lost: without the file the group
			// starts from generation 0 (its other generations are
			// removed as stale) and delivers every message again.
			r.LedgerSnapshotRemoved = true
			if !o.DryRun {
				if err := removeDurably(fsys, l.dir); err != nil {
					return out, fmt.Errorf("node: repair: remove %s: %w", l.dir, err)
				}
			}
			out = append(out, r)
			continue
		}
		// A ledger ending below its synced mark lost confirmed acks to
		// damage: their seqs are dropped, not cut as a torn tail.
		mark, _ := readSyncedMark(fsys, l.dir)
		if r.Report, err = storage.Repair(fsys, l.dir, storage.Options{DurableThrough: mark}, o.Mode, o.DryRun); err != nil {
			return out, fmt.Errorf("node: repair %s: %w", l.dir, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// dedupSnapshotStale reports whether a single node's repair would leave
// its partition's dedup snapshots possibly lying
// (RepairKeepsTrueDedupSnapshots): when it drops damaged ranges (a
// snapshot may know of records gone, whose retries must append again:
// forgetDedupSnapshot), or cuts a torn tail with the epoch file
// removed — the next reign may then reuse the epoch of a cut entry the
// snapshot stands for, and SnapshotUsable would take it. A torn tail
// alone is what any restart cuts, and the next open uses the snapshot
// only while the log still holds its point (the epoch file makes the next
// reign's epoch new); an epoch file alone changes no record. Those leave
// the snapshots as they are: on a single node with retention they are the
// only memory of producers whose every record was deleted, and removing
// them made those producers' retries append again (found by `nereus sim
// --retention`, seed 126).
func (r RepairedLog) dedupSnapshotStale() bool {
	return len(r.Report.Damage) > 0 || r.Report.DroppedSeqs > 0 || r.Report.TornTail != nil && r.EpochFileRemoved
}

// forgetDedupSnapshot makes the dedup snapshot and its copy of a
// partition log the repair is about to change forget the records the
// repair drops (or fills with lost records), before the log changes: a
// retry of one must append it again, not be answered as a duplicate of
// what is gone. Each is rewritten without the appends at those seqs
// (partition.ForgetGoneSeqs), and kept: after retention it may be the
// only memory of producers whose every record was deleted
// (RepairKeepsTrueDedupSnapshots). One whose point is dropped, or that
// does not decode, is removed. A torn tail cut where the next reign's
// epoch is not known to be new — the epoch file (a single node) or the
// hard state (a cluster partition's only replica) rebuilt from the
// repaired log — removes both: that reign may write the cut seqs again
// under a cut entry's epoch, which a snapshot's point would then match
// (dedupSnapshotStale).
func forgetDedupSnapshot(fsys vfs.FS, r *RepairedLog, o RepairOptions) error {
	gone := r.goneSeqs()
	removeAll := r.Report.TornTail != nil && (r.EpochFileRemoved || r.HardStateReset)
	found, kept := false, false
	for _, name := range []string{dedupSnapshotFile, dedupSnapshotCopyFile} {
		file := path.Join(r.Dir, name)
		b, err := storage.ReadFileAtomic(fsys, file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		found = true
		if err == nil && !removeAll {
			var rewritten []byte
			if rewritten, err = partition.ForgetGoneSeqs(b, gone); err == nil {
				kept = true
				if bytes.Equal(rewritten, b) || o.DryRun {
					continue
				}
				if err := storage.WriteFileAtomic(fsys, file, rewritten); err != nil {
					return fmt.Errorf("node: repair: rewrite %s: %w", file, err)
				}
				continue
			}
		}
		if o.DryRun {
			continue
		}
		if err := removeDurably(fsys, file); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("node: repair: remove %s: %w", file, err)
		}
	}
	r.DedupSnapshotRemoved = found && !kept
	return nil
}

// goneSeqs reports whether the repair drops seq: every damaged seq, and
// in truncate mode every seq after the first (a cluster partition's only
// replica fills them with lost records instead).
func (r RepairedLog) goneSeqs() func(seq uint64) bool {
	return func(seq uint64) bool {
		return slices.ContainsFunc(r.Report.Dropped, func(g storage.SeqRange) bool { return g.First <= seq && seq <= g.Last })
	}
}

// removeDurably removes file and syncs its directory: what a repair
// removes must stay removed through a power loss right after it (a
// damaged file back would be refused again; a dedup snapshot back would
// answer a lost record's retry as a duplicate).
func removeDurably(fsys vfs.FS, file string) error {
	if err := fsys.Remove(file); err != nil {
		return err
	}
	return fsys.SyncDir(path.Dir(file))
}

// repairMembersAlone repairs, in a cluster member's data directory, the
// logs of the partitions with one replica (replog.RepairAlone: a damaged
// range's seqs become lost records; salvage only). A replica of a larger
// group drops its damage and rebuilds from a healthy one at start: it is
// not listed. The topics come from the applied metadata (meta.json).
func repairMembersAlone(fsys vfs.FS, dataDir string, o RepairOptions) ([]RepairedLog, error) {
	if o.Mode != storage.RepairSalvage {
		return nil, fmt.Errorf("node: repair: a cluster member's partitions are repaired with salvage only, not %v", o.Mode)
	}
	b, err := storage.ReadFileAtomic(fsys, path.Join(dataDir, cluster.MetaStateFile))
	if errors.Is(err, storage.ErrCorrupt) {
		// Which partitions this node holds alone is in it: the node itself
		// rebuilds it from its metadata log (only committed entries, which
		// an offline replay could not tell).
		return nil, fmt.Errorf("node: repair: %s is damaged: start the node once (it rebuilds the file from the metadata log), stop it, and repair again: %w", cluster.MetaStateFile, err)
	}
	if err != nil {
		return nil, fmt.Errorf("node: repair: read the applied metadata: %w", err)
	}
	st := meta.New()
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("node: repair: %s: %w", cluster.MetaStateFile, err)
	}
	var out []RepairedLog
	if o.OneNodeCluster && o.Topic == "" {
		r, err := repairMetaAlone(fsys, dataDir, st.Applied, o.DryRun)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	found := o.Topic == ""
	for _, t := range st.Sorted() {
		if o.Topic != "" && t.Config.Name != o.Topic {
			continue
		}
		found = true
		if o.Partition >= int(t.Config.Partitions) {
			return nil, fmt.Errorf("node: repair: topic %s has %d partitions, no partition %d", t.Config.Name, t.Config.Partitions, o.Partition)
		}
		for p, replicas := range t.Placement {
			if len(replicas) != 1 || o.Partition >= 0 && p != o.Partition {
				continue
			}
			dir := path.Join(dataDir, "topics", meta.TopicKey(t.Config.Name, t.Incarnation), strconv.Itoa(p))
			if _, err := fsys.List(dir); err != nil {
				continue // another node's
			}
			// As on a single node: the dedup snapshot forgets what the
			// repair will drop before the log changes, and a tail lost
			// below its point is damage.
			logOpts := storage.Options{DurableThrough: DurablePoint(fsys, dir), KeepTornSeqs: true}
			alone, err := replog.RepairAlone(fsys, dir, replica.NodeID(replicas[0]), logOpts, true)
			if err != nil {
				return out, fmt.Errorf("node: repair %s: %w", dir, err)
			}
			r := RepairedLog{Topic: t.Config.Name, Partition: p, Dir: dir, Report: alone.Log,
				HardStateReset: alone.HardStateReset, SnapshotPointReset: alone.SnapshotPointReset}
			if r.Damaged() {
				if err := forgetDedupSnapshot(fsys, &r, o); err != nil {
					return out, err
				}
			}
			if !o.DryRun && r.Damaged() {
				if alone, err = replog.RepairAlone(fsys, dir, replica.NodeID(replicas[0]), logOpts, false); err != nil {
					return out, fmt.Errorf("node: repair %s: %w", dir, err)
				}
				r.Report = alone.Log
			}
			out = append(out, r)
		}
	}
	if !found {
		return nil, fmt.Errorf("node: repair: no topic %q in %s", o.Topic, dataDir)
	}
	return out, nil
}

// repairMetaAlone repairs a one-node cluster's metadata log, its only
// member node 1's: each damaged range becomes lost records (the applier
// skips them), an invalid tail below applied — the seq meta.json applied
// through, which the node's state keeps — is a damaged range too, so no
// seq it applied is handed out again. What the lost entries did stays in
// meta.json; only a replay of the log (a damaged meta.json) would miss it.
func repairMetaAlone(fsys vfs.FS, dataDir string, applied uint64, dryRun bool) (RepairedLog, error) {
	dir := path.Join(dataDir, "meta")
	logOpts := storage.Options{DurableThrough: applied}
	alone, err := replog.RepairAlone(fsys, dir, 1, logOpts, true)
	r := RepairedLog{Topic: meta.MetaTopic, Dir: dir, Report: alone.Log, HardStateReset: alone.HardStateReset, SnapshotPointReset: alone.SnapshotPointReset}
	if err == nil && !dryRun && r.Damaged() {
		alone, err = replog.RepairAlone(fsys, dir, 1, logOpts, false)
		r.Report = alone.Log
	}
	if err != nil {
		return RepairedLog{}, fmt.Errorf("node: repair %s: %w", dir, err)
	}
	return r, nil
}

// ledgerDir is a consumer group's ack ledger directory on a topic — or,
// with snapshot, its ledger-snapshot file.
type ledgerDir struct {
	group, topic, dir string
	snapshot          bool
}

// ledgerSnapshotDamaged reports whether the ledger-snapshot file fails
// its checksum or does not decode.
func ledgerSnapshotDamaged(fsys vfs.FS, file string) bool {
	b, err := storage.ReadFileAtomic(fsys, file)
	if err == nil {
		_, err = decodeLedgerSnapshot(b)
	}
	return errors.Is(err, storage.ErrCorrupt) || errors.Is(err, errBadLedgerSnapshot)
}

// ledgerDirs lists groups/<group>/<topic>/ledger* directories and
// ledger-snapshot files.
func ledgerDirs(fsys vfs.FS, groupsDir string) ([]ledgerDir, error) {
	groups, err := fsys.List(groupsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node: repair: list %s: %w", groupsDir, err)
	}
	var out []ledgerDir
	for _, g := range slices.Sorted(slices.Values(groups)) {
		topics, err := fsys.List(path.Join(groupsDir, g))
		if err != nil {
			continue // a file, not a group
		}
		for _, t := range slices.Sorted(slices.Values(topics)) {
			entries, err := fsys.List(path.Join(groupsDir, g, t))
			if err != nil {
				continue
			}
			for _, e := range slices.Sorted(slices.Values(entries)) {
				dir := path.Join(groupsDir, g, t, e)
				if e == ledgerSnapshotFile {
					out = append(out, ledgerDir{group: g, topic: t, dir: dir, snapshot: true})
					continue
				}
				if !strings.HasPrefix(e, "ledger") {
					continue
				}
				if _, err := fsys.List(dir); err == nil {
					out = append(out, ledgerDir{group: g, topic: t, dir: dir})
				}
			}
		}
	}
	return out, nil
}
