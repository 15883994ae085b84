package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// TestClusterBitFlipOnEachNodeKeepsEveryAckedMessage runs three real
// processes and, for each node in turn, kills it, flips a byte in the
// middle of its copy of the partition log and restarts it, publishing
// between the rounds. A damaged replica drops the damaged range, stays out
// of elections until it has caught up, and rebuilds it from a healthy
// one: every acknowledged message is then read back exactly once, and
// the three replicas hold the same log.
func TestClusterBitFlipOnEachNodeKeepsEveryAckedMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	rc := startRealCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := rc.dialWithTopic(ctx, client.TopicConfig{Name: "flip", Partitions: 1, Replicas: 3})
	defer c.Close()
	prod, err := c.NewProducer(client.ProducerOptions{Topic: "flip", DeliveryTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	acked := map[string]position{}
	var last uint64
	publish := func(round string, n int) {
		for i := 0; i < n; i++ {
			value := fmt.Sprintf("%s-%04d", round, i)
			r, err := prod.Publish(ctx, client.Message{Value: []byte(value)})
			if err != nil {
				t.Fatalf("publish %s: %v", value, err)
			}
			acked[value] = position{r.Partition, r.Seq}
			last = max(last, r.Seq)
		}
	}
	publish("before", 300)
	for _, id := range rc.ids {
		waitInSync(ctx, t, rc, map[int]uint64{0: last})
		rc.kill(id)
		segment := filepath.Join(rc.dir, id, "topics", "flip", "0", "00000000000000000001.log")
		data, err := os.ReadFile(segment)
		if err != nil {
			t.Fatal(err)
		}
		off := len(bytes.TrimRight(data, "\x00")) / 2
		data[off] ^= 0x10
		if err := os.WriteFile(segment, data, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: killed, flipped a bit at offset %d of %d, restarting", id, off, len(data))
		if err := rc.procs[id].restart(); err != nil {
			t.Fatal(err)
		}
		publish("after-"+id, 100)
	}
	waitInSync(ctx, t, rc, map[int]uint64{0: last})
	cons, err := c.Subscribe(ctx, "flip", "verify", client.ConsumerOptions{Credit: 512})
	if err != nil {
		t.Fatal(err)
	}
	readBackExactlyOnce(ctx, t, cons, acked)
	cons.Close()
	for _, id := range rc.ids {
		rc.kill(id)
	}
	var ref []string
	for _, id := range rc.ids {
		got := readReplica(t, filepath.Join(rc.dir, id, "topics", "flip", "0"), last)
		if ref != nil && fmt.Sprint(got) != fmt.Sprint(ref) {
			t.Fatalf("replica %s disagrees:\n%v\n%v", id, got, ref)
		}
		ref = got
	}
}
