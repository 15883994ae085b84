package replog

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
)

// TestCatchUpOfLargeRecordsSendsWhatItRead: a follower that missed 7.5
// MiB of 64 KiB records catches up from the leader's log, whose reads for
// an Append stop at AppendReadBytesMax (512 KiB here, 7 records; 4 MiB
// and 63 records by default), short of the AppendEntriesMax (256) the
// kernel asked for. The leader must go on from what it read and sent:
// were the rest counted as sent, every short Append would be followed by
// one the follower refuses as a mismatch (its previous entry never came),
// a round trip lost per read. (With the default bound it needed 37.5
// MiB, which under -race took 7-9 s of the 10 s the catch-up may take.)
func TestCatchUpOfLargeRecordsSendsWhatItRead(t *testing.T) {
	g := newGroupWith(t, 3, func(c *Config) { c.AppendReadBytesMax = 512 << 10 })
	var lagger atomic.Uint64
	var healed atomic.Bool
	var mu sync.Mutex
	matched := map[uint64]bool{} // by epoch: an Append of it matched
	mismatches := 0
	g.observe = func(m replica.Message) {
		if m.Type != replica.MsgAppendAck || uint64(m.From) != lagger.Load() || !healed.Load() {
			return
		}
		// Appends a leader sent before it heard where the follower's log
		// ends (after the cut, or after it took office: the test's 2 ms
		// ticks let leadership move when the race detector slows it) may
		// be refused; once one of its epoch matched, none.
		mu.Lock()
		defer mu.Unlock()
		switch {
		case m.Reject == replica.RejectNone:
			matched[m.Epoch] = true
		case m.Reject == replica.RejectMismatch && matched[m.Epoch]:
			mismatches++
		}
	}
	g.commit("first")
	lead := g.leader()
	for _, id := range g.members {
		if id != lead.Status().ID {
			lagger.Store(uint64(id))
			break
		}
	}
	g.isolate(replica.NodeID(lagger.Load()), true)
	value := bytes.Repeat([]byte{'v'}, 64<<10)
	ps := make([]*Proposal, 120)
	for i := range ps {
		ps[i] = lead.Propose(storage.Record{Value: value})
	}
	for _, p := range ps {
		<-p.Done
		if p.Err != nil {
			t.Fatalf("proposal: %v", p.Err)
		}
	}
	last := ps[len(ps)-1].Seq
	healed.Store(true)
	g.isolate(replica.NodeID(lagger.Load()), false)
	g.waitCommit(replica.NodeID(lagger.Load()), last)
	mu.Lock()
	defer mu.Unlock()
	if mismatches > 0 {
		t.Fatalf("the follower refused %d Appends as mismatches while catching up", mismatches)
	}
}
