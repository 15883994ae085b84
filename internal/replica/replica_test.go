package replica

import (
	"fmt"
	"slices"
	"testing"
)

// store is a replica's durable state in the test cluster.
type store struct {
	hard       HardState
	log        []Entry // full history; entries up to snapSeq count as compacted
	snapSeq    uint64
	snapEp     uint64
	rebuilding bool
	uncertain  bool    // replog's uncertain mark
	unsynced   []Entry // appended, not yet synced: a crash loses them
	// promiseLost is replog's promise-lost mark (hard is not readable),
	// lostNonce the nonce it holds; flush clears the mark once the
	// kernel wrote a hard state it recovered (promise.go).
	promiseLost bool
	lostNonce   uint64
}

func (s *store) persisted() Persisted {
	p := PersistedFromSnapshot(s.hard, s.snapSeq, s.snapEp, s.log[s.snapSeq:])
	p.Rebuilding, p.Uncertain = s.rebuilding, s.uncertain
	p.PromiseLost, p.LostNonce = s.promiseLost, s.lostNonce
	return p
}

// cluster runs replicas in lockstep with an explicit message queue: the
// scenario tests decide exactly what is delivered, dropped or delayed.
type cluster struct {
	t      *testing.T
	ids    []NodeID
	rs     map[NodeID]*Replica
	stores map[NodeID]*store
	queue  []Message
	down   map[NodeID]bool
	cut    map[NodeID]bool // isolated both ways
	policy AckPolicy
	// snapshots counts snapshot installs (rebuilds).
	snapshots int
	// tweak adjusts every replica's Config, at every (re)start.
	tweak func(*Config)
	// drop, when set, loses the messages it returns true for.
	drop func(Message) bool
	// onFlush, when set, runs after every Ready a replica carried out (the
	// scenario tests' reference model checks each step there).
	onFlush func(NodeID)
	// entriesMax, when set, makes every store read for an Append return at
	// most that many entries (replog's reads stop at a byte bound).
	entriesMax int
}

func newCluster(t *testing.T, n int, policy AckPolicy) *cluster {
	return newClusterWith(t, n, policy, nil)
}

func newClusterWith(t *testing.T, n int, policy AckPolicy, tweak func(*Config)) *cluster {
	c := &cluster{t: t, rs: map[NodeID]*Replica{}, stores: map[NodeID]*store{}, down: map[NodeID]bool{}, cut: map[NodeID]bool{}, policy: policy, tweak: tweak}
	for i := 1; i <= n; i++ {
		c.ids = append(c.ids, NodeID(i))
		c.stores[NodeID(i)] = &store{}
	}
	for _, id := range c.ids {
		c.start(id)
	}
	return c
}

func (c *cluster) start(id NodeID) {
	cfg := Config{ID: id, Replicas: c.ids, Policy: c.policy, ElectionTicks: 10, Seed: uint64(id)}
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	r, err := New(cfg, c.stores[id].persisted())
	if err != nil {
		c.t.Fatal(err)
	}
	c.rs[id] = r
	delete(c.down, id)
}

func (c *cluster) crash(id NodeID) {
	c.down[id] = true
	c.stores[id].unsynced = nil
}

// flush carries out every pending Ready of id with the shared Executor
// over id's store.
func (c *cluster) flush(id NodeID) {
	r := c.rs[id]
	x := c.executor(id)
	for !c.down[id] && r.HasReady() {
		rd, err := x.Begin(r)
		if err == nil {
			err = x.Finish(r, rd)
		}
		if err != nil {
			c.t.Fatalf("n%d: %v", id, err)
		}
		if s := c.stores[id]; s.promiseLost && !r.Status().PromiseLost {
			s.promiseLost = false
		}
		if c.onFlush != nil {
			c.onFlush(id)
		}
	}
}

func (c *cluster) executor(id NodeID) *Executor {
	return &Executor{Store: testStore{c, id}, Send: func(m Message) { c.queue = append(c.queue, m) }}
}

// testStore is the Store of replica id in the test cluster. Appends are
// durable at Sync (a crash in between loses them); the rest at once.
type testStore struct {
	c  *cluster
	id NodeID
}

func (ts testStore) InstallSnapshot(snap SnapshotMeta) error {
	c, s := ts.c, ts.c.stores[ts.id]
	c.snapshots++
	// Install the leader's snapshot: the committed prefix, copied from the
	// leader (the sender), else from a replica that holds it.
	var src *store
	if l := c.rs[ts.id].Status().Leader; l != 0 && l != ts.id && uint64(len(c.stores[l].log)) >= snap.Seq {
		src = c.stores[l]
	}
	for _, oid := range c.ids {
		if o := c.stores[oid]; src == nil && uint64(len(o.log)) >= snap.Seq && o != s {
			src = o
		}
	}
	if src == nil { // a forged snapshot (fuzzing): no replica has it
		s.log = make([]Entry, snap.Seq)
		for i := range s.log {
			s.log[i] = Entry{Seq: uint64(i) + 1, Epoch: snap.Epoch}
		}
	} else {
		s.log = slices.Clone(src.log[:snap.Seq])
	}
	s.unsynced = nil
	s.snapSeq, s.snapEp, s.rebuilding = snap.Seq, snap.Epoch, false
	return nil
}

func (ts testStore) SetHardState(h HardState) error {
	ts.c.stores[ts.id].hard = h
	return nil
}

func (ts testStore) TruncateAfter(seq uint64) error {
	s := ts.c.stores[ts.id]
	s.log = s.log[:seq]
	s.unsynced = nil
	return nil
}

func (ts testStore) Append(entries []Entry) error {
	s := ts.c.stores[ts.id]
	s.unsynced = append(s.unsynced, entries...)
	return nil
}

func (ts testStore) Sync() error {
	s := ts.c.stores[ts.id]
	s.log = append(s.log, s.unsynced...)
	s.unsynced = nil
	return nil
}

func (ts testStore) Entries(first, last uint64) ([]Entry, error) {
	s := ts.c.stores[ts.id]
	if first <= s.snapSeq {
		ts.c.t.Fatalf("n%d sends compacted entries from %d (snapshot at %d)", ts.id, first, s.snapSeq)
	}
	all := append(slices.Clone(s.log), s.unsynced...)
	if n := uint64(ts.c.entriesMax); n > 0 {
		last = min(last, first+n-1)
	}
	return slices.Clone(all[first-1 : min(last, uint64(len(all)))]), nil
}

// settle delivers messages until none is left (dropping those to or from
// crashed or isolated replicas).
func (c *cluster) settle() {
	for _, id := range c.ids {
		c.flush(id)
	}
	for guard := 0; len(c.queue) > 0; guard++ {
		if guard > 100_000 {
			c.t.Fatal("messages never settle")
		}
		m := c.queue[0]
		c.queue = c.queue[1:]
		c.deliver(m)
	}
}

// deliver hands one message to its addressee and carries out the result,
// unless the network loses it (an end is down or cut off, or drop says so).
func (c *cluster) deliver(m Message) {
	if c.down[m.To] || c.down[m.From] || c.cut[m.To] || c.cut[m.From] || (c.drop != nil && c.drop(m)) {
		return
	}
	c.rs[m.To].Step(m)
	c.flush(m.To)
}

func (c *cluster) tick(n int) {
	for i := 0; i < n; i++ {
		for _, id := range c.ids {
			if !c.down[id] {
				c.rs[id].Tick()
			}
		}
		c.settle()
	}
}

func (c *cluster) elect(id NodeID) {
	c.t.Helper()
	c.rs[id].Campaign()
	c.settle()
	if st := c.rs[id].Status(); st.Role != Leader {
		c.t.Fatalf("n%d did not win: %+v", id, st)
	}
}

func (c *cluster) propose(id NodeID, v string) (uint64, uint64) {
	c.t.Helper()
	seq, epoch, err := c.rs[id].Propose([]byte(v))
	if err != nil {
		c.t.Fatalf("propose on n%d: %v", id, err)
	}
	c.settle()
	return seq, epoch
}

func (c *cluster) logString(id NodeID) string {
	var b []byte
	for _, e := range c.stores[id].log {
		b = fmt.Appendf(b, "%d:e%d:%s ", e.Seq, e.Epoch, e.Data)
	}
	return string(b)
}

// S1: an entry acked (committed) by the leader survives the leader's crash
// at the same seq. Follower n3 is cut off, so only n1 and n2 can hold the
// entry, and n1 is killed -9 the moment it acks (reports the commit): an
// ack sent before a quorum flushed would leave it on n1 alone. Then n3,
// which lacks it, is the first to campaign (its worse lineage must lose),
// or n2 is; either way the new leader holds the entry at its seq.
func TestS1AckThenLeaderCrash(t *testing.T) {
	for _, first := range []NodeID{3, 2} {
		t.Run(fmt.Sprintf("n%d campaigns first", first), func(t *testing.T) {
			c := newCluster(t, 3, SyncQuorum)
			m := watch(c)
			c.elect(1)
			c.cut[3] = true
			seq, _, err := c.rs[1].Propose([]byte("a"))
			if err != nil {
				t.Fatal(err)
			}
			acked := false
			c.chain(func(id NodeID) {
				if id == 1 && !acked && c.rs[1].Status().CommitSeq >= seq {
					acked = true
					c.crash(1) // kill -9 right after the ack
				}
			})
			c.settle()
			if !acked || c.holds(3, "a") {
				t.Fatalf("setup: acked %v, n3 %s", acked, c.logString(3))
			}
			delete(c.cut, 3)
			c.rs[first].Campaign()
			c.settle()
			if c.leader() == 0 && !c.promote(2) {
				t.Fatal("no leader after the crash")
			}
			l := c.leader()
			if e := c.stores[l].log[seq-1]; string(e.Data) != "a" {
				t.Fatalf("AckedNeverLost: acked %q at %d, new leader n%d holds %q there: %s", "a", seq, l, e.Data, c.logString(l))
			}
			c.propose(l, "b")
			c.start(1)
			c.tick(3)
			c.requireConverged(m)
			if m.seqOf("a") != seq {
				t.Fatalf("AckedNeverLost: %q visible at %d, acked at %d", "a", m.seqOf("a"), seq)
			}
		})
	}
}

// S2: a write that reached only the (isolated) leader is never made visible
// after a failover: the new lineage overwrites it.
func TestS2NonQuorumWriteNotRevived(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.cut[1] = true
	seq, _ := c.propose(1, "lost")
	if c.rs[1].Status().CommitSeq >= seq {
		t.Fatal("write committed without a quorum")
	}
	c.crash(1)
	delete(c.cut, 1)
	c.elect(2)
	c.propose(2, "b")
	c.start(1)
	c.tick(3)
	for _, id := range c.ids {
		for _, e := range c.stores[id].log {
			if string(e.Data) == "lost" {
				t.Fatalf("n%d still holds the non-quorum write: %s", id, c.logString(id))
			}
		}
	}
	if c.rs[1].Status().CommitSeq != c.rs[2].Status().CommitSeq {
		t.Fatalf("commit differs: n1 %d, n2 %d", c.rs[1].Status().CommitSeq, c.rs[2].Status().CommitSeq)
	}
}

// S3: an old leader cut off from the group keeps believing it leads; when it
// is heard again its APPENDs are refused with STALE_LEADER_EPOCH, it
// demotes itself, and nothing it wrote alone becomes visible.
func TestS3ZombieLeaderFenced(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.cut[1] = true
	zombieSeq, zombieEpoch, err := c.rs[1].Propose([]byte("zombie"))
	if err != nil {
		t.Fatal(err)
	}
	c.settle()
	c.elect(2)
	c.propose(2, "b")
	if c.rs[1].Status().Role != Leader {
		t.Fatal("isolated leader should still think it leads")
	}
	delete(c.cut, 1)
	c.tick(2) // its heartbeats reach the others and are refused
	st := c.rs[1].Status()
	if st.Role == Leader || st.Hard.Promised <= zombieEpoch {
		t.Fatalf("zombie not fenced: %+v", st)
	}
	c.tick(3)
	if e := c.stores[1].log[zombieSeq-1]; string(e.Data) == "zombie" {
		t.Fatalf("zombie write survived: %s", c.logString(1))
	}
}

// S12: promotion takes the best lineage by (last epoch, last seq), not the
// longest log: a replica with more entries of an older epoch cannot win
// against a majority holding a newer epoch, and its extra entries are
// truncated.
func TestS12PromotionPicksBestLineageNotHighestSeq(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.cut[1] = true
	for _, v := range []string{"x1", "x2", "x3"} { // old epoch, only on n1
		c.rs[1].Propose([]byte(v))
	}
	c.settle()
	c.elect(2) // epoch 2 on n2 and n3
	c.propose(2, "b")
	c.crash(2)
	delete(c.cut, 1)
	if len(c.stores[1].log) <= len(c.stores[3].log) {
		t.Fatalf("setup: n1 should have the longer log (%d vs %d)", len(c.stores[1].log), len(c.stores[3].log))
	}
	c.crash(1)
	c.start(1)               // back as a follower with its long, old-epoch log
	for i := 0; i < 2; i++ { // once at an epoch n3 already promised, once above it
		c.rs[1].Campaign()
		c.settle()
	}
	if c.rs[1].Status().Role == Leader {
		t.Fatalf("the longer but older lineage won the election: %+v n3 %+v\n n1 %s\n n3 %s", c.rs[1].Status(), c.rs[3].Status(), c.logString(1), c.logString(3))
	}
	c.elect(3)
	c.tick(3)
	for _, e := range c.stores[1].log {
		if string(e.Data) == "x1" || string(e.Data) == "x2" || string(e.Data) == "x3" {
			t.Fatalf("old-epoch entries not truncated: %s", c.logString(1))
		}
	}
	if c.logString(1) != c.logString(3) {
		t.Fatalf("lineages differ:\n n1 %s\n n3 %s", c.logString(1), c.logString(3))
	}
}

// S18: the leader restarts before anyone notices; FLUSHED acks of its old
// reign that arrive late are ignored and never count toward a commit.
func TestS18LeaderRestartStaleAcksRejected(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	seq, _, _ := c.rs[1].Propose([]byte("pending"))
	c.flush(1)
	// Hold back the followers' acks of "pending": deliver the appends only.
	var acks []Message
	for _, m := range c.queue {
		if m.Type == MsgAppend {
			c.rs[m.To].Step(m)
			c.flush(m.To)
		}
	}
	c.queue = slices.DeleteFunc(c.queue, func(m Message) bool { return m.Type == MsgAppend })
	acks, c.queue = append(acks, c.queue...), nil
	c.crash(1)
	c.start(1) // promptly restarted: a follower now, commit unknown
	c.elect(1) // next epoch
	before := c.rs[1].Status()
	for _, m := range acks {
		c.rs[1].Step(m) // FLUSHED of the old epoch
	}
	after := c.rs[1].Status()
	if after.CommitSeq != before.CommitSeq || after.Role != Leader {
		t.Fatalf("stale acks changed the new reign: before %+v after %+v", before, after)
	}
	c.settle()
	if got := c.rs[1].Status().CommitSeq; got < seq+1 {
		t.Fatalf("the new epoch's install did not commit the old entries: commit %d", got)
	}
}

func TestSyncAllBlocksWritesWhenAReplicaLags(t *testing.T) {
	c := newCluster(t, 3, SyncAll)
	c.elect(1)
	seq, _ := c.propose(1, "a")
	if c.rs[1].Status().CommitSeq < seq {
		t.Fatal("sync_all did not commit with every replica up")
	}
	c.crash(3)
	seq2, _ := c.propose(1, "b")
	if c.rs[1].Status().CommitSeq >= seq2 {
		t.Fatal("sync_all committed with a replica down")
	}
	c.tick(25) // past the ack timeout
	if _, _, err := c.rs[1].Propose([]byte("c")); err != ErrQuorumLost {
		t.Fatalf("write with a lagging replica under sync_all: %v, want ErrQuorumLost", err)
	}
	c.start(3)
	c.tick(3)
	if c.rs[1].Status().CommitSeq < seq2 {
		t.Fatal("commit did not resume when the replica came back")
	}
	if _, _, err := c.rs[1].Propose([]byte("d")); err != nil {
		t.Fatalf("writes did not resume: %v", err)
	}
}

func TestReadOnlyDegradedOnQuorumLossAndBack(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	seq, _ := c.propose(1, "a")
	c.cut[2], c.cut[3] = true, true
	c.tick(25)
	st := c.rs[1].Status()
	if !st.ReadOnly || st.CommitSeq < seq {
		t.Fatalf("leader without quorum: %+v (want read-only, visible prefix kept)", st)
	}
	if _, _, err := c.rs[1].Propose([]byte("b")); err != ErrQuorumLost {
		t.Fatalf("write while degraded: %v", err)
	}
	delete(c.cut, 2)
	c.tick(2)
	if c.rs[1].Status().Role == Leader && c.rs[1].Status().ReadOnly {
		t.Fatal("leader did not leave read-only mode when the quorum returned")
	}
}

func TestPrepareReplayIsGrantedAgainButOnlyToTheSameCandidate(t *testing.T) {
	r, _ := New(Config{ID: 1, Replicas: []NodeID{1, 2, 3}, Seed: 1}, Persisted{})
	r.Step(Message{Type: MsgPrepare, From: 2, To: 1, Epoch: 5})
	first := r.Ready()
	r.Advance(first)
	r.Step(Message{Type: MsgPrepare, From: 2, To: 1, Epoch: 5})
	again := r.Ready()
	r.Advance(again)
	r.Step(Message{Type: MsgPrepare, From: 3, To: 1, Epoch: 5})
	other := r.Ready()
	if !first.Messages[0].Granted || !again.Messages[0].Granted || other.Messages[0].Granted {
		t.Fatalf("grants: first %v again %v other %v", first.Messages[0], again.Messages[0], other.Messages[0])
	}
	if first.HardState == nil || first.HardState.Promised != 5 || again.HardState != nil {
		t.Fatalf("promise persistence: first %+v again %+v", first.HardState, again.HardState)
	}
}

func TestCloneIsIndependent(t *testing.T) {
	r, _ := New(Config{ID: 1, Replicas: []NodeID{1}, Seed: 1}, Persisted{})
	r.Campaign()
	r.Advance(r.Ready())
	c := r.Clone()
	c.Propose([]byte("x"))
	if r.Status().Last == c.Status().Last {
		t.Fatal("clone shares state with the original")
	}
}

// FuzzStep feeds arbitrary messages to replicas in every role: Step must be
// total (never panic) and the promise must never go back.
func FuzzStep(f *testing.F) {
	f.Add(uint8(3), uint8(2), uint64(1), uint64(0), uint64(0), uint64(1), uint64(1), uint8(2), uint64(0))
	f.Add(uint8(1), uint8(3), uint64(5), uint64(3), uint64(2), uint64(0), uint64(0), uint8(0), uint64(9))
	f.Add(uint8(6), uint8(2), uint64(2), uint64(0), uint64(0), uint64(1), uint64(1), uint8(0), uint64(0))
	f.Add(uint8(7), uint8(3), uint64(4), uint64(0), uint64(0), uint64(0), uint64(0), uint8(1), uint64(0))
	f.Add(uint8(8), uint8(2), uint64(1), uint64(0), uint64(0), uint64(2), uint64(1), uint8(0), uint64(0))
	f.Fuzz(func(t *testing.T, kind, from uint8, epoch, prevSeq, prevEpoch, seq, entryEpoch uint64, n uint8, commit uint64) {
		for _, setup := range []func(*cluster){
			func(*cluster) {},
			func(c *cluster) { c.elect(1); c.propose(1, "a") },
			func(c *cluster) { c.rs[1].Campaign(); c.flush(1); c.queue = nil },
			func(c *cluster) { c.elect(2); c.startPreVote(1) },
			func(c *cluster) { c.elect(1); c.rs[1].TransferTo(2); c.flush(1) },
		} {
			c := newCluster(t, 3, SyncQuorum)
			setup(c)
			before := c.rs[1].Status().Hard.Promised
			m := Message{Type: MsgType(kind % 9), From: NodeID(from%4 + 1), To: 1, Epoch: epoch % 8, PrevSeq: prevSeq % 8,
				PrevEpoch: prevEpoch % 8, CommitSeq: commit % 10, LastSeq: seq % 8, LastEpoch: entryEpoch % 8, Granted: n%2 == 0,
				FlushedSeq: seq % 8, HintSeq: prevSeq % 8, Reject: Reject(n % 3)}
			for i := uint8(0); i < n%4; i++ {
				m.Entries = append(m.Entries, Entry{Seq: seq%8 + uint64(i), Epoch: entryEpoch % 8, Data: []byte{i}})
			}
			c.rs[1].Step(m)
			c.flush(1)
			if after := c.rs[1].Status().Hard.Promised; after < before {
				t.Fatalf("promise went back from %d to %d", before, after)
			}
		}
	})
}

func TestAppendStateIsDeterministicAndSeesChanges(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	a := c.rs[1].AppendState(nil, true)
	b := c.rs[1].Clone().AppendState(nil, true)
	if string(a) != string(b) {
		t.Fatal("a clone encodes differently")
	}
	c.propose(1, "x")
	if string(c.rs[1].AppendState(nil, true)) == string(a) {
		t.Fatal("a proposal did not change the encoding")
	}
}

// compact lets replica id compact as far as the kernel allows.
func (c *cluster) compact(id NodeID) uint64 {
	r, s := c.rs[id], c.stores[id]
	at := r.CompactTo(r.RetainFloor())
	if at > s.snapSeq {
		s.snapSeq, s.snapEp = at, s.log[at-1].Epoch
	}
	return s.snapSeq
}

// S4: a brief disconnect stays within the follower's reservation: the
// leader keeps the entries it needs, and it catches up from the log alone.
func TestS4BriefDisconnectCatchesUpFromTheLog(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.cut[3] = true
	for i := 0; i < 5; i++ {
		c.propose(1, fmt.Sprintf("x%d", i))
	}
	c.tick(3) // well within the reservation
	if at := c.compact(1); at >= uint64(len(c.stores[3].log)) && at > c.rs[3].Status().Last {
		t.Fatalf("leader compacted to %d past what n3 still needs (%d)", at, c.rs[3].Status().Last)
	}
	delete(c.cut, 3)
	c.tick(3)
	if c.snapshots != 0 {
		t.Fatalf("%d snapshot installs for a brief disconnect", c.snapshots)
	}
	if c.logString(3) != c.logString(1) {
		t.Fatalf("not caught up:\n n3 %s\n n1 %s", c.logString(3), c.logString(1))
	}
}

// S7 + S9: the follower stays away past its reservation; the leader
// compacts what it needed; on return it is NeedsRebuild, rebuilds from the
// snapshot plus the log tail, and reaches the leader's end.
func TestS7ReservationExpiryForcesRebuildAndS9SnapshotPlusTail(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.cut[3] = true
	for i := 0; i < 6; i++ {
		c.propose(1, fmt.Sprintf("x%d", i))
	}
	c.tick(45) // past the reservation (4 x 10 election ticks)
	at := c.compact(1)
	if at <= c.rs[3].Status().Last {
		t.Fatalf("reservation did not expire: compacted only to %d, n3 ends at %d", at, c.rs[3].Status().Last)
	}
	c.compact(2) // whoever leads next has compacted too
	var state PeerState
	for _, p := range c.rs[1].Status().Peers {
		if p.ID == 3 {
			state = p.State
		}
	}
	if state != NeedsRebuild {
		t.Fatalf("n3 is %v, want NeedsRebuild", state)
	}
	c.propose(1, "tail") // the tail after the snapshot
	delete(c.cut, 3)
	c.tick(60) // n3 may disrupt with its higher epoch; a complete leader wins
	if c.snapshots == 0 {
		t.Fatal("no snapshot install")
	}
	leader := c.leaderID()
	if got, want := c.rs[3].Status().Last, c.rs[leader].Status().Last; got != want {
		t.Fatalf("rebuilt replica ends at %d, leader n%d at %d", got, leader, want)
	}
	if c.logString(3) != c.logString(leader) {
		t.Fatalf("rebuilt log differs:\n n3 %s\n n%d %s", c.logString(3), leader, c.logString(leader))
	}
}

// S8: a replica whose log starts at a snapshot answers an APPEND that
// starts below it from the snapshot point — it never claims to hold, or
// truncates, entries it no longer has.
func TestS8SnapshotCannotAnswerForAnOlderSeq(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	for i := 0; i < 4; i++ {
		c.propose(1, fmt.Sprintf("v%d", i))
	}
	c.tick(2)
	at := c.compact(2)
	if at < 3 {
		t.Fatalf("follower compacted only to %d", at)
	}
	r := c.rs[2]
	r.Step(Message{Type: MsgAppend, From: 1, To: 2, Epoch: c.rs[1].Status().Hard.Promised, PrevSeq: 1, PrevEpoch: 1,
		Entries: slices.Clone(c.stores[1].log[1:3]), CommitSeq: 3})
	rd := r.Ready()
	r.Advance(rd)
	if len(rd.Messages) != 1 || rd.Messages[0].FlushedSeq < at || rd.Truncate {
		t.Fatalf("answer to an append below the snapshot: %+v", rd)
	}
}

// A replica with an unfinished rebuild is never promotable: it neither
// campaigns nor grants promises, until the leader makes it whole.
func TestRebuildingReplicaIsNeverPromotable(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.crash(1)
	c.stores[2].rebuilding = true
	c.crash(2)
	c.start(2)
	c.rs[2].Campaign()
	c.settle()
	if c.rs[2].Status().Role != Follower {
		t.Fatal("a rebuilding replica campaigned")
	}
	c.rs[3].Campaign()
	c.settle()
	if c.rs[3].Status().Role == Leader {
		t.Fatal("a rebuilding replica granted a promise to n3")
	}
	c.start(1)
	c.tick(60)
	leader := c.leaderID()
	if leader == 2 {
		t.Fatal("the rebuilding replica became leader")
	}
	c.propose(leader, "b")
	c.tick(2)
	if c.rs[2].Status().Rebuilding {
		t.Fatal("still rebuilding after the leader made it whole")
	}
}

func (c *cluster) leaderID() NodeID {
	c.t.Helper()
	for _, id := range c.ids {
		if !c.down[id] && c.rs[id].Status().Role == Leader {
			return id
		}
	}
	c.t.Fatal("no leader")
	return 0
}

// S6: a follower that cannot keep up (the leader writes more per tick than
// one Append carries) is tail chasing; the leader escalates — revokes its
// reservation, compacts past it — and it rebuilds from a snapshot plus the
// tail instead of chasing forever.
func TestS6TailChasingEscalatesToRebuild(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	for _, id := range c.ids { // small appends, so a steady writer outruns one follower
		r, err := New(Config{ID: id, Replicas: c.ids, ElectionTicks: 10, Seed: uint64(id), AppendEntriesMax: 2, ChaseTicks: 5}, c.stores[id].persisted())
		if err != nil {
			t.Fatal(err)
		}
		c.rs[id] = r
	}
	c.elect(1)
	// n3 hears only every fourth tick's messages: it falls further behind.
	for tick := 0; tick < 60; tick++ {
		for i := 0; i < 3; i++ {
			c.rs[1].Propose([]byte(fmt.Sprintf("t%d-%d", tick, i)))
		}
		c.cut[3] = tick%4 != 0
		c.tick(1)
		c.compact(1)
		c.compact(2)
	}
	var st PeerState
	for _, p := range c.rs[1].Status().Peers {
		if p.ID == 3 {
			st = p.State
		}
	}
	if c.snapshots == 0 {
		t.Fatalf("no rebuild: n3 is %v at match %d, leader last %d, snapshot at %d",
			st, c.rs[3].Status().Last, c.rs[1].Status().Last, c.rs[1].Status().SnapSeq)
	}
	delete(c.cut, 3)
	c.tick(20)
	if c.logString(3) != c.logString(1) {
		t.Fatalf("after the rebuild n3 did not converge")
	}
}

// A reservation is bounded in size too: a follower that is heard but
// further behind than ReservationEntriesMax does not pin the leader's log.
func TestReservationIsBoundedInSize(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	for _, id := range c.ids {
		r, err := New(Config{ID: id, Replicas: c.ids, ElectionTicks: 10, Seed: uint64(id), ReservationEntriesMax: 3}, c.stores[id].persisted())
		if err != nil {
			t.Fatal(err)
		}
		c.rs[id] = r
	}
	c.elect(1)
	c.propose(1, "a")
	c.cut[3] = true
	for i := 0; i < 6; i++ {
		c.propose(1, fmt.Sprintf("x%d", i))
	}
	// Within the time bound (2 ticks) but 6 entries behind, above the bound.
	c.tick(2)
	if at := c.compact(1); at <= c.rs[3].Status().Last {
		t.Fatalf("a follower beyond the size bound still pinned the log: compacted to %d, it ends at %d", at, c.rs[3].Status().Last)
	}
}

// Found by the replica-group simulator (sync_all, seed 40071): a leader
// whose next index for an up-to-date follower went stale sent it a snapshot
// below entries the follower had already acknowledged; installing it threw
// those away while the leader counted them, and sync_all committed an
// entry held by two of three replicas. A follower that already holds the
// snapshot's prefix must keep its log.
func TestSnapshotBelowAcknowledgedEntriesKeepsTheLog(t *testing.T) {
	c := newCluster(t, 3, SyncAll)
	c.elect(1)
	c.propose(1, "a")
	// Two more entries reach n2 (it acknowledges them) before it learns
	// that they committed.
	c.rs[1].Propose([]byte("x"))
	c.rs[1].Propose([]byte("y"))
	c.flush(1)
	for _, m := range c.queue {
		if m.Type == MsgAppend && m.To == 2 {
			c.rs[2].Step(m)
		}
	}
	c.queue = nil
	c.flush(2)
	c.queue = nil
	st := c.rs[2].Status()
	if st.Last < 4 || st.CommitSeq >= 3 {
		t.Fatalf("setup: n2 last %d commit %d, want the new entries held and not known committed", st.Last, st.CommitSeq)
	}
	before := c.logString(2)
	// A stale next index makes the leader send a snapshot at seq 3 (x).
	c.rs[2].Step(Message{Type: MsgSnapshot, From: 1, To: 2, Epoch: c.rs[1].Status().Hard.Promised, PrevSeq: 3, PrevEpoch: 1, CommitSeq: 3})
	c.flush(2)
	if c.snapshots != 0 || c.logString(2) != before || c.rs[2].Status().Last != st.Last {
		t.Fatalf("a follower holding the prefix installed the snapshot: installs %d, log %s (was %s)", c.snapshots, c.logString(2), before)
	}
}

// A new leader does not report followers InSync before they hold its
// install entry: until the install commits, its commit is a stale lower
// bound (0 after a restart) and says nothing about them.
func TestNewLeaderReportsInSyncOnlyPastItsInstall(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.drop = func(m Message) bool { return m.Type == MsgAppendAck } // the install is never acked
	c.elect(1)
	st := c.rs[1].Status()
	if st.CommitSeq != 0 || len(st.Peers) != 2 {
		t.Fatalf("unexpected leader state %+v", st)
	}
	for _, p := range st.Peers {
		if p.State == InSync {
			t.Fatalf("follower %d reported InSync at match %d before holding the install at %d", p.ID, p.Match, st.Last)
		}
	}
	c.drop = nil
	c.tick(2)
	for _, p := range c.rs[1].Status().Peers {
		if p.State != InSync {
			t.Fatalf("follower %d is %v once the install is acked", p.ID, p.State)
		}
	}
}

// lineage is what id would put in its PREPARE or PRE_VOTE.
func (c *cluster) lineage(id NodeID) (lastEpoch, lastSeq uint64) {
	r := c.rs[id]
	return r.lastEpoch(), r.last
}

// askPreVote hands id a PRE_VOTE from `from` and returns its answer,
// checking that answering changed nothing at all: the only work is the
// answer (no HardState, nothing to persist), and the encoded state,
// election clock included, is the same as before.
func (c *cluster) askPreVote(id, from NodeID, epoch, lastEpoch, lastSeq uint64) Message {
	c.t.Helper()
	r := c.rs[id]
	if r.HasReady() {
		c.t.Fatalf("n%d has pending work before the pre-vote", id)
	}
	before := r.AppendState(nil, true)
	r.Step(Message{Type: MsgPreVote, From: from, To: id, Epoch: epoch, LastEpoch: lastEpoch, LastSeq: lastSeq})
	rd := r.Ready()
	if rd.HardState != nil || rd.Truncate || len(rd.Entries) != 0 || rd.CommitSeq != 0 || rd.Snapshot != nil ||
		len(rd.Messages) != 1 || rd.Messages[0].Type != MsgPreVoteAck || rd.Messages[0].To != from {
		c.t.Fatalf("n%d answering a pre-vote: %+v (want exactly one PRE_VOTE_ACK to n%d, nothing persisted)", id, rd, from)
	}
	r.Advance(rd)
	if string(r.AppendState(nil, true)) != string(before) {
		c.t.Fatalf("n%d changed its state answering a pre-vote", id)
	}
	return rd.Messages[0]
}

// startPreVote ticks id alone (the others' clocks stand still) until its
// election timer fires and it starts a pre-vote round; the PRE_VOTEs are
// returned and not delivered (nor are those a round in progress sends
// again meanwhile).
func (c *cluster) startPreVote(id NodeID) []Message {
	c.t.Helper()
	hard := c.stores[id].hard
	for i := 0; i < 100; i++ {
		c.rs[id].Tick()
		c.flush(id)
		var out []Message
		for _, m := range c.queue {
			if m.From == id && m.Type == MsgPreVote {
				out = append(out, m)
			}
		}
		if len(out) > 0 && c.rs[id].electionElapsed > 0 {
			// A round in progress asking again (resendPreVotes), not a
			// new round: lost like the first.
			c.queue = slices.DeleteFunc(c.queue, func(m Message) bool { return m.From == id && m.Type == MsgPreVote })
			continue
		}
		if len(out) > 0 {
			c.queue = slices.DeleteFunc(c.queue, func(m Message) bool { return m.From == id })
			if !c.rs[id].preVoting || len(out) != len(c.ids)-1 || c.stores[id].hard != hard {
				c.t.Fatalf("n%d pre-votes %v, hard state %+v (was %+v)", id, out, c.stores[id].hard, hard)
			}
			return out
		}
	}
	c.t.Fatalf("n%d never started a pre-vote", id)
	return nil
}

func TestPreVoteRefusedByAFollowerThatHearsItsLeader(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.tick(1)
	e := c.rs[1].Status().Hard.Promised
	le, ls := c.lineage(3)
	if ack := c.askPreVote(2, 3, e+1, le, ls); ack.Granted || ack.Epoch != e {
		t.Fatalf("a follower that hears its leader answered %v", ack)
	}
}

// The lease runs out after ElectionTicks without news from the leader: one
// tick short the follower still refuses, then it grants.
func TestPreVoteGrantedOnceTheLeaseExpired(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.tick(1)
	e := c.rs[1].Status().Hard.Promised
	le, ls := c.lineage(3)
	c.cut[2] = true
	c.tick(c.rs[2].cfg.ElectionTicks - 1)
	if c.rs[2].electionTimeout <= c.rs[2].cfg.ElectionTicks {
		t.Fatalf("setup: n2's timer (%d) fires at the lease end", c.rs[2].electionTimeout)
	}
	if ack := c.askPreVote(2, 3, e+1, le, ls); ack.Granted {
		t.Fatalf("one tick before its lease expired n2 answered %v", ack)
	}
	c.tick(1)
	if ack := c.askPreVote(2, 3, e+1, le, ls); !ack.Granted || ack.Epoch != e+1 {
		t.Fatalf("with its lease expired n2 answered %v", ack)
	}
}

func TestPreVoteRefusedByAHealthyLeaderGrantedByADegradedOne(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.tick(c.rs[1].cfg.ElectionTicks + 1) // followers answer heartbeats long past any election timeout
	e := c.rs[1].Status().Hard.Promised
	le, ls := c.lineage(3)
	if ack := c.askPreVote(1, 3, e+1, le, ls); ack.Granted || ack.Epoch != e {
		t.Fatalf("a healthy leader answered %v", ack)
	}
	c.cut[2], c.cut[3] = true, true
	c.tick(c.rs[1].cfg.AckTimeoutTicks + 1)
	if !c.rs[1].Status().ReadOnly {
		t.Fatal("setup: the leader is not read-only")
	}
	if ack := c.askPreVote(1, 3, e+1, le, ls); !ack.Granted || ack.Epoch != e+1 {
		t.Fatalf("a read-only leader answered %v", ack)
	}
	if st := c.rs[1].Status(); st.Role != Leader || st.Hard.Promised != e {
		t.Fatalf("granting a pre-vote changed the leader: %+v", st)
	}
}

// Under sync_all a leader is read-only as soon as one replica lags; while
// it still hears a majority it keeps its lease and refuses (else the
// lagging replica would win with the leader's own pre-grant).
func TestSyncAllLeaderKeepsItsLeaseWhileItHearsAMajority(t *testing.T) {
	c := newCluster(t, 3, SyncAll)
	c.elect(1)
	c.propose(1, "a")
	e := c.rs[1].Status().Hard.Promised
	le, ls := c.lineage(3)
	c.cut[3] = true
	c.tick(c.rs[1].cfg.AckTimeoutTicks + 1)
	if !c.rs[1].Status().ReadOnly {
		t.Fatal("setup: the sync_all leader is not read-only")
	}
	if ack := c.askPreVote(1, 3, e+1, le, ls); ack.Granted {
		t.Fatalf("a sync_all leader that hears a majority answered %v", ack)
	}
	c.cut[2] = true
	c.tick(c.rs[1].cfg.AckTimeoutTicks + 1)
	if ack := c.askPreVote(1, 3, e+1, le, ls); !ack.Granted {
		t.Fatalf("a sync_all leader that lost its quorum answered %v", ack)
	}
}

// Besides the lease, a pre-vote needs a newer epoch, a lineage at least as
// good as the receiver's, and a receiver that is not rebuilding. A
// restarted follower knows no leader, so its lease has expired.
func TestPreVoteRefusals(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.propose(1, "b")
	e := c.rs[1].Status().Hard.Promised
	c.crash(2)
	c.start(2)
	le, ls := c.lineage(2)
	if le != e || ls != 3 {
		t.Fatalf("setup: n2 lineage (%d, %d)", le, ls)
	}
	if ack := c.askPreVote(2, 3, e+1, le, ls); !ack.Granted || ack.Epoch != e+1 {
		t.Fatalf("a restarted follower refused an equal lineage: %v", ack)
	}
	for _, tc := range []struct {
		name                    string
		epoch, lastEpoch, lastS uint64
	}{
		{"no newer epoch", e, le, ls},
		{"a shorter log of the same epoch", e + 1, le, ls - 1},
		{"a longer log of an older epoch", e + 1, le - 1, ls + 5},
	} {
		if ack := c.askPreVote(2, 3, tc.epoch, tc.lastEpoch, tc.lastS); ack.Granted || ack.Epoch != e {
			t.Fatalf("%s: n2 answered %v", tc.name, ack)
		}
	}
	c.crash(2)
	c.stores[2].rebuilding = true
	c.start(2)
	if ack := c.askPreVote(2, 3, e+1, le, ls+1); ack.Granted {
		t.Fatalf("a rebuilding replica answered %v", ack)
	}
}

// A replica whose own timer fired has heard nothing from its leader since:
// it grants a peer's pre-vote although its election clock restarted.
func TestPreCandidateGrantsAPeersPreVote(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	e := c.rs[1].Status().Hard.Promised
	c.startPreVote(3)
	if st := c.rs[3].Status(); st.Leader != 1 || c.rs[3].electionElapsed != 0 {
		t.Fatalf("setup: n3 %+v elapsed %d", st, c.rs[3].electionElapsed)
	}
	le, ls := c.lineage(2)
	if ack := c.askPreVote(3, 2, e+1, le, ls); !ack.Granted {
		t.Fatalf("a pre-candidate answered %v", ack)
	}
}

// An election timeout pre-votes (persisting nothing), and a majority of
// pre-grants leads to a real campaign, won at the next epoch.
func TestPreVoteMajorityLeadsToARealElection(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	e := c.rs[1].Status().Hard.Promised
	c.crash(1)
	hard := map[NodeID]HardState{2: c.stores[2].hard, 3: c.stores[3].hard}
	var kinds []string
	for i := 0; i < 100 && c.leader() == 0; i++ {
		c.quietTick()
		c.pump(func(msg Message) bool {
			if !c.down[msg.To] {
				kinds = append(kinds, fmt.Sprintf("%s from n%d", msg.Type, msg.From))
			}
			if msg.Type == MsgPreVote || msg.Type == MsgPreVoteAck {
				for id, h := range hard {
					if c.stores[id].hard != h {
						t.Fatalf("n%d persisted %+v during the pre-vote round", id, c.stores[id].hard)
					}
				}
			}
			return false
		})
	}
	l := c.leaderID()
	if got := c.rs[l].Status().Hard.Promised; got != e+1 {
		t.Fatalf("n%d leads epoch %d, want %d", l, got, e+1)
	}
	other := NodeID(5) - l
	want := []string{"PRE_VOTE from n" + fmt.Sprint(l), "PRE_VOTE_ACK from n" + fmt.Sprint(other), "PREPARE from n" + fmt.Sprint(l)}
	for i, k := range want {
		if len(kinds) <= i || kinds[i] != k {
			t.Fatalf("messages %v, want them to start %v", kinds, want)
		}
	}
	c.propose(l, "b")
	if m.seqOf("b") == 0 {
		t.Fatal("the new leader does not commit")
	}
}

func TestRefusedPreVoteFromANewerEpochMakesAFollower(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	e := c.rs[1].Status().Hard.Promised
	c.startPreVote(3)
	c.rs[3].Step(Message{Type: MsgPreVoteAck, From: 2, To: 3, Epoch: e})
	c.flush(3)
	if st := c.rs[3].Status(); st.Hard.Promised != e || !c.rs[3].preVoting {
		t.Fatalf("a refusal at its own epoch changed n3: %+v", st)
	}
	c.rs[3].Step(Message{Type: MsgPreVoteAck, From: 2, To: 3, Epoch: e + 3})
	c.flush(3)
	if st := c.rs[3].Status(); st.Role != Follower || st.Hard.Promised != e+3 || st.Leader != 0 || c.stores[3].hard.Promised != e+3 || c.rs[3].preVoting {
		t.Fatalf("after a refusal from epoch %d: %+v, durable %+v", e+3, st, c.stores[3].hard)
	}
}

// Grants count only toward the round in progress: not after news from the
// leader ended it, not from an earlier round at another epoch, and not
// from an earlier round at the same epoch (a restarted round starts over).
func TestPreGrantsCountOnlyForTheRoundInProgress(t *testing.T) {
	grant := func(c *cluster, to, from NodeID, epoch uint64) {
		c.rs[to].Step(Message{Type: MsgPreVoteAck, From: from, To: to, Epoch: epoch, Granted: true})
		c.flush(to)
	}
	// Late grants from a majority (n2, n3, n4 of five) after the round ended.
	t.Run("after the leader was heard", func(t *testing.T) {
		c := newCluster(t, 5, SyncQuorum)
		c.elect(1)
		e := c.rs[1].Status().Hard.Promised
		c.startPreVote(5)
		c.rs[1].Tick() // a heartbeat reaches n5
		c.settle()
		for _, from := range []NodeID{2, 3, 4} {
			grant(c, 5, from, e+1)
		}
		if st := c.rs[5].Status(); st.Role != Follower || st.Hard.Promised != e {
			t.Fatalf("late pre-grants after the leader was heard: %+v", st)
		}
	})
	t.Run("after the leader's snapshot", func(t *testing.T) {
		c := newCluster(t, 5, SyncQuorum)
		c.elect(1)
		e := c.rs[1].Status().Hard.Promised
		c.startPreVote(5)
		c.rs[5].Step(Message{Type: MsgSnapshot, From: 1, To: 5, Epoch: e})
		c.flush(5)
		for _, from := range []NodeID{2, 3, 4} {
			grant(c, 5, from, e+1)
		}
		if st := c.rs[5].Status(); st.Role != Follower || st.Hard.Promised != e {
			t.Fatalf("late pre-grants after the leader's snapshot: %+v", st)
		}
	})
	t.Run("from a round at another epoch", func(t *testing.T) {
		c := newCluster(t, 3, SyncQuorum)
		c.elect(1)
		e := c.rs[1].Status().Hard.Promised
		c.startPreVote(3)
		c.rs[3].Step(Message{Type: MsgPrepare, From: 2, To: 3, Epoch: e + 1}) // promises e+1 (refuses n2's lineage)
		c.flush(3)
		c.queue = nil
		c.startPreVote(3) // asks for e+2
		grant(c, 3, 1, e+1)
		if st := c.rs[3].Status(); st.Role != Follower || st.Hard.Promised != e+1 {
			t.Fatalf("a pre-grant for epoch %d counted toward a round for %d: %+v", e+1, e+2, st)
		}
	})
	t.Run("from an earlier round", func(t *testing.T) {
		c := newCluster(t, 5, SyncQuorum)
		c.elect(1)
		e := c.rs[1].Status().Hard.Promised
		c.startPreVote(5)
		grant(c, 5, 4, e+1)
		c.startPreVote(5) // the timer fired again: the round restarts
		grant(c, 5, 3, e+1)
		if st := c.rs[5].Status(); st.Role != Follower || st.Hard.Promised != e {
			t.Fatalf("pre-grants of two rounds added up: %+v", st)
		}
		grant(c, 5, 2, e+1)
		if st := c.rs[5].Status(); st.Role != Candidate || st.Hard.Promised != e+1 {
			t.Fatalf("three pre-grants of five in one round: %+v", st)
		}
	})
}

func TestSingleReplicaCampaignsOnTimeoutWithoutPreVote(t *testing.T) {
	c := newCluster(t, 1, SyncQuorum)
	c.drop = func(m Message) bool {
		t.Fatalf("a single replica sent %v", m)
		return true
	}
	c.tick(40)
	if st := c.rs[1].Status(); st.Role != Leader || st.Hard.Promised != 1 {
		t.Fatalf("single replica: %+v", st)
	}
}

// Campaign stays a forced election: no pre-vote, the promise at once, even
// on a follower that hears its leader.
func TestCampaignIsForcedWithoutPreVote(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.tick(1)
	e := c.rs[1].Status().Hard.Promised
	c.rs[2].Campaign()
	rd := c.rs[2].Ready()
	if rd.HardState == nil || rd.HardState.Promised != e+1 || len(rd.Messages) != 2 || rd.Messages[0].Type != MsgPrepare {
		t.Fatalf("Campaign: %+v", rd)
	}
}

// A candidate whose PREPAREs were lost (a brand-new group's members had
// not opened it yet; the network dropped them) PREPAREs again every
// HeartbeatTicks and wins long before its election timeout.
func TestCandidateRepeatsLostPreparesUntilAnswered(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.ElectionTicks = 30 })
	c.drop = dropFirst(MsgPrepare, 2)
	c.rs[1].Campaign() // a new group's first election
	c.settle()
	if st := c.rs[1].Status(); st.Role != Candidate {
		t.Fatalf("n1 with its PREPAREs lost: %v", st.Role)
	}
	heartbeat := c.rs[1].cfg.HeartbeatTicks
	c.tick(heartbeat)
	if st := c.rs[1].Status(); st.Role != Leader || st.Hard.Promised != 1 {
		t.Fatalf("n1 %d ticks on (election timeout %d): %v of epoch %d, want leader of 1", heartbeat, c.rs[1].cfg.ElectionTicks, st.Role, st.Hard.Promised)
	}
}

// A forced campaign's re-sent PREPAREs are not forced: a replica that
// still hears its leader promises nothing to them. (A transfer's target
// whose PREPAREs were lost must not depose the leader that gave up the
// hand-off and leads again.)
func TestRepeatedPreparesAreNotForced(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.ElectionTicks = 30 })
	c.elect(1)
	c.tick(1)
	e := c.rs[1].Status().Hard.Promised
	c.drop = dropFirst(MsgPrepare, 2)
	c.rs[2].Campaign()
	c.settle()
	c.tick(c.rs[2].cfg.HeartbeatTicks)
	if st := c.rs[3].Status(); st.Hard.Promised != e {
		t.Fatalf("n3, which hears its leader, promised epoch %d to a re-sent PREPARE, want still %d", st.Hard.Promised, e)
	}
	if st := c.rs[2].Status(); st.Role == Leader {
		t.Fatalf("n2 took office through re-sent PREPAREs to replicas that hear their leader")
	}
}

// A pre-vote round asks again, every heartbeat interval, the peers that
// have not answered it: a PRE_VOTE lost to the network costs a heartbeat,
// not an election timeout and another round. (n3's own rounds are lost
// throughout, so only n2 can win.)
func TestPreVoteRepeatsLostPreVotesUntilAnswered(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.ElectionTicks = 30 })
	c.elect(1)
	c.tick(1)
	c.crash(1)
	lost := false
	c.drop = func(m Message) bool {
		switch {
		case m.Type != MsgPreVote:
			return false
		case m.From == 3:
			return true
		case !lost:
			lost = true // n2's first PRE_VOTE to n3
			return true
		}
		return false
	}
	for i := 0; !c.rs[2].preVoting; i++ {
		if i > 100 {
			t.Fatal("n2 never started a pre-vote round")
		}
		c.tick(1)
	}
	if !lost {
		t.Fatal("n2's first PRE_VOTE reached n3")
	}
	heartbeat := c.rs[2].cfg.HeartbeatTicks
	c.tick(heartbeat)
	if st := c.rs[2].Status(); st.Role != Leader {
		t.Fatalf("n2 %d ticks into a round whose PRE_VOTE to n3 was lost: %v of epoch %d, want leader", heartbeat, st.Role, st.Hard.Promised)
	}
}

// A pre-vote round does not ask again a peer that answered it: a refusal
// is an answer (the round waits for the election timer, as before).
func TestPreVoteAsksAgainOnlyTheUnanswered(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.ElectionTicks = 30 })
	c.elect(1)
	c.tick(1)
	c.startPreVote(3)
	refusal := c.askPreVote(2, 3, c.rs[3].Status().Hard.Promised+1, 0, 0) // n2 hears its leader: refuses
	if refusal.Granted {
		t.Fatalf("n2, which hears its leader, granted: %v", refusal)
	}
	c.rs[3].Step(refusal)
	c.flush(3)
	c.queue = slices.DeleteFunc(c.queue, func(m Message) bool { return m.From == 3 })
	for range c.rs[3].cfg.HeartbeatTicks {
		c.rs[3].Tick()
		c.flush(3)
	}
	var asked []NodeID
	for _, m := range c.queue {
		if m.From == 3 && m.Type == MsgPreVote {
			asked = append(asked, m.To)
		}
	}
	if !slices.Equal(asked, []NodeID{1}) {
		t.Fatalf("a heartbeat into its round n3 asked %v again, want only the unanswered n1", asked)
	}
}

// dropFirst loses the first n messages of type typ.
func dropFirst(typ MsgType, n int) func(Message) bool {
	return func(m Message) bool {
		if m.Type == typ && n > 0 {
			n--
			return true
		}
		return false
	}
}

// A pre-vote round is part of the state: it shows in the encoding (without
// timers too) and a clone's round is its own.
func TestPreVoteRoundIsEncodedAndCloned(t *testing.T) {
	c := newCluster(t, 5, SyncQuorum)
	c.elect(1)
	c.tick(1) // the followers learn the install's commit
	e := c.rs[1].Status().Hard.Promised
	before := c.rs[5].AppendState(nil, false)
	c.startPreVote(5)
	round := c.rs[5].AppendState(nil, false)
	if string(round) == string(before) {
		t.Fatal("a pre-vote round does not show in the encoding")
	}
	clone := c.rs[5].Clone()
	clone.Step(Message{Type: MsgPreVoteAck, From: 4, To: 5, Epoch: e + 1, Granted: true})
	clone.Advance(clone.Ready())
	if string(clone.AppendState(nil, false)) == string(round) {
		t.Fatal("a pre-grant does not show in the encoding")
	}
	if string(c.rs[5].AppendState(nil, false)) != string(round) {
		t.Fatal("a pre-grant to the clone changed the original")
	}
	c.rs[1].Tick() // the leader's heartbeat ends the round
	c.settle()
	if string(c.rs[5].AppendState(nil, false)) != string(before) {
		t.Fatal("a pre-vote round ended by the leader's heartbeat left a trace in the state")
	}
}

// The status tells what a replica can vouch for about the others: a
// leader marks a follower it has not heard from for AckTimeoutTicks
// Silent; a follower that lost its leader's lease reports LeaderSilent
// (it still remembers who led), so the shell stops pointing clients there.
func TestStatusReportsSilentPeersAndLeader(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.tick(1)
	if st := c.rs[2].Status(); st.LeaderSilent || st.Leader != 1 {
		t.Fatalf("a follower hearing its leader: %+v", st)
	}
	for _, ps := range c.rs[1].Status().Peers {
		if ps.Silent {
			t.Fatalf("leader finds a live follower silent: %+v", ps)
		}
	}
	c.crash(3)
	c.tick(2*10 + 1) // AckTimeoutTicks (2 x ElectionTicks) and one
	for _, ps := range c.rs[1].Status().Peers {
		if ps.Silent != (ps.ID == 3) {
			t.Fatalf("after n3 crashed the leader reports %+v", c.rs[1].Status().Peers)
		}
	}
	if st := c.rs[1].Status(); st.LeaderSilent || st.ReadOnly {
		t.Fatalf("a leader with a quorum: %+v", st)
	}
	c.crash(1)
	c.tick(2 * 10) // n2 alone cannot elect anyone
	if st := c.rs[2].Status(); !st.LeaderSilent || st.Leader != 1 || st.Role == Leader {
		t.Fatalf("a follower whose leader crashed %d ticks ago: %+v", 2*10, st)
	}
}

// TestEarlyHoldsOnlyAppendsOfPlainReadys: the ordering rule is data in the
// Ready. A leader's Ready with fresh entries and nothing else to persist
// puts its Appends in Early; a Ready with a promise holds back everything.
func TestEarlyHoldsOnlyAppendsOfPlainReadys(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	r := c.rs[1]
	if _, _, err := r.Propose([]byte("v")); err != nil {
		t.Fatal(err)
	}
	rd := r.Ready()
	if rd.HardState != nil || rd.Truncate || len(rd.Entries) != 1 || len(rd.Early) != 2 {
		t.Fatalf("leader's Ready: hard %v truncate %v entries %d early %v", rd.HardState, rd.Truncate, len(rd.Entries), rd.Early)
	}
	for _, m := range rd.Early {
		if m.Type != MsgAppend {
			t.Fatalf("early %s", m)
		}
	}
	for _, m := range rd.Messages {
		if m.Type == MsgAppend {
			t.Fatalf("an Append left behind in Messages: %s", m)
		}
	}
	c.flush(1)
	c.settle()

	// A follower that times out campaigns: its promise must be durable
	// before its PREPAREs (and any Append) go out.
	c.rs[2].Campaign()
	rd = c.rs[2].Ready()
	if rd.HardState == nil || len(rd.Early) != 0 || len(rd.Messages) == 0 {
		t.Fatalf("candidate's Ready: hard %v early %v messages %v", rd.HardState, rd.Early, rd.Messages)
	}
}

// TestEarlyIsEmptyWhenTheReadyPromises: a leader whose heartbeat Appends
// are still pending when it promises a higher epoch sends nothing before
// the promise is durable — Appends included.
func TestEarlyIsEmptyWhenTheReadyPromises(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	r := c.rs[1]
	for i := 0; i < 10 && !slices.ContainsFunc(r.Ready().Messages, isAppend) && len(r.Ready().Early) == 0; i++ {
		r.Tick()
	}
	if len(r.Ready().Early) == 0 {
		t.Fatal("setup: no heartbeat Appends pending after 10 ticks")
	}
	st := r.Status()
	// Forced: a healthy leader refuses an election timeout's PREPARE.
	r.Step(Message{Type: MsgPrepare, From: 2, To: 1, Epoch: st.Hard.Promised + 1, LastEpoch: st.Hard.Promised, LastSeq: st.Last, Forced: true})
	rd := r.Ready()
	if rd.HardState == nil || len(rd.Early) != 0 || !slices.ContainsFunc(rd.Messages, isAppend) {
		t.Fatalf("hard %v, early %v, messages %v", rd.HardState, rd.Early, rd.Messages)
	}
}

// TestGrantedCountsUncertainGrantsWithinTheDamageBudget pins the election
// rule of Replica.granted for groups of 3 and 5: N grants, U of them
// uncertain, D damaged refusals; elected when N ≥ Q and
// (R−N) + min(U, R−Q−D) < Q.
func TestGrantedCountsUncertainGrantsWithinTheDamageBudget(t *testing.T) {
	for _, c := range []struct {
		replicas, grants, uncertain, damaged int
		want                                 bool
	}{
		{3, 2, 0, 0, true},
		{3, 2, 1, 0, false}, // the one outside may hold what the uncertain one lost
		{3, 2, 2, 0, false},
		{3, 2, 1, 1, true}, // the third is known damaged: the budget is spent
		{3, 2, 2, 1, true},
		{3, 3, 1, 0, true},
		{3, 3, 3, 0, true},
		{3, 1, 0, 2, false}, // no majority
		{5, 3, 0, 0, true},
		{5, 3, 1, 0, false},
		{5, 4, 1, 0, true},
		{5, 4, 2, 0, false},
		{5, 4, 2, 1, true},
		{5, 5, 2, 0, true},
		{5, 5, 5, 0, true},
		{5, 3, 1, 2, true},
		{5, 3, 2, 2, true},
	} {
		ids := make([]NodeID, c.replicas)
		for i := range ids {
			ids[i] = NodeID(i + 1)
		}
		r, err := New(Config{ID: 1, Replicas: ids}, Persisted{})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < c.grants; i++ {
			r.grants[i], r.uncertainGrants[i] = true, i < c.uncertain
		}
		for i := c.grants; i < c.grants+c.damaged; i++ {
			r.damagedRefusals[i] = true
		}
		if got := r.granted(); got != c.want {
			t.Errorf("R=%d, %d grants (%d uncertain), %d damaged refusals: elected %v, want %v", c.replicas, c.grants, c.uncertain, c.damaged, got, c.want)
		}
	}
}

// TestIdleLeaderHeartbeatsTenTimesAnElectionTimeout: by default an idle
// leader sends each follower an Append every ElectionTicks/10 ticks — not
// every tick, which cost every idle group a message and its answer per
// follower per tick — and that is enough: no follower campaigns.
func TestIdleLeaderHeartbeatsTenTimesAnElectionTimeout(t *testing.T) {
	for _, tt := range []struct {
		heartbeat, want int
	}{{heartbeat: 0, want: 10}, {heartbeat: 1, want: 30}} {
		c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) {
			cfg.ElectionTicks = 30
			cfg.HeartbeatTicks = tt.heartbeat
		})
		c.elect(1)
		c.propose(1, "a")
		appends := 0
		c.drop = func(m Message) bool {
			if m.Type == MsgAppend && m.From == 1 && m.To == 2 {
				appends++
			}
			return false
		}
		c.tick(30)
		if appends != tt.want {
			t.Errorf("HeartbeatTicks %d: %d Appends to a follower in 30 idle ticks, want %d", tt.heartbeat, appends, tt.want)
		}
		c.tick(300) // ten election timeouts
		for _, id := range c.ids {
			if st := c.rs[id].Status(); st.Hard.Promised != c.rs[1].Status().Hard.Promised || st.Leader != 1 || (id == 1) != (st.Role == Leader) {
				t.Errorf("HeartbeatTicks %d: n%d after idle ticks: %+v", tt.heartbeat, id, st)
			}
		}
	}
}
