package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as a floor replica process, as the
// harness binary does (startFloor runs os.Executable).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == floorReplicaArg {
		os.Exit(floorReplicaMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestFloorQuorum(t *testing.T) {
	tests := []struct {
		synced    uint64
		followers []uint64
		want      uint64
	}{
		{synced: 7, want: 7},                               // one replica: its own
		{synced: 4, followers: []uint64{3, 5}, want: 4},    // the leader lags the best follower
		{synced: 9, followers: []uint64{3, 5}, want: 5},    // the best follower lags the leader
		{synced: 9, followers: []uint64{0, 0}, want: 0},    // no follower has anything
		{synced: 0, followers: []uint64{6, 6}, want: 0},    // the leader's own fsync counts
		{synced: 6, followers: []uint64{6, 2}, want: 6},    // one follower is enough
		{synced: 6, followers: []uint64{2, 6, 1}, want: 6}, // whichever it is
	}
	for _, tt := range tests {
		a := floorAcks{synced: tt.synced, follower: tt.followers}
		if got := a.quorum(); got != tt.want {
			t.Errorf("synced %d, followers %v: quorum %d, want %d", tt.synced, tt.followers, got, tt.want)
		}
	}
}

// startTestFloor starts a floor of n replicas in child processes.
func startTestFloor(t *testing.T, n int) (*floorSystem, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	env := &environment{workDir: t.TempDir(), logf: t.Logf}
	t.Cleanup(func() { env.children.closeAll() })
	dataDir := t.TempDir()
	sys, err := startFloor(n)(ctx, env, dataDir)
	if err != nil {
		t.Fatal(err)
	}
	return sys.(*floorSystem), dataDir
}

// openTestPublisher opens a publisher to sys with inflightMax publishes
// in flight, and a context for its calls; both end with the test.
func openTestPublisher(t *testing.T, sys system, inflightMax int) (context.Context, publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pub, err := sys.NewPublisher(ctx, "s", inflightMax)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return ctx, pub
}

// floorBytes returns the bytes in the floor files of a replica's directory.
func floorBytes(t *testing.T, dataDir, name string) int64 {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dataDir, name, "floor-*.dat"))
	if err != nil || len(files) != 1 {
		t.Fatalf("%s: floor files %v (%v), want one", name, files, err)
	}
	st, err := os.Stat(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestFloorPublishesToAQuorum: every publish completes once, in order,
// once the leader and a follower hold it.
func TestFloorPublishesToAQuorum(t *testing.T) {
	sys, dataDir := startTestFloor(t, 3)
	ctx, pub := openTestPublisher(t, sys, 16)
	const count, size = 300, 1000
	payload := bytes.Repeat([]byte{'x'}, size)
	completed := make(chan int, count)
	for i := range count - 1 {
		if err := pub.PublishAsync(ctx, payload, func(err error) {
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
			}
			completed <- i
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Publish(ctx, payload); err != nil { // the last one, waited for
		t.Fatal(err)
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	close(completed)
	next := 0
	for i := range completed {
		if i != next {
			t.Fatalf("publish %d completed after %d", i, next-1)
		}
		next++
	}
	if next != count-1 {
		t.Fatalf("%d async publishes completed, want %d", next, count-1)
	}
	if got := floorBytes(t, dataDir, "n1"); got != count*size {
		t.Errorf("the leader holds %d bytes, want %d", got, count*size)
	}
	if got := max(floorBytes(t, dataDir, "n2"), floorBytes(t, dataDir, "n3")); got != count*size {
		t.Errorf("the best follower holds %d bytes, want %d", got, count*size)
	}
}

// TestFloorPublishFailsWithItsLeader: a publish the dead leader never
// acked completes with an error, and so does Flush.
func TestFloorPublishFailsWithItsLeader(t *testing.T) {
	sys, _ := startTestFloor(t, 1)
	ctx, pub := openTestPublisher(t, sys, 4)
	if err := pub.Publish(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if _, err := sys.procs[0].kill(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, []byte("after")); err == nil {
		t.Fatal("a publish to a killed floor succeeded")
	}
	if err := pub.Flush(ctx); err == nil {
		t.Fatal("Flush succeeded with a publish lost")
	}
}

// procState is the state letter of /proc/PID/stat ("T": stopped).
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Skip("no /proc here:", err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
}

// TestPauseOthersStopsTheIdleSystemsOnly: during a case the other
// systems' child processes are stopped, the case's own are not, and all
// go on afterwards.
func TestPauseOthersStopsTheIdleSystemsOnly(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("processes are paused on Linux only")
	}
	running, _ := startTestFloor(t, 1)
	idle, _ := startTestFloor(t, 3)
	systems := map[string]system{"floor/r1": running, "floor/r3": idle, "nereus/r1": &diskSystem{}}
	resume := pauseOthers(systems, "floor/r1", t.Logf)
	waitState := func(pid int, stopped bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for (procState(t, pid) == "T") != stopped {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d: state %s, want stopped=%v", pid, procState(t, pid), stopped)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for _, pid := range idle.pids() {
		waitState(pid, true)
	}
	if st := procState(t, running.pids()[0]); st == "T" {
		t.Fatalf("the case's own process is stopped")
	}
	// The running system still answers.
	ctx, pub := openTestPublisher(t, running, 1)
	if err := pub.Publish(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	resume()
	for _, pid := range idle.pids() {
		waitState(pid, false)
	}
}
