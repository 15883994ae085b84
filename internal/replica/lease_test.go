package replica

import "testing"

// A leader's LeaseTicks count down while no quorum answers and are back
// once one does; no other replica takes office before they ran out.
func TestLeaseTicksCloseBeforeAnotherLeaderCanBeElected(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	full := c.rs[1].Status().LeaseTicks
	if full != 10/2 {
		t.Fatalf("lease ticks %d right after a quorum answered, want %d", full, 10/2)
	}
	if n := c.rs[2].Status().LeaseTicks; n != 0 {
		t.Fatalf("a follower holds %d lease ticks", n)
	}
	c.cut[1] = true
	closedAt := -1
	for tick := 1; tick <= 60; tick++ {
		c.tick(1)
		lease := c.rs[1].Status().LeaseTicks
		if lease == 0 && closedAt < 0 {
			closedAt = tick
		}
		for _, id := range []NodeID{2, 3} {
			if st := c.rs[id].Status(); st.Role == Leader && st.Hard.Promised > 1 {
				if closedAt < 0 {
					t.Fatalf("n%d took office at tick %d while n1's lease still had %d ticks", id, tick, lease)
				}
				delete(c.cut, 1)
				c.tick(3)
				if n := c.rs[1].Status().LeaseTicks; n != 0 {
					t.Fatalf("the deposed leader holds %d lease ticks", n)
				}
				return
			}
		}
	}
	t.Fatal("no new leader within 60 ticks")
}

// A leader handing over holds no lease: its target campaigns at once.
func TestLeaseTicksZeroWhileTransferring(t *testing.T) {
	c := newCluster(t, 3, SyncQuorum)
	c.elect(1)
	c.propose(1, "a")
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	if n := c.rs[1].Status().LeaseTicks; n != 0 {
		t.Fatalf("a transferring leader holds %d lease ticks", n)
	}
}

// A single replica is the only one that can lead it.
func TestLeaseTicksOfASingleReplica(t *testing.T) {
	c := newCluster(t, 1, SyncQuorum)
	c.elect(1)
	c.tick(100)
	if n := c.rs[1].Status().LeaseTicks; n != 10/2 {
		t.Fatalf("lease ticks %d, want %d", n, 10/2)
	}
}

// A leader's lease dates from when it sent what a quorum answered, not
// from when the answers arrived (LeaseFromSend): answers that waited out
// a pause of the leader — its ticks catch up first, then its inbox is
// read — renew nothing, while the followers' timers have run since they
// heard it. (Found by the cluster simulator: a paused shard owner
// published after another node took office.)
func TestLeaseDatesFromTheAppendNotTheAnswer(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.Mutations.LeaseFromReceipt = mutated })
		c.elect(1)
		c.propose(1, "a")
		var held []Message
		for tick := 0; tick < 10 && len(held) < 2; tick++ {
			c.quietTick()
			c.pump(func(m Message) bool {
				if m.Type == MsgAppendAck && m.To == 1 {
					held = append(held, m)
					return true
				}
				return false
			})
		}
		if len(held) < 2 {
			t.Fatalf("the followers answered %d heartbeats", len(held))
		}
		// The leader's pause: its missed ticks run, nothing reaches it.
		for range 20 {
			c.rs[1].Tick()
			c.flush(1)
		}
		c.queue = nil
		if n := c.rs[1].Status().LeaseTicks; n != 0 {
			t.Fatalf("lease ticks %d after 20 silent ticks", n)
		}
		for _, m := range held {
			c.deliver(m)
		}
		st := c.rs[1].Status()
		if st.Role != Leader {
			t.Fatalf("n1 is %v", st.Role)
		}
		if mutated != (st.LeaseTicks > 0) {
			t.Fatalf("mutated %v: lease ticks %d from answers to heartbeats sent 20 ticks ago", mutated, st.LeaseTicks)
		}
		if !mutated {
			c.tick(2) // fresh heartbeats, answered at once
			if n := c.rs[1].Status().LeaseTicks; n == 0 {
				t.Fatal("no lease from answers to fresh heartbeats")
			}
		}
	}
}

// A follower that granted a pre-vote and then heard its leader again —
// and answered it, renewing the leader's lease — promises nothing to that
// candidate's PREPARE (PrepareRespectsLease), unless the campaign is
// forced (a leadership transfer's target). Found by the group simulator
// (LeaseOnTheClock): the pre-vote arrived before the leader's heartbeat,
// the PREPARE after it, and a new leader took office within the old one's
// lease.
func TestPrepareRespectsTheLeaseAPreVoteDidNot(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.Mutations.PrepareIgnoresLease = mutated })
		c.elect(1)
		c.propose(1, "a")
		f := c.rs[2]
		epoch := f.Status().Hard.Promised
		for range 10 { // n2 hears nothing for an election timeout
			f.Tick()
			c.flush(2)
		}
		c.queue = nil
		st := c.rs[3].Status()
		ask := Message{From: 3, To: 2, Epoch: epoch + 1, LastEpoch: epoch, LastSeq: st.Last}
		pre := ask
		pre.Type = MsgPreVote
		f.Step(pre)
		c.flush(2)
		if !granted(c.queue, MsgPreVoteAck) {
			t.Fatalf("n2 refused the pre-vote after an election timeout without its leader: %v", c.queue)
		}
		c.queue = nil
		// The leader's heartbeat, answered: n1's lease runs again.
		var heartbeat *Message
		for i := 0; i < 10 && heartbeat == nil; i++ {
			c.rs[1].Tick()
			c.flush(1)
			for _, m := range c.queue {
				if m.Type == MsgAppend && m.To == 2 {
					heartbeat = &m
				}
			}
		}
		if heartbeat == nil {
			t.Fatal("no heartbeat from n1")
		}
		c.queue = nil
		f.Step(*heartbeat)
		c.flush(2)
		c.queue = nil
		prepare := ask
		prepare.Type = MsgPrepare
		f.Step(prepare)
		c.flush(2)
		promised := f.Status().Hard.Promised > epoch
		if promised != mutated || granted(c.queue, MsgPrepareAck) != mutated {
			t.Fatalf("mutated %v: n2 promised %v (answers %v) a PREPARE right after answering its leader", mutated, promised, c.queue)
		}
		if mutated {
			continue
		}
		c.queue = nil
		prepare.Forced = true
		f.Step(prepare)
		c.flush(2)
		if f.Status().Hard.Promised != epoch+1 || !granted(c.queue, MsgPrepareAck) {
			t.Fatalf("n2 refused a forced PREPARE: promised %d, answers %v", f.Status().Hard.Promised, c.queue)
		}
	}
}

// granted reports whether msgs hold a granting answer of type typ.
func granted(msgs []Message, typ MsgType) bool {
	for _, m := range msgs {
		if m.Type == typ && m.Granted {
			return true
		}
	}
	return false
}

// TestLeaseOutlivesTheEpoch guards LeaseOutlivesTheEpoch: a follower that
// answered its leader's heartbeat and then adopts a later epoch without a
// leader — here from a pre-vote refusal carrying another replica's
// promise — still promises nothing to another candidate's PREPARE for an
// election timeout: its answer counted toward the leader's lease. Found
// by the group simulator (LeaseOnTheClock, seed 16071 of --replicas 3):
// n2 answered n3's heartbeat, took epoch 12 from n1's refusal 10 ms later,
// granted n1's PREPARE for 13, and n1 took office within n3's lease.
func TestLeaseOutlivesTheEpoch(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.Mutations.LeaseForgottenWithTheLeader = mutated })
		c.elect(3)
		c.propose(3, "a") // n2 takes n3's APPEND and answers it
		f := c.rs[2]
		epoch := f.Status().Hard.Promised
		c.queue = nil
		f.Step(Message{Type: MsgPreVoteAck, From: 1, To: 2, Epoch: epoch + 1}) // refused: n1 promised epoch+1
		c.flush(2)
		if st := f.Status(); st.Hard.Promised != epoch+1 || st.Leader != 0 {
			t.Fatalf("setup: n2 after the refusal: %+v", st)
		}
		c.queue = nil
		st := f.Status()
		f.Step(Message{Type: MsgPrepare, From: 1, To: 2, Epoch: epoch + 2, LastEpoch: epoch, LastSeq: st.Last})
		c.flush(2)
		promised := f.Status().Hard.Promised > epoch+1
		if promised != mutated || granted(c.queue, MsgPrepareAck) != mutated {
			t.Fatalf("mutated %v: n2 promised %v (answers %v) another candidate's PREPARE right after answering its leader", mutated, promised, c.queue)
		}
		if mutated {
			continue
		}
		// An election timeout after it last heard n3, it grants.
		for range c.rs[2].cfg.ElectionTicks {
			f.Tick()
			c.flush(2)
		}
		c.queue = nil
		f.Step(Message{Type: MsgPrepare, From: 1, To: 2, Epoch: epoch + 2, LastEpoch: epoch, LastSeq: st.Last})
		c.flush(2)
		if !granted(c.queue, MsgPrepareAck) {
			t.Fatalf("n2 refused the PREPARE an election timeout after it last heard its leader: %v", c.queue)
		}
	}
}
