package replica

import "testing"

// TestShortAppendContinuesFromWhatWasSent: a leader whose store reads for
// a catch-up return fewer entries than an Append asked for (replog's stop
// at a byte bound) goes on from what it sent (AppendShort), so the
// follower refuses no Append as a mismatch on its way to the leader's log;
// AppendShort never moves a peer's next entry forward, and ignores a peer
// it does not know.
func TestShortAppendContinuesFromWhatWasSent(t *testing.T) {
	c := newClusterWith(t, 3, SyncQuorum, func(cfg *Config) { cfg.AppendEntriesMax = 4 })
	mismatches := 0
	var appendsTo3 []Message
	c.drop = func(m Message) bool {
		if m.From == 3 && m.Type == MsgAppendAck && m.Reject == RejectMismatch {
			mismatches++
		}
		if m.To == 3 && m.Type == MsgAppend {
			appendsTo3 = append(appendsTo3, m)
		}
		return false
	}
	c.elect(1)
	c.settle()
	c.cut[3] = true
	for i := range 12 {
		c.propose(1, string(rune('a'+i)))
	}
	c.entriesMax = 2
	c.cut[3] = false
	mismatches = 0
	for range 40 {
		c.tick(1)
	}
	if got, want := c.logString(3), c.logString(1); got != want {
		t.Fatalf("n3 did not catch up:\n n3 %s\n n1 %s", got, want)
	}
	// The first Append after the cut may find n3 short of what n1 sent it
	// while it was cut off; no other may.
	if mismatches > 1 {
		t.Fatalf("n3 refused %d Appends as mismatches while catching up", mismatches)
	}

	last := c.rs[1].Status().Last
	c.rs[1].AppendShort(3, last+5) // would move n3's next entry forward
	c.rs[1].AppendShort(99, 1)     // no such peer
	appendsTo3 = nil
	c.propose(1, "z")
	if len(appendsTo3) == 0 || appendsTo3[0].PrevSeq != last {
		t.Fatalf("after AppendShort past the log, the next Append to n3 is %v, want one after seq %d", appendsTo3, last)
	}
	if got, want := c.logString(3), c.logString(1); got != want {
		t.Fatalf("n3 diverged:\n n3 %s\n n1 %s", got, want)
	}
}
