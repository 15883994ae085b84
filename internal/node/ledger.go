package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/delivery"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A single node's ack ledger (fileLedger): each group's acks and delivery
// counts appended to a storage log of its own and fsynced before their
// ACK_OKs, and compacted into snapshots.
//
// Ack ledger compaction.
//
// A group's durable done-state is a snapshot plus a ledger generation:
//
//	<group dir>/ledger-snapshot   atomic file: generation N, DoneState and delivery counts per partition
//	<group dir>/ledger-N/         the ledger of acks and delivery counts recorded after that snapshot
//
// Generation 0 has no snapshot and lives in <group dir>/ledger (the layout
// before compaction existed, which a node keeps reading unchanged). The
// snapshot file is the only commit point: whatever generation it names is
// live, and the ledger directories of every other generation are garbage.
//
// Compaction from generation N to N+1 runs right after a successful ledger
// flush, so the cursors' done state equals the durable one (every ack they
// hold was fsynced; nothing is batched). Its steps, and a crash after each:
//
//  1. Remove ledger-(N+1) and its files, left by an earlier attempt that
//     failed or crashed before its snapshot committed. Defensive: no ack
//     was ever appended there (appends go to a generation only after its
//     snapshot is durable), so they hold at most an empty segment. Crash:
//     the snapshot still names N and ledger-N is intact.
//  2. Open ledger-(N+1): an empty log (storage.Open syncs its directory into
//     the group dir). Crash: as 1; load replays N and removes N+1's files.
//  3. Write the snapshot {N+1, cursors' DoneState} with WriteFileAtomic
//     (temp file, fsync, rename, fsync of the group dir). Crash before the
//     rename is durable: the old snapshot (or none) names N, whose ledger
//     still holds every ack. Crash after: N+1's snapshot holds exactly the
//     durable done state and its ledger is empty. Either way no ACK_OK is
//     lost and no unacked seq becomes done. An error here is ambiguous (the
//     rename may be visible but not durable), so the group fails and
//     reloads: a load succeeds only after persisting the incarnation with
//     WriteFileAtomic in the group dir, and that fsync of the group dir
//     makes durable whichever snapshot load reads before any ack is
//     accepted against its generation (until then acks are refused).
//  4. Switch appends to ledger-(N+1) and close ledger-N.
//  5. Remove ledger-N (its files, then the directory), best effort.
//     Crash or error midway: the snapshot names N+1; the next load
//     removes what is left.
//
// Steps 1 and 2 change nothing durable, so their failure only defers the
// next attempt; step 3's failure goes through the group's failure/reload
// path like a failed ledger write.

// LedgerCompactBytesDefault is the ledger size (approximate bytes appended
// since the last snapshot) past which a group compacts its ack ledger.
const LedgerCompactBytesDefault = 8 << 20

const (
	ledgerDirGen0      = "ledger"
	ledgerDirPrefix    = "ledger-"
	ledgerSnapshotFile = "ledger-snapshot"
	// ledgerSnapshotMagic starts a snapshot with delivery counts;
	// ledgerSnapshotMagicV1 one without (written before counts were
	// persisted), which still decodes.
	ledgerSnapshotMagic   = "NLS2"
	ledgerSnapshotMagicV1 = "NLS1"
	// ledgerSnapshotMagicFenced: NLS2's layout and a fence (a replicated
	// group's checkpoint of a partition delivered to its members).
	ledgerSnapshotMagicFenced = "NLS3"
	// ledgerRecordOverheadBytes approximates the storage framing of one
	// ledger append (one record in one batch: 38 bytes of batch header and
	// 36 of record header) for the size accounting.
	ledgerRecordOverheadBytes = 38 + 36
)

// fileLedger is a single node's ack ledger: the live generation's
// storage log and its snapshot, owned by the group's goroutine.
type fileLedger struct {
	g *groupRunner

	log   *storage.Log // the live generation's ledger
	gen   uint64       // generation of log; names its directory
	bytes int64        // approximate bytes in log (replayed or flushed)
	// compactRetryBytes defers compaction after a failed attempt until
	// bytes reaches it; 0 = no deferral.
	compactRetryBytes int64
	// marks are the live generation's synced marks (syncedmark.go): a
	// confirmed ack in an idle ledger tail a bit flip hit is damage
	// after a crash, not a torn write forgetting it; nextMarkMs is the
	// current period's end.
	marks      syncedMarks
	nextMarkMs int64
}

// The local ledger's ack and count records have the layout of the
// replicated ack log's (internal/acklog).
const ledgerEntryBytes = acklog.AckEntryBytes

// ledgerKindHeader marks a local ledger record that holds delivery counts
// (an unmarked record holds acks, as before counts were persisted).
const ledgerKindHeader = "nereus-ledger"

func countRecord(batch []byte) storage.Record {
	return storage.Record{Value: batch, Headers: []storage.Header{{Key: ledgerKindHeader, Value: []byte(groupCount)}}}
}

func isCountRecord(r *storage.Record) bool {
	return len(r.Headers) == 1 && r.Headers[0].Key == ledgerKindHeader && string(r.Headers[0].Value) == groupCount
}

// replayCounts applies a count record's entries to the cursors.
func replayCounts(cursors []*delivery.Cursor, v []byte) error { return acklog.ReplayCounts(cursors, v) }

// replayAcks applies an ack record's entries to the cursors.
func replayAcks(cursors []*delivery.Cursor, v []byte) error { return acklog.ReplayAcks(cursors, v) }

// load restores the cursors from the live generation's snapshot and
// replays its ledger into them; it then removes the files of every other
// generation.
func (l *fileLedger) load(inc uint64) ([]*delivery.Cursor, error) {
	g, fsys := l.g, l.g.node.cfg.Env.FS
	snap, err := l.readSnapshot()
	if err != nil {
		return nil, err
	}
	dir := path.Join(g.dir, ledgerDirName(snap.gen))
	mark := g.node.syncedMark(dir, "group", g.name, "topic", g.topic.cfg.Name)
	lg, err := storage.Open(fsys, dir, storage.Options{DurableThrough: mark})
	if ce := (*storage.CorruptError)(nil); errors.As(err, &ce) {
		// Its tail below the mark was synced: damage, not a torn write.
		return nil, l.damage([]storage.Damage{ce.Damage})
	}
	if err != nil {
		return nil, fmt.Errorf("group %s: open ledger: %w", g.name, err)
	}
	if t, ok := lg.TornTail(); ok {
		// A crash's torn write holds only acks never confirmed; a bit
		// flipped in a last batch the synced mark does not cover looks
		// the same and forgets confirmed ones, whose messages come
		// again: said, as a partition's is.
		g.node.log.Warn("ack ledger torn tail truncated; acks in it are forgotten and their messages delivered again",
			"group", g.name, "topic", g.topic.cfg.Name, "file", t.Segment, "offset", t.Offset, "bytes_dropped", t.Bytes, "first_seq", t.FirstSeq)
	}
	cursors := make([]*delivery.Cursor, len(g.topic.partitions))
	for i, p := range g.topic.partitions {
		c, err := delivery.NewCursor(g.cfg, p.startSeq.Load(), inc<<40)
		if err != nil {
			lg.Close()
			return nil, err
		}
		// A snapshot from a topic with other partitions restores the
		// partitions both have; the rest start from the ledger alone.
		if err := snap.restore(i, c); err != nil {
			lg.Close()
			return nil, fmt.Errorf("group %s: restore partition %d: %w", g.name, i, err)
		}
		cursors[i] = c
	}
	// A gap (a repair dropped damaged ledger records) replays nothing: the
	// acks it held are forgotten and their messages delivered again.
	var ledgerBytes int64
	var prevSeq uint64
	err = replayLog(lg, lg.StartSeq(), func(e storage.Entry) error {
		if g.node.cfg.Mutations.LedgerReplayStopsAtGap && prevSeq != 0 && e.Seq != prevSeq+1 {
			return nil // and every entry after it
		}
		prevSeq = e.Seq
		v := e.Record.Value
		ledgerBytes += ledgerRecordOverheadBytes + int64(len(v))
		replay := replayAcks
		if isCountRecord(&e.Record) {
			replay = replayCounts
		}
		if err := replay(cursors, v); err != nil {
			return fmt.Errorf("ledger record %d: %w", e.Seq, err)
		}
		return nil
	})
	if err == nil {
		err = l.damage(lg.Damage())
	}
	if err != nil {
		lg.Close()
		return nil, fmt.Errorf("group %s: replay ledger: %w", g.name, err)
	}
	if l.log != nil {
		l.log.Close()
	}
	l.log = lg
	l.gen, l.bytes = snap.gen, ledgerBytes
	l.marks = syncedMarks{point: mark, seen: lg.NextSeq() - 1} // the open synced what it recovered
	l.removeStale(snap.gen)
	return cursors, nil
}

// needsRecord: an ack goes into the ledger once, when it is new.
func (l *fileLedger) needsRecord(isNew bool, _ uint32, _ uint64) bool { return isNew }

// follow: a single node delivers every partition. At each period's end
// the ledger marks its synced tail when it took no record through the
// period (syncedmark.go).
func (l *fileLedger) follow(now int64) {
	g := l.g
	ms := g.node.cfg.SyncedMarkMs
	if l.log == nil || ms <= 0 || now < l.nextMarkMs {
		return
	}
	l.nextMarkMs = now + ms
	dir, subject, attrs := l.markPlace()
	g.node.markSynced(&l.marks, dir, l.log.NextSeq()-1, l.log.SyncedSeq(), subject, attrs...)
}

// markPlace is where the live generation's synced mark goes, and how a
// failed write of it is logged.
func (l *fileLedger) markPlace() (dir, subject string, attrs []any) {
	g := l.g
	return path.Join(g.dir, ledgerDirName(l.gen)), g.name + "/" + g.topic.cfg.Name, []any{"group", g.name, "topic", g.topic.cfg.Name}
}

// fenced: a single node's one view of the group never goes back.
func (l *fileLedger) fenced(int, uint64, uint64) bool { return true }

func (l *fileLedger) leased(int) bool { return true }

// takingOffice: a single node delivers every partition from its load on.
func (l *fileLedger) takingOffice(int) bool { return false }

func (l *fileLedger) wakeAtMs() int64 {
	if l.log == nil || l.g.node.cfg.SyncedMarkMs <= 0 || l.log.SyncedSeq() <= l.marks.point {
		return 0
	}
	return l.nextMarkMs // a synced tail to mark once it stays idle
}

// settled: a file ledger's flush is synchronous.
func (l *fileLedger) settled(int) bool {
	return len(l.g.ledgerBatch) == 0 && len(l.g.countBatch) == 0 && l.g.failure == nil
}

// close marks what the ledger synced (a clean stop leaves no tail a
// flip could pass off as torn), then closes it.
func (l *fileLedger) close() {
	if l.log != nil {
		if l.g.failure == nil {
			dir, subject, attrs := l.markPlace()
			l.g.node.writeSyncedMark(&l.marks, dir, l.log.SyncedSeq(), subject, attrs...)
		}
		l.log.Close()
	}
}

// damage refuses a ledger with damage: the acks in the damaged range
// are unknown, and delivering their messages again without a word is
// what a damaged ledger used to do. The group stays unusable (PULL and
// ACK get DATA_CORRUPT naming the place) until `nereus repair` drops the
// range on purpose.
func (l *fileLedger) damage(ds []storage.Damage) error {
	g := l.g
	if len(ds) == 0 {
		return nil
	}
	d := ds[0]
	g.node.logRepeatedError(g.name+"/"+g.topic.cfg.Name, "group ack ledger corrupt; the group is refused until `nereus repair`",
		"group", g.name, "topic", g.topic.cfg.Name, "file", d.Segment, "offset", d.Offset, "bytes", d.Bytes,
		"first_seq", d.FirstSeq, "last_seq", d.LastSeq, "cause", d.Cause)
	return wire.Errorf(wire.CodeDataCorrupt, "the ack ledger of group %s on topic %s is damaged (%s offset %d): run nereus repair",
		g.name, g.topic.cfg.Name, d.Segment, d.Offset)
}

// holdMs: a file ledger never waits.
func (l *fileLedger) holdMs() int64 { return 0 }

// flush appends the batched acks and counts and fsyncs them, then
// answers; on a ledger failure the cursors are rebuilt from what is
// durable.
func (l *fileLedger) flush() {
	g := l.g
	var failed *wire.Error
	if len(g.ledgerBatch) > 0 || len(g.countBatch) > 0 {
		var recs []storage.Record
		if len(g.ledgerBatch) > 0 {
			recs = append(recs, storage.Record{Value: g.ledgerBatch})
		}
		if len(g.countBatch) > 0 {
			recs = append(recs, countRecord(g.countBatch))
		}
		_, err := l.log.Append(0, recs)
		if err == nil {
			l.bytes += int64(len(recs))*ledgerRecordOverheadBytes + int64(len(g.ledgerBatch)+len(g.countBatch))
			start := g.node.nowNanos()
			if !g.node.cfg.Mutations.SkipLedgerFsync {
				err = l.log.Sync()
			}
			g.node.metrics.fsyncSeconds.WithLabelValues("ledger").Observe(float64(g.node.nowNanos()-start) / 1e9)
		}
		g.ledgerBatch, g.countBatch = nil, nil
		if err == nil {
			g.deadReady = append(g.deadReady, g.deadPending...)
			g.deadPending = nil
		}
		if err != nil {
			failed = wire.Errorf(wire.CodeStorage, "ack ledger write failed: %v", err)
			g.node.logRepeatedError(g.name+"/"+g.topic.cfg.Name, "ack ledger write failed; reloading group", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
			g.failure = err
			g.reload()
		}
	}
	for _, r := range g.replies {
		r.answer(failed)
	}
	clear(g.replies)
	g.replies = g.replies[:0]
	if failed == nil {
		for i, c := range g.cursors {
			g.floors[i].Store(c.AckFloor())
		}
		// After the replies: compaction never delays an ACK_OK.
		l.maybeCompact()
	}
}

// ledgerDirName names the ledger directory of generation gen.
func ledgerDirName(gen uint64) string {
	if gen == 0 {
		return ledgerDirGen0
	}
	return ledgerDirPrefix + strconv.FormatUint(gen, 10)
}

// parseLedgerDirName reports the generation of a ledger directory name.
func parseLedgerDirName(name string) (uint64, bool) {
	if name == ledgerDirGen0 {
		return 0, true
	}
	digits, ok := strings.CutPrefix(name, ledgerDirPrefix)
	if !ok || digits == "" || digits[0] == '0' {
		return 0, false
	}
	for _, r := range digits {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	gen, err := strconv.ParseUint(digits, 10, 64)
	return gen, err == nil && gen > 0
}

// ledgerSnapshot is the decoded snapshot file.
type ledgerSnapshot struct {
	gen    uint64 // generation of the live ledger directory
	states []delivery.DoneState
	counts [][]delivery.SeqCount // per partition (nil from an NLS1 snapshot)
	fence  uint64                // a checkpoint's (acklog.Checkpoint.Fence)
}

// snapshotCursors captures the cursors' done states and delivery counts
// (a replicated group's checkpoint holds the same).
func snapshotCursors(gen uint64, cursors []*delivery.Cursor) ledgerSnapshot {
	cp := acklog.CheckpointOf(cursors)
	return ledgerSnapshot{gen: gen, states: cp.States, counts: cp.Counts}
}

// restore applies a snapshot's partition i (if it has one) to c.
func (s ledgerSnapshot) restore(i int, c *delivery.Cursor) error {
	return acklog.Checkpoint{States: s.states, Counts: s.counts}.Restore(i, c)
}

// encodeLedgerSnapshot lays out a snapshot as
//
//	magic "NLS2" | gen u64 | partitions u32 |
//	partitions × {len u32, DoneState, len u32, delivery counts}
//
// (big endian; the atomic file around it carries length and CRC). An
// "NLS1" snapshot has no counts in its partitions; an "NLS3" one (written
// when the fence is not 0) ends with the fence, u64. s.counts is empty or
// has one list per state.
func encodeLedgerSnapshot(s ledgerSnapshot) []byte {
	magic := ledgerSnapshotMagic
	if s.fence != 0 {
		magic = ledgerSnapshotMagicFenced
	}
	b := append([]byte(nil), magic...)
	b = binary.BigEndian.AppendUint64(b, s.gen)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.states)))
	for i, st := range s.states {
		at := len(b)
		b = binary.BigEndian.AppendUint32(b, 0)
		b = delivery.AppendDoneState(b, st)
		binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
		var counts []delivery.SeqCount
		if i < len(s.counts) {
			counts = s.counts[i]
		}
		at = len(b)
		b = binary.BigEndian.AppendUint32(b, 0)
		b = delivery.AppendCounts(b, counts)
		binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	}
	if s.fence != 0 {
		b = binary.BigEndian.AppendUint64(b, s.fence)
	}
	return b
}

// cutSection splits a len u32-prefixed section off b.
func cutSection(b []byte) (section, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, false
	}
	return b[4 : 4+n], b[4+n:], true
}

var errBadLedgerSnapshot = errors.New("bad ledger snapshot")

// decodeLedgerSnapshot decodes encodeLedgerSnapshot's layout; it never
// panics and allocates in proportion to len(b).
func decodeLedgerSnapshot(b []byte) (ledgerSnapshot, error) {
	const headerBytes = 4 + 8 + 4
	magic := ""
	if len(b) >= headerBytes {
		magic = string(b[:4])
	}
	if magic != ledgerSnapshotMagic && magic != ledgerSnapshotMagicV1 && magic != ledgerSnapshotMagicFenced {
		return ledgerSnapshot{}, fmt.Errorf("%w: bad header", errBadLedgerSnapshot)
	}
	withCounts, fenced := magic != ledgerSnapshotMagicV1, magic == ledgerSnapshotMagicFenced
	s := ledgerSnapshot{gen: binary.BigEndian.Uint64(b[4:])}
	count := binary.BigEndian.Uint32(b[12:])
	b = b[headerBytes:]
	if uint64(count) > uint64(len(b)/4) {
		return ledgerSnapshot{}, fmt.Errorf("%w: %d partitions in %d bytes", errBadLedgerSnapshot, count, len(b))
	}
	s.states = make([]delivery.DoneState, 0, count)
	for i := uint32(0); i < count; i++ {
		section, rest, ok := cutSection(b)
		if !ok {
			return ledgerSnapshot{}, fmt.Errorf("%w: partition %d truncated", errBadLedgerSnapshot, i)
		}
		st, err := delivery.DecodeDoneState(section)
		if err != nil {
			return ledgerSnapshot{}, fmt.Errorf("%w: partition %d: %w", errBadLedgerSnapshot, i, err)
		}
		s.states = append(s.states, st)
		b = rest
		if !withCounts {
			continue
		}
		if section, rest, ok = cutSection(b); !ok {
			return ledgerSnapshot{}, fmt.Errorf("%w: partition %d counts truncated", errBadLedgerSnapshot, i)
		}
		counts, err := delivery.DecodeCounts(section)
		if err != nil {
			return ledgerSnapshot{}, fmt.Errorf("%w: partition %d: %w", errBadLedgerSnapshot, i, err)
		}
		s.counts = append(s.counts, counts)
		b = rest
	}
	if fenced {
		if len(b) < 8 {
			return ledgerSnapshot{}, fmt.Errorf("%w: fence truncated", errBadLedgerSnapshot)
		}
		s.fence, b = binary.BigEndian.Uint64(b), b[8:]
		if s.fence == 0 {
			return ledgerSnapshot{}, fmt.Errorf("%w: NLS3 with fence 0", errBadLedgerSnapshot)
		}
	}
	if len(b) != 0 {
		return ledgerSnapshot{}, fmt.Errorf("%w: %d trailing bytes", errBadLedgerSnapshot, len(b))
	}
	return s, nil
}

// readSnapshot returns the group's snapshot, or generation 0 with no
// states when none was ever written.
func (l *fileLedger) readSnapshot() (ledgerSnapshot, error) {
	g := l.g
	file := path.Join(g.dir, ledgerSnapshotFile)
	b, err := storage.ReadFileAtomic(g.node.cfg.Env.FS, file)
	if errors.Is(err, fs.ErrNotExist) {
		return ledgerSnapshot{}, nil
	}
	var s ledgerSnapshot
	if err == nil {
		s, err = decodeLedgerSnapshot(b)
	}
	if errors.Is(err, storage.ErrCorrupt) || errors.Is(err, errBadLedgerSnapshot) {
		// The group's done state is unknown: delivering as if nothing
		// were acked, without a word, is what it must not do.
		g.node.logRepeatedError(g.name+"/"+g.topic.cfg.Name, "group ack ledger snapshot corrupt; the group is refused until `nereus repair`",
			"group", g.name, "topic", g.topic.cfg.Name, "file", file, "err", err)
		return ledgerSnapshot{}, wire.Errorf(wire.CodeDataCorrupt, "the ack ledger snapshot of group %s on topic %s is damaged (%s): run nereus repair (the group's acks are then forgotten: its messages are delivered again)",
			g.name, g.topic.cfg.Name, file)
	}
	if err != nil {
		return ledgerSnapshot{}, fmt.Errorf("group %s: read ledger snapshot: %w", g.name, err)
	}
	return s, nil
}

// removeFiles removes the ledger directory of gen and every file in it
// (a missing directory is not an error): without the directory, every
// compaction left one empty directory behind for good.
func (l *fileLedger) removeFiles(gen uint64) error {
	return removeTree(l.g.node.cfg.Env.FS, path.Join(l.g.dir, ledgerDirName(gen)))
}

// removeStale removes every ledger generation but live, best effort:
// they are garbage (see the crash analysis above).
func (l *fileLedger) removeStale(live uint64) {
	g := l.g
	names, err := g.node.cfg.Env.FS.List(g.dir)
	if err != nil {
		g.node.log.Warn("list group dir for stale ledgers failed", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
		return
	}
	for _, name := range names {
		gen, ok := parseLedgerDirName(name)
		if !ok || gen == live {
			continue
		}
		if err := l.removeFiles(gen); err != nil {
			g.node.log.Warn("remove stale ledger failed", "group", g.name, "topic", g.topic.cfg.Name, "dir", name, "err", err)
		}
	}
}

// maybeCompact compacts the ledger once it has grown past the threshold.
// The caller has just flushed the ledger successfully, so the cursors hold
// exactly the durable done state.
func (l *fileLedger) maybeCompact() {
	g := l.g
	threshold := g.ledgerCompactBytes.Load()
	if g.failure != nil || len(g.ledgerBatch) > 0 || threshold <= 0 ||
		l.bytes < max(threshold, l.compactRetryBytes) {
		return
	}
	committed, err := l.compact()
	if err == nil {
		l.compactRetryBytes = 0
		return
	}
	if committed {
		// Past the commit point only the cleanup failed: harmless.
		g.node.log.Warn("remove compacted ledger failed; next load retries", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
		l.compactRetryBytes = 0
		return
	}
	g.node.log.Error("ack ledger compaction failed", "group", g.name, "topic", g.topic.cfg.Name, "err", err)
	if errors.Is(err, errSnapshotWrite) {
		// The snapshot may or may not have become durable: reload from
		// whatever load finds (see step 3 above).
		g.failure = err
		g.reload()
	}
	// Try again once the ledger has grown by another threshold, so a
	// persistent failure costs one attempt per threshold, not per flush.
	l.compactRetryBytes = l.bytes + threshold
}

var errSnapshotWrite = errors.New("write ledger snapshot")

// compact runs steps 1-5 above. committed reports whether the new
// snapshot is durable and live (an error then comes from the cleanup).
func (l *fileLedger) compact() (committed bool, err error) {
	g, fsys := l.g, l.g.node.cfg.Env.FS
	next := l.gen + 1
	if err := l.removeFiles(next); err != nil { // step 1
		return false, fmt.Errorf("clear %s: %w", ledgerDirName(next), err)
	}
	lg, err := storage.Open(fsys, path.Join(g.dir, ledgerDirName(next)), storage.Options{}) // step 2
	if err != nil {
		return false, fmt.Errorf("open %s: %w", ledgerDirName(next), err)
	}
	snap := snapshotCursors(next, g.cursors)
	if err := storage.WriteFileAtomic(fsys, path.Join(g.dir, ledgerSnapshotFile), encodeLedgerSnapshot(snap)); err != nil { // step 3
		lg.Close()
		return false, fmt.Errorf("%w: %w", errSnapshotWrite, err)
	}
	old, oldGen := l.log, l.gen // step 4
	l.log, l.gen, l.bytes = lg, next, 0
	l.marks = syncedMarks{seen: lg.NextSeq() - 1} // step 1 removed the directory's old mark
	old.Close()
	g.node.log.Info("ack ledger compacted", "group", g.name, "topic", g.topic.cfg.Name, "generation", next)
	return true, l.removeFiles(oldGen) // step 5
}
