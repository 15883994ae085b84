package node

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// DeadLetterWindowPerPartition: a group's dead letters of each partition
// of its topic are published under a producer identity of their own, so
// each partition's dead letters have a dedup window of their own at the
// dead-letter topic. With one identity for the whole topic (producer_seq
// partition<<48 | seq) the window, which forgets its lowest producer_seq
// first, filled with a higher partition's dead letters and forgot each of
// partition 0's as soon as it was appended: the copy published again
// after a restart (the message was recorded dead, the node stopped before
// it heard its PUB_OK) was answered PRODUCER_SEQ_TOO_OLD, every retry
// too, and the message never left the group — its ack floor stuck for
// good. Here the window holds 4 producer_seqs; partition 1 dead-letters 4
// messages first. Manual mode makes the interleaving exact.
func TestDeadLetterRetriedAfterAnotherPartitionFilledTheWindow(t *testing.T) {
	fs := vfs.NewMem()
	var now atomic.Int64
	now.Store(1_000_000)
	open := func() *Node {
		n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: fs, Clock: testClock{nowMs: &now}}, Manual: true,
			Dedup: partition.Config{DedupWindowMax: 4, ProducersMax: 100}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := open()
	defer func() { n.Close() }()
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	publish := func(partition int32) {
		n.Publish(&wire.Pub{Topic: "t", Partition: partition, Value: []byte("poison")}, func(_ wire.PubOK, err *wire.Error) {
			if err != nil {
				t.Errorf("publish: %v", err)
			}
		})
	}
	for range 4 {
		publish(1)
	}
	s := newSink()
	sub, err := n.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000, MaxDeliver: 1}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(100)
	n.Step()
	if s.count() != 4 {
		t.Fatalf("%d deliveries, want 4", s.count())
	}
	// The ack waits pass: partition 1's four messages are dead-lettered
	// and leave the group.
	now.Add(1001)
	dlq := dlqTopicName("g", "t")
	for i := 0; i < 10 && groupOf(n, "g", "t").floors[1].Load() != 5; i++ {
		n.Step()
	}
	if floor := groupOf(n, "g", "t").floors[1].Load(); floor != 5 {
		t.Fatalf("partition 1's ack floor %d after its dead letters, want 5", floor)
	}
	// Partition 0's message: delivered, dead, its copy committed, and the
	// node stops before the group collects the PUB_OK.
	publish(0)
	n.Step()
	if s.count() != 5 {
		t.Fatalf("%d deliveries, want 5", s.count())
	}
	now.Add(1001)
	if !groupOf(n, "g", "t").step(now.Load()) {
		t.Fatal("the group did not run")
	}
	dt, err := n.topic(dlq)
	if err != nil {
		t.Fatal(err)
	}
	dt.partitions[0].step(now.Load())
	fs.CrashClean()
	n.Close()

	n = open()
	sub2, err := n.Subscribe("t", "g", GroupOptions{}, newSink())
	if err != nil {
		t.Fatal(err)
	}
	sub2.AddCredit(10)
	for i := 0; i < 10 && groupOf(n, "g", "t").floors[0].Load() != 2; i++ {
		n.Step()
		now.Add(200) // past any retry's backoff
	}
	if floor := groupOf(n, "g", "t").floors[0].Load(); floor != 2 {
		t.Fatalf("partition 0's ack floor %d after its dead letter was published again, want 2 (the copy's retry refused?)", floor)
	}
	copies := 0
	for _, e := range deadLetters(t, n, dlq, 1) { // seq 1 of either partition
		for _, h := range e.Record.Headers {
			if h.Key == "nereus-dlq-partition" && string(h.Value) == "0" {
				copies++
			}
		}
	}
	if copies != 1 {
		t.Fatalf("%d dead letters of partition 0, want exactly 1", copies)
	}
}

// DeadLetterOfADeletedRecord: a dead letter whose publish keeps failing
// (here a record at the size limit cannot carry the dead-letter headers)
// while retention deletes its record ends at its next attempt, done
// without a copy and said once — it used to be retried every 30 s for
// good, each attempt failing to read the record (STORAGE_ERROR) — and it
// is not counted as moved to the dead-letter topic.
func TestDeadLetterOfARecordRetentionDeletedEnds(t *testing.T) {
	h, logs := openDebugHarness(t, func(c *Config) { c.SegmentBytesMax, c.RetentionCheckMs, c.DedupSnapshotBytes = 2048, 5, -1 })
	n := h.node
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1, RetentionBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: make([]byte, 1000)})
	s := newSink()
	sub, _ := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000, MaxDeliver: 1}, s)
	sub.AddCredit(1)
	s.waitFor(t, 1)
	h.nowMs.Add(1000)
	h.sync("t", "g")
	h.sync("t", "g")
	if logs.count("level=WARN msg=\"dead-letter publish failed") != 1 {
		t.Fatalf("the dead letter's first attempt did not fail:\n%s", logs.String())
	}
	// Retention deletes seq 1: enough records after it to fill segments
	// past 4 KiB.
	for range 12 {
		h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: make([]byte, 900)})
	}
	eventually(t, "retention deletes seq 1", func() bool { return n.Metadata([]string{"t"})[0].Partitions[0].StartSeq > 1 })
	for _, waitMs := range []int64{100, 200, 400, 800} {
		h.nowMs.Add(waitMs)
		h.sync("t", "g")
		h.sync("t", "g")
	}
	const gone = "a dead letter's record was deleted by retention before its copy was published"
	if got := logs.count(gone); got != 1 {
		t.Fatalf("%d lines %q, want 1:\n%s", got, gone, logs.String())
	}
	if got := logs.count("read: storage: seq out of range"); got != 0 {
		t.Fatalf("the dead letter of a deleted record was retried %d times", got)
	}
	if v, err := n.Metrics().Value("nereus_dead_letters_total", map[string]string{"topic": "t", "group": "g"}); err != nil || v > 0 {
		t.Fatalf("nereus_dead_letters_total %v for a dead letter never published", v)
	}
}

// DeadLetterBelowTheWindow: a message that dies after more than a dedup
// window of its partition's later seqs died is refused
// PRODUCER_SEQ_TOO_OLD by the dead-letter topic (it cannot tell whether
// the copy landed before), and every retry would be too: the group
// publishes it without deduplication, says so, and the message leaves.
// Here the window holds 4 producer_seqs; seqs 2-6 are NACKed to death
// (max_deliver 1) while seq 1 waits out its ack wait.
func TestDeadLetterBelowTheDedupWindowIsPublishedOnce(t *testing.T) {
	for _, retried := range []bool{false, true} {
		h, logs := openDebugHarness(t, func(c *Config) {
			c.Dedup = partition.Config{DedupWindowMax: 4, ProducersMax: 100}
			c.Mutations.DeadLetterTooOldRetried = retried
		})
		h.declare("t", 1)
		for range 6 {
			h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("poison")})
		}
		s := newSink()
		sub, _ := h.node.Subscribe("t", "g", GroupOptions{AckWaitMs: 1000, MaxDeliver: 1}, s)
		sub.AddCredit(10)
		msgs := s.waitFor(t, 6)
		for _, m := range msgs[1:] {
			nackOn(t, h.node, "t", "g", m)
		}
		eventually(t, "seqs 2-6 leave the group", func() bool {
			h.sync("t", "g")
			return len(deadLetters(t, h.node, dlqTopicName("g", "t"), 6)) == 1
		})
		h.nowMs.Add(1001) // seq 1's ack wait ends: it dies last
		if retried {
			eventually(t, "seq 1's dead letter refused", func() bool {
				h.sync("t", "g")
				return logs.count("PRODUCER_SEQ_TOO_OLD") > 0
			})
			if copies := len(deadLetters(t, h.node, dlqTopicName("g", "t"), 1)); copies != 0 {
				t.Fatalf("with TOO_OLD retried: %d copies of seq 1", copies)
			}
			continue
		}
		eventually(t, "seq 1 leaves the group", func() bool {
			h.sync("t", "g")
			return groupOf(h.node, "g", "t").floors[0].Load() == 7
		})
		if copies := len(deadLetters(t, h.node, dlqTopicName("g", "t"), 1)); copies != 1 || logs.count("below the dead-letter topic's dedup window") != 1 {
			t.Fatalf("%d copies of seq 1, want 1, said once:\n%s", copies, logs.String())
		}
	}
}
