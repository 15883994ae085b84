package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// `nereus topic delete` against a real process: the topic's directory is
// gone from the disk, publishes fail with "was deleted", a second delete
// and a delete of an internal topic fail, and the name created again is
// incarnation 2 (topic list) with an empty log — across a kill -9 too.
func TestCLITopicDelete(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	data, srv, run := startInsecureServe(t)
	must := mustRunner(t, run)
	incarnation := func() uint64 {
		t.Helper()
		var topic struct {
			Name        string `json:"name"`
			Incarnation uint64 `json:"incarnation"`
		}
		if err := json.Unmarshal([]byte(must("topic", "list", "orders", "--json")), &topic); err != nil || topic.Name != "orders" {
			t.Fatalf("topic list --json: %v %+v", err, topic)
		}
		return topic.Incarnation
	}
	must("topic", "create", "orders")
	first := must("pub", "orders", "--producer-id", "9", "--seq", "1", "--json", "a")
	must("pub", "orders", "--json", "b")
	if inc := incarnation(); inc != 1 {
		t.Fatalf("first incarnation %d", inc)
	}
	if _, err := os.Stat(filepath.Join(data, "topics", "orders")); err != nil {
		t.Fatalf("no topic directory before the delete: %v", err)
	}
	if out := must("topic", "delete", "orders"); !strings.Contains(out, "deleted topic orders (incarnation 1)") {
		t.Fatalf("topic delete printed %q", out)
	}
	if _, err := os.Stat(filepath.Join(data, "topics", "orders")); !os.IsNotExist(err) {
		t.Fatalf("topic directory after the delete: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pub", "orders", "x"}, `topic "orders" was deleted (incarnation 1)`},
		{[]string{"topic", "delete", "orders"}, `was deleted`},
		{[]string{"topic", "delete", "__sched"}, `reserved for Nereus`},
		{[]string{"topic", "list", "orders"}, `no such topic: orders`},
	} {
		if out, stderr, err := run(c.args...); err == nil || !strings.Contains(stderr, c.want) {
			t.Fatalf("nereus %v: exit %v, want a failure saying %q\n%s%s", c.args, err, c.want, out, stderr)
		}
	}
	must("topic", "create", "orders")
	if inc := incarnation(); inc != 2 {
		t.Fatalf("re-created incarnation %d", inc)
	}
	again := must("pub", "orders", "--producer-id", "9", "--seq", "1", "--json", "a")
	if again != first {
		t.Fatalf("producer 9 seq 1 in incarnation 2: %s, want as in 1: %s", again, first)
	}
	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	if inc := incarnation(); inc != 2 {
		t.Fatalf("incarnation after kill -9: %d", inc)
	}
	if out := must("topic", "list"); !strings.Contains(out, "INCARNATION") {
		t.Fatalf("topic list table lacks the incarnation:\n%s", out)
	}
}

// Three processes: `topic update` and `topic delete` given every node go
// to the metadata leader; every node's directories of the topic go; the name created
// again (with another partition count) is incarnation 2 on every node.
func TestClusterCLITopicDelete(t *testing.T) {
	rc := startRealCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := rc.dialWithTopic(ctx, client.TopicConfig{Name: "orders", Partitions: 3, Replicas: 3})
	defer c.Close()
	p, err := c.NewProducer(client.ProducerOptions{Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(ctx, client.Message{Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	servers := strings.Join(rc.addrs(), ",")
	run := func(args ...string) (string, error) {
		cmd := exec.Command(nereusBinary(t), append(args, "--server", servers)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// An update given every node goes to the metadata leader too, and
	// every node then lists the topic with it.
	if out, err := run("topic", "update", "orders", "--retention", "1h"); err != nil || !strings.Contains(out, "retention 1h0m0s") {
		t.Fatalf("topic update: %v\n%s", err, out)
	}
	for _, addr := range rc.addrs() {
		for {
			out, err := exec.Command(nereusBinary(t), "topic", "list", "orders", "--json", "--server", addr).Output()
			if err == nil && strings.Contains(string(out), `"retention_ms":3600000`) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("topic list at %s never showed the update: %v\n%s", addr, err, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if out, err := run("topic", "delete", "orders"); err != nil || !strings.Contains(out, "incarnation 1") {
		t.Fatalf("topic delete: %v\n%s", err, out)
	}
	for _, id := range rc.ids {
		dir := filepath.Join(rc.dir, id, "topics", "orders")
		for {
			if _, err := os.Stat(dir); os.IsNotExist(err) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s still exists", dir)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if out, err := run("topic", "create", "orders", "--partitions", "2", "--replicas", "3"); err != nil {
		t.Fatalf("topic create again: %v\n%s", err, out)
	}
	for !rc.everyNodeKnows(ctx, "orders") {
		if ctx.Err() != nil {
			t.Fatal("the re-created topic never reached every node")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, addr := range rc.addrs() {
		cmd := exec.Command(nereusBinary(t), "topic", "list", "orders", "--json", "--server", addr)
		out, err := cmd.Output()
		if err != nil || !strings.Contains(string(out), `"incarnation":2`) || !strings.Contains(string(out), `"partitions":2`) {
			t.Fatalf("topic list at %s: %v\n%s", addr, err, out)
		}
	}
}
