package sim

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/wire"
)

// TestS8SnapshotCannotAnswerForAnOlderSeqAtNodeLevel (S8 at node level):
// the network keeps a copy of an early APPEND with entries to a follower
// of partition 0 (a duplicate, late); once retention compacted that
// follower's log past the APPEND's entries, the copy arrives. Its entries
// are committed, so they match the leader's: the follower skips what its
// snapshot covers and answers FLUSHED — nothing truncated, no rebuild.
// The follower restarts before the copy arrives, so it knows the epochs
// of its kept log only. Its log stays whole (CommittedPrefixAgreement and
// VisibleMonotonic after every event, the final read-back), and it is
// never rebuilt (the leader saw no mismatch). With
// replica.Mutations.AppendBelowSnapshot it matches the APPEND (the
// partition's first, prev 0) against the compacted prefix, whose epochs it
// no longer knows, takes its committed entries for others and refuses the
// message as one no correct leader sends (KernelAssertion: the cluster
// simulator checks every member's anomaly count after every event).
func TestS8SnapshotCannotAnswerForAnOlderSeqAtNodeLevel(t *testing.T) {
	for _, seed := range portedSeeds {
		st, err := appendBelowSnapshot(seed, node.Mutations{})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		t.Logf("seed %d: %s", seed, st)
	}
	caught := 0
	for _, seed := range portedSeeds {
		st, err := appendBelowSnapshot(seed, node.Mutations{Replica: replica.Mutations{AppendBelowSnapshot: true}})
		if err != nil && st.delivered {
			caught++
			t.Logf("seed %d with AppendBelowSnapshot (%s): %s", seed, st, strings.SplitN(err.Error(), "\n", 2)[0])
		}
	}
	if caught == 0 {
		t.Fatal("an APPEND below the snapshot matched against the compacted prefix went unnoticed on every seed")
	}
}

// s8Stage is what one run of the S8 scenario staged.
type s8Stage struct {
	follower                 string
	epoch, prev, last, snap  uint64 // the copy's epoch, prev seq, last entry; the follower's snapshot point when it came
	delivered                bool
	rebuildsBefore, rebuilds float64
}

func (st s8Stage) String() string {
	return fmt.Sprintf("APPEND(epoch %d, prev %d, entries to %d) to %s delivered again (%v) at its snapshot point %d; rebuilds %v -> %v",
		st.epoch, st.prev, st.last, st.follower, st.delivered, st.snap, st.rebuildsBefore, st.rebuilds)
}

func appendBelowSnapshot(seed uint64, m node.Mutations) (s8Stage, error) {
	const p = uint32(0)
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 400, Retention: retentionOptions, Mutations: m})
	var st s8Stage
	var copyOf []byte
	var from, to uint32
	sc.net.hold = func(f, t uint32, fr wire.Frame) bool {
		r, ok := fr.(*wire.Replicate)
		if copyOf != nil || !ok || r.Topic != simTopic || r.Partition != p || len(r.Entries) == 0 {
			return false
		}
		if msg := replog.FromWire(r); msg.Type == replica.MsgAppend {
			copyOf, from, to = wire.AppendFrame(nil, 0, fr), f, t
			st.epoch, st.prev, st.last = r.Epoch, r.PrevSeq, r.Entries[len(r.Entries)-1].Seq
		}
		return false // delivered as well: the copy is the duplicate
	}
	compacted := func() bool {
		b := sc.net.brokers[to]
		if copyOf == nil || !b.up {
			return false
		}
		v, ok := b.node.Replica(simTopic, p)
		return ok && v.Status.SnapSeq > st.last && v.Status.Hard.Promised == st.epoch && v.Status.Leader != 0
	}
	sc.when("a follower of partition 0 compacted past the kept APPEND", 20_000, compacted, func() {
		// Restarted, it knows the epochs of its kept log only: the
		// compacted prefix's are gone (what a match against it would
		// need).
		b := sc.net.brokers[to]
		b.crash()
		caughtUp := func() bool {
			l := sc.leaderOf(p)
			if l == nil || l == b || !compacted() {
				return false
			}
			lp, _ := partitionOn(l, p)
			fp, ok := partitionOn(b, p)
			return ok && fp.CommitSeq >= lp.CommitSeq && lp.CommitSeq > 0
		}
		sc.when(b.id+" back and caught up, its log still compacted past the APPEND", 10_000, caughtUp, func() {
			sc.net.hold = nil
			st.rebuildsBefore = sc.metric(b, "nereus_replication_rebuilds_total", p)
			sc.at(300, func() { // whatever its restart cost settled first
				if !compacted() {
					sc.fail("%s no longer in place to take the copy", b.id)
					return
				}
				v, _ := b.node.Replica(simTopic, p)
				st.follower, st.snap = b.id, v.Status.SnapSeq
				if r := sc.metric(b, "nereus_replication_rebuilds_total", p); r != st.rebuildsBefore {
					sc.fail("%s rebuilt before the copy came (rebuilds %v -> %v)", b.id, st.rebuildsBefore, r)
					return
				}
				st.delivered = sc.net.handOver(from, to, copyOf)
			})
			sc.at(1_300, func() {
				st.rebuilds = sc.metric(b, "nereus_replication_rebuilds_total", p)
				if st.rebuilds != st.rebuildsBefore {
					sc.fail("%s was rebuilt after the late APPEND (rebuilds %v -> %v)", b.id, st.rebuildsBefore, st.rebuilds)
				}
			})
		})
	})
	_, err := sc.run()
	if err == nil && !st.delivered {
		err = fmt.Errorf("not staged: %s", st)
	}
	return st, err
}
