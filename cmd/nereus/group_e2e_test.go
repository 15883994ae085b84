package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// memberProcess is one `nereus sub --member` process.
type memberProcess struct {
	id       string
	cmd      *exec.Cmd
	out, err string // files
}

func startMember(t *testing.T, dir, servers, topic, id string) *memberProcess {
	t.Helper()
	m := &memberProcess{id: id, out: filepath.Join(dir, id+".out"), err: filepath.Join(dir, id+".err")}
	stdout, err := os.Create(m.out)
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(m.err)
	if err != nil {
		t.Fatal(err)
	}
	m.cmd = exec.Command(nereusBinary(t), "sub", topic, "--group", "workers", "--member", id, "--json",
		"--timeout", "60s", "--session-timeout", "2s", "--server", servers)
	m.cmd.Stdout, m.cmd.Stderr = stdout, stderr
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if m.cmd.ProcessState == nil {
			m.cmd.Process.Signal(syscall.SIGKILL)
			m.cmd.Wait()
		}
	})
	return m
}

func (m *memberProcess) kill() {
	m.cmd.Process.Signal(syscall.SIGKILL)
	m.cmd.Wait()
}

// values returns the values the member printed.
func (m *memberProcess) values(t *testing.T) []string {
	f, err := os.Open(m.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var msg struct {
			Value string `json:"value"`
		}
		if json.Unmarshal(sc.Bytes(), &msg) == nil {
			out = append(out, msg.Value)
		}
	}
	return out
}

// lineOf returns the line the member printed for the message of value v
// ("" if none).
func (m *memberProcess) lineOf(t *testing.T, v string) string {
	b, err := os.ReadFile(m.out)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, fmt.Sprintf("%q", v)) {
			return l
		}
	}
	return ""
}

// notices returns the assignment lines the member printed on stderr.
func (m *memberProcess) notices(t *testing.T) []string {
	b, err := os.ReadFile(m.err)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "assigned ") || strings.HasPrefix(l, "revoked ") {
			out = append(out, l)
		}
	}
	return out
}

// holding returns, per member id, the partitions it holds, once the group
// is stable (no notice pending).
func holding(ctx context.Context, c *client.Client) (map[string][]int, bool) {
	gs, err := c.Groups(ctx, "workers")
	if err != nil || len(gs) != 1 || len(gs[0].Pending) > 0 {
		return nil, false
	}
	out := map[string][]int{}
	for _, m := range gs[0].Members {
		for _, p := range m.Partitions {
			out[m.ID] = append(out[m.ID], p.Partition)
		}
		slices.Sort(out[m.ID])
	}
	return out, true
}

func waitHolding(ctx context.Context, t *testing.T, c *client.Client, what string, ok func(map[string][]int) bool) map[string][]int {
	t.Helper()
	for {
		h, stable := holding(ctx, c)
		if stable && ok(h) {
			return h
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: never happened (last %v)", what, h)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClusterGroupMembersAcrossProcesses: three `nereus serve` nodes, a
// 6-partition R=3 topic ("work") and a 6-partition R=1 one ("spread": each
// node holds two partitions, no copies), and six `nereus sub --member`
// processes of one group, three per topic. Each partition gets exactly
// one owner, two each; every partition is delivered by its own leader.
// A member killed -9 loses its partitions to the others of its topic
// within its session timeout while they — and the other topic's members —
// keep theirs (their notices show only ASSIGNs). A broker node killed -9
// (the leader of work's partition 0): the R=3 partitions it led move to
// new leaders and their members follow; its R=1 partitions wait for its
// restart. Every published message is consumed, and no message reaches
// two members except those the killed member had taken (the documented
// redelivery).
func TestClusterGroupMembersAcrossProcesses(t *testing.T) {
	rc := startRealCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := rc.dialWithTopic(ctx, client.TopicConfig{Name: "work", Partitions: 6, Replicas: 3})
	defer c.Close()
	if _, err := c.DeclareTopic(ctx, client.TopicConfig{Name: "spread", Partitions: 6, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	publisher := func(topic string, id uint64) func(from, to int) {
		prod, err := c.NewProducer(client.ProducerOptions{Topic: topic, ProducerID: id})
		if err != nil {
			t.Fatal(err)
		}
		return func(from, to int) {
			for i := from; i < to; i++ {
				p := i % 6
				for {
					_, err := prod.Publish(ctx, client.Message{TargetPartition: &p, Value: fmt.Appendf(nil, "%s%d", topic, i)})
					if err == nil {
						break
					}
					if !client.IsRetryable(err) || ctx.Err() != nil {
						t.Fatalf("publish %s%d: %v", topic, i, err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	}
	publish, publishSpread := publisher("work", 77), publisher("spread", 78)
	publish(0, 300)
	publishSpread(0, 300)
	dir := t.TempDir()
	servers := strings.Join(rc.addrs(), ",")
	members := map[string]*memberProcess{}
	for _, id := range []string{"w1", "w2", "w3"} {
		members[id] = startMember(t, dir, servers, "work", id)
	}
	for _, id := range []string{"s1", "s2", "s3"} {
		members[id] = startMember(t, dir, servers, "spread", id)
	}
	even := waitHolding(ctx, t, c, "two partitions for each of six members", func(h map[string][]int) bool {
		if len(h) != 6 {
			return false
		}
		for _, ps := range h {
			if len(ps) != 2 {
				return false
			}
		}
		return true
	})
	t.Logf("assignment: %v", even)
	heard := map[string]int{}
	for id, m := range members {
		heard[id] = len(m.notices(t))
	}

	// Kill -9 a member: its partitions move to the others, who keep theirs.
	killedAt := time.Now()
	members["w3"].kill()
	after := waitHolding(ctx, t, c, "w3's partitions with the others", func(h map[string][]int) bool {
		return len(h) == 5 && len(h["w1"]) == 3 && len(h["w2"]) == 3
	})
	t.Logf("after w3 was killed: %v, %v later (session timeout 2s)", after, time.Since(killedAt).Round(time.Millisecond))
	for _, id := range []string{"w1", "w2", "s1", "s2", "s3"} {
		for _, p := range even[id] {
			if !slices.Contains(after[id], p) {
				t.Fatalf("%s lost partition %d though it stayed (%v -> %v)", id, p, even[id], after[id])
			}
		}
	}

	// Kill -9 the leader of work's partition 0: work's partitions it led
	// fail over; spread's partitions on it wait for its restart.
	leader, err := leaderOf(ctx, c, "work", 0)
	if err != nil {
		t.Fatal(err)
	}
	victim := rc.byAddr(leader)
	if victim == "" {
		t.Fatalf("no node at %s", leader)
	}
	rc.kill(victim)
	t.Logf("killed %s (work's partition 0's leader)", victim)
	publish(300, 600)
	if err := rc.procs[victim].restart(); err != nil {
		t.Fatal(err)
	}
	publishSpread(300, 600)

	want := map[string]bool{}
	for i := range 600 {
		want[fmt.Sprintf("work%d", i)] = true
		want[fmt.Sprintf("spread%d", i)] = true
	}
	for {
		got := map[string]bool{}
		for _, m := range members {
			for _, v := range m.values(t) {
				got[v] = true
			}
		}
		missing := 0
		for v := range want {
			if !got[v] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of 1200 messages never consumed", missing)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// No message went to two members, unless w3 (killed) had taken it.
	seenBy := map[string]string{}
	for _, id := range []string{"w1", "w2", "s1", "s2", "s3"} {
		for _, v := range members[id].values(t) {
			if other, ok := seenBy[v]; ok && other != id {
				// Each member's line (delivery id and count) tells a
				// redelivery after a hand-off from two deliveries at once.
				t.Errorf("%s consumed by %s (%s) and %s (%s)", v, other, members[other].lineOf(t, v), id, members[id].lineOf(t, v))
			}
			seenBy[v] = id
		}
	}
	// The group's description gathers every partition's floor from its
	// leader: all twelve, nothing left to consume once the acks are in.
	var last []client.GroupInfo
	for {
		gs, err := c.Groups(ctx, "workers")
		if err == nil {
			last = gs
		}
		done := err == nil && len(gs) == 1 && len(gs[0].Partitions) == 12
		for i := 0; done && i < 12; i++ {
			done = gs[0].Partitions[i].Lag == 0
		}
		if done {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the group's description never showed 12 partitions without lag: %+v", last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, id := range []string{"w1", "w2", "s1", "s2", "s3"} {
		all := members[id].notices(t)
		for _, n := range all[heard[id]:] {
			if strings.HasPrefix(n, "revoked") {
				t.Errorf("%s, which kept its partitions, heard %q after the group settled", id, n)
			}
		}
		t.Logf("%s notices: %v (the first %d before the group settled)", id, all, heard[id])
	}
}
