package sim

import (
	"fmt"
	"log/slog"
	"path"
	"strings"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
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
	s.b.onLog = func(level slog.Level, msg string) {
		s.nodeLines[msg]++
		if strings.HasPrefix(msg, "ack ledger torn tail truncated") && s.ledgerFlipped {
			s.ledgerFlipped = false
			s.w.tracef("checker: acks forgotten with the ack ledger's cut tail")
			s.chk.acksForgotten()
		}
		if strings.Contains(msg, "nereus repair") {
			s.askRepair(msg)
		}
	}
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
	logs, err := node.Repair(s.b.fs, dataDir, node.RepairOptions{Partition: -1, Mode: storage.RepairSalvage})
	if err != nil {
		return err
	}
	s.repairs++
	for _, l := range logs {
		if !l.Damaged() {
			continue
		}
		s.w.tracef("repair %s: %d damaged ranges, %d seqs dropped, torn tail %v, epoch file removed %v, topics rebuilt %d, ledger snapshot removed %v",
			strings.TrimPrefix(l.Dir, dataDir+"/"), len(l.Report.Damage), l.Report.DroppedSeqs, l.Report.TornTail != nil,
			l.EpochFileRemoved, l.TopicsRebuilt, l.LedgerSnapshotRemoved)
		// A ledger's tail the repair cut after a flip hit a ledger segment
		// may be the flipped last batch (as at a load, watchForRepair).
		cutAfterFlip := l.Report.TornTail != nil && s.ledgerFlipped
		if l.Group != "" && (len(l.Report.Damage) > 0 || l.LedgerSnapshotRemoved || cutAfterFlip) {
			s.ledgerFlipped = s.ledgerFlipped && !cutAfterFlip
			s.chk.acksForgotten()
		}
		for what, done := range map[string]bool{"partition ranges dropped": l.Group == "" && len(l.Report.Damage) > 0,
			"ledger ranges dropped": l.Group != "" && len(l.Report.Damage) > 0, "ledger snapshot removed": l.LedgerSnapshotRemoved,
			"epoch file removed": l.EpochFileRemoved, "topics rebuilt": l.TopicsRebuilt > 0} {
			if done {
				s.repaired[what]++
			}
		}
	}
	return nil
}

// flipStateBit flips one bit of one of the single node's state files: a
// group's ack ledger (a segment, or its snapshot), settings.json or an
// incarnation copy, a partition's epoch file or dedup snapshot, or
// topics.json; half the time the node is killed -9 at once, so its
// restart reads the file. What each must come to is in
// docs/OPERATIONS.md (Corruption and repair): refused with DATA_CORRUPT
// until a repair (the ledger, the epoch file), set again (the group's
// files), replayed from the log (the dedup snapshot), or a start that
// fails until a repair (topics.json).
func (s *sim) flipStateBit() {
	fs := s.b.fs
	var files []string
	switch s.w.rng.IntN(5) {
	case 0:
		files = groupLedgerFiles(fs)
	case 1:
		files = groupStateFiles(fs)
	case 2:
		for p := uint32(0); p < s.opts.Partitions; p++ {
			for _, name := range []string{"epoch", "dedup"} {
				if f := path.Join(dataDir, "topics", simTopic, fmt.Sprint(p), name); fileExists(fs, f) {
					files = append(files, f)
				}
			}
		}
	case 3:
		files = []string{path.Join(dataDir, "topics.json")}
	default:
		if f := path.Join(dataDir, "groups", simGroup, simTopic, "ledger-snapshot"); fileExists(fs, f) {
			files = []string{f}
		}
	}
	if len(files) == 0 {
		return
	}
	file := files[s.w.rng.IntN(len(files))]
	size, err := fs.Stat(file)
	if err != nil || size == 0 {
		return
	}
	off := s.w.rng.Int64N(size)
	if err := fs.FlipBit(file, off, uint(s.w.rng.IntN(8))); err != nil {
		return
	}
	s.chk.stateFlips++
	s.stateFlips[flipKind(file)]++
	s.ledgerFlipped = s.ledgerFlipped || flipKind(file) == "ledger segment"
	s.w.tracef("fault bit flip %s@%d", strings.TrimPrefix(file, dataDir+"/"), off)
	if s.w.rng.IntN(2) == 0 {
		s.b.crash()
	}
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
