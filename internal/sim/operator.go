package sim

import (
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The single node's operator: it watches the node's WARN and ERROR lines
// (and its failed starts), and when one asks for `nereus repair` it does
// what docs/OPERATIONS.md says — stops the node, runs `nereus repair
// --salvage` on its data directory and starts it again. What the repair
// dropped goes to the checker: loss in a damaged partition, acks a
// damaged ledger forgot.

// watchForRepair makes the operator act on the node's requests for a
// repair, and tells the checker of an ack ledger's tail cut after a bit
// flip hit a ledger segment: a flipped last batch cannot be told from a
// torn write, and its acks are forgotten (TestAckLedgerTornTailIsSaid).
func (s *sim) watchForRepair() {
	s.b.onLog = func(r slog.Record) {
		msg := r.Message
		s.nodeLines[msg]++
		if strings.HasPrefix(msg, "ack ledger torn tail truncated") {
			var file string
			var off int64
			r.Attrs(func(a slog.Attr) bool {
				switch a.Key {
				case "file":
					file = a.Value.String()
				case "offset":
					if a.Value.Kind() == slog.KindInt64 {
						off = a.Value.Int64()
					}
				}
				return true
			})
			s.ledgerTailCut(file, off, logAttrUint(r, "first_seq"))
		}
		if msg == tornTailMessage && logAttrString(r, "topic") == simTopic {
			s.tornTailCut(uint32(logAttrUint(r, "partition")), tornTailOf(r))
		}
		if strings.Contains(msg, "nereus repair") {
			s.askRepair(msg)
		}
	}
	s.b.beforeStart = s.readDurablePoints
}

// readDurablePoints reads each partition's durable point (its dedup
// snapshots' and its synced mark's) and each ack ledger's synced mark, as
// the node reads them before it opens its logs and as a repair does.
func (s *sim) readDurablePoints() {
	clear(s.durable)
	for p := range uint32(s.opts.Partitions) {
		if point := node.DurablePoint(s.b.fs, partitionDir(p)); point > 0 {
			s.durable[p] = point
		}
	}
	s.ledgerDurable = node.LedgerMarks(s.b.fs, dataDir)
}

// tornTailCut takes in a start's or a repair's torn tail t cut of
// partition p (cutCommitted).
func (s *sim) tornTailCut(p uint32, t storage.TornTail) {
	if s.cutCommitted(p, t, s.chk.maxCommit[commitKey{partition: p}]) && s.logWatch != nil {
		s.logWatch.forgetCut(p, t.FirstSeq)
	}
}

// tornTailOf is the torn tail a node's TornTailMessage line r says.
func tornTailOf(r slog.Record) storage.TornTail {
	t := storage.TornTail{FirstSeq: logAttrUint(r, "first_seq"), LastSeq: logAttrUint(r, "kept_through")}
	t.Kept = t.Named()
	return t
}

// cutCommitted judges a torn tail t cut of partition p,
// its highest commit_seq seen committed. Only records never synced may
// go so: a cut at or below the partition's durable point (its dedup
// snapshot's, its synced mark's) breaks DurableTailNotTorn, and one of
// committed records breaks VisibleMonotonic — unless a bit flip hit the
// partition and the point does not stand for them (a crash since it was
// written): a flip into the last batches looks exactly like a torn write
// (a documented gap). It reports whether committed records were cut:
// the seqs the node kept (storage.Options.KeepTornSeqs) are lost like a
// repair's dropped ones, positions after them may hold other records
// (checker.reused).
func (s *sim) cutCommitted(p uint32, t storage.TornTail, committed uint64) bool {
	chk, first := s.chk, t.FirstSeq
	if t.Kept {
		chk.tornKept(p, storage.SeqRange{First: first, Last: t.LastSeq})
	}
	switch {
	case first <= s.durable[p]:
		chk.violate(DurableTailNotTorn, "partition %d's log was cut from seq %d as a torn tail, below seq %d its durable point stood for", p, first, s.durable[p])
	case first > committed:
	case !chk.damaged[p]:
		chk.violate(VisibleMonotonic, "partition %d's log was cut from seq %d as a torn tail, below its commit_seq %d", p, first, committed)
	default:
		if t.Kept {
			chk.dropped(p, []storage.SeqRange{{First: first, Last: t.LastSeq}})
			first = t.LastSeq + 1
		}
		if committed >= first {
			chk.cutFrom(p, first)
		}
		return true
	}
	return false
}

// askRepair pages the operator, who repairs the node a while later (once
// for every request made meanwhile).
func (s *sim) askRepair(msg string) {
	if s.repairDue || s.b.stopRestarts {
		return
	}
	s.repairDue = true
	s.w.tracef("operator asked to repair: %s", msg)
	s.w.after(s.w.between(50, 500), s.operatorRepair)
}

// operatorRepair stops the node, repairs its data directory and starts it
// again. A repair the disk's own faults failed (they hit the tool too) is
// run again a while later, the node down meanwhile: each segment is
// replaced atomically, so running it again is what OPERATIONS.md says.
func (s *sim) operatorRepair() {
	s.repairDue = false
	if s.b.stopRestarts { // the final phase repairs on its own
		return
	}
	s.b.stopRestarts = true
	s.b.crash()
	s.b.stopRestarts = false
	if err := s.repair(); err != nil {
		s.askRepair(fmt.Sprintf("the repair failed: %v", err))
		return
	}
	s.b.start()
	s.restoreRetention()
}

// restoreRetention is the operator checking the topic's settings after a
// repair and setting its retention again when the repair rebuilt
// topics.json (OPERATIONS: `nereus topic update`); a node that is down, a
// topic not there yet or an update that fails is tried again a while
// later.
func (s *sim) restoreRetention() {
	s.restoreDue = false
	if !s.settingsUnchecked {
		return
	}
	if !s.b.up {
		s.askRestoreRetention()
		return
	}
	md := s.b.node.Metadata([]string{simTopic})
	if len(md) != 1 {
		s.askRestoreRetention()
		return
	}
	if s.retentionKept(md[0].Config) {
		s.settingsUnchecked, s.retentionLost = false, false
		return
	}
	s.retentionLost = true
	u := wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: simTopic}, Set: wire.SetRetentionMs | wire.SetRetentionBytes,
		RetentionMs: s.retentionMs, RetentionBytes: s.retentionBytes}
	s.b.node.UpdateTopic(u, func(_ wire.TopicConfig, _ uint64, err error) {
		if err != nil {
			s.w.tracef("operator: topic update failed: %v", err)
			s.askRestoreRetention()
			return
		}
		s.settingsUnchecked, s.retentionLost = false, false
		s.repaired["retention set again"]++
		s.w.tracef("operator: topic update set the retention lost with topics.json again")
	})
}

// askRestoreRetention runs restoreRetention a while later, once.
func (s *sim) askRestoreRetention() {
	if !s.restoreDue {
		s.restoreDue = true
		s.w.after(s.w.between(1, 100), s.restoreRetention)
	}
}

// retentionKept reports whether c has the retention the topic was
// declared with.
func (s *sim) retentionKept(c wire.TopicConfig) bool {
	return c.RetentionMs == s.retentionMs && c.RetentionBytes == s.retentionBytes
}

// repair runs `nereus repair --salvage` on the stopped node's data
// directory and tells the checker what it dropped. An armed kill point
// kills the repair itself -9 (the disk keeps what it synced): it is
// interrupted, and run again.
func (s *sim) repair() (err error) {
	defer func() {
		if r := recover(); r != nil {
			k, ok := r.(killSignal)
			if !ok {
				panic(r)
			}
			s.b.fs.Crash(s.w.rng)
			s.repaired["killed, run again"]++
			err = fmt.Errorf("repair killed -9 at %s", k.at)
		}
	}()
	s.settingsUnchecked = true // topics.json may be rebuilt, even by a repair killed before it says so
	// What it will drop, read first (a dry run changes nothing): a
	// repair killed after the log's rewrite drops nothing when run again.
	opts := node.RepairOptions{Partition: -1, Mode: storage.RepairSalvage, DryRun: true}
	plan, err := node.Repair(s.b.fs, dataDir, opts)
	if err != nil {
		return err
	}
	s.readDurablePoints() // what the repair reads too
	for _, l := range plan {
		if l.Topic == simTopic && l.Group == "" && l.Partition >= 0 {
			s.chk.dropped(uint32(l.Partition), l.Report.Dropped)
			if t := l.Report.TornTail; t != nil {
				s.tornTailCut(uint32(l.Partition), *t)
			}
		}
	}
	opts.DryRun = false
	logs, err := node.Repair(s.b.fs, dataDir, opts)
	if err != nil {
		return err
	}
	s.repairs++
	s.dedupSnapshotsLeft()
	for _, l := range logs {
		if !l.Damaged() {
			continue
		}
		s.w.tracef("repair %s: %d damaged ranges, %d seqs dropped, torn tail %v, epoch file removed %v, topics rebuilt %d, ledger snapshot removed %v",
			strings.TrimPrefix(l.Dir, dataDir+"/"), len(l.Report.Damage), l.Report.DroppedSeqs, l.Report.TornTail != nil,
			l.EpochFileRemoved, l.TopicsRebuilt, l.LedgerSnapshotRemoved)
		if l.Group != "" {
			s.ledgerRepaired(l)
		}
		for what, done := range map[string]bool{"partition ranges dropped": l.Group == "" && len(l.Report.Damage) > 0,
			"ledger ranges dropped": l.Group != "" && len(l.Report.Damage) > 0, "ledger snapshot removed": l.LedgerSnapshotRemoved,
			"epoch file removed": l.EpochFileRemoved, "topics rebuilt": l.TopicsRebuilt > 0, "groups reset": l.GroupsReset} {
			if done {
				s.repaired[what]++
			}
		}
	}
	return nil
}

// dedupSnapshotsLeft makes a partition left without a readable dedup
// snapshot or copy forgetful: a producer whose every record retention
// deleted is forgotten there (the repair removed them, or they were
// unreadable; a repair killed -9 may have removed them before saying so).
func (s *sim) dedupSnapshotsLeft() {
	if s.logWatch == nil {
		return
	}
	for p := range uint32(s.opts.Partitions) {
		dir := partitionDir(p)
		left := false
		for _, name := range []string{"dedup", "dedup.copy"} {
			if _, err := storage.ReadFileAtomic(s.b.fs, path.Join(dir, name)); err == nil {
				left = true
			}
		}
		if !left && !s.logWatch.forgetful[p] {
			s.logWatch.forgetful[p] = true
			s.w.tracef("checker: partition %d has no dedup snapshot after the repair: a retry of a producer retention deleted may append again", p)
		}
	}
}

// flipStateBit flips one bit of one of the single node's state files: a
// group's ack ledger (a segment, or its snapshot), settings.json or an
// incarnation copy, groups.json or its copy (with Options.Members), a
// partition's epoch file, dedup snapshot or its copy, or topics.json or
// its copy;
// half the time the node is killed -9 at once, so its restart reads the
// file. What each must come to is in docs/OPERATIONS.md (Corruption and
// repair): refused with DATA_CORRUPT until a repair (the ledger, the
// epoch file), set again (the group's files), replayed from the log or
// read from the copy (the dedup snapshot), read from the other copy and
// written again (topics.json, groups.json), or a start that fails until a
// repair (both copies of groups.json: its members join again; of
// topics.json: the operator sets its retention again).
func (s *sim) flipStateBit() {
	fs := s.b.fs
	var files []string
	switch s.w.rng.IntN(5) {
	case 0:
		files = groupLedgerFiles(fs)
	case 1:
		files = groupStateFiles(fs)
		for _, name := range []string{"groups.json", "groups.json.copy"} { // Options.Members
			if f := path.Join(dataDir, name); fileExists(fs, f) {
				files = append(files, f)
			}
		}
	case 2:
		for p := uint32(0); p < s.opts.Partitions; p++ {
			for _, name := range []string{"epoch", "dedup", "dedup.copy"} {
				if f := path.Join(partitionDir(p), name); fileExists(fs, f) {
					files = append(files, f)
				}
			}
		}
	case 3:
		files = []string{path.Join(dataDir, "topics.json"), path.Join(dataDir, "topics.json.copy")}
	default:
		if f := path.Join(dataDir, "groups", simGroup, simTopic, "ledger-snapshot"); fileExists(fs, f) {
			files = []string{f}
		}
	}
	if len(files) == 0 {
		return
	}
	file := files[s.w.rng.IntN(len(files))]
	if !s.flipFileBit(file) {
		return
	}
	// (topics.json's draw comes from a stream of its own, so that the runs
	// whose flips miss it keep their traces of before.)
	base, twice := strings.CutSuffix(path.Base(file), ".copy")
	if (base == "groups.json" && s.w.rng.IntN(3) == 0) || (base == "topics.json" && s.doubleFlips.IntN(3) == 0) {
		// A double fault, now and then: both copies damaged keep the
		// node down until the operator's repair — which forgets its
		// members (groups.json), or the topic's settings (topics.json),
		// which the operator then sets again (restoreRetention).
		other := path.Join(dataDir, base)
		if !twice {
			other += ".copy"
		}
		s.flipFileBit(other)
	}
	if s.w.rng.IntN(2) == 0 {
		s.b.crash()
	}
}

// flipFileBit flips a random bit of file, when it holds any, and tells
// the checker.
func (s *sim) flipFileBit(file string) bool {
	fs := s.b.fs
	size, err := fs.Stat(file)
	if err != nil || size == 0 {
		return false
	}
	off := s.w.rng.Int64N(size)
	content, _ := fs.ReadFile(file) // before the flip: what its batches held
	bit := uint(s.w.rng.IntN(8))
	if err := fs.FlipBit(file, off, bit); err != nil {
		return false
	}
	s.chk.stateFlips++
	s.stateFlips[flipKind(file)]++
	if flipKind(file) == "ledger segment" {
		s.ledgerFlipped(file, content, off, byte(1)<<bit, ledgerRecordAcks)
	}
	s.w.tracef("fault bit flip %s@%d", strings.TrimPrefix(file, dataDir+"/"), off)
	return true
}

// flipKind names the kind of state file a flip hit (Result.StateFlips).
func flipKind(file string) string {
	if strings.HasSuffix(file, ".log") {
		return "ledger segment"
	}
	return path.Base(file)
}

// groupLedgerFiles lists the segments of every group's ack ledger on fs
// (groups/<group>/<topic>/ledger/, generation 0, and ledger-<generation>/).
func groupLedgerFiles(fs *vfs.MemFS) []string {
	var files []string
	root := path.Join(dataDir, "groups")
	groups, _ := fs.List(root)
	for _, g := range groups {
		topics, _ := fs.List(path.Join(root, g))
		for _, t := range topics {
			dirs, _ := fs.List(path.Join(root, g, t))
			for _, d := range dirs {
				if d != "ledger" && !strings.HasPrefix(d, "ledger-") || d == "ledger-snapshot" {
					continue
				}
				names, _ := fs.List(path.Join(root, g, t, d))
				for _, n := range names {
					if strings.HasSuffix(n, ".log") {
						files = append(files, path.Join(root, g, t, d, n))
					}
				}
			}
		}
	}
	return files
}

// ledgerFlip is what bit flips hit in one ack ledger (a generation's
// directory): the acks of each record of the segments they hit, by
// ledger seq, and the acks of the batches they hit.
type ledgerFlip struct {
	acksAt  map[uint64][]position
	flipped []flippedBatch
}

// flippedBatch is a ledger batch a flip hit: its segment, where it
// starts, the acks it held, and the flipped byte and bit.
type flippedBatch struct {
	file   string
	offset int64
	acks   []position
	at     int64
	mask   byte
}

// recordAcks reads a record of a log holding a group's acks: the acks
// it holds, and known false when it holds them folded (a checkpoint),
// so that its loss may take any.
type recordAcks func(r *storage.Record) (acks []position, known bool)

// ledgerRecordAcks reads a record of a single node's ack ledger.
func ledgerRecordAcks(r *storage.Record) (acks []position, known bool) {
	if len(r.Headers) == 0 { // an ack record (node/ledger.go); the others hold counts
		acklog.ForEachAck(r.Value, func(k acklog.Key) { acks = append(acks, position{k.Partition, k.Seq}) })
	}
	return acks, true
}

// partitionRecordAcks reads a record of a cluster partition's log, which
// holds the group's acks of that partition among its messages.
func partitionRecordAcks(r *storage.Record) (acks []position, known bool) {
	keys, summary := node.GroupRecordAcks(r)
	for _, k := range keys {
		acks = append(acks, position{k.Partition, k.Seq})
	}
	return acks, !summary
}

// ledgerFlipped notes a flip of mask at off of a segment of a log holding
// a group's acks (read by acksOf) whose content was content: the acks
// its batches held, so that a repair or a cut tail makes the checker
// forget only those it drops. The earlier flips into its batches that no
// cut or repair answered yet are undone in content first, or the batches
// after the first would not be read.
func (s *sim) ledgerFlipped(file string, content []byte, off int64, mask byte, acksOf recordAcks) {
	dir := path.Dir(file)
	f := s.ledgerFlips[dir]
	if f == nil {
		f = &ledgerFlip{acksAt: map[uint64][]position{}}
		s.ledgerFlips[dir] = f
	}
	for _, b := range f.flipped {
		if b.file == file && b.at < int64(len(content)) {
			content[b.at] ^= b.mask
		}
	}
	for _, b := range storage.SegmentBatches(content) {
		var inBatch []position
		for _, e := range b.Entries {
			acks, known := acksOf(&e.Record)
			if !known {
				delete(f.acksAt, e.Seq) // its loss may take any ack
				continue
			}
			f.acksAt[e.Seq] = acks
			inBatch = append(inBatch, acks...)
		}
		if g := b.Gap; g != nil {
			for seq := g.First; seq <= g.Last; seq++ {
				f.acksAt[seq] = nil // an earlier repair's gap: no ack
			}
		}
		if off >= b.Offset && off < b.End {
			f.flipped = append(f.flipped, flippedBatch{file: file, offset: b.Offset, acks: inBatch, at: off, mask: mask})
		}
	}
}

// ledgerTailCut: the node cut the tail of a ledger segment from off on,
// as a crash's torn write; a flipped batch there was cut with it, and
// the checker forgets its acks. (A cut of a segment no flip hit loses
// only acks never confirmed.)
func (s *sim) ledgerTailCut(file string, off int64, first uint64) {
	if mark := s.ledgerDurable[path.Dir(file)]; mark > 0 && first <= mark {
		s.chk.violate(DurableTailNotTorn, "ack ledger %s was cut from seq %d as a torn tail, at or below seq %d its synced mark stood for", strings.TrimPrefix(path.Dir(file), dataDir+"/"), first, mark)
	}
	f := s.ledgerFlips[path.Dir(file)]
	if f == nil {
		return
	}
	f.flipped = slices.DeleteFunc(f.flipped, func(b flippedBatch) bool {
		if b.file != file || b.offset < off {
			return false
		}
		s.w.tracef("checker: %d acks forgotten with the cut tail of %s", len(b.acks), strings.TrimPrefix(file, dataDir+"/"))
		s.chk.forgetAcks(b.acks)
		s.acksForgotten["cut tail"]++
		return true
	})
}

// ledgerRepaired tells the checker which confirmed acks a group's ledger
// repair dropped: every one with its snapshot; those of the dropped seqs
// (all of them when a dropped seq is one no flip showed: damage the
// simulator did not make); the flipped batches' with a cut tail.
func (s *sim) ledgerRepaired(l node.RepairedLog) {
	f := s.ledgerFlips[l.Dir]
	if l.LedgerSnapshotRemoved {
		s.w.tracef("checker: every ack forgotten with %s", strings.TrimPrefix(l.Dir, dataDir+"/"))
		s.chk.acksForgotten()
		s.acksForgotten["ledger snapshot"]++
		return
	}
	if len(l.Report.Dropped) > 0 {
		var acks []position
		for _, r := range l.Report.Dropped {
			for seq := r.First; seq <= r.Last; seq++ {
				held, known := f.acksAtSeq(seq)
				if !known {
					s.w.tracef("checker: every ack forgotten: %s dropped seq %d, which no flip showed", strings.TrimPrefix(l.Dir, dataDir+"/"), seq)
					s.chk.acksForgotten()
					s.acksForgotten["unknown damage"]++
					return
				}
				acks = append(acks, held...)
			}
		}
		s.w.tracef("checker: %d acks of %s forgotten with its dropped seqs", len(acks), strings.TrimPrefix(l.Dir, dataDir+"/"))
		s.chk.forgetAcks(acks)
		s.acksForgotten["dropped seqs"]++
	}
	if t := l.Report.TornTail; t != nil {
		s.ledgerTailCut(t.Segment, t.Offset, t.FirstSeq)
	}
	if l.Damaged() {
		delete(s.ledgerFlips, l.Dir) // answered: the repaired ledger holds no flipped byte
	}
}

// acksAtSeq returns the acks the ledger record at seq held, and whether a
// flip showed it (f may be nil).
func (f *ledgerFlip) acksAtSeq(seq uint64) ([]position, bool) {
	if f == nil {
		return nil, false
	}
	acks, ok := f.acksAt[seq]
	return acks, ok
}
