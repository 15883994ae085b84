package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// TestCorruptionAndRepairThroughTheCLI is the runbook of docs/OPERATIONS.md
// ("Corruption and repair") against a real process: a flipped byte in the
// middle of one partition's log makes that partition corrupt (topic list
// --json, /readyz, DATA_CORRUPT on publish) while its neighbour works;
// `nereus repair` is refused while the node runs; with the node stopped,
// `--dry-run` changes nothing, `--salvage` drops only the damaged batch,
// and after a restart the partition takes publishes above its old end and
// a consumer gets every surviving record.
func TestCorruptionAndRepairThroughTheCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	srv := startServe(t, "--data", data, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--insecure-no-auth", "--log-level", "warn")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+srv.addr)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := cli("topic", "create", "t", "--partitions", "2"); err != nil {
		t.Fatalf("topic create: %v\n%s", err, out)
	}
	c, err := client.Dial(ctx, client.Options{Servers: []string{srv.addr}})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := c.NewProducer(client.ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	var last uint64
	for i := 0; i < n; i++ { // one at a time: each batch synced before the next
		r, err := prod.Publish(ctx, client.Message{Value: []byte(fmt.Sprintf("v%03d", i)), TargetPartition: client.PartitionOf(1)})
		if err != nil {
			t.Fatal(err)
		}
		last = r.Seq
	}
	c.Close()
	srv.cmd.Process.Signal(syscall.SIGKILL)
	srv.cmd.Wait()

	segment := filepath.Join(data, "topics", "t", "1", "00000000000000000001.log")
	raw, err := os.ReadFile(segment)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(bytes.TrimRight(raw, "\x00"))/2] ^= 0x08
	if err := os.WriteFile(segment, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	out, err := cli("topic", "list", "--json")
	if err != nil || !strings.Contains(out, `"partition":1,`) {
		t.Fatalf("topic list: %v\n%s", err, out)
	}
	var listed topicJSON
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &listed); err != nil {
		t.Fatalf("topic list --json: %v\n%s", err, out)
	}
	if listed.State[0].State != "ok" || listed.State[1].State != "corrupt" || listed.State[1].CommitSeq != last {
		t.Fatalf("partition states %+v, want 0 ok and 1 corrupt at commit %d", listed.State, last)
	}
	resp, err := http.Get("http://" + srv.httpAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "t/1:") {
		t.Fatalf("/readyz: %d %s", resp.StatusCode, body)
	}
	c, err = client.Dial(ctx, client.Options{Servers: []string{srv.addr}})
	if err != nil {
		t.Fatal(err)
	}
	prod, err = c.NewProducer(client.ProducerOptions{Topic: "t", DeliveryTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prod.Publish(ctx, client.Message{Value: []byte("x"), TargetPartition: client.PartitionOf(1)}); !errors.Is(err, client.ErrDataCorrupt) {
		t.Fatalf("publish to the corrupt partition: %v, want DATA_CORRUPT", err)
	}
	if _, err := prod.Publish(ctx, client.Message{Value: []byte("y"), TargetPartition: client.PartitionOf(0)}); err != nil {
		t.Fatalf("publish to the healthy partition: %v", err)
	}
	c.Close()
	before, _ := os.ReadFile(segment)
	if out, err := cli("repair", "--data", data, "--salvage"); err == nil || !strings.Contains(out, "data directory "+data+" is in use") {
		t.Fatalf("repair while the node runs: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(segment); !bytes.Equal(before, after) {
		t.Fatal("a repair refused while the node runs changed the segment")
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	srv.cmd.Wait()

	out, err = cli("repair", "--data", data, "--salvage", "--dry-run", "--json")
	if err != nil {
		t.Fatalf("repair --dry-run: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(segment); !bytes.Equal(before, after) {
		t.Fatal("a dry run changed the segment")
	}
	out, err = cli("repair", "--data", data, "--salvage", "--json")
	if err != nil {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	var dropped uint64
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r repairJSON
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("repair --json line %q: %v", line, err)
		}
		if r.Partition != nil && *r.Partition == 1 {
			dropped = r.DroppedSeqs
			if len(r.Damage) != 1 || r.NextSeq != last+1 {
				t.Fatalf("repair of t/1: %+v", r)
			}
		} else if len(r.Damage) > 0 {
			t.Fatalf("repair found damage elsewhere: %+v", r)
		}
	}
	if dropped == 0 || dropped >= n {
		t.Fatalf("repair dropped %d seqs of %d", dropped, n)
	}

	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	c, err = client.Dial(ctx, client.Options{Servers: []string{srv.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod, err = c.NewProducer(client.ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := prod.Publish(ctx, client.Message{Value: []byte("after"), TargetPartition: client.PartitionOf(1)})
	if err != nil || r.Seq != last+1 {
		t.Fatalf("publish after repair: seq %d, %v; want %d", r.Seq, err, last+1)
	}
	cons, err := c.Subscribe(ctx, "t", "check", client.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	want := int(n-dropped) + 1 + 1 // survivors and "after" on 1, "y" on 0
	for got := 0; got < want; got++ {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := cons.Next(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", got, want, err)
		}
		m.Ack()
	}
}

// TestClusterMemberAloneRepairThroughTheCLI is the cluster runbook of
// docs/OPERATIONS.md ("Corruption and repair") against three real
// processes: a flipped byte in a one-replica partition's log no longer
// keeps its node (which also holds a replica of a three-replica topic)
// from starting; the damaged topic answers DATA_CORRUPT there; `nereus
// repair --salvage` on the
// stopped node's data directory repairs that log, and after a restart the
// topic takes publishes and a consumer gets every surviving message.
func TestClusterMemberAloneRepairThroughTheCLI(t *testing.T) {
	rc := startRealCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := rc.dialWithTopic(ctx, client.TopicConfig{Name: "alone", Partitions: 1, Replicas: 1})
	if _, err := c.DeclareTopic(ctx, client.TopicConfig{Name: "shared", Partitions: 1, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	prod, err := c.NewProducer(client.ProducerOptions{Topic: "alone"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	for i := range n { // one at a time: each batch synced before the next
		if _, err := prod.Publish(ctx, client.Message{Value: fmt.Appendf(nil, "v%03d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := leaderOf(ctx, c, "alone", 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	holder := rc.byAddr(addr)
	rc.kill(holder)
	data := filepath.Join(rc.dir, holder)
	segment := filepath.Join(data, "topics", "alone", "0", "00000000000000000001.log")
	raw, err := os.ReadFile(segment)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(bytes.TrimRight(raw, "\x00"))/2] ^= 0x10
	if err := os.WriteFile(segment, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := rc.procs[holder].restart(); err != nil {
		t.Fatalf("the node with a damaged one-replica partition did not start: %v", err)
	}
	single, err := client.Dial(ctx, client.Options{Servers: []string{rc.procs[holder].addr}, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := single.NewProducer(client.ProducerOptions{Topic: "alone", DeliveryTimeout: 5 * time.Second})
	if err == nil {
		_, err = p2.Publish(ctx, client.Message{Value: []byte("refused")})
	}
	if !errors.Is(err, client.ErrDataCorrupt) {
		t.Fatalf("publish to the damaged topic: %v, want DATA_CORRUPT", err)
	}
	single.Close()
	rc.kill(holder)

	out, err := exec.CommandContext(ctx, nereusBinary(t), "repair", "--data", data, "--salvage", "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	var r repairJSON
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil || r.Topic != "alone" || len(r.Damage) != 1 || r.DroppedSeqs == 0 {
		t.Fatalf("repair --json: %v\n%s", err, out)
	}
	if err := rc.procs[holder].restart(); err != nil {
		t.Fatal(err)
	}
	c = rc.dialWithTopic(ctx, client.TopicConfig{Name: "alone", Partitions: 1, Replicas: 1})
	defer c.Close()
	prod, err = c.NewProducer(client.ProducerOptions{Topic: "alone", DeliveryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	after, err := prod.Publish(ctx, client.Message{Value: []byte("after")})
	if err != nil || after.Seq < r.NextSeq {
		t.Fatalf("publish after the repair: %+v, %v; want a seq from %d on", after, err, r.NextSeq)
	}
	cons, err := c.Subscribe(ctx, "alone", "verify", client.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	want := n + 1 - int(r.DroppedSeqs)
	for got := 0; got < want; got++ {
		m, err := cons.Next(ctx)
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", got, want, err)
		}
		m.Ack()
	}
}
