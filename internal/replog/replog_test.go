package replog

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/peer"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// group runs members in-process; a router delivers messages between the
// ones that are up and not isolated.
type group struct {
	t       *testing.T
	fs      *vfs.MemFS
	members []replica.NodeID
	mu      sync.Mutex
	logs    map[replica.NodeID]*Log
	cut     map[replica.NodeID]bool
	tune    func(*Config) // adjusts every member's config (nil: defaults)
	// observe, when set before traffic starts, sees every message routed.
	observe func(replica.Message)
}

func newGroup(t *testing.T, n int) *group { return newGroupWith(t, n, nil) }

func newGroupWith(t *testing.T, n int, tune func(*Config)) *group {
	g := &group{t: t, fs: vfs.NewMem(), logs: map[replica.NodeID]*Log{}, cut: map[replica.NodeID]bool{}, tune: tune}
	for i := 1; i <= n; i++ {
		g.members = append(g.members, replica.NodeID(i))
	}
	for _, id := range g.members {
		g.start(id)
	}
	t.Cleanup(func() {
		for _, id := range g.members {
			g.stop(id)
		}
	})
	return g
}

func (g *group) start(id replica.NodeID) {
	g.t.Helper()
	cfg := Config{ID: id, Members: g.members, Dir: fmt.Sprintf("/n%d", id), FS: g.fs, Logger: quiet,
		Tick: 2 * time.Millisecond, Seed: uint64(id), Send: g.route, Clock: env.Wall{}}
	if g.tune != nil {
		g.tune(&cfg)
	}
	l, err := Open(cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	g.mu.Lock()
	g.logs[id] = l
	g.mu.Unlock()
}

func (g *group) stop(id replica.NodeID) {
	g.mu.Lock()
	l := g.logs[id]
	delete(g.logs, id)
	g.mu.Unlock()
	if l != nil {
		l.Close()
	}
}

func (g *group) route(m replica.Message) {
	g.mu.Lock()
	to := g.logs[m.To]
	blocked := g.cut[m.From] || g.cut[m.To]
	g.mu.Unlock()
	if to != nil && !blocked {
		if g.observe != nil {
			g.observe(m)
		}
		to.Step(m)
	}
}

func (g *group) isolate(id replica.NodeID, on bool) {
	g.mu.Lock()
	g.cut[id] = on
	g.mu.Unlock()
}

// leader waits for a single member that leads (among those up).
func (g *group) leader() *Log {
	g.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		g.mu.Lock()
		var found *Log
		for id, l := range g.logs {
			if st := l.Status(); st.Role == replica.Leader && !g.cut[id] {
				found = l
			}
		}
		g.mu.Unlock()
		if found != nil {
			return found
		}
		<-time.After(5 * time.Millisecond)
	}
	g.t.Fatal("no leader elected")
	return nil
}

// commit proposes v until it commits (retrying across leader changes).
func (g *group) commit(v string) (seq uint64) {
	g.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p := g.leader().Propose(storage.Record{Value: []byte(v)})
		select {
		case <-p.Done:
			if p.Err == nil {
				return p.Seq
			}
		case <-time.After(2 * time.Second):
		}
	}
	g.t.Fatalf("%s never committed", v)
	return 0
}

func (g *group) waitCommit(id replica.NodeID, seq uint64) {
	g.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		l := g.logs[id]
		g.mu.Unlock()
		if l != nil && l.CommitSeq() >= seq {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("n%d never reached commit %d", id, seq)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// values returns the committed non-empty entries of a member.
func (g *group) values(id replica.NodeID) []string {
	g.mu.Lock()
	l := g.logs[id]
	g.mu.Unlock()
	var out []string
	for from := l.ReadLog().StartSeq(); ; {
		es, err := l.Read(from, 1000)
		if err != nil {
			g.t.Fatal(err)
		}
		if len(es) == 0 {
			return out
		}
		for _, e := range es {
			if !IsControl(&e.Record) {
				out = append(out, fmt.Sprintf("%d:%s", e.Seq, e.Record.Value))
			}
		}
		from = es[len(es)-1].Seq + 1
	}
}

func TestCommitsReplicateToEveryMember(t *testing.T) {
	g := newGroup(t, 3)
	var last uint64
	for i := 0; i < 20; i++ {
		last = g.commit(fmt.Sprintf("v%d", i))
	}
	for _, id := range g.members {
		g.waitCommit(id, last)
	}
	a, b, c := g.values(1), g.values(2), g.values(3)
	if len(a) != 20 || fmt.Sprint(a) != fmt.Sprint(b) || fmt.Sprint(a) != fmt.Sprint(c) {
		t.Fatalf("members disagree:\n%v\n%v\n%v", a, b, c)
	}
}

func TestFailoverKeepsCommittedAndRestartCatchesUp(t *testing.T) {
	g := newGroup(t, 3)
	for i := 0; i < 5; i++ {
		g.commit(fmt.Sprintf("a%d", i))
	}
	old := g.leader().Status().ID
	g.stop(old) // kill the leader
	for i := 0; i < 5; i++ {
		g.commit(fmt.Sprintf("b%d", i))
	}
	if g.leader().Status().ID == old {
		t.Fatal("a stopped member still leads")
	}
	g.start(old) // restarts from its directory and catches up
	last := g.commit("c")
	g.waitCommit(old, last)
	got := g.values(old)
	if len(got) != 11 || fmt.Sprint(got) != fmt.Sprint(g.values(g.leader().Status().ID)) {
		t.Fatalf("restarted member: %v", got)
	}
}

func TestIsolatedLeaderCannotCommitAndIsFenced(t *testing.T) {
	g := newGroup(t, 3)
	g.commit("before")
	old := g.leader()
	oldID := old.Status().ID
	g.isolate(oldID, true)
	p := old.Propose(storage.Record{Value: []byte("alone")})
	g.commit("after") // the others elect a new leader and commit
	select {
	case <-p.Done:
		t.Fatalf("isolated leader finished a proposal: %v", p.Err)
	case <-time.After(100 * time.Millisecond):
	}
	g.isolate(oldID, false)
	select {
	case <-p.Done:
		if !errors.Is(p.Err, ErrLost) {
			t.Fatalf("the isolated write ended with %v, want ErrLost", p.Err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the isolated write never resolved after healing")
	}
	for _, v := range g.values(oldID) {
		if v[len(v)-5:] == "alone" {
			t.Fatalf("the isolated write became visible: %v", g.values(oldID))
		}
	}
}

// TestOverThePeerTransport runs three members over authenticated TCP.
func TestOverThePeerTransport(t *testing.T) {
	members := []replica.NodeID{1, 2, 3}
	listeners, addrs := map[uint32]net.Listener{}, map[uint32]string{}
	for _, id := range members {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[uint32(id)], addrs[uint32(id)] = l, l.Addr().String()
	}
	logs := make([]*Log, 3)
	var ready sync.WaitGroup
	ready.Add(1)
	transports := make([]*peer.Transport, 3)
	for i, id := range members {
		i := i
		tr, err := peer.Listen(peer.Config{ID: uint32(id), Listener: listeners[uint32(id)], Peers: addrs,
			Secret: []byte("replog-test-cluster-secret"), Logger: quiet,
			Handler: func(from uint32, f wire.Frame) {
				ready.Wait()
				m, ok := f.(*wire.Replicate)
				if !ok {
					return
				}
				msg := FromWire(m)
				if uint32(msg.From) != from {
					return // only the authenticated sender counts
				}
				logs[i].Step(msg)
			}})
		if err != nil {
			t.Fatal(err)
		}
		transports[i] = tr
		t.Cleanup(func() { tr.Close() })
	}
	fs := vfs.NewMem()
	for i, id := range members {
		tr := transports[i]
		l, err := Open(Config{ID: id, Members: members, Dir: fmt.Sprintf("/n%d", id), FS: fs, Logger: quiet, Clock: env.Wall{}, Seed: uint64(id),
			Send: func(m replica.Message) { tr.Send(uint32(m.To), ToWire("t", 0, m)) }})
		if err != nil {
			t.Fatal(err)
		}
		logs[i] = l
		t.Cleanup(func() { l.Close() })
	}
	ready.Done()
	g := &group{t: t, members: members, logs: map[replica.NodeID]*Log{1: logs[0], 2: logs[1], 3: logs[2]}, cut: map[replica.NodeID]bool{}}
	var last uint64
	for i := 0; i < 10; i++ {
		last = g.commit(fmt.Sprintf("v%d", i))
	}
	for _, id := range members {
		g.waitCommit(id, last)
	}
	if fmt.Sprint(g.values(1)) != fmt.Sprint(g.values(3)) || len(g.values(2)) != 10 {
		t.Fatalf("members disagree over TCP: %v / %v", g.values(1), g.values(3))
	}
}

// Records travel whole (key, headers, producer identity) and every epoch's
// install entry is a control record on every member, so readers can tell
// it from a message.
func TestRecordsReplicateWholeAndInstallsAreControl(t *testing.T) {
	g := newGroup(t, 3)
	rec := storage.Record{TimestampMs: 42, Key: []byte("k"), Value: []byte("v"),
		Headers: []storage.Header{{Key: "h", Value: []byte("x")}}, ProducerID: 7, ProducerSeq: 9}
	done := make(chan uint64, 1)
	var seq uint64
	for seq == 0 {
		g.leader().ProposeFunc(rec, func(s, _ uint64, err error) {
			if err != nil {
				s = 0
			}
			done <- s
		})
		seq = <-done
	}
	for _, id := range g.members {
		g.waitCommit(id, seq)
		g.mu.Lock()
		l := g.logs[id]
		g.mu.Unlock()
		es, err := l.Read(1, int(seq))
		if err != nil {
			t.Fatal(err)
		}
		controls := 0
		for _, e := range es {
			if IsControl(&e.Record) {
				controls++
				continue
			}
			if e.Seq != seq || !reflect.DeepEqual(e.Record, rec) {
				t.Fatalf("n%d: entry %d = %+v, want %+v at %d", id, e.Seq, e.Record, rec, seq)
			}
		}
		if controls == 0 || controls != len(es)-1 {
			t.Fatalf("n%d: %d control records among %d entries", id, controls, len(es))
		}
	}
}
