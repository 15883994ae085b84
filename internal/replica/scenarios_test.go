package replica

// Named DESIGN §5 scenarios on the lockstep cluster of replica_test.go,
// each checked step by step against a reference model (model, below) and
// at the end against the expected final state.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the reference the scenarios check against: the visible
// (committed) prefix of the partition, entry by entry, as replicas first
// reported it. It checks every Ready of every replica (cluster.onFlush):
//   - VisibleImpliesQuorumFlushed: a seq becomes visible only once it is
//     durable on a quorum (every replica under sync_all), and never beyond
//     the reporting replica's own durable log;
//   - CommittedPrefixAgreement / VisibleMonotonic: once visible, a seq keeps
//     its (epoch, data) on every replica that reports it and in every
//     durable log that holds it as visible; a replica's commit never goes
//     back within one incarnation;
//   - a rebuilding replica is never a candidate or a leader;
//   - no replica refuses an impossible message (Anomalies).
type model struct {
	c       *cluster
	visible []Entry
	seen    map[*Replica]uint64 // commit already checked, per incarnation
}

func watch(c *cluster) *model {
	m := &model{c: c, seen: map[*Replica]uint64{}}
	c.onFlush = m.check
	return m
}

func sameEntry(a, b Entry) bool {
	return a.Seq == b.Seq && a.Epoch == b.Epoch && string(a.Data) == string(b.Data)
}

func (m *model) check(id NodeID) {
	t, r, s := m.c.t, m.c.rs[id], m.c.stores[id]
	t.Helper()
	st := r.Status()
	if st.Anomalies > 0 {
		t.Fatalf("n%d refused %d impossible messages", id, st.Anomalies)
	}
	if st.Rebuilding && st.Role != Follower {
		t.Fatalf("n%d is %v while rebuilding: a rebuilding replica is never promotable", id, st.Role)
	}
	from, ok := m.seen[r]
	if !ok {
		from = st.SnapSeq // a fresh incarnation knows its snapshot is committed
		if from > uint64(len(m.visible)) {
			t.Fatalf("n%d starts from a snapshot at %d beyond the visible prefix %d", id, from, len(m.visible))
		}
	}
	if st.CommitSeq < from {
		t.Fatalf("VisibleMonotonic: n%d commit went back from %d to %d", id, from, st.CommitSeq)
	}
	for seq := from + 1; seq <= st.CommitSeq; seq++ {
		m.learn(id, seq)
	}
	m.seen[r] = st.CommitSeq
	for seq := uint64(1); seq <= st.CommitSeq; seq++ {
		if !sameEntry(s.log[seq-1], m.visible[seq-1]) {
			t.Fatalf("VisibleMonotonic: n%d holds %v at visible seq %d, visible was %v", id, s.log[seq-1], seq, m.visible[seq-1])
		}
	}
}

func (m *model) learn(id NodeID, seq uint64) {
	t, s := m.c.t, m.c.stores[id]
	t.Helper()
	if seq > uint64(len(s.log)) {
		t.Fatalf("VisibleImpliesQuorumFlushed: n%d made %d visible, its durable log ends at %d", id, seq, len(s.log))
	}
	e := s.log[seq-1]
	if seq <= uint64(len(m.visible)) {
		if !sameEntry(e, m.visible[seq-1]) {
			t.Fatalf("CommittedPrefixAgreement: seq %d visible on n%d as (e%d %q), earlier as (e%d %q)", seq, id, e.Epoch, e.Data, m.visible[seq-1].Epoch, m.visible[seq-1].Data)
		}
		return
	}
	holders := 0
	for _, o := range m.c.stores {
		if uint64(len(o.log)) >= seq && sameEntry(o.log[seq-1], e) {
			holders++
		}
	}
	need := len(m.c.ids)/2 + 1
	if m.c.policy == SyncAll {
		need = len(m.c.ids)
	}
	if holders < need {
		t.Fatalf("VisibleImpliesQuorumFlushed: seq %d (e%d %q) visible on n%d, durable on %d replicas, need %d", seq, e.Epoch, e.Data, id, holders, need)
	}
	m.visible = append(m.visible, e)
}

// seqOf returns where value became visible (0: never).
func (m *model) seqOf(value string) uint64 {
	for _, e := range m.visible {
		if string(e.Data) == value {
			return e.Seq
		}
	}
	return 0
}

// seeded is a scenario's PRNG for a seed: splitmix64 spreads small seeds
// (PCG's first outputs for seeds 1, 2, 3... are alike).
func seeded(seed, scenario uint64) *rand.Rand {
	mix := func(z uint64) uint64 {
		z += 0x9E3779B97F4A7C15
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		return z ^ z>>31
	}
	return rand.New(rand.NewPCG(mix(seed), mix(scenario)))
}

// chain adds fn after whatever onFlush already does (the model's check).
func (c *cluster) chain(fn func(NodeID)) {
	prev := c.onFlush
	c.onFlush = func(id NodeID) {
		if prev != nil {
			prev(id)
		}
		fn(id)
	}
}

// pump delivers the queued messages one at a time, in order, until none is
// left. intercept, when set, sees each message first; returning true means
// the scenario took it over and the network does not deliver it.
func (c *cluster) pump(intercept func(Message) bool) {
	for guard := 0; len(c.queue) > 0; guard++ {
		if guard > 100_000 {
			c.t.Fatal("messages never settle")
		}
		m := c.queue[0]
		c.queue = c.queue[1:]
		if intercept != nil && intercept(m) {
			continue
		}
		c.deliver(m)
	}
}

// quietTick advances every live replica by one tick and carries out its
// Ready, leaving the messages queued for pump.
func (c *cluster) quietTick() {
	for _, id := range c.ids {
		if !c.down[id] {
			c.rs[id].Tick()
			c.flush(id)
		}
	}
}

func (c *cluster) flushAll() {
	for _, id := range c.ids {
		c.flush(id)
	}
}

// killOnReceipt hands m to its addressee and kills it (kill -9): after its
// Ready was made durable (the answers are already on the wire), or before
// (the entries it received were never fsynced and are lost; it answered
// nothing).
func (c *cluster) killOnReceipt(m Message, fsynced bool) {
	c.rs[m.To].Step(m)
	if fsynced {
		c.flush(m.To)
	}
	c.crash(m.To)
}

// leader returns the live leader, 0 if there is none.
func (c *cluster) leader() NodeID {
	for _, id := range c.ids {
		if !c.down[id] && c.rs[id].Status().Role == Leader {
			return id
		}
	}
	return 0
}

// promote makes id campaign until it wins (a first campaign may be at an
// epoch another replica already promised) and lets the install settle.
func (c *cluster) promote(id NodeID) bool {
	for i := 0; i < 3; i++ {
		c.rs[id].Campaign()
		c.settle()
		if c.rs[id].Status().Role == Leader {
			return true
		}
	}
	return false
}

// peer is the leader's view of follower id.
func (c *cluster) peer(leader, id NodeID) PeerStatus {
	c.t.Helper()
	for _, p := range c.rs[leader].Status().Peers {
		if p.ID == id {
			return p
		}
	}
	c.t.Fatalf("n%d is not a peer of leader n%d", id, leader)
	return PeerStatus{}
}

func (c *cluster) peerState(leader, id NodeID) PeerState { return c.peer(leader, id).State }
func (c *cluster) peerMatch(leader, id NodeID) uint64    { return c.peer(leader, id).Match }

// requireConverged checks the expected final state: one leader that has
// committed its whole log, every replica holding exactly that log (which
// is the model's visible prefix) with the same commit, and every follower
// InSync.
func (c *cluster) requireConverged(m *model) NodeID {
	c.t.Helper()
	l := c.leaderID()
	st := c.rs[l].Status()
	if st.CommitSeq != st.Last || uint64(len(m.visible)) != st.Last {
		c.t.Fatalf("leader n%d: last %d commit %d, visible prefix %d", l, st.Last, st.CommitSeq, len(m.visible))
	}
	for i, e := range c.stores[l].log {
		if !sameEntry(e, m.visible[i]) {
			c.t.Fatalf("leader n%d holds %v at %d, visible is %v", l, e, e.Seq, m.visible[i])
		}
	}
	for _, id := range c.ids {
		if c.logString(id) != c.logString(l) {
			c.t.Fatalf("n%d differs from leader n%d:\n n%d %s\n n%d %s", id, l, id, c.logString(id), l, c.logString(l))
		}
		if got := c.rs[id].Status(); got.CommitSeq != st.CommitSeq || got.Rebuilding {
			c.t.Fatalf("n%d: commit %d rebuilding %v, leader commit %d", id, got.CommitSeq, got.Rebuilding, st.CommitSeq)
		}
		if id != l && c.peerState(l, id) != InSync {
			c.t.Fatalf("n%d is %v, want InSync", id, c.peerState(l, id))
		}
	}
	return l
}

func (c *cluster) holds(id NodeID, value string) bool {
	return slices.ContainsFunc(c.stores[id].log, func(e Entry) bool { return string(e.Data) == value })
}

// S5: a follower that keeps flapping — cut off, mute, killed after or
// before fsyncing what it just received, restarted — keeps catching up.
// While every absence is brief (inside its reservation) the leader keeps
// its range and it recovers from the log alone; with some long absences
// mixed in it rebuilds from a snapshot instead. Either way it never
// reports anything but the committed prefix, and it ends InSync holding
// exactly that prefix.
func TestS5FlappingReplicaStaysRecoverable(t *testing.T) {
	for _, long := range []bool{false, true} {
		for seed := uint64(1); seed <= 10; seed++ {
			t.Run(fmt.Sprintf("long=%v/seed=%d", long, seed), func(t *testing.T) { flapping(t, seed, long) })
		}
	}
}

func flapping(t *testing.T, seed uint64, long bool) {
	rng := seeded(seed, 5)
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 3 })
	m := watch(c)
	c.elect(1)
	next, flaps, longs := 0, 0, 0
	for round := 0; round < 60; round++ {
		if l := c.leader(); l != 0 {
			for i := rng.IntN(4); i > 0; i-- {
				if _, _, err := c.rs[l].Propose(fmt.Appendf(nil, "v%d", next)); err == nil {
					next++
				}
			}
		}
		away := 1 + rng.IntN(5)
		var back func()
		switch kind := rng.IntN(5); {
		case long && (round == 30 || kind == 4 && rng.IntN(3) == 0): // away past its reservation
			c.crash(3)
			away, back = 45, func() { c.start(3) }
			longs++
		case kind == 0: // cut off both ways
			c.cut[3] = true
			back = func() { delete(c.cut, 3) }
		case kind == 1: // mute: hears and fsyncs the leader's Appends, its answers are lost
			c.drop = func(m Message) bool { return m.From == 3 }
			back = func() { c.drop = nil }
		case kind == 2: // kill -9 after its last fsync
			c.crash(3)
			back = func() { c.start(3) }
		case kind == 3: // kill -9 on receipt of an Append, before or after fsyncing it
			c.flushAll()
			c.pump(func(msg Message) bool {
				if c.down[3] || msg.To != 3 || msg.Type != MsgAppend || len(msg.Entries) == 0 {
					return false
				}
				c.killOnReceipt(msg, rng.IntN(2) == 0)
				return true
			})
			c.crash(3)
			back = func() { c.start(3) }
		default: // a calm round
			away = 1
		}
		c.tick(away)
		if l := c.leader(); l != 0 {
			c.compact(l) // while n3 is away the leader compacts as far as reservations allow
		}
		if back != nil {
			back()
			flaps++
		}
		c.tick(1) // back on the network for at least one round trip
	}
	if flaps < 30 {
		t.Fatalf("only %d flaps", flaps)
	}
	c.tick(30)
	l := c.requireConverged(m)
	t.Logf("%d flaps (%d past the reservation), %d snapshot installs, leader n%d epoch %d, %d entries visible", flaps, longs, c.snapshots, l, c.rs[l].Status().Hard.Promised, len(m.visible))
	if !long && c.snapshots != 0 {
		t.Fatalf("%d snapshot installs although every absence was inside the reservation", c.snapshots)
	}
	if long && c.snapshots == 0 {
		t.Fatal("no snapshot rebuild although n3 stayed away past its reservation")
	}
	for _, e := range m.visible {
		if e.Data != nil && slices.ContainsFunc(m.visible, func(o Entry) bool { return o.Seq != e.Seq && string(o.Data) == string(e.Data) }) {
			t.Fatalf("value %q visible twice", e.Data)
		}
	}
}

// S13: a lagging follower whose missing range the leader still retains is
// recoverable from the log. The leader compacts as far as it may before
// every delivery; the reservation stops it exactly at the follower's end,
// the leader reports the follower CatchingUp (never NeedsRebuild) until it
// is InSync, and the range arrives in Appends — no snapshot.
func TestS13RetainedRangeIsRecoverableFromTheLog(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 3 })
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	c.crash(3)
	for i := 0; i < 12; i++ {
		c.propose(1, fmt.Sprintf("x%d", i))
	}
	c.tick(10) // away, but well inside the reservation (40 ticks)
	end := uint64(len(c.stores[3].log))
	held := slices.Clone(c.stores[3].log)
	if at := c.compact(1); at != end {
		t.Fatalf("leader compacted to %d, want exactly n3's end %d (the reservation)", at, end)
	}
	if st := c.peerState(1, 3); st != CatchingUp {
		t.Fatalf("n3 is %v, want CatchingUp", st)
	}
	c.start(3)
	for i := 0; i < 10 && c.peerState(1, 3) != InSync; i++ {
		c.quietTick()
		c.pump(func(Message) bool {
			if at := c.compact(1); at > c.peerMatch(1, 3) {
				t.Fatalf("leader compacted to %d past n3's match", at)
			}
			if st := c.peerState(1, 3); st == NeedsRebuild {
				t.Fatal("a follower whose range is retained was classified NeedsRebuild")
			}
			return false
		})
	}
	if c.snapshots != 0 {
		t.Fatalf("%d snapshot installs for a retained range", c.snapshots)
	}
	if !slices.EqualFunc(held, c.stores[3].log[:len(held)], sameEntry) {
		t.Fatal("n3's own prefix changed while catching up")
	}
	c.requireConverged(m)
}

// S14: once the leader compacts past a follower's end, the range is lost
// for catch-up: the leader classifies it NeedsRebuild, never sends it a
// compacted entry (the cluster refuses to), and it rebuilds from exactly
// one snapshot plus the log tail. The range is lost when the reservation
// expires, when the follower is too far behind for a reservation at all,
// or when the leader that kept it fails over to one that did not.
func TestS14CompactedRangeIsLostAndForcesRebuild(t *testing.T) {
	cases := []struct {
		name string
		tw   func(*Config)
		away int
		// failover: the old leader kept the range, the new one (which
		// compacted freely as a follower) did not.
		failover bool
	}{
		{"reservation expired", nil, 45, false},
		{"beyond the reservation size", func(cfg *Config) { cfg.ReservationEntriesMax = 4 }, 3, false},
		{"lost on the next leader", nil, 3, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClusterWith(t, 3, SyncQuorum, tc.tw)
			m := watch(c)
			c.elect(1)
			c.propose(1, "a")
			c.crash(3)
			for i := 0; i < 12; i++ {
				c.propose(1, fmt.Sprintf("x%d", i))
			}
			c.tick(tc.away)
			end := uint64(len(c.stores[3].log))
			c.compact(2) // a follower compacts up to its commit
			leader := NodeID(1)
			if tc.failover {
				if at := c.compact(1); at > end {
					t.Fatalf("leader compacted to %d, past n3's retained end %d", at, end)
				}
				c.crash(1)
				c.start(1)
				if !c.promote(2) {
					t.Fatal("n2 did not win")
				}
				leader = 2
			} else if at := c.compact(1); at <= end {
				t.Fatalf("leader compacted only to %d, n3 ends at %d: the range was not lost", at, end)
			}
			c.propose(leader, "tail") // the tail after the snapshot
			snap := c.rs[leader].Status().SnapSeq
			if st := c.peerState(leader, 3); st != NeedsRebuild {
				t.Fatalf("n3 is %v, want NeedsRebuild", st)
			}
			c.start(3)
			c.tick(5)
			if c.snapshots != 1 {
				t.Fatalf("%d snapshot installs, want exactly one", c.snapshots)
			}
			if s := c.stores[3]; s.snapSeq != snap {
				t.Fatalf("n3 rebuilt from a snapshot at %d, leader's is at %d", s.snapSeq, snap)
			}
			c.requireConverged(m)
		})
	}
}

// S15: a replica's uncommitted tail that is lost (never fsynced before a
// crash) or truncated (an old epoch's writes on a minority) is never
// reported committed by anyone — not before, not during, not after the
// truncation — and is gone from every log at the end.
func TestS15UncommittedTailIsNeverReportedCommitted(t *testing.T) {
	t.Run("lost before fsync", func(t *testing.T) {
		c := newCluster(t, 3, SyncQuorum)
		m := watch(c)
		c.elect(1)
		c.propose(1, "a")
		c.rs[1].Propose([]byte("t1"))
		c.rs[1].Propose([]byte("t2"))
		c.flush(1)
		// Both followers receive the tail and die before fsyncing it: only
		// the leader ever held it.
		c.pump(func(msg Message) bool {
			if msg.Type == MsgAppend && len(msg.Entries) > 0 {
				c.killOnReceipt(msg, false)
				return true
			}
			return false
		})
		c.crash(1)
		c.start(2)
		c.start(3)
		if c.holds(2, "t1") || c.holds(3, "t1") {
			t.Fatal("setup: an unsynced entry survived a crash")
		}
		if !c.promote(2) {
			t.Fatal("n2 did not win")
		}
		c.propose(2, "b1")
		c.propose(2, "b2")
		c.start(1) // back with its uncommitted tail
		c.tick(3)
		c.requireConverged(m)
		for _, v := range []string{"t1", "t2"} {
			if m.seqOf(v) != 0 || c.holds(1, v) {
				t.Fatalf("%s was reported committed or survived: %s", v, c.logString(1))
			}
		}
	})
	// A follower holds an old epoch's tail (t1, t2 at 4..5, written by a
	// leader that reached it alone) while the new leader has committed
	// other entries at those seqs. A duplicated LOG_MISMATCH, stepped twice
	// before the leader's Ready, walks the leader's next index below the
	// divergence: its Append then matches only up to 3 while carrying a
	// commit of 6. The follower may learn commit only up to what it
	// matched; learning it up to its log end would make t1 and t2 visible.
	t.Run("stale tail behind a duplicated rejection", func(t *testing.T) {
		c := newClusterWith(t, 5, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 1 })
		m := watch(c)
		c.elect(1)
		c.propose(1, "a")
		if !c.promote(2) {
			t.Fatal("n2 did not win")
		}
		c.drop = func(msg Message) bool { return msg.From == 2 && msg.To != 3 }
		c.propose(2, "t1")
		c.propose(2, "t2")
		c.crash(2)
		c.drop = func(msg Message) bool { return msg.From == 1 && msg.To == 3 }
		if !c.promote(1) { // with n4 and n5; n3's longer lineage refuses
			t.Fatal("n1 did not win")
		}
		c.propose(1, "b")
		c.propose(1, "c")
		c.drop = nil
		if !c.holds(3, "t2") || c.rs[1].Status().CommitSeq != 6 {
			t.Fatalf("setup: n3 %s, leader commit %d", c.logString(3), c.rs[1].Status().CommitSeq)
		}
		duplicated := false
		c.quietTick()
		c.pump(func(msg Message) bool {
			if duplicated || msg.To != 1 || msg.From != 3 || msg.Reject != RejectMismatch {
				return false
			}
			duplicated = true
			c.rs[1].Step(msg)
			c.rs[1].Step(msg)
			c.flush(1)
			return true
		})
		if !duplicated {
			t.Fatal("setup: no rejection to duplicate")
		}
		c.start(2)
		c.tick(3)
		c.requireConverged(m)
		for _, v := range []string{"t1", "t2"} {
			if m.seqOf(v) != 0 || c.holds(3, v) {
				t.Fatalf("%s was reported committed or survived: %s", v, c.logString(3))
			}
		}
	})
}

// S16: a follower restarts in the middle of catching up — after fsyncing
// part of the missing range, or with an Append received but not fsynced.
// It resumes from what it durably holds: the leader walks its next index
// back to the follower's real end and serves the rest from its log (the
// reservation survives the restart: no snapshot), while writes keep
// coming. With n2 down the group's commits wait on n3's catch-up, so an
// ack for anything n3 does not durably hold would show as a visible entry
// without a quorum; with n2 up the leader compacts before every delivery,
// so a reservation that did not survive the restart would force a
// rebuild. The follower ends with exactly the leader's log and commit.
func TestS16RestartDuringCatchUp(t *testing.T) {
	for _, n2Down := range []bool{true, false} {
		for seed := uint64(1); seed <= 8; seed++ {
			t.Run(fmt.Sprintf("n2down=%v/seed=%d", n2Down, seed), func(t *testing.T) { restartDuringCatchUp(t, seed, n2Down) })
		}
	}
}

func restartDuringCatchUp(t *testing.T, seed uint64, n2Down bool) {
	rng := seeded(seed, map[bool]uint64{true: 161, false: 160}[n2Down])
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 2 })
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	c.crash(3)
	for i := 0; i < 16; i++ {
		c.propose(1, fmt.Sprintf("x%d", i))
	}
	c.tick(3)
	if n2Down {
		c.crash(2)
	}
	c.start(3)
	start, target := uint64(len(c.stores[3].log)), c.rs[1].Status().Last
	// Kill n3 once its durable log passes each of a few points inside the
	// missing range.
	var points []uint64
	for i := 0; i < 1+rng.IntN(3); i++ {
		points = append(points, start+1+rng.Uint64N(target-start-1))
	}
	slices.Sort(points)
	mid, next := 0, 0
	for round := 0; round < 100; round++ {
		if st := c.rs[3].Status(); len(points) == 0 && st.Last == c.rs[1].Status().Last && st.CommitSeq == c.rs[1].Status().CommitSeq {
			break
		}
		c.quietTick()
		c.pump(func(msg Message) bool {
			if !n2Down {
				c.compact(1)
			}
			if msg.To == 3 && rng.IntN(4) == 0 { // writes keep coming during the catch-up
				if _, _, err := c.rs[1].Propose(fmt.Appendf(nil, "y%d", next)); err != nil {
					t.Fatalf("leader refused a write during the catch-up: %v", err)
				}
				next++
				c.flush(1)
			}
			if len(points) == 0 || msg.To != 3 || msg.Type != MsgAppend || len(msg.Entries) == 0 || uint64(len(c.stores[3].log)) < points[0] {
				return false
			}
			held := uint64(len(c.stores[3].log))
			if held > start && held < target {
				mid++
			}
			points = points[1:]
			c.killOnReceipt(msg, rng.IntN(2) == 0)
			c.tick(rng.IntN(3)) // down a moment
			c.start(3)
			if got := uint64(len(c.stores[3].log)); got < held {
				t.Fatalf("n3 restarted with %d entries, had fsynced %d", got, held)
			}
			return true
		})
	}
	if c.snapshots != 0 {
		t.Fatalf("%d snapshot installs: the restart should resume the catch-up from the log", c.snapshots)
	}
	if mid == 0 {
		t.Fatal("n3 was never restarted in the middle of its catch-up")
	}
	t.Logf("n3 restarted %d times in the middle of catching up %d entries; %d written meanwhile", mid, target-start, next)
	if n2Down {
		c.start(2)
	}
	c.tick(3)
	c.requireConverged(m)
	for i := 0; i < next; i++ {
		if m.seqOf(fmt.Sprintf("y%d", i)) == 0 {
			t.Fatalf("y%d, written during the catch-up, never became visible", i)
		}
	}
}

// S17: a follower is killed in the middle of a snapshot install (once or
// twice): its store holds a partial copy of the snapshot's prefix and a
// durable "rebuilding" mark. On restart it is Rebuilding, and until it is
// whole again it is never promotable: it neither campaigns nor grants, so
// with the leader also down the group stays without a leader rather than
// electing through it; no leader counts it InSync on its partial log. It
// finishes the rebuild — from the snapshot when every replica compacted
// past it, or from the log of a leader that kept the range (sometimes
// itself just restarted, so it knows no commit until its install
// commits), in which case the mark clears only once it holds everything
// that was visible when it restarted — and ends with exactly the leader's
// log.
func TestS17RestartDuringRebuild(t *testing.T) {
	for _, fromLog := range []bool{false, true} {
		for seed := uint64(1); seed <= 8; seed++ {
			t.Run(fmt.Sprintf("fromLog=%v/seed=%d", fromLog, seed), func(t *testing.T) { restartDuringRebuild(t, seed, fromLog) })
		}
	}
}

func restartDuringRebuild(t *testing.T, seed uint64, fromLog bool) {
	rng := seeded(seed, map[bool]uint64{true: 171, false: 170}[fromLog])
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 2 })
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	c.crash(3)
	for i := 0; i < 10; i++ {
		c.propose(1, fmt.Sprintf("x%d", i))
	}
	c.tick(45) // past n3's reservation
	c.compact(1)
	if !fromLog {
		c.compact(2)
	}
	c.propose(1, "tail")
	c.start(3)

	// The rebuild must not count until it is whole: while n3 is Rebuilding
	// no leader counts it InSync on a partial log, and the mark clears only
	// with a snapshot install or once n3 holds all that was visible at its
	// restart.
	var whole uint64
	installs := c.snapshots
	c.chain(func(id NodeID) {
		st := c.rs[3].Status()
		if l := c.leader(); st.Rebuilding && l != 0 && l != 3 && c.peerState(l, 3) == InSync &&
			c.rs[l].Status().CommitSeq >= whole && uint64(len(c.stores[3].log)) < whole {
			t.Fatalf("leader n%d counts the rebuilding n3 InSync on %d of %d entries", l, len(c.stores[3].log), whole)
		}
		if id == 3 && whole > 0 && !st.Rebuilding {
			if c.snapshots == installs && st.Last < whole {
				t.Fatalf("n3 left Rebuilding holding %d entries, %d were visible", st.Last, whole)
			}
			whole = 0
		}
	})

	interrupted, leaderDied, leaderRestarted := 0, false, false
	for k, guard := 1+rng.IntN(2), 0; interrupted < k; guard++ {
		if guard > 50 {
			t.Fatal("n3 was never told to install a snapshot")
		}
		// Run until n3 is told to install a snapshot; kill it halfway.
		cut := false
		c.quietTick()
		c.pump(func(msg Message) bool {
			if cut || msg.To != 3 || msg.Type != MsgSnapshot || c.down[3] || c.down[msg.From] {
				return false
			}
			r, s := c.rs[3], c.stores[3]
			r.Step(msg)
			rd := r.Ready()
			if rd.Snapshot == nil {
				t.Fatalf("n3 did not start an install: %+v", rd)
			}
			part := rng.Uint64N(rd.Snapshot.Seq)
			s.rebuilding, s.snapSeq, s.snapEp = true, 0, 0
			s.log = slices.Clone(c.stores[msg.From].log[:part])
			c.crash(3)
			cut = true
			return true
		})
		if !cut {
			continue
		}
		interrupted++
		if interrupted == k && rng.IntN(2) == 0 {
			// The leader dies too while n3 is down: the survivors cannot
			// elect anyone through the rebuilding n3.
			leaderDied = true
			c.crash(1)
			c.start(3)
			whole = uint64(len(m.visible))
			if !c.rs[3].Status().Rebuilding {
				t.Fatal("n3 restarted after an unfinished install without Rebuilding")
			}
			c.rs[3].Campaign()
			c.tick(60)
			if l := c.leader(); l != 0 {
				t.Fatalf("n%d was elected through the rebuilding n3", l)
			}
			c.start(1)
		} else {
			c.tick(rng.IntN(3))
			c.start(3)
			whole = uint64(len(m.visible))
			if !c.rs[3].Status().Rebuilding {
				t.Fatal("n3 restarted after an unfinished install without Rebuilding")
			}
		}
	}
	if fromLog {
		// The replica that kept the whole log takes over and finishes the
		// rebuild by Appends, two entries at a time.
		if l := c.leader(); l != 2 {
			if l != 0 {
				c.crash(l)
				c.start(l)
			}
			if rng.IntN(2) == 0 {
				// n2 restarts too: until its install commits it knows no
				// commit at all, and n1's answers are slow to tell it one.
				leaderRestarted = true
				c.crash(2)
				c.start(2)
				c.drop = func(msg Message) bool { return msg.From == 1 && msg.Type == MsgAppendAck }
			}
			if !c.promote(2) {
				t.Fatal("n2 did not win")
			}
			c.drop = nil
		}
	}
	c.tick(60)
	if c.rs[3].Status().Rebuilding {
		t.Fatal("n3 never finished its rebuild")
	}
	t.Logf("%d installs interrupted (leader died meanwhile: %v), then %d completed; final leader n%d (restarted before leading: %v)",
		interrupted, leaderDied, c.snapshots-installs, c.leader(), leaderRestarted)
	if fromLog && c.snapshots != installs {
		t.Fatalf("%d snapshot installs, want the rebuild finished from n2's log", c.snapshots-installs)
	}
	if !fromLog && c.snapshots == installs {
		t.Fatal("no completed snapshot install")
	}
	c.requireConverged(m)
}

// Found by TestS17RestartDuringRebuild (a restarted leader finishing a
// rebuild from its log): a rebuilding replica left Rebuilding as soon as it
// matched the commit the leader sent — but a leader that has just
// restarted knows no commit (0) until its install commits, so the replica
// counted itself whole holding 5 of 13 committed entries and was
// promotable again (it campaigns and grants). A leader's commit proves the
// prefix complete only once it is an entry of the leader's own epoch.
func TestRebuildingClearsOnlyAgainstTheLeadersOwnCommit(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 2 })
	m := watch(c)
	c.elect(1)
	for i := 0; i < 12; i++ {
		c.propose(1, fmt.Sprintf("x%d", i))
	}
	c.tick(1)
	visible := uint64(len(m.visible))
	// n3's snapshot install was cut short: three entries and the mark.
	s := c.stores[3]
	s.log, s.rebuilding = slices.Clone(s.log[:3]), true
	c.restartAll()
	c.chain(func(id NodeID) {
		if st := c.rs[3].Status(); id == 3 && !st.Rebuilding && st.Last < visible {
			t.Fatalf("n3 left Rebuilding holding %d entries, %d are visible", st.Last, visible)
		}
	})
	// n2 leads with no commit known; n1's answers are lost, so only n3's
	// own catch-up can commit n2's install.
	c.drop = func(msg Message) bool { return msg.From == 1 && msg.Type == MsgAppendAck }
	if !c.promote(2) {
		t.Fatal("n2 did not win")
	}
	c.drop = nil
	c.tick(2)
	if c.rs[3].Status().Rebuilding {
		t.Fatal("n3 never left Rebuilding")
	}
	c.requireConverged(m)
}

// crashAfterEarlyAppends carries out id's pending Ready only as far as the
// Ready's relaxation lets a shell go before a crash: its APPENDs are sent
// (entries not yet durable taken from the Ready itself), then it is killed
// -9 before the fsync, losing the Ready's entries.
func (c *cluster) crashAfterEarlyAppends(id NodeID) {
	c.t.Helper()
	r := c.rs[id]
	if !r.HasReady() {
		c.t.Fatalf("n%d has no Ready", id)
	}
	rd, err := c.executor(id).Begin(r)
	if err != nil {
		c.t.Fatal(err)
	}
	if rd.HardState != nil || rd.Truncate || rd.Snapshot != nil || len(rd.Early) == 0 {
		c.t.Fatalf("n%d: expected a Ready whose Appends may go early, got %+v", id, rd)
	}
	c.crash(id)
}

// S18, the unsynced tail: leader n1 sends its APPEND of entry 3 before its
// own fsync (the Ready's relaxation) and is killed -9 before the fsync, so
// it restarts holding 1..2 only — no failover happened. n2 fsynced entry 3
// of epoch 1 and its FLUSHED(3) is delayed. n1 wins epoch 2 with n3's
// grant (n2's longer lineage refuses) and writes its install entry at the
// same seq 3. The delayed epoch-1 FLUSHED(3) then arrives: it speaks of
// another entry 3, and counting it toward epoch 2 would make the install
// visible while n1 alone holds it.
func TestS18UnsyncedLeaderRestartIgnoresStaleFlushed(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	c.rs[1].Propose([]byte("pending"))
	c.crashAfterEarlyAppends(1)
	var stale []Message
	c.pump(func(msg Message) bool {
		switch {
		case msg.Type == MsgAppend && msg.To == 2: // in flight from the dead leader
			c.rs[2].Step(msg)
			c.flush(2)
		case msg.Type == MsgAppendAck && msg.From == 2: // delayed
			stale = append(stale, msg)
		}
		return true // n3 never hears of entry 3
	})
	if len(stale) != 1 || stale[0].Epoch != 1 || stale[0].FlushedSeq != 3 || c.holds(1, "pending") || !c.holds(2, "pending") || c.holds(3, "pending") {
		t.Fatalf("setup: delayed %v\n n1 %s\n n2 %s\n n3 %s", stale, c.logString(1), c.logString(2), c.logString(3))
	}
	c.start(1)
	c.rs[1].Campaign()
	c.flush(1)
	var held []Message
	c.pump(func(msg Message) bool {
		if msg.From == 1 && msg.Type == MsgAppend { // INSTALL: not answered yet
			held = append(held, msg)
			return true
		}
		return false
	})
	if st := c.rs[1].Status(); st.Role != Leader || st.Hard.Promised != 2 || st.Durable != 3 || c.stores[1].log[2].Epoch != 2 {
		t.Fatalf("setup: n1 should lead epoch 2 with its install durable at 3: %+v %s", st, c.logString(1))
	}
	c.rs[1].Step(stale[0])
	c.flush(1) // the reference model fails here too, naming the invariant
	if got := c.rs[1].Status().CommitSeq; got >= 3 {
		t.Fatalf("VisibleImpliesQuorumFlushed: n2's epoch-1 FLUSHED(3) committed n1's epoch-2 install at 3, durable on n1 alone (commit %d)", got)
	}
	c.queue = append(held, c.queue...)
	c.settle()
	c.tick(3)
	c.requireConverged(m)
	if m.seqOf("pending") != 0 || c.holds(2, "pending") {
		t.Fatalf("the lost entry survived: n2 %s", c.logString(2))
	}
}

// S19: chain of custody over several promotions. The classic trap first
// (R=5, one entry per Append): x is written in epoch 1 on n1 and n2 only;
// n5 leads epoch 2 alone with its own entry at that seq; n1 leads epoch 3
// and copies x to a majority — but x is an older epoch's entry, and
// counting replicas must not commit it (n1 crashes before its own epoch's
// install reaches a majority). n5 then wins epoch 4 and legitimately
// overwrites x. Then the chain goes on: four more promotions, each after a
// crash. After each, the new leader holds every visible entry at its seq
// with its epoch, and its commit covers the whole previous visible prefix
// (VisibleMonotonic across the chain).
func TestS19ChainOfCustodyAcrossPromotions(t *testing.T) {
	c := newClusterWith(t, 5, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 1 })
	m := watch(c)
	promote := func(id NodeID) {
		t.Helper()
		before := uint64(len(m.visible))
		if !c.promote(id) {
			t.Fatalf("n%d did not win: %+v", id, c.rs[id].Status())
		}
		st := c.rs[id].Status()
		if st.CommitSeq < before {
			t.Fatalf("VisibleMonotonic: n%d's reign commits to %d, %d were visible before it", id, st.CommitSeq, before)
		}
		if log := c.stores[id].log; len(log) < len(m.visible) || !slices.EqualFunc(m.visible, log[:len(m.visible)], sameEntry) {
			t.Fatalf("n%d does not hold the visible prefix:\n %s", id, c.logString(id))
		}
	}
	c.elect(1)
	c.drop = func(msg Message) bool { return msg.From == 1 && msg.Type == MsgAppend && msg.To != 2 }
	c.propose(1, "x") // seq 2, epoch 1: on n1 and n2
	c.crash(1)
	c.drop = func(msg Message) bool { return msg.From == 5 && msg.Type == MsgAppend }
	if !c.promote(5) { // epoch 2 with n3, n4: its install at seq 2 stays on n5 (it commits nothing)
		t.Fatal("n5 did not win")
	}
	c.crash(5)
	c.start(1)
	c.drop = func(msg Message) bool { return msg.From == 1 && msg.Type == MsgAppend && msg.LastSeqSent >= 3 }
	if !c.promote(1) { // epoch 3: x reaches n3 and n4, the install does not
		t.Fatal("n1 did not win")
	}
	c.tick(1) // heartbeats: n3 and n4 answer LOG_MISMATCH and are sent x
	holders := 0
	for _, id := range c.ids {
		if c.holds(id, "x") {
			holders++
		}
	}
	if holders < 3 || c.rs[1].Status().CommitSeq >= 2 {
		t.Fatalf("x on %d replicas, commit %d: an older epoch's entry on a majority must not commit by counting", holders, c.rs[1].Status().CommitSeq)
	}
	c.crash(1)
	c.drop = nil
	c.start(5)
	promote(5) // epoch 4 (n2, n3, n4 grant): x is overwritten, legitimately
	c.propose(5, "y")
	for i, step := range []struct{ crash, restart, next NodeID }{
		{crash: 5, restart: 1, next: 2},
		{crash: 2, restart: 5, next: 3},
		{crash: 3, restart: 2, next: 4},
		{crash: 4, restart: 3, next: 1},
	} {
		c.crash(step.crash)
		c.start(step.restart)
		promote(step.next)
		c.propose(step.next, fmt.Sprintf("z%d", i))
	}
	c.start(4)
	c.tick(3)
	c.requireConverged(m)
	if m.seqOf("x") != 0 {
		t.Fatal("x became visible")
	}
	for _, v := range []string{"y", "z0", "z1", "z2", "z3"} {
		if m.seqOf(v) == 0 {
			t.Fatalf("%s never became visible", v)
		}
	}
}

// S19, randomized: chains of five or more promotions with crashes between
// them (sometimes of followers too) and writes that reach only some
// followers before the leader dies. The first value ever committed keeps
// its seq and epoch on every replica to the end, and so does every other
// visible entry (the model).
func TestS19CustodyCampaign(t *testing.T) {
	for _, n := range []int{3, 5} {
		for seed := uint64(1); seed <= 10; seed++ {
			t.Run(fmt.Sprintf("R%d/seed=%d", n, seed), func(t *testing.T) { custodyChain(t, seed, n) })
		}
	}
}

func custodyChain(t *testing.T, seed uint64, n int) {
	rng := seeded(seed, 19)
	c := newClusterWith(t, n, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 1 + int(seed%3) })
	m := watch(c)
	quorum := n/2 + 1
	var custody Entry
	reigns, next, attempt := 0, 0, 0
	for ; reigns < 5 && attempt < 50; attempt++ {
		c.drop = nil
		for _, id := range c.ids {
			if c.down[id] && rng.IntN(2) == 0 {
				c.start(id)
			}
		}
		for up := n - len(c.down); up < quorum; up++ {
			for _, id := range c.ids {
				if c.down[id] {
					c.start(id)
					break
				}
			}
		}
		var live []NodeID
		for _, id := range c.ids {
			if !c.down[id] {
				live = append(live, id)
			}
		}
		cand := live[rng.IntN(len(live))]
		before := uint64(len(m.visible))
		if !c.promote(cand) {
			continue // a worse lineage: refused
		}
		reigns++
		if st := c.rs[cand].Status(); st.CommitSeq < before {
			t.Fatalf("VisibleMonotonic: n%d's reign commits to %d, %d were visible before it", cand, st.CommitSeq, before)
		}
		for i := rng.IntN(3); i >= 0; i-- {
			c.propose(cand, fmt.Sprintf("v%d", next))
			next++
		}
		if custody.Seq == 0 {
			at := m.seqOf("v0")
			if at == 0 {
				t.Fatal("v0 was not committed in the first reign")
			}
			custody = m.visible[at-1]
		}
		// Writes that reach only some followers, then the leader dies —
		// sometimes before fsyncing its last write.
		reach := map[NodeID]bool{}
		for _, id := range live {
			reach[id] = rng.IntN(2) == 0
		}
		c.drop = func(msg Message) bool { return msg.From == cand && msg.Type == MsgAppend && !reach[msg.To] }
		for i := rng.IntN(3); i > 0; i-- {
			c.propose(cand, fmt.Sprintf("v%d", next))
			next++
		}
		if rng.IntN(2) == 0 {
			c.rs[cand].Propose(fmt.Appendf(nil, "v%d", next)) // never fsynced
			next++
		}
		c.crash(cand)
		if rng.IntN(3) == 0 {
			c.crash(live[rng.IntN(len(live))])
		}
	}
	if reigns < 5 {
		t.Fatalf("only %d reigns", reigns)
	}
	t.Logf("%d reigns in %d attempts, custody entry %v", reigns, attempt, custody)
	c.drop = nil
	for _, id := range c.ids {
		if c.down[id] {
			c.start(id)
		}
	}
	c.tick(60)
	c.requireConverged(m)
	for _, id := range c.ids {
		if e := c.stores[id].log[custody.Seq-1]; !sameEntry(e, custody) {
			t.Fatalf("n%d holds %v where %v was committed first", id, e, custody)
		}
	}
}

// S20: a live partition with competing writes (R=5). The old leader n1 and
// n2 are cut off from n3..n5; n3 is elected on the majority side. Both
// would-be leaders accept writes, and the minority writes more (its log is
// longer). Only the majority side commits. After healing the minority's
// writes are truncated and never revived: not when the majority's leader
// crashes at the moment of healing (the minority replicas, with the
// longest logs, cannot win: the lineage with the newer epoch does), and
// not after a later failover to a former minority replica. Committed
// prefixes agree throughout (the model).
func TestS20LivePartitionWithCompetingWrites(t *testing.T) {
	for _, crashAtHeal := range []bool{false, true} {
		t.Run(fmt.Sprintf("crashAtHeal=%v", crashAtHeal), func(t *testing.T) { competingWrites(t, crashAtHeal) })
	}
}

func competingWrites(t *testing.T, crashAtHeal bool) {
	c := newCluster(t, 5, SyncQuorum)
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	minority := map[NodeID]bool{1: true, 2: true}
	c.drop = func(msg Message) bool { return minority[msg.From] != minority[msg.To] }
	if !c.promote(3) {
		t.Fatal("n3 did not win on the majority side")
	}
	visible := c.rs[1].Status().CommitSeq
	var lost []string
	type write struct{ seq, epoch uint64 }
	won := map[string]write{}
	for i := 0; i < 8; i++ {
		v := fmt.Sprintf("minority%d", i)
		if _, _, err := c.rs[1].Propose([]byte(v)); err != nil {
			t.Fatalf("the old leader refused %s while it still believed it led: %v", v, err)
		}
		lost = append(lost, v)
		if i < 3 {
			v := fmt.Sprintf("majority%d", i)
			seq, epoch, err := c.rs[3].Propose([]byte(v))
			if err != nil {
				t.Fatal(err)
			}
			won[v] = write{seq, epoch}
		}
		c.tick(1)
	}
	if st := c.rs[1].Status(); st.Role != Leader || st.CommitSeq != visible || !c.holds(2, lost[len(lost)-1]) {
		t.Fatalf("minority side: n1 %+v; n2 %s", st, c.logString(2))
	}
	if c.rs[1].Status().Last <= c.rs[3].Status().Last {
		t.Fatal("setup: the minority's log should be the longer one")
	}
	for v, w := range won {
		if m.seqOf(v) != w.seq {
			t.Fatalf("%s not committed on the majority side", v)
		}
	}
	c.drop = nil
	if crashAtHeal {
		c.crash(3)
		c.tick(1) // n1's heartbeats reach n4, n5 and are refused: it demotes
		for _, id := range []NodeID{1, 2} {
			if c.promote(id) {
				t.Fatalf("n%d won with a minority lineage:\n %s", id, c.logString(id))
			}
		}
		if !c.promote(4) {
			t.Fatal("n4 did not win")
		}
		c.start(3)
	}
	c.tick(5)
	l := c.requireConverged(m)
	// A later failover to a former minority replica revives nothing.
	c.crash(l)
	if !c.promote(2) {
		t.Fatal("n2 did not win")
	}
	c.propose(2, "after")
	c.start(l)
	c.tick(3)
	c.requireConverged(m)
	for v, w := range won {
		if e := m.visible[w.seq-1]; string(e.Data) != v || e.Epoch != w.epoch {
			t.Fatalf("%s committed at (%d, e%d), visible there now %v", v, w.seq, w.epoch, e)
		}
	}
	for _, v := range lost {
		for _, id := range c.ids {
			if c.holds(id, v) {
				t.Fatalf("n%d still holds the minority write %s", id, v)
			}
		}
		if m.seqOf(v) != 0 {
			t.Fatalf("minority write %s became visible", v)
		}
	}
}

// S21: a follower cut off long enough for its election timer to fire
// several times rejoins without deposing the healthy leader. While cut off
// it only pre-votes (persisting nothing); it heals just as its last
// pre-vote is in flight, which reaches both others before the leader's
// next heartbeat reaches it (the moment an election would disrupt the
// group): both still hold the leader's lease and refuse. The leader keeps
// its epoch, nobody promises a newer one, writes go on before, during
// (writesWhileCut) and after the cut, and the follower catches up from the
// log. Without writes during the cut the follower's lineage is as good as
// the others', so the lease alone stands between it and an election.
func TestS21IsolatedFollowerRejoinsWithoutDeposingAHealthyLeader(t *testing.T) {
	for _, writesWhileCut := range []bool{false, true} {
		for seed := uint64(1); seed <= 10; seed++ {
			t.Run(fmt.Sprintf("writesWhileCut=%v/seed=%d", writesWhileCut, seed), func(t *testing.T) {
				if why := isolatedFollowerRejoins(t, seed, writesWhileCut, Mutations{}); why != "" {
					t.Fatal(why)
				}
			})
		}
	}
}

// TestS21MutationIsCaught: with pre-votes granted regardless of the lease,
// the rejoining follower (as up to date as the others: the leader had
// nothing to write during the cut) wins its pre-vote, its campaign fences
// the healthy leader and the group pays an election — on every seed.
func TestS21MutationIsCaught(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			why := isolatedFollowerRejoins(t, seed, false, Mutations{PreVoteIgnoresLease: true})
			if why == "" {
				t.Fatal("the leader was not deposed although pre-votes ignore the lease")
			}
			t.Log(why)
		})
	}
}

// isolatedFollowerRejoins runs S21 and returns how the healthy leader was
// disturbed ("" if it was not); safety is checked by the model throughout.
func isolatedFollowerRejoins(t *testing.T, seed uint64, writesWhileCut bool, muts Mutations) string {
	rng := seeded(seed, 21)
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.Mutations = muts })
	m := watch(c)
	c.elect(1)
	epoch := c.rs[1].Status().Hard.Promised
	var written []string
	write := func(v string) {
		if _, _, err := c.rs[1].Propose([]byte(v)); err != nil {
			t.Fatalf("the leader refused %s: %v", v, err)
		}
		written = append(written, v)
	}
	for i := 0; i < 10; i++ {
		if rng.IntN(2) == 0 {
			write(fmt.Sprintf("before%d", i))
		}
		c.tick(1)
	}
	hard := map[NodeID]HardState{}
	for _, id := range c.ids {
		hard[id] = c.stores[id].hard
	}
	c.cut[3] = true
	rounds, want := 0, 3+rng.IntN(4)
	for tick := 0; ; tick++ {
		if tick > 200 {
			t.Fatalf("n3 pre-voted %d times in %d ticks", rounds, tick)
		}
		if writesWhileCut && (tick == 0 || rng.IntN(3) == 0) {
			write(fmt.Sprintf("cut%d", tick))
		}
		c.quietTick()
		if slices.ContainsFunc(c.queue, func(msg Message) bool { return msg.From == 3 && msg.Type == MsgPreVote }) {
			rounds++
		}
		if rounds == want {
			break
		}
		c.pump(nil) // n3's PRE_VOTEs are lost
	}
	if c.stores[3].hard != hard[3] || c.rs[3].Status().Role != Follower {
		t.Fatalf("n3 timed out %d times while cut off and now is %v with %+v (was %+v)", rounds, c.rs[3].Status().Role, c.stores[3].hard, hard[3])
	}
	// Heal with n3's last PRE_VOTEs in flight: they and the answers they
	// draw go first; the leader's Appends to n3 arrive after them.
	delete(c.cut, 3)
	var first, toN3, rest []Message
	for _, msg := range c.queue {
		switch {
		case msg.From == 3:
			first = append(first, msg)
		case msg.To == 3:
			toN3 = append(toN3, msg)
		default:
			rest = append(rest, msg)
		}
	}
	refused := 0
	c.queue = append(first, rest...)
	c.pump(func(msg Message) bool {
		if msg.Type == MsgPreVoteAck && msg.To == 3 && !msg.Granted {
			refused++
		}
		return false
	})
	c.queue = append(c.queue, toN3...)
	c.pump(nil)
	for i := 0; i < 40; i++ {
		if i%4 == 0 && c.rs[1].Status().Role == Leader {
			write(fmt.Sprintf("healed%d", i))
		}
		c.tick(1)
	}
	for _, id := range c.ids {
		if c.stores[id].hard != hard[id] {
			return fmt.Sprintf("n%d promised %+v (was %+v) after n3 rejoined: an election for nothing", id, c.stores[id].hard, hard[id])
		}
	}
	if st := c.rs[1].Status(); st.Role != Leader || st.Hard.Promised != epoch {
		return fmt.Sprintf("n1 is %v at epoch %d, led epoch %d", st.Role, st.Hard.Promised, epoch)
	}
	if refused != 2 {
		t.Fatalf("n3's pre-vote at the heal was refused %d times, want 2 (the scenario did not exercise it)", refused)
	}
	c.requireConverged(m)
	for _, v := range written {
		if m.seqOf(v) == 0 {
			t.Fatalf("%s was never committed", v)
		}
	}
	if len(written) == 0 {
		t.Fatal("no writes")
	}
	t.Logf("n3 pre-voted %d times while cut off; %d writes committed at epoch %d", rounds, len(written), epoch)
	return ""
}

// S22: a flushed entry goes bad where nothing proves it was durable (the
// last batch of a log), so the replica's restart cuts it as a torn write
// and it is uncertain. n1 leads and commits a with n2's FLUSHED alone (n3
// cut off); n2's copy of a goes bad; n1 dies. n3 (without a) campaigns:
// n2's grant alone would elect it — a majority with n3's own — and a
// would be overwritten. Uncertain, n2's grant vouches for less: n3 waits
// for n1. Once n1 is back only n1 (the one holding a) can win, which
// makes n2 whole (certain again). It returns how a was lost ("" if not);
// the reference model checks the unmutated run throughout.
func damagedTail(t *testing.T, muts Mutations) string {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.Mutations = muts })
	var m *model
	if muts == (Mutations{}) {
		m = watch(c)
	}
	c.elect(1)
	c.cut[3] = true
	c.propose(1, "a")
	if st := c.rs[1].Status(); st.CommitSeq != st.Last || c.holds(3, "a") {
		t.Fatalf("setup: n1 commit %d of %d, n3 holds a: %v", st.CommitSeq, st.Last, c.holds(3, "a"))
	}
	s2 := c.stores[2]
	if last := s2.log[len(s2.log)-1]; string(last.Data) != "a" {
		t.Fatalf("setup: n2's last entry is %v, not a", last)
	}
	s2.log, s2.uncertain = slices.Clone(s2.log[:len(s2.log)-1]), true
	c.crash(2)
	c.start(2)
	c.crash(1)
	delete(c.cut, 3)
	if c.promote(3) {
		if !c.holds(3, "a") {
			return "n3 won with n2's uncertain grant and does not hold a"
		}
		return "n3 won without n1"
	}
	if !c.rs[2].Status().Uncertain {
		t.Fatal("n2 is no longer uncertain, yet no new leader made it whole")
	}
	c.start(1)
	if c.promote(3) || c.promote(2) {
		t.Fatal("a replica without a won")
	}
	if !c.promote(1) {
		t.Fatal("n1 did not win once every replica answers")
	}
	c.settle()
	c.tick(2)
	for _, id := range c.ids {
		if !c.holds(id, "a") {
			t.Fatalf("n%d does not hold a", id)
		}
	}
	if c.rs[2].Status().Uncertain {
		t.Fatal("n2 stayed uncertain under a leader of a newer epoch")
	}
	c.requireConverged(m)
	return ""
}

func TestS22DamagedTailDoesNotVouch(t *testing.T) {
	if why := damagedTail(t, Mutations{}); why != "" {
		t.Fatal(why)
	}
}

// TestS22MutationIsCaught: with an uncertain grant trusted as any other,
// n3 wins without a — the committed entry is gone.
func TestS22MutationIsCaught(t *testing.T) {
	why := damagedTail(t, Mutations{TrustUncertainGrants: true})
	if why == "" {
		t.Fatal("a survived although uncertain grants were trusted")
	}
	t.Log(why)
}

// A replica that refuses because it lost a damaged range (rebuilding) has
// used up the damage a 3-replica group is built for: the uncertain
// replica's grant then vouches for its log, and the group elects a leader
// without waiting for the damaged one to be made whole (by a leader: it
// would never be).
func TestUncertainGrantCountsOnceTheDamageIsKnown(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	c.settle()
	c.stores[1].rebuilding = true
	c.stores[2].uncertain = true
	c.restartAll()
	if !c.promote(3) {
		t.Fatal("n3 did not win with n2's grant and n1's damaged refusal")
	}
	c.settle()
	c.tick(2)
	if st := c.rs[1].Status(); st.Rebuilding {
		t.Fatal("n1 never left Rebuilding")
	}
	c.requireConverged(m)
}

// An uncertain replica elected by grants that vouch for every committed
// entry (here all three) holds them all, in an epoch newer than its
// uncertainty: it is certain from its install on.
func TestAnUncertainReplicaElectedIsCertain(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	c.settle()
	c.stores[1].uncertain = true
	c.restartAll()
	if !c.rs[1].Status().Uncertain {
		t.Fatal("n1 restarted certain despite its mark")
	}
	if !c.promote(1) {
		t.Fatal("n1 did not win with every grant")
	}
	if c.rs[1].Status().Uncertain {
		t.Fatal("n1 leads, yet is still uncertain")
	}
	c.settle()
	c.tick(2)
	c.requireConverged(m)
}

// restartAll kills every replica and restarts it from its durable state.
func (c *cluster) restartAll() {
	for _, id := range c.ids {
		c.crash(id)
		c.start(id)
	}
}

// TestLongDivergentTailConvergesInAFewRoundTrips: a deposed leader that
// appended 300 entries alone rejoins under a newer leader whose log has
// grown longer. Its rejection
// points the leader before its whole divergent epoch run, so it is made
// whole within a few round trips instead of one per divergent entry (soak
// seed 300399: stepping back one seq per rejection, with every rejection
// answered by a new Append, never converged under load).
func TestLongDivergentTailConvergesInAFewRoundTrips(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, nil)
	c.elect(1)
	c.propose(1, "a")
	c.drop = func(m Message) bool { return m.From == 1 || m.To == 1 }
	for i := range 300 {
		if _, _, err := c.rs[1].Propose(fmt.Appendf(nil, "alone-%d", i)); err != nil {
			t.Fatal(err)
		}
		c.flush(1)
	}
	if !c.promote(2) {
		t.Fatal("n2 did not win")
	}
	// The new leader's log grows past n1's, so its first Append to n1
	// lands beyond n1's end and the search starts at n1's last seq.
	for i := range 400 {
		c.propose(2, fmt.Sprintf("b-%d", i))
	}
	c.propose(2, "b")
	c.drop = nil
	rejects := 0
	for round := 0; round < 50 && !c.holds(1, "b"); round++ {
		c.quietTick()
		c.pump(func(m Message) bool {
			if m.From == 1 && m.Reject == RejectMismatch {
				rejects++
			}
			return false
		})
	}
	if !c.holds(1, "b") {
		t.Fatalf("n1 never caught up: %d rejections; n1 %d entries", rejects, len(c.stores[1].log))
	}
	if rejects > 3 {
		t.Fatalf("n1 caught up after %d rejections; want at most 3 for one divergent epoch run", rejects)
	}
	if c.holds(1, "alone-0") {
		t.Fatal("n1 kept its divergent tail")
	}
	t.Logf("n1 made whole after %d rejection(s)", rejects)
}
