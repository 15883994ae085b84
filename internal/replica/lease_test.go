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
