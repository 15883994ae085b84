package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

func TestGlobalFlagDefaultsComeFromEnvironment(t *testing.T) {
	t.Setenv(envServer, "h1:1,h2:2")
	t.Setenv(envToken, "tok")
	root := newRootCmd()
	if got := root.PersistentFlags().Lookup("server").DefValue; got != "h1:1,h2:2" {
		t.Fatalf("--server default = %q", got)
	}
	if got := root.PersistentFlags().Lookup("token").DefValue; got != "tok" {
		t.Fatalf("--token default = %q", got)
	}
	t.Setenv(envServer, "")
	if got := newRootCmd().PersistentFlags().Lookup("server").DefValue; got != client.DefaultServer {
		t.Fatalf("--server default without env = %q", got)
	}
}

func TestClientOptionsFromFlags(t *testing.T) {
	root := newRootCmd()
	root.SetArgs([]string{"topic", "list", "--server", "a:1, b:2", "--token", "x", "--timeout", "3s"})
	list, _, err := root.Find([]string{"topic", "list"})
	if err != nil {
		t.Fatal(err)
	}
	if err := root.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	if err := list.ParseFlags([]string{"--server", "a:1, b:2", "--token", "x", "--timeout", "3s"}); err != nil {
		t.Fatal(err)
	}
	opts, err := clientOptions(list)
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Servers) != 2 || opts.Servers[1] != "b:2" || opts.Token != "x" || opts.RequestTimeout != 3*time.Second || opts.DialTimeout != 3*time.Second {
		t.Fatalf("options = %+v", opts)
	}
	// sub's own --timeout is an idle timeout, not the request timeout.
	sub, _, _ := root.Find([]string{"sub"})
	if err := sub.ParseFlags([]string{"--timeout", "1s"}); err != nil {
		t.Fatal(err)
	}
	opts, err = clientOptions(sub)
	if err != nil || opts.RequestTimeout != client.DefaultRequestTimeout {
		t.Fatalf("sub options = %+v, %v", opts, err)
	}
}

func TestUnreachableServerFailsClearly(t *testing.T) {
	root := newRootCmd()
	var stderr bytes.Buffer
	root.SetErr(&stderr)
	root.SetArgs([]string{"topic", "list", "--server", "127.0.0.1:1", "--timeout", "1s"})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "connect to 127.0.0.1:1") {
		t.Fatalf("err = %v", err)
	}
}

func TestExtraCommandsAreAdded(t *testing.T) {
	root := newRootCmd()
	addExtraCommands(root)
	addExtraCommands(root) // idempotent
	names := map[string]int{}
	for _, c := range root.Commands() {
		names[c.Name()]++
	}
	for _, want := range []string{"topic", "pub", "sub", "bench"} {
		if names[want] != 1 {
			t.Fatalf("command %s present %d times: %v", want, names[want], names)
		}
	}
	for name, n := range names {
		if n != 1 {
			t.Fatalf("command %s added %d times", name, n)
		}
	}
}

// `sim --replicas` runs the replication simulator with the requested
// faults; the same seed prints the same trace hash.
func TestSimReplicasWithDiskAndClockFaults(t *testing.T) {
	run := func() string {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{"sim", "--replicas", "3", "--disk-faults", "--clock-faults", "--seed", "4", "--seeds", "2", "--steps", "3000"})
		if err := root.Execute(); err != nil {
			t.Fatalf("sim: %v\n%s", err, out.String())
		}
		return out.String()
	}
	a := run()
	if strings.Count(a, ": ok\n") != 2 || !strings.Contains(a, "seed 4: R=3 sync_quorum") {
		t.Fatalf("sim output:\n%s", a)
	}
	if b := run(); b != a {
		t.Fatalf("the same seeds ran differently:\n%s\n%s", a, b)
	}
	root := newRootCmd()
	addExtraCommands(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"sim", "--replicas", "3", "--golden", "kill-leader-before-commit"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "kill -9 n1 before any FLUSHED of m1 reaches it") {
		t.Fatalf("replicated golden: %v\n%s", err, out.String())
	}
	root = newRootCmd()
	addExtraCommands(root)
	root.SetArgs([]string{"sim", "--replicas", "3", "--policy", "most"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), `--policy "most"`) {
		t.Fatalf("a bad policy: %v", err)
	}
	// The replica group's own options are refused without --replicas
	// (or with --nodes, where --replicas is the topics'), instead of
	// running a node or cluster simulation without them.
	for _, flag := range []string{"--compact", "--short-reads", "--disk-faults", "--clock-faults"} {
		for _, args := range [][]string{{flag}, {"--nodes", "3", "--replicas", "3", flag}} {
			root = newRootCmd()
			addExtraCommands(root)
			root.SetArgs(append(append([]string{"sim"}, args...), "--seed", "1", "--steps", "100"))
			if err := root.Execute(); err == nil || err.Error() != flag+" needs --replicas without --nodes" {
				t.Fatalf("sim %v: %v", args, err)
			}
		}
	}
	// A cluster run's topics have 1, 3 or 5 replicas, at most one a node:
	// refused up front, not after a run that cannot declare them.
	for _, c := range []struct{ args, want string }{
		{"--nodes 4", "--nodes 4: the topics' replicas (default: the number of nodes) must be 1, 3 or 5, not 4"},
		{"--nodes 5 --replicas 2", "--nodes 5: the topics' replicas (default: the number of nodes) must be 1, 3 or 5, not 2"},
		{"--nodes 3 --replicas 5", "--nodes 3: 5 replicas need at least as many nodes, not 3"},
	} {
		root = newRootCmd()
		addExtraCommands(root)
		root.SetArgs(append(append([]string{"sim"}, strings.Fields(c.args)...), "--seed", "1", "--steps", "100"))
		if err := root.Execute(); err == nil || err.Error() != c.want {
			t.Fatalf("sim %s: %v, want %q", c.args, err, c.want)
		}
	}
	root = newRootCmd()
	addExtraCommands(root)
	var short bytes.Buffer
	root.SetOut(&short)
	root.SetArgs([]string{"sim", "--replicas", "3", "--short-reads", "--seed", "3", "--steps", "5000"})
	err := root.Execute()
	if m := regexp.MustCompile(` (\d+) short reads, .*: ok\n`).FindStringSubmatch(short.String()); err != nil || m == nil || m[1] == "0" {
		t.Fatalf("sim --replicas 3 --short-reads: %v\n%s", err, short.String())
	}
}

// runSim runs `nereus sim args...` and returns what it printed.
func runSim(args ...string) (string, error) {
	root := newRootCmd()
	addExtraCommands(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs(append([]string{"sim"}, args...))
	err := root.Execute()
	return out.String(), err
}

// `sim --nodes` runs complete nodes in the simulator; a mutation is caught
// and the error names the command that reproduces it.
func TestSimNodes(t *testing.T) {
	run := runSim
	out, err := run("--nodes", "3", "--seed", "1", "--steps", "3000")
	if err != nil || !strings.Contains(out, "seed 1: 3 nodes") || !strings.HasSuffix(out, ": ok\n") {
		t.Fatalf("sim --nodes: %v\n%s", err, out)
	}
	out, err = run("--nodes", "3", "--seed", "1", "--steps", "3000", "--kv", "20")
	if err != nil || !strings.Contains(out, "kv ops") || !strings.HasSuffix(out, ": ok\n") {
		t.Fatalf("sim --nodes --kv: %v\n%s", err, out)
	}
	out, err = run("--nodes", "3", "--list-mutations")
	if err != nil || !strings.Contains(out, "ack-before-commit\n") || !strings.Contains(out, "kv-read-without-lease\n") {
		t.Fatalf("--nodes 3 --list-mutations: %v\n%s", err, out)
	}
	// Seeds from 1 on: the run stops at the first that catches it (seed 1
	// now; which one moves with the runs' traces).
	_, err = run("--nodes", "3", "--seed", "1", "--seeds", "60", "--mutation", "ack-before-commit")
	if err == nil || !strings.Contains(err.Error(), "AckFloorNeverRedelivered") || !strings.Contains(err.Error(), "--mutation ack-before-commit") {
		t.Fatalf("a mutated run: %v", err)
	}
	if _, err = run("--nodes", "3", "--mutation", "nope"); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("an unknown mutation: %v", err)
	}
	if _, err = run("--nodes", "3", "--faults", "lightning"); err == nil {
		t.Fatal("an unknown fault was accepted")
	}
}

// `sim --retention` without --nodes runs a single node whose topic keeps
// 4 KiB a partition; --mutation picks a single node's deliberate bugs
// there, and the error of a caught one names the command that reproduces
// it. --retention-updates needs --retention, and runs on a single node too.
func TestSimSingleNodeRetention(t *testing.T) {
	run := runSim
	out, err := run("--retention", "--seed", "1", "--members")
	if err != nil || !strings.Contains(out, "seed 1: ") || !strings.HasSuffix(out, ": ok\n") {
		t.Fatalf("sim --retention: %v\n%s", err, out)
	}
	out, err = run("--list-mutations")
	if err != nil || !strings.Contains(out, "dedup-snapshot-once\n") || strings.Contains(out, "ack-before-commit") {
		t.Fatalf("--list-mutations: %v\n%s", err, out)
	}
	// Seeds from 1 on: the run stops at the first that catches it (seed
	// 20 now; which one moves with the runs' traces).
	_, err = run("--retention", "--faults", "partition,bitflip", "--seed", "1", "--seeds", "40", "--mutation", "dedup-snapshot-once")
	if err == nil || !strings.Contains(err.Error(), "NoDuplicateFromReplay") || !strings.Contains(err.Error(), "--retention --mutation dedup-snapshot-once") {
		t.Fatalf("a mutated run: %v", err)
	}
	if _, err = run("--mutation", "ack-before-commit"); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("a cluster's mutation without --nodes: %v", err)
	}
	for _, args := range [][]string{{"--retention-updates", "2"}, {"--nodes", "3", "--retention-updates", "2"}, {"--retention", "--retention-updates", "-1"}} {
		if _, err = run(args...); err == nil || !strings.Contains(err.Error(), "--retention-updates needs --retention") {
			t.Fatalf("sim %v: %v", args, err)
		}
	}
	out, err = run("--nodes", "3", "--retention", "--retention-updates", "3", "--seed", "1")
	if err != nil || !strings.Contains(out, " retention updates: ok") {
		t.Fatalf("sim --nodes 3 --retention --retention-updates 3: %v\n%s", err, out)
	}
	out, err = run("--retention", "--retention-updates", "3", "--seed", "1")
	if err != nil || !strings.Contains(out, " retention updates, trace ") || !strings.HasSuffix(out, ": ok\n") {
		t.Fatalf("sim --retention --retention-updates 3: %v\n%s", err, out)
	}
}

// `check --early-appends` explores the leader sending its APPENDs before
// its own fsync: the complete exploration of the same configuration has
// more states (an fsync is then an action of its own, and deliveries
// interleave with it).
func TestCheckEarlyAppends(t *testing.T) {
	states := func(extra ...string) string {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "--campaigns", "1", "--crashes", "0", "--drops", "0"}, extra...))
		if err := root.Execute(); err != nil {
			t.Fatalf("check %v: %v\n%s", extra, err, out.String())
		}
		if !strings.Contains(out.String(), "complete=true") {
			t.Fatalf("check %v did not finish:\n%s", extra, out.String())
		}
		return strings.Fields(out.String())[0]
	}
	if plain, early := states(), states("--early-appends"); plain == early {
		t.Fatalf("--early-appends explored the same %s states", plain)
	}
}

// `check --crash-partial`, `--ack-timeouts` and `--compactions` put
// crashes in the middle of a Ready, read-only leaders and snapshot
// installs into the explored space, and the report says they were
// reached.
func TestCheckNewDimensions(t *testing.T) {
	check := func(args ...string) (states int, reached map[string]int) {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "--campaigns", "1", "--drops", "0"}, args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("check %v: %v\n%s", args, err, out.String())
		}
		lines := strings.Split(out.String(), "\n")
		if _, err := fmt.Sscan(lines[0], &states); err != nil {
			t.Fatalf("check %v: %v\n%s", args, err, out.String())
		}
		reached = map[string]int{}
		for _, part := range strings.Split(strings.TrimPrefix(lines[1], "reached: "), ", ") {
			var n int
			if _, err := fmt.Sscan(part, &n); err == nil {
				reached[strings.TrimLeft(part, "0123456789 ")] = n
			}
		}
		return states, reached
	}
	plain, _ := check("--proposals", "0", "--crashes", "1")
	partial, reached := check("--proposals", "0", "--crashes", "1", "--crash-partial")
	if partial <= plain || reached["mid-Ready crashes"] == 0 {
		t.Fatalf("--crash-partial: %d states (plain %d), reached %v", partial, plain, reached)
	}
	_, reached = check("--proposals", "1", "--crashes", "0", "--ack-timeouts", "1", "--compactions", "1", "--states-max", "20000")
	for _, what := range []string{"read-only", "back from read-only", "compactions", "snapshot installs", "appends below a snapshot"} {
		if reached[what] == 0 {
			t.Errorf("--ack-timeouts 1 --compactions 1 never reached %q: %v", what, reached)
		}
	}
	_, reached = check("--proposals", "1", "--crashes", "0", "--campaigns", "2", "--promise-losses", "1", "--network-max", "6", "--states-max", "20000")
	if reached["promises recovered"] == 0 {
		t.Errorf("--promise-losses 1 never reached a recovered promise: %v", reached)
	}
	_, reached = check("--proposals", "1", "--crashes", "0", "--campaigns", "2", "--heartbeats", "1", "--rebuilds", "1", "--network-max", "6", "--states-max", "20000")
	if reached["damaged refusals"] == 0 || reached["nodes rebuilt"] == 0 {
		t.Errorf("--rebuilds 1 never reached a damaged refusal and a node rebuilt: %v", reached)
	}
}

// `check groups` explores the group kernel; a mutation fails with a
// counterexample.
func TestCheckGroups(t *testing.T) {
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "groups", "--partitions", "1", "--nodes", "1"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	if out, err := run(); err != nil || !strings.Contains(out, "complete=true") {
		t.Fatalf("check groups: %v\n%s", err, out)
	}
	out, err := run("--mutation", "stale-ack-accepted")
	if err == nil || !strings.Contains(out, "VIOLATION AckFromCurrentOwner") {
		t.Fatalf("the stale-ack mutation passed: %v\n%s", err, out)
	}
	if _, err := run("--mutation", "nonsense"); err == nil {
		t.Fatal("an unknown mutation was accepted")
	}
}

// `check sched` explores the scheduler kernel; each mutation fails with
// a counterexample.
func TestCheckSched(t *testing.T) {
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "sched", "--due", "1", "--crashes", "0"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	if out, err := run(); err != nil || !strings.Contains(out, "complete=true") {
		t.Fatalf("check sched: %v\n%s", err, out)
	}
	out, err := run("--mutation", "fenced-still-fires")
	if err == nil || !strings.Contains(out, "VIOLATION NoPublishWithoutBothGates") {
		t.Fatalf("the fenced-still-fires mutation passed: %v\n%s", err, out)
	}
	// A mutation of the applied state, at every node.
	out, err = run("--mutation", "closed-lane-admits", "--closes", "1", "--intake-races", "--moves", "0", "--time-max", "1")
	if err == nil || !strings.Contains(out, "VIOLATION ClosedAdmitsNone") {
		t.Fatalf("the closed-lane-admits mutation passed: %v\n%s", err, out)
	}
	if _, err := run("--mutation", "nonsense"); err == nil {
		t.Fatal("an unknown mutation was accepted")
	}
}

// `check consume` explores the delivery cursor and the ack log; a
// mutation fails with a counterexample, bad bounds are refused.
func TestCheckConsume(t *testing.T) {
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "consume", "--degrades", "0"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	if out, err := run(); err != nil || !strings.Contains(out, "complete=true") {
		t.Fatalf("check consume: %v\n%s", err, out)
	}
	out, err := run("--mutation", "re-ack-waits-for-any-record")
	if err == nil || !strings.Contains(out, "VIOLATION RebuildHoldsConfirmedAcks") {
		t.Fatalf("the re-ack mutation passed: %v\n%s", err, out)
	}
	for _, bad := range [][]string{{"--mutation", "nonsense"}, {"--messages", "0"}, {"--messages", "9"}, {"--max-deliver", "0"}} {
		if _, err := run(bad...); err == nil {
			t.Fatalf("%v was accepted", bad)
		}
	}
}

// `check produce` explores the publish kernel; a mutation fails with a
// counterexample, bad bounds are refused.
func TestCheckProduce(t *testing.T) {
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "produce", "--messages", "1", "--retries", "2", "--lost-replies", "0", "--elections", "0", "--apply-errors", "1"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	if out, err := run(); err != nil || !strings.Contains(out, "complete=true") {
		t.Fatalf("check produce: %v\n%s", err, out)
	}
	out, err := run("--mutation", "not-applied-forgets-inflight")
	if err == nil || !strings.Contains(out, "VIOLATION NoDuplicateFromReplay") {
		t.Fatalf("the not-applied mutation passed: %v\n%s", err, out)
	}
	for _, bad := range [][]string{{"--mutation", "nonsense"}, {"--replicas", "1"}, {"--messages", "0"}, {"--inflight-max", "0"}} {
		if _, err := run(bad...); err == nil {
			t.Fatalf("%v was accepted", bad)
		}
	}
}

// A campaign stops between seeds once its context is done (Ctrl-C), and
// says where to resume, in each of the three simulators.
func TestSimStopsBetweenSeedsWhenInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{{}, {"--nodes", "3"}, {"--replicas", "3"}} {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"sim", "--seed", "7", "--seeds", "2", "--steps", "100"}, args...))
		err := root.ExecuteContext(ctx)
		if err == nil || err.Error() != "interrupted before seed 7" || strings.Contains(out.String(), "seed 7:") {
			t.Fatalf("sim %v with its context done: %v\n%s", args, err, out.String())
		}
	}
	if err := interrupted(ctx, 7, 10); err == nil || !strings.Contains(err.Error(), "seeds 7 to 9 ran, resume with --seed 10") {
		t.Fatalf("interrupted after three seeds: %v", err)
	}
}
