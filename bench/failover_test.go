package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeFailoverSystem records what the failover workload asks of it. Its
// leader is n1, then the next node after each restart; KillLeader reports
// a kill sent killedAgo before it returns.
type fakeFailoverSystem struct {
	events    []string
	leader    int
	killedAgo time.Duration
	killErr   error
}

func (f *fakeFailoverSystem) log(format string, args ...any) {
	f.events = append(f.events, fmt.Sprintf(format, args...))
}

func (f *fakeFailoverSystem) CreateStream(_ context.Context, name string) error {
	f.log("create %s", name)
	return nil
}

func (f *fakeFailoverSystem) NewPublisher(context.Context, string, int) (publisher, error) {
	return nil, errors.New("not used")
}

func (f *fakeFailoverSystem) NewSubscriber(context.Context, string, string, int) (subscriber, error) {
	return nil, errors.New("not used")
}

func (f *fakeFailoverSystem) Close() error { return nil }

func (f *fakeFailoverSystem) AwaitInSync(_ context.Context, stream string) error {
	f.log("in sync %s", stream)
	return nil
}

func (f *fakeFailoverSystem) KillLeader(_ context.Context, stream string) (string, time.Time, error) {
	name := fmt.Sprintf("n%d", f.leader%3+1)
	f.log("kill %s of %s", name, stream)
	return name, time.Now().Add(-f.killedAgo), f.killErr
}

func (f *fakeFailoverSystem) Restart(_ context.Context, name string) error {
	f.log("restart %s", name)
	f.leader++
	return nil
}

func (f *fakeFailoverSystem) NewFailoverPublisher(_ context.Context, stream string) (publisher, error) {
	return &fakeFailoverPublisher{sys: f, stream: stream}, nil
}

type fakeFailoverPublisher struct {
	sys    *fakeFailoverSystem
	stream string
}

// Publish logs "publish STREAM", folding a run of them into "publish STREAM ×N".
func (p *fakeFailoverPublisher) Publish(context.Context, []byte) error {
	e := &p.sys.events
	prefix := "publish " + p.stream
	if n := len(*e); n > 0 && strings.HasPrefix((*e)[n-1], prefix) {
		count := 1
		fmt.Sscanf(strings.TrimPrefix((*e)[n-1], prefix), " ×%d", &count)
		(*e)[n-1] = fmt.Sprintf("%s ×%d", prefix, count+1)
		return nil
	}
	*e = append(*e, prefix)
	return nil
}

func (p *fakeFailoverPublisher) PublishAsync(context.Context, []byte, func(error)) error {
	return errFailoverPublisherOnly
}
func (p *fakeFailoverPublisher) Flush(context.Context) error { return nil }
func (p *fakeFailoverPublisher) Close() error {
	p.sys.log("close publisher %s", p.stream)
	return nil
}

func TestFailoverKillsTheLeaderOfEachStreamOnceInSync(t *testing.T) {
	sys := &fakeFailoverSystem{killedAgo: 40 * time.Millisecond}
	prog := startProgress(io.Discard)
	defer prog.close()
	res, err := runFailover(t.Context(), sys, "s", make([]byte, 16), limits{FailoverKills: 3}, prog)
	if err != nil {
		t.Fatal(err)
	}
	steady := fmt.Sprintf(" ×%d", failoverSteadyCount)
	want := []string{
		// The case's stream exists already (runCase created it).
		"publish s" + steady, "in sync s", "publish s", "kill n1 of s", "publish s", "restart n1", "close publisher s",
		"create s-k2", "publish s-k2" + steady, "in sync s-k2", "publish s-k2", "kill n2 of s-k2", "publish s-k2", "restart n2", "close publisher s-k2",
		"create s-k3", "publish s-k3" + steady, "in sync s-k3", "publish s-k3", "kill n3 of s-k3", "publish s-k3", "restart n3", "close publisher s-k3",
	}
	if !slices.Equal(sys.events, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(sys.events, "\n"), strings.Join(want, "\n"))
	}
	if res.Messages != 3 || len(res.Latencies) != 3 {
		t.Fatalf("%d kills, %d samples", res.Messages, len(res.Latencies))
	}
	for _, d := range res.Latencies {
		if d < sys.killedAgo {
			t.Errorf("sample %s is shorter than the time since the kill (%s)", d, sys.killedAgo)
		}
	}
}

func TestFailoverStopsAtAFailedKill(t *testing.T) {
	sys := &fakeFailoverSystem{killErr: errors.New("no such process")}
	prog := startProgress(io.Discard)
	defer prog.close()
	_, err := runFailover(t.Context(), sys, "s", nil, limits{FailoverKills: 5}, prog)
	if err == nil || !strings.Contains(err.Error(), "kill 1: no such process") {
		t.Fatalf("err = %v", err)
	}
	if slices.ContainsFunc(sys.events, func(e string) bool { return strings.HasPrefix(e, "restart") || strings.HasPrefix(e, "create") }) {
		t.Errorf("went on after the failed kill: %v", sys.events)
	}
}

func TestFailoverNeedsAKillableSystem(t *testing.T) {
	prog := startProgress(io.Discard)
	defer prog.close()
	if _, err := runFailover(t.Context(), &diskSystem{dir: t.TempDir()}, "s", nil, limits{FailoverKills: 1}, prog); err == nil {
		t.Fatal("the disk anchor ran the failover workload")
	}
}

func TestNATSServerConfig(t *testing.T) {
	peers := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}
	got := natsServerConfig("n2", "127.0.0.1:6002", peers[1], peers, "/data/n2", false)
	for _, want := range []string{
		`server_name: "n2"`, `listen: "127.0.0.1:6002"`, `jetstream { store_dir: "/data/n2" }`,
		`cluster { name: "bench", listen: "127.0.0.1:7002", routes: ["nats://127.0.0.1:7001", "nats://127.0.0.1:7002", "nats://127.0.0.1:7003"] }`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %q:\n%s", want, got)
		}
	}
	always := natsServerConfig("n1", "127.0.0.1:6001", peers[0], peers, "/data/n1", true)
	if !strings.Contains(always, `jetstream { store_dir: "/data/n1", sync_interval: "always" }`) {
		t.Errorf("sync-always config:\n%s", always)
	}
}
