package replog

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// compacting configures small segments, a small retention and a short
// reservation, so that a stopped follower soon falls behind the leader's
// compacted prefix.
func compacting(c *Config) {
	c.Storage = storage.Options{SegmentBytesMax: 1024, RetentionBytes: 3000}
	c.CompactEvery = 5 * time.Millisecond
	c.Reservation = 100 * time.Millisecond
}

func (g *group) member(id replica.NodeID) *Log {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.logs[id]
}

// TestRetentionCompactsEveryMember: with a retention, every member deletes
// old segments and keeps serving the same entries after them. Retention
// deletes sealed segments only: a follower that caught up late wrote its
// whole log as one batch into one segment (a batch never spans two), so
// writes go on until every member rolled and compacted.
func TestRetentionCompactsEveryMember(t *testing.T) {
	g := newGroupWith(t, 3, compacting)
	var last uint64
	for i := range 300 {
		last = g.commit(fmt.Sprintf("value-%03d", i))
	}
	for _, id := range g.members {
		g.waitCommit(id, last)
	}
	lastValue, more := "value-299", 0
	compacted := func() bool {
		for _, id := range g.members {
			if g.member(id).ReadLog().StartSeq() <= 1 || g.member(id).Status().SnapSeq == 0 {
				return false
			}
		}
		return true
	}
	// A slow machine can make this slow (elections under CPU starvation);
	// on a timeout, say where each member stands.
	deadline := time.Now().Add(30 * time.Second)
	for !compacted() {
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, id := range g.members {
				st := g.member(id).Status()
				fmt.Fprintf(&b, "\n  n%d: role %v epoch %d commit %d durable %d last %d snap %d start %d rebuilding %v peers %+v",
					id, st.Role, st.Hard.Promised, st.CommitSeq, st.Durable, st.Last, st.SnapSeq, g.member(id).ReadLog().StartSeq(), st.Rebuilding, st.Peers)
			}
			t.Fatalf("timed out waiting until every member compacts:%s", b.String())
		}
		time.Sleep(5 * time.Millisecond)
		if more < 100 {
			more++
			lastValue = fmt.Sprintf("more-%03d", more)
			last = g.commit(lastValue)
		}
	}
	for _, id := range g.members {
		g.waitCommit(id, last)
	}
	ref := g.values(g.leader().Status().ID)
	for _, id := range g.members {
		got := g.values(id)
		if len(got) == 0 || !strings.HasSuffix(got[len(got)-1], lastValue) || !isSuffixOf(got, ref) && !isSuffixOf(ref, got) {
			t.Fatalf("n%d keeps %v", id, got)
		}
	}
}

// TestLaggingFollowerRebuildsFromSnapshotPoint: a follower that was down
// while the leader compacted past its log end (its reservation expired)
// rebuilds from the leader's snapshot point, catches up, agrees with the
// leader on every entry both keep, and survives a restart.
func TestLaggingFollowerRebuildsFromSnapshotPoint(t *testing.T) {
	g := newGroupWith(t, 3, compacting)
	for i := range 10 {
		g.commit(fmt.Sprintf("early-%d", i))
	}
	leader := g.leader().Status().ID
	lagger := g.members[(slices.Index(g.members, leader)+1)%3]
	g.waitCommit(lagger, g.leader().CommitSeq())
	lagEnd := g.member(lagger).ReadLog().NextSeq() - 1
	g.stop(lagger)
	var last uint64
	for i := range 400 {
		last = g.commit(fmt.Sprintf("late-%03d", i))
	}
	waitFor(t, "the leader compacts past the stopped follower", func() bool {
		return g.leader().Status().SnapSeq > lagEnd
	})
	g.start(lagger)
	last = max(last, g.commit("after-restart"))
	g.waitCommit(lagger, last)
	l := g.member(lagger)
	if l.Installs() == 0 {
		t.Fatalf("n%d caught up without a snapshot install (start %d, leader's snapshot %d)", lagger, l.ReadLog().StartSeq(), g.leader().Status().SnapSeq)
	}
	if st := l.Status(); st.Rebuilding || st.SnapSeq <= lagEnd {
		t.Fatalf("after the install: %+v", st)
	}
	check := func() {
		t.Helper()
		got, ref := g.values(lagger), g.values(g.leader().Status().ID)
		if len(got) == 0 || got[len(got)-1] != ref[len(ref)-1] || !isSuffixOf(got, ref) && !isSuffixOf(ref, got) {
			t.Fatalf("n%d holds %v\nthe leader holds %v", lagger, got, ref)
		}
	}
	check()
	g.stop(lagger)
	g.start(lagger)
	last = g.commit("after-second-restart")
	g.waitCommit(lagger, last)
	check()
}

// TestInterruptedInstallIsFinishedOnRestart: a crash between recording an
// install and resetting the log is completed when the member opens.
func TestInterruptedInstallIsFinishedOnRestart(t *testing.T) {
	fsys := vfs.NewMem()
	cfg := Config{ID: 1, Members: []replica.NodeID{1}, Dir: "/m", FS: fsys, Logger: quiet, Clock: env.Wall{}, Tick: 2 * time.Millisecond,
		Send: func(replica.Message) {}}
	l, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.Campaign()
	waitFor(t, "the single member leads", func() bool { return l.Status().Role == replica.Leader })
	for i := range 5 {
		p := l.Propose(storage.Record{Value: fmt.Appendf(nil, "v%d", i)})
		<-p.Done
		if p.Err != nil {
			t.Fatal(p.Err)
		}
	}
	l.Close()
	if err := writeSnapshotPoint(fsys, "/m", snapshotPoint{seq: 40, epoch: 3, installing: true}); err != nil {
		t.Fatal(err)
	}
	l, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if start, next := l.ReadLog().StartSeq(), l.ReadLog().NextSeq(); start != 41 || next != 41 {
		t.Fatalf("after the interrupted install: log [%d, %d)", start, next)
	}
	if st := l.Status(); st.SnapSeq != 40 || st.Last != 40 {
		t.Fatalf("kernel after the install: %+v", st)
	}
	if p, err := readSnapshotPoint(fsys, "/m"); err != nil || p.installing {
		t.Fatalf("snapshot point %+v, %v", p, err)
	}
}

// TestDamagedSnapshotPointRefusesToOpen: a member alone has no healthy
// replica to rebuild from (a member of a group resets and rebuilds:
// TestDamagedSnapshotPointEmptiesTheMemberWhichRebuilds).
func TestDamagedSnapshotPointRefusesToOpen(t *testing.T) {
	fsys := vfs.NewMem()
	if err := fsys.MkdirAll("/m"); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{{1, 2, 3}, make([]byte, 17)} {
		b := b
		if len(b) == 17 {
			b[7], b[16] = 9, 0 // seq 9 with epoch 0
		}
		if err := storage.WriteFileAtomic(fsys, "/m/"+snapshotFile, b); err != nil {
			t.Fatal(err)
		}
		_, err := Open(Config{ID: 1, Members: []replica.NodeID{1}, Dir: "/m", FS: fsys, Logger: quiet, Clock: env.Wall{}, Send: func(replica.Message) {}})
		if err == nil || !strings.Contains(err.Error(), "snapshot point") {
			t.Fatalf("open with snapshot point file %v: %v", b, err)
		}
	}
}

func isSuffixOf(a, b []string) bool {
	return len(a) <= len(b) && slices.Equal(a, b[len(b)-len(a):])
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
