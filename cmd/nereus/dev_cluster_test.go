package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freeDevBase finds a client port p with p..p+2 and the peer ports
// p+1000..p+1002 free on loopback (dev --nodes 3 uses them).
func freeDevBase(t *testing.T) int {
	t.Helper()
	for attempt := 0; attempt < 50; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p+1002 > 65535 {
			continue
		}
		ok := true
		for _, q := range []int{p, p + 1, p + 2, p + 1000, p + 1001, p + 1002} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", q))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return p
		}
	}
	t.Skip("no free block of loopback ports")
	return 0
}

// TestDevClusterAndClusterStatus runs `nereus dev --nodes 3` and drives it
// with the CLI: a replicated topic, a publish through the seed list, and
// `cluster status --json` naming one leader with every replica InSync.
func TestDevClusterAndClusterStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	base := freeDevBase(t)
	dev := exec.Command(nereusBinary(t), "dev", "--nodes", "3", "--data", t.TempDir(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", base), "--http", "", "--log-level", "warn")
	logs, _ := os.Create(filepath.Join(t.TempDir(), "dev.log"))
	dev.Stderr = logs
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dev.Process.Signal(syscall.SIGTERM)
		dev.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("dev log tail:\n%s", tail(string(b), 3000))
		}
	})
	ready := make(chan int, 1)
	go func() {
		sc, n := bufio.NewScanner(stdout), 0
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "nereus ready") {
				if n++; n == 3 {
					ready <- n
				}
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("dev --nodes 3 not ready")
	}
	servers := fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", base, base+1, base+2)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+servers)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("nereus %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("topic", "create", "dev3", "--replicas", "3", "--ack", "all")
	run("pub", "dev3", "hello")
	// The replicas report InSync once the leader has heard them ack; until
	// then the cluster is degraded: exit status 2.
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, code := clusterStatus(t, servers)
		var leaders, inSync, up int
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var obj struct {
				Up       bool   `json:"up"`
				Topic    string `json:"topic"`
				Leader   string `json:"leader"`
				Ack      string `json:"ack"`
				Replicas []struct {
					State string `json:"state"`
				} `json:"replicas"`
			}
			if err := json.Unmarshal([]byte(line), &obj); err != nil {
				t.Fatalf("cluster status line %q: %v", line, err)
			}
			if obj.Up {
				up++
			}
			if obj.Topic == "dev3" && obj.Leader != "" && obj.Ack == "all" {
				leaders++
				for _, r := range obj.Replicas {
					if r.State == "InSync" {
						inSync++
					}
				}
			}
		}
		if up == 3 && leaders == 1 && inSync == 3 {
			if code != 0 {
				t.Fatalf("cluster status exited %d for a healthy cluster:\n%s", code, out)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster status never showed 3 nodes up and 3 replicas InSync:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clusterStatus runs `nereus cluster status --json` against servers and
// returns its output and exit status (0 healthy, 2 degraded; anything else
// fails the test).
func clusterStatus(t *testing.T, servers string) (string, int) {
	t.Helper()
	cmd := exec.Command(nereusBinary(t), "cluster", "status", "--json", "--server", servers)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0
	case errors.As(err, &exit) && exit.ExitCode() == exitDegraded:
		if !strings.Contains(stderr.String(), "cluster degraded: ") {
			t.Fatalf("cluster status exited %d without saying why: %q", exitDegraded, stderr.String())
		}
		return stdout.String(), exitDegraded
	}
	t.Fatalf("cluster status: %v\n%s%s", err, stdout.String(), stderr.String())
	return "", 0
}
