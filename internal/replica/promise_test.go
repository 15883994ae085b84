package replica

import (
	"fmt"
	"slices"
	"testing"
)

// loseHardState restarts id as after its hard-state file went bad: the
// promise unknown, nonce the loss's.
func (c *cluster) loseHardState(id NodeID, nonce uint64) {
	s := c.stores[id]
	s.hard, s.promiseLost, s.lostNonce = HardState{}, true, nonce
	c.crash(id)
	c.start(id)
}

// take removes from the queue the first message of typ from → to.
func (c *cluster) take(typ MsgType, from, to NodeID) Message {
	c.t.Helper()
	for i, m := range c.queue {
		if m.Type == typ && m.From == from && m.To == to {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			return m
		}
	}
	c.t.Fatalf("no %v %d->%d in the queue %v", typ, from, to, c.queue)
	return Message{}
}

// lostPromise (S24): n3 promised epoch 2 to n2, whose PREPARE n1 never
// got; n3's grant is still in the network when n3's hard state goes bad.
// Were n3 to take part again on its log's last epoch (1), n1 — still
// leading epoch 1 — would commit b with n3, and n2 would then win epoch
// 2 with that very grant, without b. Waiting for every peer's promise,
// n3 learns epoch 2 from n2 (n1 reports 1): b never commits, and n3
// rejoins under n2. It returns how a committed entry was lost ("" if
// none); the reference model checks the unmutated run throughout.
func lostPromise(t *testing.T, muts Mutations) string {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.Mutations = muts })
	var m *model
	if muts == (Mutations{}) {
		m = watch(c)
	}
	c.elect(1)
	c.propose(1, "a")
	c.rs[2].Campaign()
	c.flush(2)
	prepare := c.take(MsgPrepare, 2, 3)
	c.queue = nil // the PREPARE to n1 is lost
	c.deliver(prepare)
	grant := c.take(MsgPrepareAck, 3, 2)
	if !grant.Granted || grant.Epoch != 2 {
		t.Fatalf("setup: n3 answered %v", grant)
	}
	c.loseHardState(3, 1)
	c.cut[2] = true
	seqB, _, err := c.rs[1].Propose([]byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	c.settle()
	c.tick(3)
	committedB := c.rs[1].Status().CommitSeq >= seqB
	if st := c.rs[3].Status(); !st.PromiseLost && muts == (Mutations{}) {
		t.Fatalf("n3 recovered its promise without n2's report: %+v", st.Hard)
	}
	delete(c.cut, 2)
	c.deliver(grant)
	if c.rs[2].Status().Role == Leader && committedB && !c.holds(2, "b") {
		return fmt.Sprintf("n1 committed b at %d in epoch 1 with n3, then n2 won epoch 2 with n3's grant, without b", seqB)
	}
	if committedB {
		t.Fatalf("b committed with n3 before n3 knew its promise")
	}
	c.tick(3)
	l := c.requireConverged(m)
	st := c.rs[3].Status()
	if l != 2 || st.PromiseLost || st.Hard.Promised != 2 || c.stores[3].promiseLost || c.stores[3].hard.Promised != 2 {
		t.Fatalf("leader n%d; n3: lost %v, promise %+v, stored %+v (mark %v)", l, st.PromiseLost, st.Hard, c.stores[3].hard, c.stores[3].promiseLost)
	}
	return ""
}

func TestS24LostPromiseWaitsForEveryPeer(t *testing.T) {
	if why := lostPromise(t, Mutations{}); why != "" {
		t.Fatal(why)
	}
}

// TestS24MutationsAreCaught: taking part at once, or on a majority's
// reports (n1's alone), loses the committed b.
func TestS24MutationsAreCaught(t *testing.T) {
	for _, muts := range []Mutations{{PromiseLostNotRecovered: true}, {PromiseFromQuorumReports: true}} {
		why := lostPromise(t, muts)
		if why == "" {
			t.Fatalf("%+v: b survived", muts)
		}
		t.Logf("%+v: %s", muts, why)
	}
}

// TestLostPromiseIgnoresReportsOfAnotherLoss: a report that answers a
// query of an earlier loss (another nonce) may predate promises made
// since: it does not count.
func TestLostPromiseIgnoresReportsOfAnotherLoss(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	c.loseHardState(3, 7)
	for _, from := range []NodeID{1, 2} {
		c.rs[3].Step(Message{Type: MsgPromiseReport, From: from, To: 3, Epoch: 1, Tick: 6})
	}
	c.flush(3)
	if !c.rs[3].Status().PromiseLost {
		t.Fatal("reports of another loss recovered the promise")
	}
	c.tick(2)
	st := c.rs[3].Status()
	if st.PromiseLost || st.Hard.Promised != 1 || c.stores[3].hard.Promised != 1 || c.stores[3].promiseLost {
		t.Fatalf("n3 after this loss's reports: %+v, stored %+v (mark %v)", st, c.stores[3].hard, c.stores[3].promiseLost)
	}
	c.propose(1, "b")
	if !c.holds(3, "b") {
		t.Fatal("n3 does not follow n1 again")
	}
}

// twoLostPromises loses the hard states of the last two of n replicas
// (n1 leading, a committed) and ticks: it reports whether both take part
// again, holding b proposed after.
func twoLostPromises(t *testing.T, n int, muts Mutations) bool {
	c := newClusterWith(t, n, SyncQuorum, func(cfg *Config) { cfg.Mutations = muts })
	c.elect(1)
	c.propose(1, "a")
	a, b := NodeID(n-1), NodeID(n)
	c.loseHardState(a, 1)
	c.loseHardState(b, 1)
	c.tick(5)
	if c.rs[a].Status().PromiseLost || c.rs[b].Status().PromiseLost {
		return false
	}
	c.propose(1, "b")
	c.tick(2)
	return c.holds(a, "b") && c.holds(b, "b")
}

// TestTwoLostPromisesOfFiveTakePartAgain: two replicas of five whose
// promises are lost answer each other PROMISE_UNKNOWN and, the three
// others' reports bounding every quorum (LostPeersFewerThanAQuorum), both
// take part again. Silent (LostPeerSilent, as before) they waited for
// each other for good — and under sync_all every write with them.
func TestTwoLostPromisesOfFiveTakePartAgain(t *testing.T) {
	if !twoLostPromises(t, 5, Mutations{}) {
		t.Fatal("two lost replicas of five did not take part again")
	}
	if twoLostPromises(t, 5, Mutations{LostPeerSilent: true}) {
		t.Fatal("LostPeerSilent: they took part again without each other's answer")
	}
}

// TestTwoLostPromisesOfThreeWait: two lost replicas of three leave one
// member that can report, and a quorum of two lost ones may have elected
// a leader no report bounds: they stay out. With LostPeersUnbounded they
// trusted each other.
func TestTwoLostPromisesOfThreeWait(t *testing.T) {
	if twoLostPromises(t, 3, Mutations{}) {
		t.Fatal("two lost replicas of three took part again")
	}
	if !twoLostPromises(t, 3, Mutations{LostPeersUnbounded: true}) {
		t.Fatal("LostPeersUnbounded: two lost replicas of three still wait")
	}
}

// reportsBeforeALostPeer (ReportsAfterTheLostPeer), five replicas: n2
// campaigns for epoch 2, n3 grants it and then loses its hard state. n3
// hears the promises of n1, n4 and n5 (epoch 1), not yet n2's. n4 then
// grants epoch 2 too — n2 now holds a quorum of grants (n2, n3, n4) and
// may have won — and n2 loses its hard state, answering n3
// PROMISE_UNKNOWN. The reports n3 heard predate n4's grant: taken as the
// bound, n3 would promise epoch 1 and could grant epoch 2 again to another
// candidate, a second leader of epoch 2. It returns n3's promise once it
// takes part again.
func reportsBeforeALostPeer(t *testing.T, muts Mutations) uint64 {
	c := newClusterWith(t, 5, SyncQuorum, func(cfg *Config) { cfg.Mutations = muts })
	c.elect(1)
	c.propose(1, "a")
	c.rs[2].Campaign()
	c.flush(2)
	to3, to4 := c.take(MsgPrepare, 2, 3), c.take(MsgPrepare, 2, 4)
	c.queue = nil
	c.deliver(to3)
	if g := c.take(MsgPrepareAck, 3, 2); !g.Granted || g.Epoch != 2 {
		t.Fatalf("setup: n3 answered %v", g)
	}
	c.loseHardState(3, 9)
	c.rs[3].Tick() // asks every peer
	c.flush(3)
	c.take(MsgPromiseQuery, 3, 2) // lost
	for _, id := range []NodeID{1, 4, 5} {
		c.deliver(c.take(MsgPromiseQuery, 3, id))
		c.deliver(c.take(MsgPromiseReport, id, 3))
	}
	c.queue = nil
	if !c.rs[3].Status().PromiseLost {
		t.Fatal("setup: n3 recovered without n2's answer")
	}
	c.deliver(to4)
	if g := c.take(MsgPrepareAck, 4, 2); !g.Granted || g.Epoch != 2 {
		t.Fatalf("setup: n4 answered %v", g)
	}
	c.queue = nil
	c.loseHardState(2, 5)
	c.queue = nil
	for range 2 * c.rs[3].cfg.HeartbeatTicks {
		c.rs[3].Tick()
		c.flush(3)
	}
	c.deliver(c.take(MsgPromiseQuery, 3, 2))
	c.deliver(c.take(MsgPromiseUnknown, 2, 3))
	if st := c.rs[3].Status(); !st.PromiseLost {
		return st.Hard.Promised
	}
	c.queue = slices.DeleteFunc(c.queue, func(m Message) bool { return m.From == 2 || m.To == 2 })
	c.down[2] = true // n2 stays lost; the others answer again
	c.tick(3)
	if st := c.rs[3].Status(); st.PromiseLost {
		t.Fatalf("n3 still lost after the others answered again: %+v", st)
	}
	return c.rs[3].Status().Hard.Promised
}

func TestReportsBeforeALostPeerDoNotCount(t *testing.T) {
	if p := reportsBeforeALostPeer(t, Mutations{}); p < 2 {
		t.Fatalf("n3 promises epoch %d after taking part again; n2 may have won epoch 2 with its grant", p)
	}
	if p := reportsBeforeALostPeer(t, Mutations{UnknownKeepsReports: true}); p >= 2 {
		t.Fatalf("UnknownKeepsReports: n3 promises %d, the stale reports bounded nothing wrong", p)
	}
}

// TestLostPromiseStaysOutOfElections: while its promise is unknown a
// replica neither campaigns nor answers PREPARE, PRE_VOTE or APPEND.
func TestLostPromiseStaysOutOfElections(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.loseHardState(2, 1)
	c.rs[2].Campaign()
	c.rs[2].ElectionTimeout()
	c.flush(2)
	for _, typ := range []MsgType{MsgPrepare, MsgPreVote, MsgAppend} {
		c.rs[2].Step(Message{Type: typ, From: 3, To: 2, Epoch: 5, LastEpoch: 1, LastSeq: 9})
	}
	c.flush(2)
	for _, m := range c.queue {
		if m.From == 2 && m.Type != MsgPromiseQuery {
			t.Fatalf("n2 sent %v while its promise is lost", m)
		}
	}
	if st := c.rs[2].Status(); st.Role != Follower || st.Hard.Promised != 1 {
		t.Fatalf("n2: %+v", st)
	}
}

// TestLostPromiseKeepsAnUncertainReplicaUncertain: damage that cut n3's
// last entry (uncertain) and its hard state: its promise when it became
// uncertain is unknown too, so the leader it may have answered FLUSHED
// (n1, epoch 1 — the bound the reports give) does not make it certain
// again; only a newer epoch's leader does.
func TestLostPromiseKeepsAnUncertainReplicaUncertain(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	s3 := c.stores[3]
	s3.log, s3.uncertain = s3.log[:len(s3.log)-1], true
	c.loseHardState(3, 1)
	c.tick(2)
	c.propose(1, "b")
	if st := c.rs[3].Status(); st.PromiseLost || !c.holds(3, "b") || !st.Uncertain {
		t.Fatalf("n3 under epoch 1's leader: lost %v, holds b %v, uncertain %v", st.PromiseLost, c.holds(3, "b"), st.Uncertain)
	}
	if !c.promote(2) {
		t.Fatal("n2 did not win epoch 2")
	}
	c.tick(2)
	if c.rs[3].Status().Uncertain {
		t.Fatal("n3 stayed uncertain under a newer leader")
	}
	c.requireConverged(m)
}

// TestLostPromiseStateIsEncoded: the model checker tells apart states
// that differ only in a lost promise's recovery: the loss, its nonce,
// each report counted and the highest one.
func TestLostPromiseStateIsEncoded(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.loseHardState(3, 1)
	r := c.rs[3]
	state := string(r.AppendState(nil, true))
	if string(r.Clone().AppendState(nil, true)) != state {
		t.Fatal("a clone encodes differently")
	}
	for name, change := range map[string]func(*Replica){
		"lost":      func(x *Replica) { x.lost = !x.lost },
		"nonce":     func(x *Replica) { x.lostNonce++ },
		"reported":  func(x *Replica) { x.reported[0] = !x.reported[0] },
		"reportMax": func(x *Replica) { x.reportMax++ },
	} {
		x := r.Clone()
		change(x)
		if string(x.AppendState(nil, true)) == state {
			t.Errorf("%s does not change the encoding", name)
		}
		if string(r.AppendState(nil, true)) != state {
			t.Fatalf("changing a clone's %s changed the original", name)
		}
	}
	for _, typ := range []MsgType{MsgPromiseQuery, MsgPromiseReport} {
		m := Message{Type: typ, From: 1, To: 3, Epoch: 1, Tick: 1}
		other := m
		other.Tick = 2
		if string(AppendMessage(nil, m)) == string(AppendMessage(nil, other)) {
			t.Errorf("%v: the nonce does not change the encoding", typ)
		}
	}
}
