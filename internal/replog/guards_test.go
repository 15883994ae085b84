package replog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// Tests that pin guards of this package which a mutation sweep found
// untested: each names the guard it pins, and fails when that guard is
// deleted or weakened.

// guardConfig is member 1 of a three-member group in /n1 on fsys; what it
// sends is appended to *sent (nil: dropped). Nothing runs it: the tests
// drive its store and kernel directly.
func guardConfig(fsys vfs.FS, sent *[]replica.Message) Config {
	return Config{ID: 1, Members: []replica.NodeID{1, 2, 3}, Dir: "/n1", FS: fsys, Logger: quiet, Clock: env.NewVirtual(1_000),
		Send: func(m replica.Message) {
			if sent != nil {
				*sent = append(*sent, m)
			}
		}}
}

// writeGuardLog opens a member on fsys, lets prepare write its log through
// the member's store, syncs the log and closes the member.
func writeGuardLog(t *testing.T, fsys vfs.FS, prepare func(s memberStore) error) {
	t.Helper()
	m, err := OpenMember(guardConfig(fsys, nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := prepare(memberStore{m}); err != nil {
		t.Fatal(err)
	}
	if err := m.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// openGuardMember opens guardConfig's member on fsys, closed when the
// test ends.
func openGuardMember(t *testing.T, fsys vfs.FS) *Member {
	t.Helper()
	m, err := OpenMember(guardConfig(fsys, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestStateFilesThatCannotBeReadRefuseToOpen pins the I/O-error branches
// of the state-file readers: readHardState, readPromiseLost, hasMark (the
// rebuilding and uncertain marks) and readSnapshotPoint. A file that is
// there but cannot be read is neither missing nor damaged: a member that
// took it for missing would forget its promises (and grant a second vote
// in an epoch), that it may lack entries it acknowledged, or where its log
// starts. It must refuse to open instead.
func TestStateFilesThatCannotBeReadRefuseToOpen(t *testing.T) {
	for _, name := range []string{hardStateFile, promiseLostFile, rebuildingFile, uncertainFile, snapshotFile} {
		t.Run(name, func(t *testing.T) {
			fsys := vfs.NewMem()
			writeGuardLog(t, fsys, func(s memberStore) error { return s.Append(entriesOf(1, 1, "a", "b")) })
			if err := writeHardState(fsys, "/n1", replica.HardState{Promised: 5, PromisedTo: 2}); err != nil {
				t.Fatal(err)
			}
			var err error
			switch name {
			case promiseLostFile:
				err = storage.WriteFileAtomic(fsys, path.Join("/n1", name), []byte{0, 0, 0, 0, 0, 0, 0, 9})
			case rebuildingFile, uncertainFile:
				err = storage.WriteFileAtomic(fsys, path.Join("/n1", name), []byte("marked"))
			}
			if err != nil {
				t.Fatal(err)
			}
			fsys.SetInjector(func(op vfs.Op, n string) error {
				if op == vfs.OpOpen && path.Base(n) == name {
					return errors.New("injected I/O error")
				}
				return nil
			})
			m, err := OpenMember(guardConfig(fsys, nil))
			if err == nil {
				st := m.Status()
				m.Close()
				t.Fatalf("opened although %s could not be read: promised %d, rebuilding %v, uncertain %v, promise lost %v",
					name, st.Hard.Promised, st.Rebuilding, st.Uncertain, st.PromiseLost)
			}
		})
	}
}

// TestSnapshotPointOutsideTheLogRefusesToOpen pins loadPersisted's bounds
// on the snapshot point: the log must start at or before the entry after
// the point (else the entries between are in neither) and end at or after
// it. Each bound is checked on both sides of its edge.
func TestSnapshotPointOutsideTheLogRefusesToOpen(t *testing.T) {
	for _, c := range []struct {
		seq uint64
		ok  bool
		why string
	}{
		{9, false, "after its snapshot point"}, // log starts at 11: seq 10 is in neither
		{10, true, ""},
		{15, true, ""},
		{16, false, "before its snapshot point"}, // log ends at 15
	} {
		t.Run(fmt.Sprint(c.seq), func(t *testing.T) {
			fsys := vfs.NewMem()
			writeGuardLog(t, fsys, func(s memberStore) error {
				if err := s.InstallSnapshot(replica.SnapshotMeta{Seq: 10, Epoch: 1}); err != nil {
					return err
				}
				return s.Append(entriesOf(11, 1, "a", "b", "c", "d", "e"))
			})
			if err := writeSnapshotPoint(fsys, "/n1", snapshotPoint{seq: c.seq, epoch: 1}); err != nil {
				t.Fatal(err)
			}
			m, err := OpenMember(guardConfig(fsys, nil))
			if err == nil {
				defer m.Close()
			}
			switch {
			case c.ok && err != nil:
				t.Fatalf("log [11, 15] with snapshot point %d: %v", c.seq, err)
			case !c.ok && (err == nil || !strings.Contains(err.Error(), c.why)):
				t.Fatalf("log [11, 15] with snapshot point %d: opened (err %v); want it refused: log starts %s", c.seq, err, c.why)
			}
		})
	}
}

// TestSnapshotPointEpochBoundsTheLineageAfterRestart pins loadPersisted's
// epoch boundary at the snapshot point (snap.seq > 0): a member whose log
// is empty after its point (a snapshot install) still knows the epoch of
// its last entry after a restart, so it refuses its vote to a candidate
// whose lineage ends in an older epoch.
func TestSnapshotPointEpochBoundsTheLineageAfterRestart(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error { return s.InstallSnapshot(replica.SnapshotMeta{Seq: 40, Epoch: 3}) })
	var sent []replica.Message
	m, err := OpenMember(guardConfig(fsys, &sent))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if st := m.Status(); !slices.Equal(st.Epochs, []replica.EpochStart{{Epoch: 3, StartSeq: 40}}) || st.Last != 40 {
		t.Fatalf("after a restart at snapshot point (40, 3): epochs %v, last %d", st.Epochs, st.Last)
	}
	// A forced campaign (no lease in the way) whose log ends at (2, 50):
	// longer, but in an older epoch than this member's last entry.
	m.Step(replica.Message{Type: replica.MsgPrepare, From: 2, To: 1, Epoch: 4, LastEpoch: 2, LastSeq: 50, Forced: true})
	if err := m.Handle(); err != nil {
		t.Fatal(err)
	}
	for _, msg := range sent {
		if msg.Type == replica.MsgPrepareAck && msg.Granted {
			t.Fatalf("granted a candidate at (2, 50) over its own last entry (3, 40): %+v", msg)
		}
	}
}

// TestEpochsAfterASnapshotPointStartPastIt pins loadPersisted's scan of
// epoch boundaries from past the snapshot point (max(StartSeq,
// snap.seq+1)): Compact writes the point before it deletes the segments
// below it, so after a crash between the two the log still starts below
// the point. The boundaries of the entries below it must not follow the
// point's: the kernel's epochs are ascending.
func TestEpochsAfterASnapshotPointStartPastIt(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error {
		for _, es := range [][]replica.Entry{entriesOf(1, 1, "a", "b", "c"), entriesOf(4, 2, "d", "e", "f"), entriesOf(7, 3, "g", "h")} {
			if err := s.Append(es); err != nil {
				return err
			}
		}
		return nil
	})
	if err := writeSnapshotPoint(fsys, "/n1", snapshotPoint{seq: 5, epoch: 2}); err != nil {
		t.Fatal(err)
	}
	m := openGuardMember(t, fsys)
	want := []replica.EpochStart{{Epoch: 2, StartSeq: 5}, {Epoch: 3, StartSeq: 7}}
	if st := m.Status(); !slices.Equal(st.Epochs, want) || st.SnapSeq != 5 || st.Last != 8 {
		t.Fatalf("log [1, 8] under snapshot point (5, 2): epochs %v, snap %d, last %d; want epochs %v, snap 5, last 8", st.Epochs, st.SnapSeq, st.Last, want)
	}
}

// TestInterruptedInstallThatFailsAgainStaysRecorded pins loadPersisted's
// check of the log reset that finishes an interrupted install: when that
// reset fails, the member must not open and the point must stay
// "installing", so that the next open finishes the install rather than
// find a log that was never reset under a point marked done.
func TestInterruptedInstallThatFailsAgainStaysRecorded(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error { return s.Append(entriesOf(1, 1, "a", "b", "c", "d", "e")) })
	if err := writeSnapshotPoint(fsys, "/n1", snapshotPoint{seq: 40, epoch: 3, installing: true}); err != nil {
		t.Fatal(err)
	}
	failed := false
	fsys.SetInjector(func(op vfs.Op, n string) error {
		if op == vfs.OpCreate && path.Base(n) == "00000000000000000041.log" && !failed {
			failed = true
			return errors.New("injected create failure")
		}
		return nil
	})
	if m, err := OpenMember(guardConfig(fsys, nil)); err == nil {
		m.Close()
		t.Fatal("opened although finishing the install failed")
	}
	if !failed {
		t.Fatal("the install's reset never created its segment")
	}
	fsys.SetInjector(nil)
	if p, err := readSnapshotPoint(fsys, "/n1"); err != nil || !p.installing {
		t.Fatalf("after the failed reset the snapshot point is %+v, %v; want it still installing", p, err)
	}
	m, err := OpenMember(guardConfig(fsys, nil))
	if err != nil {
		t.Fatalf("open after the disk healed: %v", err)
	}
	defer m.Close()
	if start, next := m.log.StartSeq(), m.log.NextSeq(); start != 41 || next != 41 {
		t.Fatalf("after the install was finished: log [%d, %d); want [41, 41)", start, next)
	}
}

// TestCompactionThatFailsStopsAManualMember pins Pump's check of
// Compact's error: a compaction that cannot write its snapshot point
// means the member cannot persist, so it claims nothing (no leader in
// its status) until it restarted in place, as after a failed fsync; once
// the disk works again it compacts and the group commits on.
func TestCompactionThatFailsStopsAManualMember(t *testing.T) {
	g := newManualGroup(t, 3, compacting)
	l := g.elect()
	id := l.Status().ID
	failing, hit := true, false
	g.fs.SetInjector(func(op vfs.Op, name string) error {
		if failing && op == vfs.OpCreate && name == fmt.Sprintf("/m%d/%s.tmp", id, snapshotFile) {
			hit = true
			return errors.New("injected create failure")
		}
		return nil
	})
	for i := 0; i < 500 && !hit; i++ {
		l.ProposeFunc(storage.Record{Value: []byte(fmt.Sprintf("value-%03d-%s", i, strings.Repeat("x", 80)))}, func(_, _ uint64, _ error) {})
		g.run(10)
	}
	if !hit {
		t.Fatal("setup: the leader never compacted")
	}
	if st := l.Status(); st.Role == replica.Leader || st.Leader != 0 {
		t.Fatalf("a member whose compaction failed still claims leadership: role %v, leader %d", st.Role, st.Leader)
	}
	failing = false
	g.run(1500)
	if g.leader() == nil {
		t.Fatal("no leader after the disk healed")
	}
	if start := l.ReadLog().StartSeq(); start <= 1 {
		t.Fatalf("n%d never compacted after the disk healed: log starts at %d", id, start)
	}
}

// TestEpochAtAnEpochsFirstSeq pins epochAt's bound (StartSeq > seq ends
// the scan): the first seq of an epoch is in that epoch. Compact records
// the snapshot point's epoch with it; a point that is the first entry of
// an epoch (an install entry that ends a segment) recorded under the
// epoch before would not match the leader's (PrevSeq, PrevEpoch) after it.
func TestEpochAtAnEpochsFirstSeq(t *testing.T) {
	epochs := []replica.EpochStart{{Epoch: 1, StartSeq: 1}, {Epoch: 3, StartSeq: 5}, {Epoch: 4, StartSeq: 9}}
	for seq, want := range map[uint64]uint64{0: 0, 1: 1, 4: 1, 5: 3, 8: 3, 9: 4, 20: 4} {
		if got := epochAt(epochs, seq); got != want {
			t.Errorf("epochAt(%v, %d) = %d, want %d", epochs, seq, got, want)
		}
	}
}

// TestPromiseLostMarkOfAnotherSizeStillMarks pins readPromiseLost's size
// check (len(b) == 8) and its "err == nil" case: a mark whose checksum
// holds but which is not one 8-byte nonce still marks, with nonce 0 (so
// loadOrQuarantine writes it again); it is neither taken for no mark nor
// read as a nonce.
func TestPromiseLostMarkOfAnotherSizeStillMarks(t *testing.T) {
	fsys := vfs.NewMem()
	if err := fsys.MkdirAll("/m"); err != nil {
		t.Fatal(err)
	}
	good := []byte{0, 0, 0, 0, 0, 0, 0, 9}
	for _, c := range []struct {
		b     []byte
		nonce uint64
	}{{good, 9}, {nil, 0}, {good[:7], 0}, {append(good, 1), 0}} {
		if err := storage.WriteFileAtomic(fsys, path.Join("/m", promiseLostFile), c.b); err != nil {
			t.Fatal(err)
		}
		if lost, nonce, err := readPromiseLost(fsys, "/m"); err != nil || !lost || nonce != c.nonce {
			t.Errorf("a mark of %d bytes: lost %v, nonce %d, err %v; want lost with nonce %d", len(c.b), lost, nonce, err, c.nonce)
		}
	}
}

// TestPromiseLostNonceIsNeverZero pins markPromiseLost's floor on the
// nonce (max(NowNanos, 1)): nonce 0 means a damaged mark, so a loss marked
// at clock reading 0 (a simulated clock that starts there) must not read
// back as one.
func TestPromiseLostNonceIsNeverZero(t *testing.T) {
	fsys := vfs.NewMem()
	if err := fsys.MkdirAll("/m"); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Dir: "/m", FS: fsys, Logger: quiet, Clock: env.NewVirtual(0)}
	if err := markPromiseLost(cfg, errors.New("test")); err != nil {
		t.Fatal(err)
	}
	if lost, nonce, err := readPromiseLost(fsys, "/m"); err != nil || !lost || nonce == 0 {
		t.Fatalf("marked at clock 0: lost %v, nonce %d, err %v; want a nonce other than 0", lost, nonce, err)
	}
}

// damagedGuardLog writes three one-entry batches to member 1's log in /n1,
// each synced before the next, and flips a bit inside the second, which
// the third proves was durable (its synced-through seq): damage the member
// finds when it opens.
func damagedGuardLog(t *testing.T, fsys *vfs.MemFS) {
	t.Helper()
	writeGuardLog(t, fsys, func(s memberStore) error {
		for i, v := range []string{"one", "two", "three"} {
			if err := s.Append(entriesOf(uint64(i+1), 1, v)); err != nil {
				return err
			}
			if err := s.Sync(); err != nil {
				return err
			}
		}
		return nil
	})
	name := "/n1/00000000000000000001.log"
	data, err := fsys.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	offsets := batchOffsets(data)
	if len(offsets) != 3 {
		t.Fatalf("%d batches, want 3", len(offsets))
	}
	if err := fsys.FlipBit(name, offsets[1]+40, 2); err != nil {
		t.Fatal(err)
	}
}

// TestDamageIsNotDroppedWhenTheRebuildingMarkCannotBeWritten pins
// quarantineDamage's check of the rebuilding mark's write: the mark is
// what remembers, across restarts, that the member may lack entries it
// acknowledged once the damaged range is gone. When it cannot be written
// the member must not open, and must not drop the range either.
func TestDamageIsNotDroppedWhenTheRebuildingMarkCannotBeWritten(t *testing.T) {
	fsys := vfs.NewMem()
	damagedGuardLog(t, fsys)
	fsys.SetInjector(func(op vfs.Op, n string) error {
		if op == vfs.OpCreate && path.Base(n) == rebuildingFile+".tmp" {
			return errors.New("injected create failure")
		}
		return nil
	})
	if m, err := OpenMember(guardConfig(fsys, nil)); err == nil {
		st := m.Status()
		m.Close()
		t.Fatalf("opened a damaged log without its rebuilding mark: rebuilding %v, last %d", st.Rebuilding, st.Last)
	}
	fsys.SetInjector(nil)
	m := openGuardMember(t, fsys)
	if st := m.Status(); !st.Rebuilding || st.Last != 1 {
		t.Fatalf("once the mark could be written: rebuilding %v, last %d; want rebuilding from seq 1", st.Rebuilding, st.Last)
	}
}

// TestRepairAloneRewritesDamagedStateFiles pins RepairAlone's handling of
// the state files of a member alone: it finds a damaged hard state and a
// damaged snapshot point (and, in a dry run, only reports them), then
// rewrites the point as the seq before the log's start in the epoch of
// its first entry (epoch 1 at least, for an empty log: a point (seq, 0)
// is invalid) and the hard state as a promise to itself of the highest
// epoch it knows — its log's last, or the point's when the log is empty.
// The member then opens.
func TestRepairAloneRewritesDamagedStateFiles(t *testing.T) {
	for _, c := range []struct {
		name      string
		snap      replica.SnapshotMeta
		entries   [][]replica.Entry
		wantPoint snapshotPoint
		wantHard  replica.HardState
	}{
		{"log after the point", replica.SnapshotMeta{Seq: 1, Epoch: 2}, [][]replica.Entry{entriesOf(2, 2, "a", "b", "c"), entriesOf(5, 4, "d", "e")},
			snapshotPoint{seq: 1, epoch: 2}, replica.HardState{Promised: 4, PromisedTo: 1}},
		{"empty log after the point", replica.SnapshotMeta{Seq: 40, Epoch: 3}, nil,
			snapshotPoint{seq: 40, epoch: 1}, replica.HardState{Promised: 1, PromisedTo: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fsys := vfs.NewMem()
			cfg := guardConfig(fsys, nil)
			cfg.Members = []replica.NodeID{1}
			m, err := OpenMember(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := (memberStore{m}).InstallSnapshot(c.snap); err != nil {
				t.Fatal(err)
			}
			for _, es := range c.entries {
				if err := (memberStore{m}).Append(es); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.log.Sync(); err != nil {
				t.Fatal(err)
			}
			m.Close()
			for _, name := range []string{hardStateFile, snapshotFile} {
				if err := fsys.WriteFile(path.Join("/n1", name), []byte("not a state file")); err != nil {
					t.Fatal(err)
				}
			}
			r, err := RepairAlone(fsys, "/n1", 1, storage.Options{}, true)
			if err != nil || !r.HardStateReset || !r.SnapshotPointReset {
				t.Fatalf("dry run: %+v, %v; want both files found damaged", r, err)
			}
			if _, err := readHardState(fsys, "/n1"); !errors.Is(err, errHardStateDamaged) {
				t.Fatalf("a dry run rewrote the hard state: %v", err)
			}
			if _, err := readSnapshotPoint(fsys, "/n1"); !errors.Is(err, errSnapshotPointDamaged) {
				t.Fatalf("a dry run rewrote the snapshot point: %v", err)
			}
			if r, err := RepairAlone(fsys, "/n1", 1, storage.Options{}, false); err != nil || !r.HardStateReset || !r.SnapshotPointReset {
				t.Fatalf("repair: %+v, %v", r, err)
			}
			if p, err := readSnapshotPoint(fsys, "/n1"); err != nil || p != c.wantPoint {
				t.Fatalf("repaired snapshot point %+v, %v; want %+v", p, err, c.wantPoint)
			}
			if h, err := readHardState(fsys, "/n1"); err != nil || h != c.wantHard {
				t.Fatalf("repaired hard state %+v, %v; want %+v", h, err, c.wantHard)
			}
			m, err = OpenMember(cfg)
			if err != nil {
				t.Fatalf("open after the repair: %v", err)
			}
			m.Close()
		})
	}
}

// TestTornTailIsNotCutWhenTheUncertainMarkCannotBeWritten pins the check
// of the uncertain mark's write in storageOptions' BeforeTornTailCut: the
// mark must be durable before the log cuts an invalid tail that nothing
// proves torn (it may hold a flushed entry this member acknowledged).
// When the mark cannot be written the member must not open, and the tail
// must not be cut; once it can, the member opens uncertain.
func TestTornTailIsNotCutWhenTheUncertainMarkCannotBeWritten(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error {
		for i, v := range []string{"one", "two", "three"} {
			if err := s.Append(entriesOf(uint64(i+1), 1, v)); err != nil {
				return err
			}
		}
		return nil
	})
	name := "/n1/00000000000000000001.log"
	data, err := fsys.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	offsets := batchOffsets(data)
	if len(offsets) != 3 {
		t.Fatalf("%d batches, want 3", len(offsets))
	}
	end := offsets[2] + 6 + int64(binary.LittleEndian.Uint32(data[offsets[2]+2:]))
	if err := fsys.FlipBit(name, (offsets[2]+end)/2, 5); err != nil { // inside the last batch
		t.Fatal(err)
	}
	fsys.SetInjector(func(op vfs.Op, n string) error {
		if op == vfs.OpCreate && path.Base(n) == uncertainFile+".tmp" {
			return errors.New("injected create failure")
		}
		return nil
	})
	if m, err := OpenMember(guardConfig(fsys, nil)); err == nil {
		st := m.Status()
		m.Close()
		t.Fatalf("cut an unproven tail without the uncertain mark: uncertain %v, last %d", st.Uncertain, st.Last)
	}
	fsys.SetInjector(nil)
	if after, err := fsys.ReadFile(name); err != nil || len(after) != len(data) {
		t.Fatalf("the tail was cut although the mark could not be written: %d bytes of %d (%v)", len(after), len(data), err)
	}
	m := openGuardMember(t, fsys)
	if st := m.Status(); !st.Uncertain || st.Last != 2 {
		t.Fatalf("once the mark could be written: uncertain %v, last %d; want uncertain at 2", st.Uncertain, st.Last)
	}
}

// TestDamagedMarksStillMark pins hasMark's ErrCorrupt case: a rebuilding
// or uncertain mark that fails its checksum is still a mark — the member
// opens rebuilding (or uncertain), not whole.
func TestDamagedMarksStillMark(t *testing.T) {
	for _, name := range []string{rebuildingFile, uncertainFile} {
		t.Run(name, func(t *testing.T) {
			fsys := vfs.NewMem()
			writeGuardLog(t, fsys, func(s memberStore) error { return s.Append(entriesOf(1, 1, "a", "b")) })
			if err := fsys.WriteFile(path.Join("/n1", name), []byte("not a mark")); err != nil {
				t.Fatal(err)
			}
			m := openGuardMember(t, fsys)
			st := m.Status()
			if name == rebuildingFile && !st.Rebuilding || name == uncertainFile && !st.Uncertain {
				t.Fatalf("a damaged %s mark: rebuilding %v, uncertain %v", name, st.Rebuilding, st.Uncertain)
			}
		})
	}
}

// TestDamagedSnapshotPointResetThatFailsIsRetried pins
// resetDamagedMember's check of the log's reset: the zero snapshot point
// is written only once the log is empty. Were it written over a log that
// still starts after seq 1 (the reset failed), every later open would
// refuse a log that starts after its snapshot point, and the member would
// never rebuild.
func TestDamagedSnapshotPointResetThatFailsIsRetried(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error {
		if err := s.InstallSnapshot(replica.SnapshotMeta{Seq: 10, Epoch: 1}); err != nil {
			return err
		}
		return s.Append(entriesOf(11, 1, "a", "b", "c"))
	})
	if err := fsys.WriteFile(path.Join("/n1", snapshotFile), []byte("not a snapshot point")); err != nil {
		t.Fatal(err)
	}
	failed := false
	fsys.SetInjector(func(op vfs.Op, n string) error {
		if op == vfs.OpRemove && strings.HasSuffix(n, ".log") && !failed {
			failed = true
			return errors.New("injected remove failure")
		}
		return nil
	})
	if m, err := OpenMember(guardConfig(fsys, nil)); err == nil {
		m.Close()
		t.Fatal("opened although emptying the log failed")
	}
	if !failed {
		t.Fatal("setup: the reset removed no segment")
	}
	fsys.SetInjector(nil)
	m, err := OpenMember(guardConfig(fsys, nil))
	if err != nil {
		t.Fatalf("open once the disk healed: %v", err)
	}
	defer m.Close()
	if st := m.Status(); !st.Rebuilding || st.Last != 0 || st.SnapSeq != 0 {
		t.Fatalf("after the reset: rebuilding %v, last %d, snap %d; want an empty rebuilding member", st.Rebuilding, st.Last, st.SnapSeq)
	}
}

// TestMemberAloneKeepsItsDamage pins restartDamaged's refusal for a
// member alone (len(Members) < 2): no other member holds a healthy copy,
// so it must not drop a damaged range (what follows it is its only copy)
// nor restart rebuilding, which it could never finish; RepairAlone is the
// way out.
func TestMemberAloneKeepsItsDamage(t *testing.T) {
	fsys := vfs.NewMem()
	cfg := guardConfig(fsys, nil)
	cfg.Members = []replica.NodeID{1}
	m, err := OpenMember(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, v := range []string{"one", "two", "three"} {
		if err := (memberStore{m}).Append(entriesOf(uint64(i+1), 1, v)); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.log.Sync(); err != nil {
		t.Fatal(err)
	}
	flipSecondBatch(t, fsys)
	restarted, err := m.restartDamaged()
	if err != nil || restarted {
		t.Fatalf("a member alone over damage: restarted %v, err %v; want no restart", restarted, err)
	}
	if next := m.log.NextSeq(); next != 4 {
		t.Fatalf("a member alone dropped its damaged range: log ends at %d, want 3", next-1)
	}
	if ok, err := hasMark(fsys, "/n1", rebuildingFile); err != nil || ok {
		t.Fatalf("a member alone marked itself rebuilding: %v, %v", ok, err)
	}
}

// TestDamageFoundWhileRunningKeepsTheMemberUncertain pins two guards of
// restartDamaged, the restart in place that drops a damaged range found
// while the member runs. It reads the uncertain mark: the fresh kernel
// must still know that the member cut an unproven tail before (its grants
// vouch for less), as after a process restart. And it clamps the
// published commit point to the cut log: CommitSeq never names an entry
// the member no longer holds.
func TestDamageFoundWhileRunningKeepsTheMemberUncertain(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error {
		for i, v := range []string{"one", "two", "three"} {
			if err := s.Append(entriesOf(uint64(i+1), 1, v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err := storage.WriteFileAtomic(fsys, path.Join("/n1", uncertainFile), []byte("cut before")); err != nil {
		t.Fatal(err)
	}
	m := openGuardMember(t, fsys)
	if st := m.Status(); !st.Uncertain || st.Rebuilding {
		t.Fatalf("setup: uncertain %v, rebuilding %v", st.Uncertain, st.Rebuilding)
	}
	flipSecondBatch(t, fsys) // what a scrubber finds
	m.commitSeq.Store(3)     // as a leader had told it
	if restarted, err := m.restartDamaged(); err != nil || !restarted {
		t.Fatalf("restartDamaged: %v, %v", restarted, err)
	}
	if st := m.Status(); !st.Uncertain || !st.Rebuilding || st.Last != 1 {
		t.Fatalf("after dropping the damage in place: uncertain %v, rebuilding %v, last %d; want uncertain, rebuilding at 1", st.Uncertain, st.Rebuilding, st.Last)
	}
	if commit := m.CommitSeq(); commit > 1 {
		t.Fatalf("after dropping seqs 2-3: CommitSeq %d, past the log's end at 1", commit)
	}
}

// TestDamageFoundWhileLeadingAnswersPendingProposals pins restartDamaged's
// answer to the proposals pending on the member: the restart drops the
// kernel that took them, so each is answered ErrRestarted at once (they
// may still commit through the other members: the client retries with
// its producer identity) rather than left to a kernel that never took
// them.
func TestDamageFoundWhileLeadingAnswersPendingProposals(t *testing.T) {
	g := newManualGroup(t, 3, nil)
	l := g.elect()
	for i := range 4 {
		l.ProposeFunc(storage.Record{Value: []byte(fmt.Sprintf("committed-value-%02d", i))}, func(_, _ uint64, _ error) {})
		g.run(50)
	}
	var answer error = errors.New("not answered")
	l.ProposeFunc(storage.Record{Value: []byte("pending")}, func(_, _ uint64, err error) { answer = err })
	g.pumpOnly(l) // taken and written, not replicated: pending
	if answer == nil || errors.Is(answer, ErrRestarted) {
		t.Fatalf("setup: the proposal was answered %v before the damage", answer)
	}
	name := fmt.Sprintf("/m%d/00000000000000000001.log", l.Status().ID)
	data, err := g.fs.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	offsets := batchOffsets(data)
	if len(offsets) < 4 {
		t.Fatalf("setup: %d batches", len(offsets))
	}
	if err := g.fs.FlipBit(name, offsets[2]+40, 2); err != nil { // a batch later ones prove durable
		t.Fatal(err)
	}
	l.Damaged()
	g.pumpOnly(l)
	if st := l.Status(); !st.Rebuilding {
		t.Fatalf("setup: the member did not restart rebuilding: %+v", st)
	}
	if !errors.Is(answer, ErrRestarted) {
		t.Fatalf("the proposal pending when the member restarted in place: %v; want ErrRestarted", answer)
	}
}

// TestRestartInPlaceThatCannotReadItsStateFails pins restartDamaged's
// check of loadPersisted: after dropping a damaged range the fresh kernel
// starts from the state files, and a hard state that cannot be read must
// fail the restart (its driver then restarts the member in place until
// it can) rather than start a kernel that promised nothing.
func TestRestartInPlaceThatCannotReadItsStateFails(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error {
		for i, v := range []string{"one", "two", "three"} {
			if err := s.Append(entriesOf(uint64(i+1), 1, v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err := writeHardState(fsys, "/n1", replica.HardState{Promised: 5, PromisedTo: 2}); err != nil {
		t.Fatal(err)
	}
	m := openGuardMember(t, fsys)
	flipSecondBatch(t, fsys)
	fsys.SetInjector(func(op vfs.Op, n string) error {
		if op == vfs.OpOpen && path.Base(n) == hardStateFile {
			return errors.New("injected I/O error")
		}
		return nil
	})
	if restarted, err := m.restartDamaged(); err == nil {
		t.Fatalf("restarted in place (%v) without reading its hard state: promised %d", restarted, m.Status().Hard.Promised)
	}
}

// TestSnapshotPointFileOfAnotherShapeIsDamaged pins readSnapshotPoint's
// checks of what a file whose checksum holds says: 17 bytes, an installing
// flag of 0 or 1, and a seq and an epoch that are both zero or both not.
// Anything else is errSnapshotPointDamaged (a member of a group then
// rebuilds), not a point.
func TestSnapshotPointFileOfAnotherShapeIsDamaged(t *testing.T) {
	fsys := vfs.NewMem()
	if err := fsys.MkdirAll("/m"); err != nil {
		t.Fatal(err)
	}
	point := func(seq, epoch uint64, flag byte) []byte {
		return append(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, seq), epoch), flag)
	}
	for _, c := range []struct {
		what string
		b    []byte
		ok   bool
	}{
		{"a point", point(40, 3, 0), true},
		{"an install", point(40, 3, 1), true},
		{"none yet", point(0, 0, 0), true},
		{"a byte more", append(point(40, 3, 0), 0), false},
		{"a byte less", point(40, 3, 0)[:16], false},
		{"installing flag 2", point(40, 3, 2), false},
		{"a seq without an epoch", point(40, 0, 0), false},
		{"an epoch without a seq", point(0, 3, 0), false},
	} {
		if err := storage.WriteFileAtomic(fsys, path.Join("/m", snapshotFile), c.b); err != nil {
			t.Fatal(err)
		}
		p, err := readSnapshotPoint(fsys, "/m")
		if c.ok && err != nil || !c.ok && !errors.Is(err, errSnapshotPointDamaged) {
			t.Errorf("%s: %+v, %v; want ok %v", c.what, p, err, c.ok)
		}
	}
}

// TestInstalledLogSurvivesARestart pins installSnapshot's second write of
// the point (installing cleared once the log is reset): a point left
// "installing" would make every later open reset the log again, dropping
// the entries the member took (and acknowledged) after the install.
func TestInstalledLogSurvivesARestart(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error {
		if err := s.Append(entriesOf(1, 1, "a", "b")); err != nil {
			return err
		}
		if err := s.InstallSnapshot(replica.SnapshotMeta{Seq: 40, Epoch: 3}); err != nil {
			return err
		}
		return s.Append(entriesOf(41, 3, "x", "y", "z"))
	})
	m := openGuardMember(t, fsys)
	if st := m.Status(); st.SnapSeq != 40 || st.Last != 43 {
		t.Fatalf("after a restart: snap %d, last %d; want the install at 40 and the entries after it to 43", st.SnapSeq, st.Last)
	}
}

// TestInstallThatFailsMidwayIsFinishedOnRestart pins the order of
// installSnapshot's writes: the point is recorded, as installing, before
// the log is reset, and recorded done only after. An install cut short by
// a failed reset (or a crash) then leaves a point that the next open
// finishes, never one that names a log that was not reset (which every
// later open would refuse) nor a reset log under the old point.
func TestInstallThatFailsMidwayIsFinishedOnRestart(t *testing.T) {
	for _, c := range []struct {
		what string
		fail func(op vfs.Op, name string) bool
	}{
		{"the reset fails", func(op vfs.Op, name string) bool { return op == vfs.OpRemove && strings.HasSuffix(name, ".log") }},
		{"recording it done fails", func(op vfs.Op, name string) bool {
			return op == vfs.OpCreate && path.Base(name) == snapshotFile+".tmp"
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			fsys := vfs.NewMem()
			m, err := OpenMember(guardConfig(fsys, nil))
			if err != nil {
				t.Fatal(err)
			}
			if err := (memberStore{m}).Append(entriesOf(1, 1, "a", "b", "c")); err != nil {
				t.Fatal(err)
			}
			if err := m.log.Sync(); err != nil {
				t.Fatal(err)
			}
			creates := 0
			fsys.SetInjector(func(op vfs.Op, name string) error {
				if op == vfs.OpCreate && path.Base(name) == snapshotFile+".tmp" {
					creates++
					if creates == 1 {
						return nil // the first write of the point goes through
					}
				}
				if c.fail(op, name) {
					return errors.New("injected failure")
				}
				return nil
			})
			if err := (memberStore{m}).InstallSnapshot(replica.SnapshotMeta{Seq: 40, Epoch: 3}); err == nil {
				t.Fatal("setup: the install did not fail")
			}
			m.Close()
			fsys.SetInjector(nil)
			m, err = OpenMember(guardConfig(fsys, nil))
			if err != nil {
				t.Fatalf("open after an install that failed midway: %v", err)
			}
			defer m.Close()
			if st := m.Status(); st.SnapSeq != 40 || st.Last != 40 || m.log.StartSeq() != 41 {
				t.Fatalf("after the install was finished: snap %d, last %d, log start %d; want 40, 40, 41", st.SnapSeq, st.Last, m.log.StartSeq())
			}
		})
	}
}

// aloneConfig is the Manual member alone of newManualGroup(t, 1, tune), for
// reopening it.
func aloneConfig(g *manualGroup, tune func(*Config)) Config {
	cfg := Config{ID: 1, Members: []replica.NodeID{1}, Dir: "/m1", FS: g.fs, Logger: quiet, Seed: 1,
		Manual: true, Clock: g.clock, Send: func(m replica.Message) { g.net = append(g.net, m) }}
	if tune != nil {
		tune(&cfg)
	}
	return cfg
}

// proposeEach proposes n records of about 100 bytes on l, one at a time,
// running g 10 ms after each.
func proposeEach(g *manualGroup, l *Log, prefix string, n int) {
	for i := range n {
		l.ProposeFunc(storage.Record{Value: []byte(fmt.Sprintf("%s-%03d-%s", prefix, i, strings.Repeat("x", 80)))}, func(_, _ uint64, _ error) {})
		g.run(10)
	}
}

// TestCompactionKeepsWhatTheCallerHasNotConsumed pins Compact's bound by
// CompactLimit (what the caller, a partition, has not consumed yet):
// retention deletes nothing past it, however old or large the log is.
func TestCompactionKeepsWhatTheCallerHasNotConsumed(t *testing.T) {
	limit := uint64(0)
	tune := func(c *Config) {
		compacting(c)
		c.CompactLimit = func() uint64 { return limit }
	}
	g := newManualGroup(t, 1, tune)
	l := g.elect()
	proposeEach(g, l, "value", 80)
	if st := l.Status(); st.CommitSeq < 80 {
		t.Fatalf("setup: commit %d", st.CommitSeq)
	}
	if start := l.ReadLog().StartSeq(); start != 1 {
		t.Fatalf("compacted to %d with nothing consumed", start-1)
	}
	limit = 30
	g.run(50)
	if start := l.ReadLog().StartSeq(); start <= 1 || start-1 > limit {
		t.Fatalf("compacted to %d with %d consumed; want some, not past it", start-1, limit)
	}
}

// TestCompactedMemberReopens pins Compact's write of the snapshot point
// before it deletes segments: a member whose log retention shortened
// opens again at its point, which names the seq before its log's start.
func TestCompactedMemberReopens(t *testing.T) {
	g := newManualGroup(t, 1, compacting)
	l := g.elect()
	proposeEach(g, l, "value", 80)
	start := l.ReadLog().StartSeq()
	if start <= 1 {
		t.Fatal("setup: nothing compacted")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := Open(aloneConfig(g, compacting))
	if err != nil {
		t.Fatalf("reopen after compaction to %d: %v", start-1, err)
	}
	g.logs[0] = l
	t.Cleanup(func() { l.Close() })
	if st, start := l.Status(), l.ReadLog().StartSeq(); st.SnapSeq == 0 || st.SnapSeq != start-1 {
		t.Fatalf("reopened with snapshot point %d and log start %d", st.SnapSeq, start)
	}
}

// TestCompactionKeepsWhatAFollowerStillNeeds pins Compact's bound by the
// kernel's RetainFloor: a leader keeps the log a follower that went
// silent (inside its reservation) still needs, so the follower catches up
// from the log, without a snapshot install.
func TestCompactionKeepsWhatAFollowerStillNeeds(t *testing.T) {
	tune := func(c *Config) {
		compacting(c)
		c.Reservation = 10 * time.Second
	}
	g := newManualGroup(t, 3, tune)
	l := g.elect()
	id := l.Status().ID
	silent := g.logs[id%3] // another member
	silent.HoldUp(g.clock.NowMs() + 2_000)
	proposeEach(g, l, "value", 80)
	if st := l.Status(); st.CommitSeq < 80 {
		t.Fatalf("setup: commit %d", st.CommitSeq)
	}
	if start, need := l.ReadLog().StartSeq(), silent.ReadLog().NextSeq(); start > need {
		t.Fatalf("the leader compacted to %d; a silent follower still needs %d", start-1, need)
	}
	g.run(2_000)
	if silent.CommitSeq() < 80 || silent.Installs() != 0 {
		t.Fatalf("the follower back: commit %d, installs %d; want it caught up from the log", silent.CommitSeq(), silent.Installs())
	}
}

// TestRecoverMakesTheStateFilesDurable pins that Recover makes the
// directory durable before it trusts it: a hard state whose write failed
// at its directory sync is already current (the rename happened) but not
// durable. Recover reads it and the fresh kernel acts on the promise in
// it, so after a crash the member must still hold that promise. Two
// SyncDirs of the member's directory guarantee it today — Recover's own
// and the one storage.Open's recovery ends with (the log lives in the
// same directory) — so removing either alone keeps this green; removing
// both fails it.
func TestRecoverMakesTheStateFilesDurable(t *testing.T) {
	fsys := vfs.NewMem()
	writeGuardLog(t, fsys, func(s memberStore) error { return s.Append(entriesOf(1, 1, "a")) })
	m, err := OpenMember(guardConfig(fsys, nil))
	if err != nil {
		t.Fatal(err)
	}
	failing := true
	fsys.SetInjector(func(op vfs.Op, name string) error {
		if failing && op == vfs.OpSyncDir {
			return errors.New("injected dir sync failure")
		}
		return nil
	})
	m.Step(replica.Message{Type: replica.MsgPrepare, From: 2, To: 1, Epoch: 5, LastEpoch: 1, LastSeq: 1, Forced: true})
	if err := m.Handle(); err == nil {
		t.Fatal("setup: the hard state's write did not fail")
	}
	failing = false
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); st.Hard.Promised != 5 {
		t.Fatalf("setup: recovered with promise %d, want 5 (the renamed hard state)", st.Hard.Promised)
	}
	fsys.CrashClean()
	m.Close()
	m = openGuardMember(t, fsys)
	if st := m.Status(); st.Hard.Promised != 5 {
		t.Fatalf("after a crash: promise %d; the member recovered (and acted) with 5", st.Hard.Promised)
	}
}

// TestAppendRefusesEntriesThatDoNotContinueTheLog pins memberStore.Append's
// check that storage put each batch at the seq the kernel expects: a
// kernel whose view of the log's end is off must not write entries under
// seqs other than their own.
func TestAppendRefusesEntriesThatDoNotContinueTheLog(t *testing.T) {
	m := openTestMember(t)
	if err := (memberStore{m}).Append(entriesOf(1, 1, "a", "b")); err != nil {
		t.Fatal(err)
	}
	if err := (memberStore{m}).Append(entriesOf(5, 1, "e")); err == nil {
		t.Fatalf("appended seq 5 after a log ending at 2 (it landed at %d)", m.log.NextSeq()-1)
	}
}

// TestRecoverClampsTheCommitPointAndAnswersPendingProposals pins two
// guards of Recover, the restart in place after a failed write: it clamps
// the published commit point to the log it cut back to its synced end
// (CommitSeq never names an entry the member no longer holds), and it
// answers the proposals pending on the kernel it drops with ErrRestarted.
func TestRecoverClampsTheCommitPointAndAnswersPendingProposals(t *testing.T) {
	m := openTestMember(t)
	if err := (memberStore{m}).Append(entriesOf(1, 1, "a")); err != nil {
		t.Fatal(err)
	}
	if err := m.log.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := (memberStore{m}).Append(entriesOf(2, 1, "b", "c")); err != nil { // never synced
		t.Fatal(err)
	}
	m.commitSeq.Store(3) // committed through the other members
	var answer error = errors.New("not answered")
	p := NewProposalFunc(storage.Record{Value: []byte("c")}, func(_, _ uint64, err error) { answer = err })
	p.Seq, p.Epoch = 3, 1
	m.pending = append(m.pending, p)
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	if last := m.log.NextSeq() - 1; last != 1 {
		t.Fatalf("setup: Recover cut the log to %d, want its synced end 1", last)
	}
	if commit := m.CommitSeq(); commit > 1 {
		t.Fatalf("after Recover cut the log to 1: CommitSeq %d", commit)
	}
	if !errors.Is(answer, ErrRestarted) {
		t.Fatalf("the proposal pending when the member restarted in place: %v; want ErrRestarted", answer)
	}
}

// TestAMemberThatCannotPersistHoldsNoLease pins publishStopped's clearing
// of the lease (leaseUntil): a leader whose fsync failed claims nothing
// while it cannot persist, its lease included — HoldsLease would let the
// node serve reads from it.
func TestAMemberThatCannotPersistHoldsNoLease(t *testing.T) {
	g := newManualGroup(t, 3, nil)
	l := g.elect()
	l.ProposeFunc(storage.Record{Value: []byte("v")}, func(_, _ uint64, _ error) {})
	g.run(100)
	if !l.HoldsLease() {
		t.Fatal("setup: the leader holds no lease")
	}
	id := l.Status().ID
	g.fs.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSync && strings.HasPrefix(name, fmt.Sprintf("/m%d/", id)) {
			return errors.New("injected fsync error")
		}
		return nil
	})
	l.ProposeFunc(storage.Record{Value: []byte("lost")}, func(_, _ uint64, _ error) {})
	g.pumpOnly(l)
	if st := l.Status(); st.Role == replica.Leader {
		t.Fatal("setup: the leader did not stop")
	}
	if l.HoldsLease() || l.LeaseUntil() != 0 {
		t.Fatalf("a member that cannot persist holds a lease until %d (now %d)", l.LeaseUntil(), g.clock.NowNanos())
	}
}

// TestCompactionRecordsThePointsOwnEpoch pins the epoch Compact writes
// with the snapshot point (epochAt(st.Epochs, point)): a point that is the
// last entry of an epoch, with the next epoch's entries after it, is
// recorded in its own epoch, which a leader's (PrevSeq, PrevEpoch) after
// it names.
func TestCompactionRecordsThePointsOwnEpoch(t *testing.T) {
	limit := uint64(0)
	tune := func(c *Config) {
		c.Storage = storage.Options{SegmentBytesMax: 1, RetentionBytes: 1} // a segment a batch; retention lets go of every sealed one
		c.CompactEvery = 5 * time.Millisecond
		c.CompactLimit = func() uint64 { return limit }
	}
	g := newManualGroup(t, 1, tune)
	l := g.elect()
	proposeEach(g, l, "first", 3)
	first := l.Status()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := Open(aloneConfig(g, tune))
	if err != nil {
		t.Fatal(err)
	}
	g.logs[0] = l
	t.Cleanup(func() { l.Close() })
	l.Campaign()
	g.run(200)
	proposeEach(g, l, "second", 2)
	st := l.Status()
	if st.Role != replica.Leader || st.Hard.Promised <= first.Hard.Promised || st.CommitSeq <= first.Last+1 {
		t.Fatalf("setup: the member alone did not lead a second epoch: %+v", st)
	}
	limit = first.Last // the last entry of the first epoch
	g.run(50)
	p, err := readSnapshotPoint(g.fs, "/m1")
	if want := (snapshotPoint{seq: first.Last, epoch: first.Hard.Promised}); err != nil || p != want {
		t.Fatalf("compacted to the first epoch's last entry: snapshot point %+v, %v; want %+v", p, err, want)
	}
}

// TestAppendRefusesAnEntryThatDoesNotDecode pins memberStore.Append's
// check of DecodeRecord: an entry whose data is not a record (garbage
// from a peer) fails the write; it is never stored as some other record
// under the leader's seq.
func TestAppendRefusesAnEntryThatDoesNotDecode(t *testing.T) {
	m := openTestMember(t)
	bad := []replica.Entry{{Seq: 1, Epoch: 1, Data: []byte{0xff, 0xff, 0xff}}}
	if err := (memberStore{m}).Append(bad); err == nil {
		t.Fatalf("stored an entry that is not a record (the log ends at %d)", m.log.NextSeq()-1)
	}
}

// TestCommittedServesNothingPastTheCommitPoint pins Log.Committed's
// refusal of a fromSeq past the commit point: the entries the cache holds
// there are not committed yet, and none is served.
func TestCommittedServesNothingPastTheCommitPoint(t *testing.T) {
	m := openTestMember(t)
	if err := (memberStore{m}).Append(entriesOf(1, 1, "a", "b", "c", "d", "e")); err != nil {
		t.Fatal(err)
	}
	m.commitSeq.Store(2)
	l := &Log{m: m}
	for from := uint64(3); from <= 5; from++ {
		if got, err := l.Committed(nil, from, 10); len(got) != 0 || err != nil {
			t.Fatalf("Committed from %d with commit 2: %d entries, %v", from, len(got), err)
		}
	}
}

// TestRecoverOverDamageRemembersItsMark pins Recover's reload of the mark
// flags (rebuildingMarked and the others) from what loadOrQuarantine
// found: a restart in place that drops newly found damage writes the
// rebuilding mark, and the member must know it did, or Handle never
// removes it once the member is whole — and every later restart would
// come back rebuilding (with a majority so marked, the group could elect
// no one).
func TestRecoverOverDamageRemembersItsMark(t *testing.T) {
	fsys := vfs.NewMem()
	m, err := OpenMember(guardConfig(fsys, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.Close() }()
	for i, v := range []string{"one", "two", "three"} {
		if err := (memberStore{m}).Append(entriesOf(uint64(i+1), 1, v)); err != nil {
			t.Fatal(err)
		}
		if err := m.log.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	flipSecondBatch(t, fsys)
	if m.rebuildingMarked {
		t.Fatal("setup: marked before the damage")
	}
	if err := m.Recover(); err != nil {
		t.Fatal(err)
	}
	if ok, err := hasMark(fsys, "/n1", rebuildingFile); err != nil || !ok || !m.Status().Rebuilding {
		t.Fatalf("setup: Recover over damage: marked %v (%v), rebuilding %v", ok, err, m.Status().Rebuilding)
	}
	if !m.rebuildingMarked {
		t.Fatal("Recover wrote the rebuilding mark but the member does not know it: Handle would never remove it")
	}
}

// flipSecondBatch flips a bit inside the second batch of member n1's
// first segment.
func flipSecondBatch(t *testing.T, fsys *vfs.MemFS) {
	t.Helper()
	name := "/n1/00000000000000000001.log"
	data, err := fsys.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.FlipBit(name, batchOffsets(data)[1]+40, 2); err != nil {
		t.Fatal(err)
	}
}
