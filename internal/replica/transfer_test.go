package replica

// Leadership transfer (transfer.go) and rebalancing toward the preferred
// leader, on the lockstep cluster, each checked against the reference
// model (watch). Every guard of a transfer has a test here that fails
// when the guard is removed: the Mutations named in each test switch
// one off, and the test's "mutated" half expects the scenario to fail.

import (
	"errors"
	"testing"
)

// transferCluster is a 3-replica group with n1 leading epoch 1 and "a"
// committed everywhere.
func transferCluster(t *testing.T, mut Mutations, tweak func(*Config)) (*cluster, *model) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) {
		cfg.Mutations = mut
		if tweak != nil {
			tweak(cfg)
		}
	})
	m := watch(c)
	c.elect(1)
	c.propose(1, "a")
	return c, m
}

// TestTransferHandsLeadershipToACaughtUpFollower: the plain hand-off. n1
// transfers to n2; n2 leads the next epoch after one exchange, nothing
// committed is lost, and n1 follows it and took no write meanwhile.
func TestTransferHandsLeadershipToACaughtUpFollower(t *testing.T) {
	c, m := transferCluster(t, Mutations{}, nil)
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	if got := c.rs[1].Status().TransferTo; got != 2 {
		t.Fatalf("Status.TransferTo = %d, want 2", got)
	}
	if _, _, err := c.rs[1].Propose([]byte("during")); !errors.Is(err, ErrTransferring) {
		t.Fatalf("propose during a transfer: %v, want ErrTransferring", err)
	}
	c.settle()
	if st := c.rs[2].Status(); st.Role != Leader || st.Hard.Promised != 2 {
		t.Fatalf("n2 after the transfer: %+v", st)
	}
	if st := c.rs[1].Status(); st.Role != Follower || st.Leader != 2 || st.TransferTo != 0 {
		t.Fatalf("n1 after the transfer: %+v", st)
	}
	c.propose(2, "b")
	c.tick(2)
	c.requireConverged(m)
	if m.seqOf("a") == 0 || m.seqOf("b") == 0 {
		t.Fatalf("visible %v", m.visible)
	}
}

// transferToLaggard: n2 missed "b" and "c" (cut off while they
// committed on n1 and n3); n1 transfers to it at once. The leader must
// catch n2 up before TIMEOUT_NOW: campaigning with a shorter log, n2
// would get no grant (n1 and n3 both hold more), and the group would
// have no leader until an election timeout. Guard: TimeoutNowBeforeCaughtUp.
func transferToLaggard(t *testing.T, mut Mutations) (ok bool, why string) {
	c, m := transferCluster(t, mut, nil)
	c.cut[2] = true
	c.propose(1, "b")
	c.propose(1, "c")
	delete(c.cut, 2)
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	c.settle()
	if st := c.rs[2].Status(); st.Role != Leader {
		return false, "n2 did not take over after catching up: " + st.Role.String()
	}
	c.tick(2)
	c.requireConverged(m)
	return true, ""
}

func TestTransferWaitsForTheTargetToCatchUp(t *testing.T) {
	if ok, why := transferToLaggard(t, Mutations{}); !ok {
		t.Fatal(why)
	}
	if ok, _ := transferToLaggard(t, Mutations{TimeoutNowBeforeCaughtUp: true}); ok {
		t.Fatal("mutated (TimeoutNowBeforeCaughtUp): the laggard took over anyway; the test no longer proves the guard")
	}
}

// transferWithProposal: a proposal reaches n1 after TIMEOUT_NOW went out
// and before n2's PREPARE arrives. Taken, it would make n1's (and n3's)
// lineage longer than n2's: both would refuse n2, and the hand-off would
// cost an election timeout. Guard: ProposeWhileTransferring
// (TransferRefusesWrites in the model checker).
func transferWithProposal(t *testing.T, mut Mutations) (ok bool, why string) {
	c, m := transferCluster(t, mut, nil)
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	c.flush(1) // TIMEOUT_NOW queued: n2 flushed everything
	_, _, err := c.rs[1].Propose([]byte("late"))
	c.settle()
	if st := c.rs[2].Status(); st.Role != Leader {
		return false, "n2 did not take over: " + st.Role.String()
	}
	if !errors.Is(err, ErrTransferring) {
		return false, "the proposal was not refused with ErrTransferring"
	}
	c.propose(2, "b")
	c.tick(2)
	c.requireConverged(m)
	return true, ""
}

func TestTransferRefusesWritesUntilItEnds(t *testing.T) {
	if ok, why := transferWithProposal(t, Mutations{}); !ok {
		t.Fatal(why)
	}
	if ok, _ := transferWithProposal(t, Mutations{ProposeWhileTransferring: true}); ok {
		t.Fatal("mutated (ProposeWhileTransferring): the hand-off succeeded anyway; the test no longer proves the guard")
	}
}

// transferToDeadTarget: the target is down, so the hand-off cannot end.
// After TransferTicks the leader gives up and takes writes again — the
// refusal lasts at most that long. Guard: TransferNeverAbandoned.
func transferToDeadTarget(t *testing.T, mut Mutations) (ok bool, why string) {
	c, m := transferCluster(t, mut, func(cfg *Config) { cfg.TransferTicks = 7 })
	c.crash(2)
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	for tick := 1; tick <= 7; tick++ {
		if _, _, err := c.rs[1].Propose([]byte("x")); !errors.Is(err, ErrTransferring) {
			return false, "a write was taken before the transfer was abandoned"
		}
		c.tick(1)
	}
	if st := c.rs[1].Status(); st.Role != Leader || st.TransferTo != 0 {
		return false, "the transfer was not abandoned after TransferTicks"
	}
	if _, _, err := c.rs[1].Propose([]byte("b")); err != nil {
		return false, "no write taken after the abandoned transfer: " + err.Error()
	}
	c.settle()
	c.start(2)
	c.tick(3)
	c.requireConverged(m)
	if m.seqOf("b") == 0 {
		return false, "b never became visible"
	}
	return true, ""
}

func TestTransferAbandonedAfterTransferTicks(t *testing.T) {
	if ok, why := transferToDeadTarget(t, Mutations{}); !ok {
		t.Fatal(why)
	}
	if ok, _ := transferToDeadTarget(t, Mutations{TransferNeverAbandoned: true}); ok {
		t.Fatal("mutated (TransferNeverAbandoned): writes resumed anyway; the test no longer proves the guard")
	}
}

// staleTimeoutNow: n1's TIMEOUT_NOW to n2 is held back; n1 dies and n3
// leads epoch 2. When the old TIMEOUT_NOW finally arrives, n2 must
// ignore it: obeying would depose n3, a healthy leader nobody wants to
// replace. Guard: TimeoutNowAnyEpoch.
func staleTimeoutNow(t *testing.T, mut Mutations) (ok bool, why string) {
	c, m := transferCluster(t, mut, nil)
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	c.flush(1)
	var held []Message
	c.pump(func(msg Message) bool {
		if msg.Type == MsgTimeoutNow {
			held = append(held, msg)
			return true
		}
		return false
	})
	if len(held) != 1 {
		t.Fatalf("setup: %d TIMEOUT_NOW sent", len(held))
	}
	c.crash(1)
	c.elect(3)
	c.propose(3, "b")
	before := c.rs[2].Status()
	c.rs[2].Step(held[0]) // from n1, which is down: the network would not carry it now
	c.settle()
	if after := c.rs[2].Status(); after.Hard.Promised != before.Hard.Promised || after.Leader != 3 {
		return false, "a stale TIMEOUT_NOW started an election"
	}
	c.start(1)
	c.tick(3)
	c.requireConverged(m)
	return true, ""
}

func TestStaleTimeoutNowIsIgnored(t *testing.T) {
	if ok, why := staleTimeoutNow(t, Mutations{}); !ok {
		t.Fatal(why)
	}
	if ok, _ := staleTimeoutNow(t, Mutations{TimeoutNowAnyEpoch: true}); ok {
		t.Fatal("mutated (TimeoutNowAnyEpoch): n3 kept its leadership anyway; the test no longer proves the guard")
	}
}

func TestTransferToRefusals(t *testing.T) {
	c, _ := transferCluster(t, Mutations{}, nil)
	if err := c.rs[2].TransferTo(3); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a follower's TransferTo: %v", err)
	}
	if err := c.rs[1].TransferTo(1); err == nil {
		t.Fatal("a transfer to itself was accepted")
	}
	if err := c.rs[1].TransferTo(9); err == nil {
		t.Fatal("a transfer to a non-member was accepted")
	}
	if err := c.rs[1].TransferTo(2); err != nil {
		t.Fatal(err)
	}
	if err := c.rs[1].TransferTo(3); !errors.Is(err, ErrTransferring) {
		t.Fatalf("a second transfer to another target: %v", err)
	}
}

// rebalanceConfig: n1 is every replica's preferred leader; elections
// take 10 ticks, a replica must keep up 20 ticks in a row, and a leader
// tries at most once every 50 ticks.
func rebalanceConfig(cfg *Config) {
	cfg.PreferredLeader, cfg.RebalanceStableTicks, cfg.RebalanceEveryTicks = 1, 20, 50
}

// TestRebalanceReturnsLeadershipToThePreferredLeader: n1, the preferred
// leader, dies; n2 takes over; n1 restarts and catches up; n2 hands
// leadership back — only after n1 kept up for RebalanceStableTicks, and
// with writes refused for one round trip (the hand-off), not an election
// timeout. Nothing committed is lost.
func TestRebalanceReturnsLeadershipToThePreferredLeader(t *testing.T) {
	c, m := transferCluster(t, Mutations{}, rebalanceConfig)
	c.crash(1)
	c.elect(2)
	c.propose(2, "b")
	c.tick(60) // n2 rested past RebalanceEveryTicks
	c.start(1)
	tick, firstKeptUp, transferAt, refused := 0, -1, -1, 0
	c.chain(func(id NodeID) {
		if id == 2 && transferAt < 0 && c.rs[2].Status().TransferTo == 1 {
			transferAt = tick
		}
	})
	for ; tick < 200 && c.rs[1].Status().Role != Leader; tick++ {
		if l := c.leader(); l == 2 {
			if firstKeptUp < 0 && c.peerState(2, 1) == InSync {
				firstKeptUp = tick
			}
			if _, _, err := c.rs[2].Propose([]byte("w")); errors.Is(err, ErrTransferring) {
				refused++
			} else if err != nil {
				t.Fatalf("tick %d: %v", tick, err)
			}
		}
		c.tick(1)
	}
	if st := c.rs[1].Status(); st.Role != Leader {
		t.Fatalf("leadership never returned to n1: %+v", st)
	}
	// Ticks firstKeptUp..transferAt all saw n1 in sync: the transfer's
	// own tick is the RebalanceStableTicks-th.
	if kept := transferAt - firstKeptUp + 1; transferAt < 0 || kept < 20 {
		t.Fatalf("n2 transferred at tick %d, n1 in sync since tick %d (%d ticks): RebalanceStableTicks is 20", transferAt, firstKeptUp, kept)
	}
	if refused > 1 {
		t.Fatalf("writes refused for %d ticks of the hand-off, want at most 1", refused)
	}
	c.propose(1, "c")
	c.tick(2)
	c.requireConverged(m)
	for _, v := range []string{"a", "b", "c"} {
		if m.seqOf(v) == 0 {
			t.Fatalf("%q not visible: %v", v, m.visible)
		}
	}
}

// TestRebalanceAttemptsAreRateLimited: n1 keeps up but never takes over
// (every TIMEOUT_NOW to it is lost). n2 tries again at most once every
// RebalanceEveryTicks, and takes writes between attempts.
func TestRebalanceAttemptsAreRateLimited(t *testing.T) {
	c, _ := transferCluster(t, Mutations{}, rebalanceConfig)
	c.crash(1)
	c.elect(2)
	c.start(1)
	c.drop = func(msg Message) bool { return msg.Type == MsgTimeoutNow }
	var starts []int
	transferring := false
	for tick := 0; tick < 400; tick++ {
		now := c.rs[2].Status().TransferTo == 1
		if now && !transferring {
			starts = append(starts, tick)
		}
		transferring = now
		c.tick(1)
	}
	if c.leader() != 2 {
		t.Fatalf("leader n%d, want n2 (n1 never hears TIMEOUT_NOW)", c.leader())
	}
	if len(starts) < 2 {
		t.Fatalf("%d attempts in 400 ticks, want several", len(starts))
	}
	for i := 1; i < len(starts); i++ {
		if starts[i]-starts[i-1] < 50 {
			t.Fatalf("attempts at ticks %v: %d apart, RebalanceEveryTicks is 50", starts, starts[i]-starts[i-1])
		}
	}
}

// TestPreferredLeaderNeverTransfers: the preferred leader leading is the
// balanced state — it never hands off.
func TestPreferredLeaderNeverTransfers(t *testing.T) {
	c, _ := transferCluster(t, Mutations{}, rebalanceConfig)
	for tick := 0; tick < 200; tick++ {
		if c.rs[1].Status().TransferTo != 0 {
			t.Fatalf("tick %d: the preferred leader started a transfer", tick)
		}
		c.tick(1)
	}
	if c.leader() != 1 {
		t.Fatalf("leader n%d, want n1", c.leader())
	}
}

// TestRebalanceSkipsASilentPreferredLeader: n1 was in sync when it went
// silent (cut off; its match on n2 stays where it was). A replica the
// leader does not hear is not fit to lead: n2 never starts a transfer to
// it, and keeps taking writes.
func TestRebalanceSkipsASilentPreferredLeader(t *testing.T) {
	c, _ := transferCluster(t, Mutations{}, rebalanceConfig)
	c.crash(1)
	c.elect(2)
	c.start(1)
	c.tick(10) // n1 catches up
	if c.peerState(2, 1) != InSync {
		t.Fatalf("setup: n1 is %v", c.peerState(2, 1))
	}
	c.cut[1] = true
	for tick := 0; tick < 200; tick++ {
		if c.rs[2].Status().TransferTo != 0 {
			t.Fatalf("tick %d: n2 started a transfer to n1, which it has not heard from", tick)
		}
		c.propose(2, "w")
		c.tick(1)
	}
}

// TestRebalanceIgnoresAFlappingPreferredLeader: n1 keeps dropping off the
// network (10 ticks heard, 8 ticks cut, over and over). It never keeps up
// for RebalanceStableTicks in a row, so n2 never hands it leadership: a
// flapping replica cannot make leadership flap with it.
func TestRebalanceIgnoresAFlappingPreferredLeader(t *testing.T) {
	c, _ := transferCluster(t, Mutations{}, rebalanceConfig)
	c.crash(1)
	c.elect(2)
	c.start(1)
	for tick := 0; tick < 400; tick++ {
		c.cut[1] = tick%18 >= 10
		if c.rs[2].Status().TransferTo != 0 || c.leader() != 2 {
			t.Fatalf("tick %d: n2 (leader %d) started a transfer to a flapping n1", tick, c.leader())
		}
		c.propose(2, "w")
		c.tick(1)
	}
}

// TestRebalanceWaitsForTheShellsRelease: under ReleaseBeforeTransfer the
// leader that would hand leadership back to n1 only reports it
// (TransferWanted) and goes on leading — lease and writes — until the
// shell calls TransferTo; then the hand-off runs as usual. A scheduler
// shard's owner drains its publishes in that window instead of being
// fenced mid-flight. Guard: TransferWithoutRelease.
func TestRebalanceWaitsForTheShellsRelease(t *testing.T) {
	wanted, leased := rebalanceAwaitingRelease(t, Mutations{})
	if wanted == 0 || !leased {
		t.Fatalf("transfer wanted %d, lease and writes kept %v: want n1 reported and n2 leading meanwhile", wanted, leased)
	}
	if wanted, leased := rebalanceAwaitingRelease(t, Mutations{TransferWithoutRelease: true}); wanted != 0 && leased {
		t.Fatal("mutated (TransferWithoutRelease): the leader still waited; the test no longer proves the guard")
	}
}

// rebalanceAwaitingRelease runs n2 leading with n1 (the preferred
// leader) back and in sync for 150 ticks without releasing, and reports
// the TransferWanted it saw and whether n2 kept its lease and took
// writes every tick since; then it releases and expects n1 to lead.
func rebalanceAwaitingRelease(t *testing.T, mut Mutations) (wanted NodeID, leased bool) {
	t.Helper()
	c, m := transferCluster(t, mut, func(cfg *Config) {
		rebalanceConfig(cfg)
		cfg.ReleaseBeforeTransfer = true
	})
	c.crash(1)
	c.elect(2)
	c.propose(2, "b")
	c.tick(60)
	c.start(1)
	leased = true
	for tick := 0; tick < 150; tick++ {
		st := c.rs[2].Status()
		if st.TransferWanted != 0 {
			wanted = st.TransferWanted
		}
		if st.Role != Leader || st.LeaseTicks == 0 || st.TransferTo != 0 {
			leased = false
			break
		}
		if _, _, err := c.rs[2].Propose([]byte("w")); err != nil {
			leased = false
			break
		}
		c.tick(1)
	}
	if !leased {
		return wanted, false
	}
	if err := c.rs[2].TransferTo(wanted); err != nil {
		t.Fatalf("release: TransferTo(%d): %v", wanted, err)
	}
	for tick := 0; tick < 50 && c.leader() != 1; tick++ {
		c.tick(1)
	}
	if c.leader() != 1 {
		t.Fatalf("leader n%d after the release, want n1", c.leader())
	}
	if st := c.rs[1].Status(); st.TransferWanted != 0 {
		t.Fatalf("the preferred leader wants a transfer: %+v", st)
	}
	c.propose(1, "c")
	c.tick(2)
	c.requireConverged(m)
	return wanted, true
}

// TestTransferWantedStaysUntilReleased: a hand-off reported to the shell
// (TransferWanted) is not withdrawn by the leader on its own, even when
// the preferred replica stops keeping up: the shell may be draining for
// it or have asked for it already, and a withdrawal it did not see would
// let its owner take office again just before the hand-off starts
// (WantedUntilReleased). TransferTo or leaving office ends it.
func TestTransferWantedStaysUntilReleased(t *testing.T) {
	c, _ := transferCluster(t, Mutations{}, func(cfg *Config) {
		rebalanceConfig(cfg)
		cfg.ReleaseBeforeTransfer = true
	})
	c.crash(1)
	c.elect(2)
	c.tick(60)
	c.start(1)
	for tick := 0; tick < 150 && c.rs[2].Status().TransferWanted == 0; tick++ {
		c.tick(1)
	}
	if c.rs[2].Status().TransferWanted != 1 {
		t.Fatalf("no hand-off to n1 wanted: %+v", c.rs[2].Status())
	}
	c.crash(1) // n1 stops keeping up
	c.tick(40)
	if st := c.rs[2].Status(); st.TransferWanted != 1 || st.Role != Leader {
		t.Fatalf("the wanted hand-off was withdrawn (or n2 stopped leading) without the shell: %+v", st)
	}
	if err := c.rs[2].TransferTo(1); err != nil {
		t.Fatal(err)
	}
	if st := c.rs[2].Status(); st.TransferWanted != 0 || st.TransferTo != 1 {
		t.Fatalf("after TransferTo: wanted %d, transferring to %d", st.TransferWanted, st.TransferTo)
	}
}
