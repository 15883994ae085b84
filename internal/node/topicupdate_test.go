package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// updateTopic updates a topic's retention on n and waits for the answer.
func updateTopic(t *testing.T, n *Node, u wire.TopicUpdate) (wire.TopicConfig, uint64, error) {
	t.Helper()
	type res struct {
		cfg wire.TopicConfig
		inc uint64
		err error
	}
	ch := make(chan res, 1)
	n.UpdateTopic(u, func(cfg wire.TopicConfig, inc uint64, err error) { ch <- res{cfg, inc, err} })
	select {
	case r := <-ch:
		return r.cfg, r.inc, r.err
	case <-time.After(waitMax):
		t.Fatal("update: no reply")
		return wire.TopicConfig{}, 0, nil
	}
}

func retentionAge(name string, ms int64) wire.TopicUpdate {
	return wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: name}, Set: wire.SetRetentionMs, RetentionMs: ms}
}

// A single node's topic declared without retention keeps its records
// until an update gives it one; then its partitions delete what the new
// retention no longer keeps, at their next retention check, and the
// setting survives a restart (topics.json): a DECLARE must now match it.
// Bad updates get clear, local answers and change nothing.
func TestTopicUpdateChangesRetention(t *testing.T) {
	h, clock := newVirtualHarness(t, func(c *Config) {
		c.RetentionCheckMs = 1000
		c.ScrubBytesPerSecond = -1
	})
	h.declare("t", 1)
	var last wire.PubOK
	for i := range uint64(10) {
		last = h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: i, Value: fmt.Appendf(nil, "m%d", i)})
	}
	startSeq := func() uint64 { return h.node.Metadata([]string{"t"})[0].Partitions[0].StartSeq }
	for _, tc := range []struct {
		what string
		u    wire.TopicUpdate
		code wire.Code
		text string
	}{
		{"internal", retentionAge(wire.SchedTopic, 1), wire.CodeInvalidArgument, "internal"},
		{"never declared", retentionAge("nope", 1), wire.CodeNotFound, "does not exist"},
		{"another incarnation", wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: "t", Incarnation: 2}, Set: wire.SetRetentionMs, RetentionMs: 1}, wire.CodeNotFound, "incarnation 2"},
		{"sets nothing", wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: "t"}}, wire.CodeInvalidArgument, "sets nothing"},
		{"negative", retentionAge("t", -5), wire.CodeInvalidArgument, "negative"},
	} {
		_, _, err := updateTopic(t, h.node, tc.u)
		wantWireCode(t, tc.what, err, tc.code, tc.text)
	}
	clock.Advance(20 * time.Second) // retention passes run: nothing to delete
	if md := h.node.Metadata([]string{"t"})[0]; md.Config.RetentionMs != 0 || startSeq() != 1 {
		t.Fatalf("before the update: %+v, log start %d", md.Config, startSeq())
	}

	cfg, inc, err := updateTopic(t, h.node, retentionAge("t", 5000))
	if err != nil || cfg.RetentionMs != 5000 || cfg.Partitions != 1 || inc != 1 {
		t.Fatalf("update: %+v incarnation %d, %v", cfg, inc, err)
	}
	if got := h.node.Metadata([]string{"t"})[0].Config; got != cfg {
		t.Fatalf("METADATA after the update: %+v, want %+v", got, cfg)
	}
	advanceUntil(t, clock, time.Second, "the partition deleted the records its new retention lets go", func() bool { return startSeq() > last.Seq })
	if _, _, err := updateTopic(t, h.node, retentionAge("t", 5000)); err != nil {
		t.Fatalf("the same update again: %v", err)
	}
	// Lifted again, it keeps what is written from then on: 20 s later,
	// four times the age the records would have expired at.
	if _, _, err := updateTopic(t, h.node, retentionAge("t", 0)); err != nil {
		t.Fatal(err)
	}
	kept := startSeq()
	for i := range uint64(5) {
		h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: 10 + i, Value: []byte("kept")})
	}
	for range 20 {
		clock.Advance(time.Second)
		time.Sleep(time.Millisecond) // (the partition's goroutine runs its retention checks)
	}
	if s := startSeq(); s != kept {
		t.Fatalf("with retention lifted the log start moved from %d to %d", kept, s)
	}
	if _, _, err := updateTopic(t, h.node, retentionAge("t", 5000)); err != nil {
		t.Fatal(err)
	}

	h.restart()
	if got := h.node.Metadata([]string{"t"})[0].Config; got.RetentionMs != 5000 {
		t.Fatalf("after a restart: %+v, want retention 5000 ms", got)
	}
	if created, err := h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 1, RetentionMs: 5000}); created || err != nil {
		t.Fatalf("a DECLARE with the updated retention: created=%v, %v", created, err)
	}
	_, err = h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 1})
	wantWireCode(t, "a DECLARE with the old retention", err, wire.CodeTopicConflict, "retention_ms=5000")
}

// After a repair rebuilt topics.json (both copies damaged) every topic is
// back at default settings, so a client declaring its topic with its
// retention gets TOPIC_CONFLICT; an update puts the retention back, and
// the client's DECLARE matches again.
func TestTopicUpdateRestoresSettingsAfterARepair(t *testing.T) {
	var logs logBuffer
	h := newCorruptionHarness(t, &logs)
	cfg := wire.TopicConfig{Name: "t", Partitions: 2, RetentionMs: 60_000, RetentionBytes: 1 << 20}
	if _, err := h.node.Declare(cfg); err != nil {
		t.Fatal(err)
	}
	h.node.Close()
	for _, f := range []string{"/data/topics.json", "/data/topics.json" + storage.CopySuffix} {
		if err := h.fs.FlipBit(f, 12, 1); err != nil {
			t.Fatal(err)
		}
	}
	if repaired, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil || len(repaired) == 0 || repaired[0].TopicsRebuilt != 1 {
		t.Fatalf("repair: %+v, %v", repaired, err)
	}
	h.open()
	_, err := h.node.Declare(cfg)
	wantWireCode(t, "a DECLARE with the settings of before the repair", err, wire.CodeTopicConflict, "retention_ms=0")
	got, _, err := updateTopic(t, h.node, wire.TopicUpdate{TopicRef: wire.TopicRef{Topic: "t"}, Set: wire.SetRetentionMs | wire.SetRetentionBytes,
		RetentionMs: cfg.RetentionMs, RetentionBytes: cfg.RetentionBytes})
	if err != nil || got.RetentionMs != cfg.RetentionMs || got.RetentionBytes != cfg.RetentionBytes {
		t.Fatalf("update: %+v, %v", got, err)
	}
	if created, err := h.node.Declare(cfg); created || err != nil {
		t.Fatalf("the client's DECLARE after the update: created=%v, %v", created, err)
	}
}

// Three nodes: an update is decided at the metadata leader only
// (NOT_LEADER elsewhere), reaches every node through the metadata log,
// and every replica of the partition deletes what the new retention no
// longer keeps; a node restarted afterwards holds it (meta.json).
func TestClusterTopicUpdate(t *testing.T) {
	tc := newTestClusterWith(t, 3, func(c *Config) { c.RetentionCheckMs = 20 })
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})
	var last wire.PubOK
	for i := range uint64(20) {
		_, last = tc.publishAnywhere(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 7, ProducerSeq: i, Value: fmt.Appendf(nil, "m%d", i)})
	}
	coord, cn := tc.coordinatorOf()
	var other string
	for id := range tc.nodes {
		if id != coord {
			other = id
			_, _, err := updateTopic(t, tc.nodes[id], retentionAge("t", 200))
			wantWireCode(t, "update at a non-coordinator", err, wire.CodeNotLeader, "metadata leader")
			break
		}
	}
	cfg, inc, err := updateTopic(t, cn, retentionAge("t", 200))
	if err != nil || cfg.RetentionMs != 200 || cfg.Replicas != 3 || inc != 1 {
		t.Fatalf("update: %+v incarnation %d, %v", cfg, inc, err)
	}
	for id, n := range tc.nodes {
		eventually(t, id+" deletes what the updated retention lets go", func() bool {
			md := n.Metadata([]string{"t"})[0]
			return md.Config.RetentionMs == 200 && md.Partitions[0].StartSeq > last.Seq
		})
	}
	tc.stop(other)
	tc.start(other)
	if md := tc.nodes[other].Metadata([]string{"t"}); len(md) != 1 || md[0].Config.RetentionMs != 200 {
		t.Fatalf("%s after a restart: %+v", other, md)
	}
}
