package replog

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// TestAnswersCommitBeforeTheNextBatchSyncs: a leader that comes out of a
// batch's fsync with its followers' FLUSHED for that batch and new
// proposals both queued steps the answers first, in Readys of their own.
// The batch's commit is published, and its proposals complete, before the
// next batch's fsync — not one whole fsync later. The production loop's
// select picks at random among ready channels, so a loop that took the
// proposals first would fail a round about half the time; the test runs
// several.
func TestAnswersCommitBeforeTheNextBatchSyncs(t *testing.T) {
	fss := map[replica.NodeID]*vfs.MemFS{1: vfs.NewMem(), 2: vfs.NewMem(), 3: vfs.NewMem()}
	var (
		g       *group
		flushed atomic.Uint64 // the highest FLUSHED a follower sent the leader
	)
	g = newGroupWith(t, 3, func(c *Config) {
		// The member's own file system (the gate below blocks it whole),
		// and no election while the leader waits at the gate.
		c.FS, c.ElectionTicks = fss[c.ID], 5000
		c.Send = func(m replica.Message) {
			if m.Type == replica.MsgAppendAck && m.To == 1 && m.Reject == replica.RejectNone {
				for cur := flushed.Load(); m.FlushedSeq > cur && !flushed.CompareAndSwap(cur, m.FlushedSeq); cur = flushed.Load() {
				}
			}
			g.route(m)
		}
	})
	var (
		armed   atomic.Bool
		entered = make(chan struct{})
		release = make(chan struct{})
		stop    = make(chan struct{})
	)
	fss[1].SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSync && strings.HasSuffix(name, ".log") && armed.CompareAndSwap(true, false) {
			select {
			case entered <- struct{}{}:
				select {
				case <-release:
				case <-stop:
				}
			case <-stop:
			}
		}
		return nil
	})
	t.Cleanup(func() { close(stop) }) // before the group's: a failed round leaves the leader at the gate
	leader := g.firstLeads()
	waitFor := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	for round := range 8 {
		armed.Store(true)
		a := leader.Propose(storage.Record{Value: []byte("a")})
		waitFor("the leader's fsync of a", entered)
		// a's Appends went out before that fsync (and a.Seq was set):
		// wait for the followers' FLUSHED of it, which queue at the
		// blocked leader.
		for deadline := time.Now().Add(10 * time.Second); flushed.Load() < a.Seq; {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the followers never flushed a", round)
			}
			time.Sleep(100 * time.Microsecond)
		}
		b := leader.Propose(storage.Record{Value: []byte("b")})
		armed.Store(true)
		release <- struct{}{}
		waitFor("the leader's fsync of b", entered)
		select {
		case <-a.Done:
			if a.Err != nil {
				t.Fatalf("round %d: a: %v", round, a.Err)
			}
		default:
			t.Fatalf("round %d: a is not complete when the leader fsyncs b: its followers' FLUSHED waited behind b's fsync", round)
		}
		release <- struct{}{}
		waitFor("b", b.Done)
		if b.Err != nil {
			t.Fatalf("round %d: b: %v", round, b.Err)
		}
	}
}

// TestObserveSyncAndCommit: a member reports each fsync of its log and,
// on the leader, each proposal's time to commit — which covers the
// leader's own fsync of it. The leader's fsyncs are slowed to at least
// 20 ms, so both measurements are at least that.
func TestObserveSyncAndCommit(t *testing.T) {
	const slow = 20 * time.Millisecond
	var (
		mu             sync.Mutex
		syncs, commits = map[replica.NodeID][]time.Duration{}, map[replica.NodeID][]time.Duration{}
		fss            = map[replica.NodeID]*vfs.MemFS{1: vfs.NewMem(), 2: vfs.NewMem(), 3: vfs.NewMem()}
		observe        = func(into map[replica.NodeID][]time.Duration, id replica.NodeID) func(time.Duration) {
			return func(d time.Duration) {
				mu.Lock()
				into[id] = append(into[id], d)
				mu.Unlock()
			}
		}
	)
	g := newGroupWith(t, 3, func(c *Config) {
		c.FS, c.ObserveSync, c.ObserveCommit = fss[c.ID], observe(syncs, c.ID), observe(commits, c.ID)
	})
	leader := g.firstLeads()
	fss[1].SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSync && strings.HasSuffix(name, ".log") {
			time.Sleep(slow)
		}
		return nil
	})
	mu.Lock()
	before := len(commits[1])
	mu.Unlock()
	p := leader.Propose(storage.Record{Value: []byte("a")})
	select {
	case <-p.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the proposal did not complete")
	}
	if p.Err != nil {
		t.Fatal(p.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(commits[1]) != before+1 || commits[1][before] < slow {
		t.Fatalf("leader's commit observations %v after %d before, want one more of at least %v", commits[1], before, slow)
	}
	if n := len(syncs[1]); n == 0 || syncs[1][n-1] < slow {
		t.Fatalf("leader's sync observations %v, want the last at least %v", syncs[1], slow)
	}
	for _, id := range []replica.NodeID{2, 3} {
		if len(syncs[id]) == 0 || len(commits[id]) != 0 {
			t.Fatalf("follower %d observed syncs %v and commits %v, want syncs and no commit (it proposes nothing)", id, syncs[id], commits[id])
		}
	}
}

// firstLeads makes member 1 lead g and commits a first entry.
func (g *group) firstLeads() *Log {
	g.t.Helper()
	g.mu.Lock()
	leader := g.logs[1]
	g.mu.Unlock()
	leader.Campaign()
	if g.leader() != leader {
		g.t.Fatal("n1 does not lead")
	}
	g.commit("warm-up")
	return leader
}
