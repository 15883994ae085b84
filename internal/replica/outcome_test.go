package replica

import "testing"

// LostBehindALaterEpoch: a deposed leader's proposals beyond its
// successor's log are Lost as soon as its committed prefix ends in the
// later epoch — not only once something more is written at their seqs,
// which may never happen (their publisher waits on them and writes
// nothing). The successor's own proposal beyond the commit point stays
// Pending, and a committed one is Committed.
func TestOutcomeLostBehindALaterEpoch(t *testing.T) {
	for _, mutated := range []bool{false, true} {
		c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.Mutations.OutcomeWaitsForTheCommitPoint = mutated })
		c.elect(1)
		aSeq, aEpoch := c.propose(1, "a")
		c.cut[1] = true
		var zombie []uint64
		for _, v := range []string{"x", "y", "z"} {
			seq, _, err := c.rs[1].Propose([]byte(v))
			if err != nil {
				t.Fatal(err)
			}
			zombie = append(zombie, seq)
		}
		c.settle()
		c.elect(2)
		delete(c.cut, 1)
		c.tick(5) // n1 hears n2 and follows its log
		st := c.rs[1].Status()
		if st.Role == Leader || st.CommitSeq >= zombie[len(zombie)-1] || st.Hard.Promised <= aEpoch {
			t.Fatalf("n1 %+v: want a follower of a later epoch whose commit point (%d) is below some of its old proposals %v", st, st.CommitSeq, zombie)
		}
		for _, seq := range zombie {
			got, want := c.rs[1].Outcome(seq, aEpoch), Lost // at or below the commit point: another epoch's entry is there
			if mutated && seq > st.CommitSeq {
				want = Pending
			}
			if got != want {
				t.Fatalf("mutated %v: n1's proposal at %d (epoch %d) is %v with the commit at %d in epoch %d, want %v; log %s",
					mutated, seq, aEpoch, got, st.CommitSeq, c.rs[1].epochAt(st.CommitSeq), want, c.logString(1))
			}
		}
		if got := c.rs[1].Outcome(aSeq, aEpoch); got != Committed {
			t.Fatalf("n1's committed proposal is %v", got)
		}
		c.cut[1], c.cut[3] = true, true
		seq, epoch, err := c.rs[2].Propose([]byte("w"))
		if err != nil {
			t.Fatal(err)
		}
		c.settle()
		if got := c.rs[2].Outcome(seq, epoch); got != Pending {
			t.Fatalf("the leader's own proposal beyond its commit point (%d) is %v, want Pending", c.rs[2].Status().CommitSeq, got)
		}
	}
}
