package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// buildBinary compiles the nereus command once per test binary.
var buildOnce struct {
	sync.Once
	path string
	err  error
}

func nereusBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nereus-e2e-bin")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.path = filepath.Join(dir, "nereus")
		out, err := exec.Command("go", "build", "-o", buildOnce.path, ".").CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

// serverProcess is a `nereus serve` child process.
type serverProcess struct {
	t    *testing.T
	bin  string
	addr string // client address the first start reported
	// httpAddr is the HTTP address the last start reported ("" without).
	httpAddr string
	args     []string
	cmd      *exec.Cmd
	logs     *os.File
}

func startServe(t *testing.T, args ...string) *serverProcess {
	t.Helper()
	p := newServe(t, args...)
	p.start()
	return p
}

// newServe prepares a `nereus serve` process (not started) whose log the
// test prints if it fails, and which is killed at the end of the test.
func newServe(t *testing.T, args ...string) *serverProcess {
	t.Helper()
	logs, err := os.Create(filepath.Join(t.TempDir(), "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &serverProcess{t: t, bin: nereusBinary(t), args: args, logs: logs}
	t.Cleanup(func() {
		if p.cmd != nil && p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("server log tail:\n%s", tail(string(b), 3000))
		}
	})
	return p
}

// startServeWithToken runs `nereus serve` on a free loopback port with a
// token file holding token, and returns the client address.
func startServeWithToken(t *testing.T, token string) (string, *serverProcess) {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokenFile, []byte("# test token\n"+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Port 0: the kernel picks a free port (no race with other processes),
	// and restarts reuse the port the first start reported.
	srv := startServe(t, "--data", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--http", "",
		"--token-file", tokenFile, "--log-level", "warn")
	return srv.addr, srv
}

// start launches the process and waits (bounded) for its ready line; it
// fails the test, so it must run on the test goroutine (see restart).
func (p *serverProcess) start() {
	p.t.Helper()
	if err := p.restart(); err != nil {
		p.t.Fatal(err)
	}
}

// restart kills the process with SIGKILL if it runs, then starts it again.
// It returns errors instead of failing the test, so any goroutine may call it.
func (p *serverProcess) restart() error {
	if p.cmd != nil && p.cmd.ProcessState == nil {
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill -9: %w", err)
		}
		p.cmd.Wait()
	}
	cmd := exec.Command(p.bin, append([]string{"serve"}, p.args...)...)
	cmd.Stderr = p.logs
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "nereus ready") {
				for _, field := range strings.Fields(line) {
					if a, ok := strings.CutPrefix(field, "client="); ok {
						p.pinListen(a)
					}
					if a, ok := strings.CutPrefix(field, "http="); ok {
						p.httpAddr = a
					}
				}
				ready <- nil
				for sc.Scan() {
				}
				return
			}
		}
		ready <- fmt.Errorf("server exited before ready: %v", sc.Err())
	}()
	p.cmd = cmd
	select {
	case err := <-ready:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("server not ready within 30s")
	}
}

// pinListen records the address the server reported and makes later
// restarts listen on it, so clients reconnect to the same place.
func (p *serverProcess) pinListen(addr string) {
	p.addr = addr
	for i := 0; i+1 < len(p.args); i++ {
		if p.args[i] == "--listen" {
			p.args[i+1] = addr
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

type position struct {
	partition int
	seq       uint64
}

// TestKillNineKeepsEveryAckedMessage publishes through the SDK while the
// broker is killed with SIGKILL and restarted three times, then reads the
// whole topic back: every acknowledged message is at its acknowledged
// (partition, seq), and exactly once.
func TestKillNineKeepsEveryAckedMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	addr, srv := startServeWithToken(t, "e2e-secret")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Servers: []string{addr}, Token: "e2e-secret", DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DeclareTopic(ctx, client.TopicConfig{Name: "e2e", Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	prod, err := c.NewProducer(client.ProducerOptions{Topic: "e2e", MaxInFlight: 64})
	if err != nil {
		t.Fatal(err)
	}

	const total = 3000
	killAt := map[int]bool{400: true, 1200: true, 2200: true}
	ackedCount := make(chan int, total)
	kills := 0
	var killErr error
	killerDone := make(chan struct{})
	go func() {
		// The killer: SIGKILL when enough acks arrived, restart at once.
		defer close(killerDone)
		for n := range ackedCount {
			if killAt[n] && killErr == nil {
				killErr = srv.restart()
				kills++
			}
		}
	}()
	acked, failures := publishTracked(ctx, t, prod, total, true, ackedCount, nil)
	<-killerDone
	if killErr != nil {
		t.Fatalf("restart during publishing: %v", killErr)
	}
	if kills != len(killAt) {
		t.Fatalf("%d kills happened, want %d", kills, len(killAt))
	}
	if len(failures) > 0 {
		t.Fatalf("%d publishes failed, first: %v", len(failures), failures[0])
	}
	if len(acked) != total {
		t.Fatalf("%d acked, want %d", len(acked), total)
	}

	// One more kill -9 after the last ack, then read everything back.
	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	cons, err := c.Subscribe(ctx, "e2e", "verify", client.ConsumerOptions{Credit: 512})
	if err != nil {
		t.Fatal(err)
	}
	readBackExactlyOnce(ctx, t, cons, acked)
}

// publishTracked publishes total messages "msg-NNNNN" (also as keys when
// keyed) and returns where each acknowledged one landed and the failures.
// After every ack it sends the count so far to progress, which it closes
// once every publish completed; pace, when set, runs after each handoff.
func publishTracked(ctx context.Context, t *testing.T, prod *client.Producer, total int, keyed bool,
	progress chan<- int, pace func(i int)) (map[string]position, []error) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	acked := map[string]position{}
	var failures []error
	for i := 0; i < total; i++ {
		value := fmt.Sprintf("msg-%05d", i)
		m := client.Message{Value: []byte(value)}
		if keyed {
			m.Key = m.Value
		}
		wg.Add(1)
		err := prod.PublishAsync(ctx, m, func(r client.PublishResult, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, fmt.Errorf("%s: %w", value, err))
				return
			}
			acked[value] = position{r.Partition, r.Seq}
			progress <- len(acked)
		})
		if err != nil {
			t.Fatalf("PublishAsync %d: %v", i, err)
		}
		if pace != nil {
			pace(i)
		}
	}
	wg.Wait()
	close(progress)
	return acked, failures
}

// readBackExactlyOnce consumes until it has seen len(acked) distinct
// positions and checks that every acknowledged message is at its
// acknowledged (partition, seq), stored once, and that nothing else is.
// A redelivery of one position (same value) is tolerated.
func readBackExactlyOnce(ctx context.Context, t *testing.T, cons *client.Consumer, acked map[string]position) {
	t.Helper()
	readBackExactlyOnceBut(ctx, t, cons, acked, "")
}

// readBackExactlyOnceBut is readBackExactlyOnce, where records of value
// unacked (publishes whose outcome was an error: they may have committed
// since) may be in the log too.
func readBackExactlyOnceBut(ctx context.Context, t *testing.T, cons *client.Consumer, acked map[string]position, unacked string) {
	t.Helper()
	seen := map[position]string{}
	count := map[string]int{}
	extra := 0
	for len(seen)-extra < len(acked) {
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		m, err := cons.Next(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("after %d messages: %v", len(seen), err)
		}
		pos := position{m.Partition, m.Seq}
		if prev, dup := seen[pos]; dup {
			if prev != string(m.Value) {
				t.Fatalf("position %v holds %s and %s", pos, prev, m.Value)
			}
		} else if unacked != "" && string(m.Value) == unacked {
			extra++
		} else {
			count[string(m.Value)]++
		}
		seen[pos] = string(m.Value)
		m.Ack()
	}
	for value, pos := range acked {
		if seen[pos] != value {
			t.Fatalf("acked %s at %v, the log has %q there", value, pos, seen[pos])
		}
		if count[value] != 1 {
			t.Fatalf("%s stored %d times", value, count[value])
		}
	}
	if len(seen)-extra != len(acked) {
		t.Fatalf("the log holds %d records, want exactly %d", len(seen)-extra, len(acked))
	}
}

// TestCLIAgainstRealServer drives the CLI verbs as a user would, against a
// `nereus serve` with a token file.
func TestCLIAgainstRealServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	addr, _ := startServeWithToken(t, "cli-secret")
	run := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command(nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+addr, "NEREUS_TOKEN=cli-secret")
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		return string(out), err
	}
	if _, err := run("", "topic", "create", "cli", "--partitions", "2"); err != nil {
		t.Fatalf("topic create: %v", err)
	}
	if _, err := run("", "topic", "create", "cli", "--partitions", "3"); err == nil {
		t.Fatal("conflicting topic create exited 0")
	}
	out, err := run("one\ntwo\nthree\n", "pub", "cli", "--json", "-")
	if err != nil || strings.Count(out, `"seq":`) != 3 {
		t.Fatalf("pub from stdin: %v\n%s", err, out)
	}
	first, err := run("", "pub", "cli", "--producer-id", "9", "--seq", "1", "--json", "once")
	if err != nil {
		t.Fatal(err)
	}
	again, err := run("", "pub", "cli", "--producer-id", "9", "--seq", "1", "--json", "once")
	if err != nil || strings.Replace(again, `"duplicate":true`, `"duplicate":false`, 1) != first {
		t.Fatalf("replay: %v\nfirst %s\nagain %s", err, first, again)
	}
	out, err = run("", "sub", "cli", "--group", "g", "--count", "4", "--json")
	if err != nil {
		t.Fatalf("sub: %v\n%s", err, out)
	}
	for _, v := range []string{`"value":"one"`, `"value":"two"`, `"value":"three"`, `"value":"once"`, `"key":`, `"delivery_id":`} {
		if !strings.Contains(out, v) {
			t.Fatalf("sub output lacks %s:\n%s", v, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 4 {
		t.Fatalf("sub printed %d lines, want 4:\n%s", n, out)
	}
	// Everything was acked: the group has nothing left.
	if out, err := run("", "sub", "cli", "--group", "g", "--count", "1", "--timeout", "300ms"); err == nil {
		t.Fatalf("sub of an empty group reached --count: %s", out)
	}
	cmd := exec.Command(nereusBinary(t), "topic", "list", "--server", addr, "--token", "wrong")
	if err := cmd.Run(); err == nil {
		t.Fatal("wrong token exited 0")
	}
}

// startInsecureServe runs `nereus serve` without auth on a data
// directory of its own and returns the directory, the process and a
// runner of CLI commands against it (stdout, stderr, exit error).
func startInsecureServe(t *testing.T) (string, *serverProcess, func(args ...string) (string, string, error)) {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	srv := startServe(t, "--data", data, "--listen", "127.0.0.1:0", "--http", "", "--insecure-no-auth", "--log-level", "warn")
	return data, srv, func(args ...string) (string, string, error) {
		cmd := exec.Command(nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+srv.addr)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return string(out), stderr.String(), err
	}
}

// mustRunner turns a runner of startInsecureServe into one that fails the
// test when the command fails, and returns its stdout.
func mustRunner(t *testing.T, run func(args ...string) (string, string, error)) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, stderr, err := run(args...)
		if err != nil {
			t.Fatalf("nereus %v: %v\n%s%s", args, err, out, stderr)
		}
		return out
	}
}

// TestCLIRefusesAndStopsAtCount: names reserved for Nereus or shaped like
// paths, and a retention finer than the protocol's millisecond, are refused
// with the reason and leave the data directory as it was; `topic list` of
// a missing topic fails; `sub --count N` takes exactly N messages, so the
// next member of the group gets the rest at once, delivered for the first
// time.
func TestCLIRefusesAndStopsAtCount(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	data, _, run := startInsecureServe(t)
	if _, _, err := run("topic", "create", "one"); err != nil {
		t.Fatal(err)
	}
	tree := func() []string {
		var out []string
		filepath.WalkDir(data, func(p string, _ os.DirEntry, err error) error {
			out = append(out, p)
			return err
		})
		return out
	}
	before := tree()
	for _, c := range []struct {
		args []string
		why  string
	}{
		{[]string{"topic", "create", "__meta", "--replicas", "1"}, "reserved"},
		{[]string{"topic", "create", "."}, "not allowed"},
		{[]string{"topic", "create", ".."}, "not allowed"},
		{[]string{"topic", "create", "dlq.g.one"}, "dead-letter"},
		{[]string{"pub", "dlq.g.one", "forged"}, "dead-letter"},
		{[]string{"sub", "one", "--group", ".."}, "not allowed"},
		{[]string{"sub", "topics.json", "--group", "..", "--timeout", "5s"}, "not allowed"},
		{[]string{"topic", "create", "r", "--retention", "1ns"}, "milliseconds"},
		{[]string{"topic", "list", "one", "nonexist"}, "no such topic: nonexist"},
	} {
		if _, stderr, err := run(c.args...); err == nil || !strings.Contains(stderr, c.why) {
			t.Errorf("%v: err %v, stderr %q (want %q)", c.args, err, stderr, c.why)
		}
	}
	if after := tree(); !slices.Equal(before, after) {
		t.Fatalf("refused commands changed the data directory:\nbefore %v\nafter  %v", before, after)
	}
	if _, _, err := run("topic", "list", "one"); err != nil {
		t.Fatalf("topic list one: %v", err)
	}
	for _, m := range []string{"m1", "m2", "m3", "m4"} {
		if _, stderr, err := run("pub", "one", m); err != nil {
			t.Fatalf("pub %s: %v %s", m, err, stderr)
		}
	}
	first, _, err := run("sub", "one", "--group", "g", "--count", "1", "--json")
	if err != nil || !strings.Contains(first, `"seq":1,`) {
		t.Fatalf("sub --count 1: %v\n%s", err, first)
	}
	// With the default ack wait (30 s), a message the first sub fetched and
	// dropped would not come back within --timeout.
	rest, _, err := run("sub", "one", "--group", "g", "--count", "3", "--json", "--timeout", "5s")
	if err != nil {
		t.Fatalf("second sub: %v\n%s", err, rest)
	}
	for _, want := range []string{`"seq":2,`, `"seq":3,`, `"seq":4,`} {
		if !strings.Contains(rest, want) {
			t.Fatalf("second sub lacks %s:\n%s", want, rest)
		}
	}
	if strings.Count(rest, `"delivery_count":1,`) != 3 {
		t.Fatalf("messages were delivered before:\n%s", rest)
	}
}

// TestCLIGroupMembers: `sub --member` joins the group and prints its
// assignment on stderr; `group list`, `group describe --json` show the
// member and its partitions while it runs; after it leaves, `group delete`
// removes the group; a second delete fails; the group used again gets
// every message again.
func TestCLIGroupMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	addr, _ := startServeWithToken(t, "grp-secret")
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+addr, "NEREUS_TOKEN=grp-secret")
		return cmd
	}
	run := func(args ...string) (string, error) {
		out, err := command(args...).Output()
		return string(out), err
	}
	if _, err := run("topic", "create", "jobs", "--partitions", "3"); err != nil {
		t.Fatal(err)
	}
	pub := command("pub", "jobs", "-")
	pub.Stdin = strings.NewReader("a\nb\nc\n")
	if out, err := pub.CombinedOutput(); err != nil {
		t.Fatalf("pub: %v %s", err, out)
	}
	// A member that waits for a message that never comes, long enough to
	// be described.
	sub := command("sub", "jobs", "--group", "workers", "--member", "w1", "--count", "4", "--timeout", "3s")
	var subOut, subErr strings.Builder
	sub.Stdout, sub.Stderr = &subOut, &subErr
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	var desc string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, err := run("group", "describe", "workers", "--json")
		if err == nil && strings.Contains(out, `"id":"w1"`) && strings.Count(out, `"topic":"jobs"`) >= 3 {
			desc = out
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if desc == "" {
		t.Fatal("group describe never showed w1 holding the topic's partitions")
	}
	list, err := run("group", "list")
	if err != nil || !strings.Contains(list, "workers") || !strings.Contains(list, "exclusive") {
		t.Fatalf("group list: %v\n%s", err, list)
	}
	if _, err := run("group", "delete", "workers"); err == nil {
		t.Fatal("a group with a member was deleted")
	}
	_ = sub.Wait() // it times out waiting for a 4th message: exit 1
	if got := subOut.String(); strings.Count(got, "\n") != 3 {
		t.Fatalf("sub printed:\n%s", got)
	}
	if !strings.Contains(subErr.String(), "assigned jobs partitions [0 1 2]") {
		t.Fatalf("sub stderr lacks its assignment:\n%s", subErr.String())
	}
	if out, err := run("group", "delete", "workers"); err != nil {
		t.Fatalf("delete after the member left: %v %s", err, out)
	}
	if _, err := run("group", "delete", "workers"); err == nil {
		t.Fatal("a second delete succeeded")
	}
	// The name starts afresh: a member of the group used again gets the
	// three messages the deleted group had acked.
	again, err := run("sub", "jobs", "--group", "workers", "--member", "w2", "--count", "3", "--timeout", "5s")
	if err != nil || strings.Count(again, "\n") != 3 {
		t.Fatalf("sub of the group used again: %v\n%s", err, again)
	}
	// A group consumed only by SDK consumers without a Member is not the
	// coordinator's: a delete names the flag that deletes it, and --force
	// resets it.
	consume := func(want int) int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, client.Options{Servers: []string{addr}, Token: "grp-secret"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		co, err := c.Subscribe(ctx, "jobs", "batch", client.ConsumerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer co.Close()
		got := 0
		for got < want {
			wait, cancel := context.WithTimeout(ctx, time.Second)
			m, err := co.Next(wait)
			cancel()
			if err != nil {
				break
			}
			if err := m.AckSync(ctx); err != nil {
				t.Fatal(err)
			}
			got++
		}
		return got
	}
	if got := consume(3); got != 3 {
		t.Fatalf("a consumer without a member got %d messages, want 3", got)
	}
	if got := consume(1); got != 0 {
		t.Fatalf("the group without members delivered %d again before its delete", got)
	}
	_, err = run("group", "delete", "batch")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(string(exit.Stderr), "nereus group delete --force batch") {
		t.Fatalf("delete without --force of a group without members: %v, want a hint to --force", err)
	}
	if out, err := run("group", "delete", "--force", "batch"); err != nil || !strings.Contains(out, "deleted group batch (incarnation 1)") {
		t.Fatalf("delete --force: %v %s", err, out)
	}
	if got := consume(3); got != 3 {
		t.Fatalf("the group without members got %d messages after its delete, want all 3 again", got)
	}
	// The delete run again, as a script does whose first run's answer was
	// lost, naming the incarnation printed: OK, and the next incarnation's
	// acks stand (GroupDeleteRetryDeletesOnce).
	if out, err := run("group", "delete", "--force", "--incarnation", "1", "batch"); err != nil || !strings.Contains(out, "deleted group batch (incarnation 1)") {
		t.Fatalf("delete --force --incarnation 1 again: %v %s", err, out)
	}
	if got := consume(1); got != 0 {
		t.Fatalf("the retried delete reset the next incarnation: it delivered %d again", got)
	}
	if _, err := run("group", "delete", "--force", "--incarnation", "3", "batch"); !errors.As(err, &exit) || !strings.Contains(string(exit.Stderr), "incarnation 3 does not exist") {
		t.Fatalf("delete of an incarnation not yet created: %v, want NOT_FOUND", err)
	}
}
