package node

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// diskTree lists every path under dir.
func diskTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		out = append(out, p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func wantInvalidArgument(t *testing.T, what string, err error) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeInvalidArgument {
		t.Errorf("%s: err = %v, want INVALID_ARGUMENT", what, err)
	}
}

// Every name a client sends is checked at the node boundary: `.`, `..` and
// `__`-names are refused for topics and groups, and a client may neither
// declare nor publish into a dead-letter topic. Each refusal is
// INVALID_ARGUMENT and leaves the data directory, on a real disk, as it was
// (before the check, `..` wrote into the data directory's own folders).
func TestRefusedNamesCreateNothingOnDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	n, err := Open(Config{DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	before := diskTree(t, dir)
	publish := func(topic string) error {
		ch := make(chan *wire.Error, 1)
		n.Publish(&wire.Pub{Topic: topic, Partition: wire.PartitionAuto, Value: []byte("v")},
			func(_ wire.PubOK, err *wire.Error) { ch <- err })
		select {
		case err := <-ch:
			if err == nil {
				return nil
			}
			return err
		case <-time.After(waitMax):
			t.Fatal("publish: no reply")
			return nil
		}
	}
	ack := func(topic, group string) error {
		ch := make(chan *wire.Error, 1)
		n.Ack(topic, group, nil, func(_ []wire.Code, err *wire.Error) { ch <- err })
		if err := <-ch; err != nil {
			return err
		}
		return nil
	}
	for _, name := range []string{".", "..", "__meta", "__x", "dlq.g.t"} {
		_, err := n.Declare(wire.TopicConfig{Name: name, Partitions: 1})
		wantInvalidArgument(t, "declare "+name, err)
		wantInvalidArgument(t, "publish to "+name, publish(name))
	}
	for _, name := range []string{".", "..", "__meta", "__x"} {
		_, err := n.Subscribe("t", name, GroupOptions{}, newSink())
		wantInvalidArgument(t, "subscribe group "+name, err)
		_, err = n.Subscribe(name, "g", GroupOptions{}, newSink())
		wantInvalidArgument(t, "subscribe topic "+name, err)
		_, err = n.Subscribe(topicsFile, name, GroupOptions{}, newSink())
		wantInvalidArgument(t, "subscribe topics.json group "+name, err)
		wantInvalidArgument(t, "ack group "+name, ack("t", name))
		wantInvalidArgument(t, "ack topic "+name, ack(name, "g"))
	}
	if after := diskTree(t, dir); !slices.Equal(before, after) {
		t.Fatalf("refused names changed the data directory:\nbefore %v\nafter  %v", before, after)
	}
	if got := n.Metadata(nil); len(got) != 1 || got[0].Config.Name != "t" {
		t.Fatalf("topics after refusals: %+v", got)
	}
}

// A dead-letter topic is the group machinery's: once it exists a client can
// consume it (TestAckFencingRedeliveryAndDeadLetter) but still neither
// publish into it nor declare it.
func TestClientCannotWriteAnExistingDeadLetterTopic(t *testing.T) {
	h := newHarness(t)
	dlq := dlqTopicName("g", "t")
	if _, err := h.node.declare(wire.TopicConfig{Name: dlq, Partitions: 1}); err != nil {
		t.Fatalf("internal declare of %s: %v", dlq, err)
	}
	_, err := h.node.Declare(wire.TopicConfig{Name: dlq, Partitions: 1})
	wantInvalidArgument(t, "declare", err)
	_, err = h.publish(&wire.Pub{Topic: dlq, Partition: 0, Value: []byte("forged")})
	wantInvalidArgument(t, "publish", err)
	if info := h.node.Metadata([]string{dlq}); len(info) != 1 || info[0].Partitions[0].CommitSeq != 0 {
		t.Fatalf("dead-letter topic after refused writes: %+v", info)
	}
}

// In a cluster a `__meta` topic would share the metadata log's replica
// group on the peer transport (every later DECLARE then failed with
// QUORUM_LOST). Every node refuses it, and so does the metadata leader when
// a DECLARE reaches it through forwarding; DECLAREs keep working after, and
// the group machinery's dead-letter topics still pass the leader's decision.
func TestClusterRefusesReservedTopicNames(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 3})
	// clusterDeclare retries while the metadata leadership is unsettled.
	clusterDeclare := func(n *Node, cfg wire.TopicConfig) error {
		deadline := time.Now().Add(waitMax)
		for {
			_, err := n.cluster.Declare(cfg)
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != wire.CodeUnavailable || time.Now().After(deadline) {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for id, n := range tc.nodes {
		for _, name := range []string{"__meta", "..", "dlq.g.orders"} {
			_, err := n.Declare(wire.TopicConfig{Name: name, Partitions: 1, Replicas: 3})
			wantInvalidArgument(t, id+": declare "+name, err)
		}
		// Past the node's check: on the leader, or forwarded to it.
		wantInvalidArgument(t, id+": metadata decision on __meta", clusterDeclare(n, wire.TopicConfig{Name: "__meta", Partitions: 1, Replicas: 3}))
	}
	tc.declare("n2", wire.TopicConfig{Name: "after", Partitions: 1, Replicas: 3})
	for id := range tc.nodes {
		if err := clusterDeclare(tc.nodes[id], wire.TopicConfig{Name: "dlq.g.orders", Partitions: 1, Replicas: 1}); err != nil {
			t.Fatalf("%s: internal declare of a dead-letter topic: %v", id, err)
		}
	}
	tc.waitKnown("dlq.g.orders")
	for id, n := range tc.nodes {
		if got := n.Metadata([]string{"__meta", ".."}); len(got) != 0 {
			t.Fatalf("%s knows %+v", id, got)
		}
	}
}

// A `__meta` topic applied before names were checked is not started when
// the node reopens (its replica group would answer for the metadata log),
// and the cluster keeps declaring.
func TestClusterDoesNotStartAReservedTopicFromOldMetadata(t *testing.T) {
	tc := newTestCluster(t, 1)
	tc.declare("n1", wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 1})
	tc.stop("n1")
	file := "/n1/" + cluster.MetaStateFile
	b, err := storage.ReadFileAtomic(tc.fs, file)
	if err != nil {
		t.Fatal(err)
	}
	st := meta.New()
	if err := json.Unmarshal(b, st); err != nil {
		t.Fatal(err)
	}
	old := st.Topics["orders"]
	old.Config.Name = meta.MetaTopic
	st.Topics[meta.MetaTopic] = old
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := storage.WriteFileAtomic(tc.fs, file, b); err != nil {
		t.Fatal(err)
	}
	tc.start("n1")
	if got := tc.nodes["n1"].Metadata(nil); len(got) != 1 || got[0].Config.Name != "orders" {
		t.Fatalf("topics after reopening: %+v", got)
	}
	tc.declare("n1", wire.TopicConfig{Name: "after", Partitions: 1, Replicas: 1})
}
