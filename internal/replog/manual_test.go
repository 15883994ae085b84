package replog

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// manualGroup runs Manual logs on the test's goroutine: a virtual clock
// and a queue of messages in flight, delivered by pump.
type manualGroup struct {
	t     *testing.T
	fs    *vfs.MemFS
	clock *env.Virtual
	logs  []*Log
	net   []replica.Message
}

func newManualGroup(t *testing.T, n int, tune func(*Config)) *manualGroup {
	g := &manualGroup{t: t, clock: env.NewVirtual(1_000)}
	fs := vfs.NewMem()
	g.fs = fs
	var members []replica.NodeID
	for i := 1; i <= n; i++ {
		members = append(members, replica.NodeID(i))
	}
	for _, id := range members {
		cfg := Config{ID: id, Members: members, Dir: fmt.Sprintf("/m%d", id), FS: fs, Logger: quiet, Seed: uint64(id),
			Manual: true, Clock: g.clock, Send: func(m replica.Message) { g.net = append(g.net, m) }}
		if tune != nil {
			tune(&cfg)
		}
		l, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		g.logs = append(g.logs, l)
		t.Cleanup(func() { l.Close() })
	}
	return g
}

// run advances the clock by ms, one tick at a time, delivering every
// message and pumping every log after each tick.
func (g *manualGroup) run(ms int64) {
	for end := g.clock.NowMs() + ms; g.clock.NowMs() < end; g.clock.Advance(10 * time.Millisecond) {
		for progress := true; progress; {
			progress = false
			for _, l := range g.logs {
				ran, err := l.Pump()
				if err != nil {
					g.t.Fatal(err)
				}
				progress = progress || ran
			}
			for len(g.net) > 0 {
				m := g.net[0]
				g.net = g.net[1:]
				g.logs[m.To-1].Step(m)
				progress = true
			}
		}
	}
}

// elect has the first log campaign, runs 200 ms and returns the leader.
func (g *manualGroup) elect() *Log {
	g.t.Helper()
	g.logs[0].Campaign()
	g.run(200)
	l := g.leader()
	if l == nil {
		g.t.Fatal("no leader after 200 ms")
	}
	return l
}

func (g *manualGroup) leader() *Log {
	for _, l := range g.logs {
		if l.Status().Role == replica.Leader {
			return l
		}
	}
	return nil
}

// TestManualLogsElectCommitAndAnswer: Manual logs run entirely on the
// caller's goroutine, by the virtual clock: they elect a leader, commit a
// proposal and answer it, with no goroutine of their own.
func TestManualLogsElectCommitAndAnswer(t *testing.T) {
	g := newManualGroup(t, 3, nil)
	l := g.elect()
	var got error = errors.New("not answered")
	var seq uint64
	l.ProposeFunc(storage.Record{Value: []byte("v")}, func(s, _ uint64, err error) { seq, got = s, err })
	g.run(100)
	if got != nil || seq == 0 {
		t.Fatalf("proposal: seq %d, err %v", seq, got)
	}
	for _, m := range g.logs {
		if m.CommitSeq() < seq {
			t.Fatalf("n%d commit %d < %d", m.Status().ID, m.CommitSeq(), seq)
		}
	}
	// No clock, no ticks: a follower never times out between two Pumps at
	// the same virtual time.
	before := g.logs[1].Status()
	for i := 0; i < 100; i++ {
		g.logs[1].Pump()
	}
	if after := g.logs[1].Status(); after.Hard != before.Hard || after.Role != before.Role {
		t.Fatalf("pumping without time passing changed n2: %+v -> %+v", before, after)
	}
}

// TestManualLogNeverBlocksAProposal: a full proposal queue is pumped (and
// proposed) by the next ProposeFunc; inside a Pump it fails with ErrBusy
// instead of blocking the only goroutine.
func TestManualLogNeverBlocksAProposal(t *testing.T) {
	g := newManualGroup(t, 1, func(c *Config) { c.ProposeQueueMax = 2 })
	l := g.logs[0]
	l.Campaign()
	g.run(50)
	if l.Status().Role != replica.Leader {
		t.Fatal("a group of one did not elect itself")
	}
	var answers []error
	record := func(_, _ uint64, err error) { answers = append(answers, err) }
	for i := 0; i < 3; i++ { // the third pumps the first two
		l.ProposeFunc(storage.Record{Value: []byte("v")}, record)
	}
	if len(answers) != 2 || answers[0] != nil || answers[1] != nil {
		t.Fatalf("the full queue was not pumped: answers %v", answers)
	}
	l.ProposeFunc(storage.Record{Value: []byte("w")}, record) // queue: 2 of 2
	l.pumping = true                                          // as if called from inside a Pump
	l.ProposeFunc(storage.Record{Value: []byte("x")}, record)
	l.pumping = false
	if len(answers) != 3 || !errors.Is(answers[2], ErrBusy) {
		t.Fatalf("a full queue inside a Pump: answers %v, want ErrBusy last", answers)
	}
}

// TestMemberRestartsInPlaceAfterAFailedFsync: a leader whose fsync fails
// claims nothing while it cannot persist (no leader in its status),
// answers proposals instead of leaving them waiting, and once the disk
// works again restarts in place with its log cut back to what it had
// synced — the entry whose fsync failed is gone from it — and the group
// commits again.
func TestMemberRestartsInPlaceAfterAFailedFsync(t *testing.T) {
	g := newManualGroup(t, 3, nil)
	l := g.elect()
	var seq uint64
	l.ProposeFunc(storage.Record{Value: []byte("synced")}, func(s, _ uint64, err error) { seq = s })
	g.run(100)
	synced := l.ReadLog().SyncedSeq()
	if seq == 0 || synced < seq {
		t.Fatalf("setup: seq %d synced %d", seq, synced)
	}
	id := l.Status().ID
	failing := true
	g.fs.SetInjector(func(op vfs.Op, name string) error {
		if failing && op == vfs.OpSync && strings.HasPrefix(name, fmt.Sprintf("/m%d/", id)) {
			return errors.New("injected fsync error")
		}
		return nil
	})
	var answer error = errors.New("not answered")
	l.ProposeFunc(storage.Record{Value: []byte("lost")}, func(_, _ uint64, err error) { answer = err })
	g.pumpOnly(l)
	if st := l.Status(); st.Role == replica.Leader || st.Leader != 0 {
		t.Fatalf("a member that cannot persist still claims leadership: %+v", st)
	}
	if !errors.Is(answer, ErrRestarted) && !errors.Is(answer, ErrLost) {
		t.Fatalf("the proposal whose fsync failed: %v", answer)
	}
	if next := l.ReadLog().NextSeq(); next <= synced+1 {
		t.Fatalf("setup: the failed entry was never written (next %d, synced %d)", next, synced)
	}
	failing = false
	// Restart it alone (no message moves): it cut its log back to what
	// it had synced. (The entry may still come back from a follower that
	// flushed the early APPEND, as the next leader's.)
	g.clock.Advance(200 * time.Millisecond)
	g.pumpOnly(l)
	if next := l.ReadLog().NextSeq(); next != synced+1 {
		t.Fatalf("n%d restarted with its log ending at %d, want its synced %d", id, next-1, synced)
	}
	g.net = nil // what it sent meanwhile
	g.run(1500) // an election timeout (300-600 ms)
	leader := g.leader()
	if leader == nil {
		t.Fatal("no leader after the disk healed")
	}
	var after error = errors.New("not answered")
	leader.ProposeFunc(storage.Record{Value: []byte("after")}, func(_, _ uint64, err error) { after = err })
	g.run(200)
	if after != nil {
		t.Fatalf("a write after the restart: %v", after)
	}
}

// pumpOnly pumps one log until it has nothing left to do, without time
// passing or messages moving.
func (g *manualGroup) pumpOnly(l *Log) {
	for i := 0; i < 100; i++ {
		if ran, err := l.Pump(); err != nil {
			g.t.Fatal(err)
		} else if !ran {
			return
		}
	}
}

// TestMemberRestartsInPlaceOverDamage: a member restarting after a failed
// fsync whose log also took damage drops the damaged range and rebuilds,
// as at open, instead of failing every restart for good.
func TestMemberRestartsInPlaceOverDamage(t *testing.T) {
	g := newManualGroup(t, 3, nil)
	l := g.elect()
	for i := 0; i < 20; i++ {
		l.ProposeFunc(storage.Record{Value: []byte(fmt.Sprintf("value-%02d", i))}, func(_, _ uint64, _ error) {})
		g.run(20)
	}
	follower := g.logs[(int(l.Status().ID))%3]
	id := follower.Status().ID
	dir := fmt.Sprintf("/m%d/", id)
	failing := true
	g.fs.SetInjector(func(op vfs.Op, name string) error {
		if failing && op == vfs.OpSync && strings.HasPrefix(name, dir) {
			return errors.New("injected fsync error")
		}
		return nil
	})
	l.ProposeFunc(storage.Record{Value: []byte("while failing")}, func(_, _ uint64, _ error) {})
	g.run(50)
	if st := follower.Status(); st.Leader != 0 {
		t.Fatalf("setup: n%d did not fail (status %+v)", id, st)
	}
	if err := g.fs.FlipBit(dir+"00000000000000000001.log", 200, 3); err != nil {
		t.Fatal(err)
	}
	failing = false
	g.run(300)
	if st := follower.Status(); st.Rebuilding && st.Leader == 0 {
		t.Fatalf("n%d never came back: %+v", id, st)
	}
	g.run(1500)
	if c, lc := follower.CommitSeq(), g.leader().CommitSeq(); c != lc {
		t.Fatalf("n%d commit %d, leader %d: not caught up after the restart over damage", id, c, lc)
	}
}

// TestLeaderThatCannotDropDamageRestartsInPlace (found by the cluster
// soak, seed 105140): a leader told its log is damaged drops the range,
// but the fsync of the drop fails. It used to stop for good with its last
// status — still the leader, its log already cut below its commit — so
// its node went on coordinating from the cut log and redelivered an
// acknowledged message. It now claims nothing and restarts in place like a
// member whose fsync failed, finishes the drop, and rebuilds.
func TestLeaderThatCannotDropDamageRestartsInPlace(t *testing.T) {
	g := newManualGroup(t, 3, nil)
	l := g.elect()
	for i := 0; i < 20; i++ {
		l.ProposeFunc(storage.Record{Value: []byte(fmt.Sprintf("value-%02d", i))}, func(_, _ uint64, _ error) {})
		g.run(20)
	}
	id := l.Status().ID
	dir := fmt.Sprintf("/m%d/", id)
	segment := dir + "00000000000000000001.log"
	data, err := g.fs.ReadFile(segment)
	if err != nil {
		t.Fatal(err)
	}
	offs := batchOffsets(data)
	if len(offs) < 10 {
		t.Fatalf("setup: %d batches", len(offs))
	}
	if err := g.fs.FlipBit(segment, offs[len(offs)/2]+40, 3); err != nil {
		t.Fatal(err)
	}
	failing := true
	g.fs.SetInjector(func(op vfs.Op, name string) error {
		if failing && op == vfs.OpSync && strings.HasPrefix(name, dir) {
			return errors.New("injected fsync error")
		}
		return nil
	})
	l.Damaged()
	g.pumpOnly(l) // fails the test if the member stopped
	if st := l.Status(); st.Role == replica.Leader || st.Leader != 0 {
		t.Fatalf("a member that could not drop its damage still claims leadership: %+v", st)
	}
	failing = false
	g.run(2000)
	st := l.Status()
	if st.Rebuilding {
		t.Fatalf("n%d never came back whole: %+v", id, st)
	}
	leader := g.leader()
	if leader == nil {
		t.Fatal("no leader after the disk healed")
	}
	if c, lc := l.CommitSeq(), leader.CommitSeq(); c != lc {
		t.Fatalf("n%d commit %d, leader %d: not caught up", id, c, lc)
	}
}

// TestLoneMemberDamagedAtRestartIsSaid (LoneDamageAtRestartIsSaid): a
// member alone restarting in place after a failed fsync whose log also
// took damage has no healthy copy to rebuild from and cannot drop it: it
// used to retry the restart in silence for good. It says the damage once
// (StuckOnDamage, which its node turns into a corrupt partition until a
// repair) and notifies, and stays down.
//
// A flip into a sealed segment, which the open does not verify, stops
// the member's scan of its log with an error that locates nothing (not a
// storage.CorruptError): it was retried in silence for good (seed 48 of `nereus sim --replicas 1 --kv 30`: the
// partition answered nothing, no repair asked). It is said too, its
// place unknown.
func TestLoneMemberDamagedAtRestartIsSaid(t *testing.T) {
	for _, tc := range []struct {
		name         string
		offset       int64
		located      bool
		segmentBytes int64
	}{{"in the active segment", 200, true, 0}, {"in a sealed segment", -20, false, 256}} {
		t.Run(tc.name, func(t *testing.T) { loneMemberDamagedAtRestart(t, tc.offset, tc.located, tc.segmentBytes) })
	}
}

func loneMemberDamagedAtRestart(t *testing.T, offset int64, located bool, segmentBytes int64) {
	notified := 0
	g := newManualGroup(t, 1, func(c *Config) {
		c.Notify = func() { notified++ }
		c.Storage.SegmentBytesMax = segmentBytes
	})
	l := g.elect()
	for i := 0; i < 20; i++ {
		l.ProposeFunc(storage.Record{Value: []byte(fmt.Sprintf("value-%02d", i))}, func(_, _ uint64, _ error) {})
		g.run(20)
	}
	failing := true
	g.fs.SetInjector(func(op vfs.Op, name string) error {
		if failing && op == vfs.OpSync && strings.HasPrefix(name, "/m1/") {
			return errors.New("injected fsync error")
		}
		return nil
	})
	l.ProposeFunc(storage.Record{Value: []byte("while failing")}, func(_, _ uint64, _ error) {})
	g.run(50)
	if st := l.Status(); st.Leader != 0 {
		t.Fatalf("setup: the member did not fail (status %+v)", st)
	}
	if l.StuckOnDamage() != nil {
		t.Fatal("stuck on damage before any")
	}
	if offset < 0 { // into the header of the segment's second batch
		b, err := g.fs.ReadFile("/m1/00000000000000000001.log")
		batches := storage.SegmentBatches(b)
		if err != nil || len(batches) < 2 {
			t.Fatalf("segment 1: %d batches, %v", len(batches), err)
		}
		offset = batches[1].Offset - offset
	}
	if err := g.fs.FlipBit("/m1/00000000000000000001.log", offset, 3); err != nil {
		t.Fatal(err)
	}
	failing = false
	before := notified
	g.run(1000) // several restart attempts
	d := l.StuckOnDamage()
	if d == nil {
		t.Fatalf("a member alone restarting over damage says nothing (status %+v)", l.Status())
	}
	if (d.Segment != "" && d.FirstSeq != 0) != located || d.Cause == "" {
		t.Fatalf("the damage said: %+v (located: want %v)", d, located)
	}
	if notified == before {
		t.Fatal("its node was not notified")
	}
	if st := l.Status(); st.Role == replica.Leader || st.Leader != 0 {
		t.Fatalf("a member alone down on damage claims leadership: %+v", st)
	}
}
