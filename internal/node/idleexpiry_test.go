package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// IdleLogExpires at node level: a partition that took records and then
// stopped deletes them once they are older than its retention (the active
// segment they sit in is sealed first; retention deletes only sealed
// segments), and its producer stays known: after a restart a retry of a
// deleted record is its duplicate, and the next publish takes the next seq.
func TestIdlePartitionRecordsExpire(t *testing.T) {
	h, clock := newVirtualHarness(t, func(c *Config) {
		c.RetentionCheckMs = 1000
		c.ScrubBytesPerSecond = -1
	})
	if _, err := h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 1, RetentionMs: 5000}); err != nil {
		t.Fatal(err)
	}
	var last wire.PubOK
	for i := range uint64(10) {
		last = h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: i, Value: fmt.Appendf(nil, "m%d", i)})
	}
	if n := len(segmentsOf(t, h.fs, "t", 0)); n != 1 {
		t.Fatalf("%d segments: want the records in the active one", n)
	}
	startSeq := func() uint64 { return h.node.Metadata([]string{"t"})[0].Partitions[0].StartSeq }
	advanceUntil(t, clock, time.Second, "retention deleted the idle partition's records", func() bool { return startSeq() > last.Seq })

	h.restart()
	if s := startSeq(); s != last.Seq+1 {
		t.Fatalf("after a restart the log starts at %d, want %d", s, last.Seq+1)
	}
	ok := h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: 9, Value: []byte("m9")})
	if !ok.Duplicate || ok.Seq != last.Seq {
		t.Fatalf("a retry of a deleted record: %+v, want a duplicate at %d", ok, last.Seq)
	}
	ok = h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: 10, Value: []byte("m10")})
	if ok.Duplicate || ok.Seq != last.Seq+1 {
		t.Fatalf("the next publish: %+v, want seq %d", ok, last.Seq+1)
	}
}

// IdleLogExpires on a replicated topic: every replica of an idle
// partition seals the segment its records sit in and deletes them once
// they are older than the topic's retention — the leader carrying the
// producer first (a dedup carry) — and after every node restarts without
// dedup snapshots, each table rebuilt from its kept log, a retry of a
// deleted record is its duplicate.
func TestClusterIdlePartitionRecordsExpire(t *testing.T) {
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.RetentionCheckMs = 20
		c.DedupSnapshotBytes = -1
	})
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3, RetentionMs: 1000})
	var last wire.PubOK
	for i := range uint64(20) {
		_, last = tc.publishAnywhere(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: i, Value: fmt.Appendf(nil, "m%d", i)})
	}
	for id, n := range tc.nodes {
		deadline := time.Now().Add(waitMax)
		for n.Metadata([]string{"t"})[0].Partitions[0].StartSeq <= last.Seq {
			if time.Now().After(deadline) {
				t.Fatalf("%s never deleted the idle partition's records through %d: %s", id, last.Seq, compactionState(n, "t"))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for id := range tc.nodes {
		tc.stop(id)
	}
	for _, m := range tc.members {
		tc.start(m.ID)
	}
	_, ok := tc.publishAnywhere(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: 19, Value: []byte("retry")})
	if !ok.Duplicate || ok.Seq != last.Seq {
		t.Fatalf("a retry of a deleted record after every node restarted: %+v, want a duplicate at %d", ok, last.Seq)
	}
}
