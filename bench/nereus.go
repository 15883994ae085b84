package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// Bounds of the Nereus child processes.
const (
	nereusBuildTimeout = 5 * time.Minute
	nereusStopTimeout  = childStopTimeout
)

// nereusSystem is one `nereus serve` child process, or a cluster of them
// on loopback, driven over TCP with the SDK.
type nereusSystem struct {
	addrs    []string    // client addresses
	stops    []io.Closer // the processes (or in-process node) behind them
	procs    []*nereusProc
	replicas int // of the topics it declares
	// admin is the connection used to declare topics.
	admin *client.Client
}

// nereusProc is one `nereus serve` child process.
type nereusProc struct {
	*childProc
	addr string // client listen address, from the ready line
	// httpAddr serves the node's metrics (measureReplication), from the
	// ready line.
	httpAddr string
	// pprofAddr serves net/http/pprof when the binary was built with the
	// bench's profiling overlay (-profile); "" otherwise.
	pprofAddr string
}

// pprofEnv names the environment variable the profiling overlay
// (pprof_overlay.go.txt) reads: the address to serve net/http/pprof on.
const pprofEnv = "NEREUS_BENCH_PPROF_ADDR"

// buildNereus builds the CLI once per run into dir and returns its path.
// It builds from the repository root (the main module), so bench/ needs
// none of the CLI's own dependencies. With profiling, an overlay adds one
// file to the CLI's main package that serves net/http/pprof on the address
// in $NEREUS_BENCH_PPROF_ADDR; the sources are not changed.
func buildNereus(ctx context.Context, dir string, profiling bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, nereusBuildTimeout)
	defer cancel()
	bin := filepath.Join(dir, "nereus")
	fmt.Fprintln(os.Stderr, "bench: building ../cmd/nereus")
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go tool to build nereus: %w", err)
	}
	args := []string{"build", "-o", bin}
	if profiling {
		overlay, err := writePprofOverlay(dir)
		if err != nil {
			return "", err
		}
		args = append(args, "-overlay", overlay)
	}
	cmd := exec.CommandContext(ctx, goTool, append(args, "./cmd/nereus")...)
	cmd.Dir = ".." // bench/ is run from its own directory; the CLI is ../cmd/nereus
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ../cmd/nereus (run the harness from bench/): %w\n%s", err, out)
	}
	return bin, nil
}

// startNereus starts one `nereus serve` on a loopback port the kernel picks
// and waits for its ready line.
func startNereus(ctx context.Context, env *environment, dataDir string) (system, error) {
	p, err := startNereusProc(ctx, env, dataDir, "n1")
	if err != nil {
		return nil, err
	}
	return newNereusSystem(ctx, 1, p)
}

// startNereusCluster starts a cluster of n `nereus serve` processes on
// loopback whose topics have n replicas.
func startNereusCluster(n int) func(context.Context, *environment, string) (system, error) {
	return func(ctx context.Context, env *environment, dataDir string) (system, error) {
		addrs, err := freeLoopbackAddrs(n)
		if err != nil {
			return nil, err
		}
		var peers []string
		for i, addr := range addrs {
			peers = append(peers, fmt.Sprintf("n%d=%s", i+1, addr))
		}
		secret := filepath.Join(dataDir, "cluster-secret")
		if err := os.WriteFile(secret, []byte("bench-cluster-secret-0123456789"), 0o600); err != nil {
			return nil, err
		}
		var procs []*nereusProc
		for i := 1; i <= n; i++ {
			p, err := startNereusProc(ctx, env, dataDir, fmt.Sprintf("n%d", i),
				"--peers", strings.Join(peers, ","), "--cluster-secret-file", secret)
			if err != nil {
				return nil, err
			}
			procs = append(procs, p)
		}
		return newNereusSystem(ctx, n, procs...)
	}
}

func newNereusSystem(ctx context.Context, replicas int, procs ...*nereusProc) (*nereusSystem, error) {
	var addrs []string
	var stops []io.Closer
	for _, p := range procs {
		addrs = append(addrs, p.addr)
		stops = append(stops, p)
	}
	s, err := newNereusSystemAt(ctx, replicas, addrs, stops...)
	if s != nil {
		s.procs = procs
	}
	return s, err
}

func newNereusSystemAt(ctx context.Context, replicas int, addrs []string, stops ...io.Closer) (*nereusSystem, error) {
	s := &nereusSystem{addrs: addrs, stops: stops, replicas: replicas}
	var err error
	s.admin, err = s.dial(ctx, "bench-admin")
	if err != nil {
		return nil, err
	}
	return s, nil
}

// startNereusProc starts one child with its data under dataDir/id.
func startNereusProc(ctx context.Context, env *environment, dataDir, id string, extra ...string) (*nereusProc, error) {
	bin, err := env.nereusBinary(ctx)
	if err != nil {
		return nil, err
	}
	p := &nereusProc{}
	var childEnv []string
	if env.profiling {
		addrs, err := freeLoopbackAddrs(1)
		if err != nil {
			return nil, err
		}
		p.pprofAddr = addrs[0]
		childEnv = append(childEnv, pprofEnv+"="+p.pprofAddr)
	}
	args := append([]string{"serve", "--node-id", id, "--data", filepath.Join(dataDir, id),
		"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--insecure-no-auth", "--log-level", "warn"}, extra...)
	isReady := func(line string) bool { return strings.HasPrefix(line, "nereus ready") }
	p.childProc, err = startChild(ctx, env, id, filepath.Join(dataDir, id+".log"), isReady, childEnv, bin, args...)
	if err != nil {
		return nil, err
	}
	if p.addr, err = parseReadyAddr(p.readyLine); err != nil {
		return nil, err
	}
	p.httpAddr = parseReadyField(p.readyLine, "http")
	return p, nil
}

// restart starts a killed child again on its data directory and its client
// address, and waits for its ready line.
func (p *nereusProc) restart(ctx context.Context) error {
	for i := range len(p.args) - 1 {
		if p.args[i] == "--listen" {
			p.args[i+1] = p.addr
		}
	}
	if err := p.start(ctx); err != nil {
		return err
	}
	addr, err := parseReadyAddr(p.readyLine)
	if err != nil {
		return err
	}
	if addr != p.addr {
		return fmt.Errorf("%s restarted on %s, not on %s", p.name, addr, p.addr)
	}
	p.httpAddr = parseReadyField(p.readyLine, "http") // a new port
	return nil
}

// parseReadyAddr extracts ADDR from "nereus ready client=ADDR http=...".
func parseReadyAddr(line string) (string, error) {
	if addr := parseReadyField(line, "client"); addr != "" {
		return addr, nil
	}
	return "", fmt.Errorf("no client address in ready line %q", line)
}

// parseReadyField extracts VALUE from "name=VALUE" in a ready line ("":
// absent or empty).
func parseReadyField(line, name string) string {
	for _, field := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(field, name+"="); ok {
			return v
		}
	}
	return ""
}

// metricsAddrs implements metricsSource: the HTTP addresses of the child
// processes (none for a node in the harness process).
func (s *nereusSystem) metricsAddrs() []string {
	var out []string
	for _, p := range s.procs {
		if p.httpAddr != "" {
			out = append(out, p.httpAddr)
		}
	}
	return out
}

func (s *nereusSystem) dial(ctx context.Context, name string) (*client.Client, error) {
	return client.Dial(ctx, client.Options{Servers: s.addrs, ClientName: name})
}

// CreateStream declares the topic, retrying while a new cluster elects its
// metadata leader, and returns once every partition has a leader: a new
// replica group elects its first one a few ticks after DECLARE, and a timed
// phase must not start inside that election (it showed as ~50 ms at the
// e2e p99 of R=3).
func (s *nereusSystem) CreateStream(ctx context.Context, name string) error {
	return s.createTopic(ctx, name, 1)
}

// createTopic is CreateStream with partitions partitions.
func (s *nereusSystem) createTopic(ctx context.Context, name string, partitions int) error {
	err := retryWhileRetryable(ctx, clusterRetryInterval, func() error {
		_, err := s.admin.DeclareTopic(ctx, client.TopicConfig{Name: name, Partitions: partitions, Replicas: s.replicas})
		return err
	})
	if err != nil {
		return err
	}
	if len(s.addrs) == 1 {
		return awaitLed(ctx, s.admin, name)
	}
	// Every node, not only the admin connection's: a node that restarted
	// (the failover case) may not have applied the declaration yet, and a
	// client that reaches it first is told the topic does not exist.
	for _, addr := range s.addrs {
		c, err := client.Dial(ctx, client.Options{Servers: []string{addr}, ClientName: "bench-admin-check"})
		if err != nil {
			return err
		}
		err = awaitLed(ctx, c, name)
		c.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
	}
	return nil
}

// awaitLed waits until c's server knows topic name with a leader for every
// partition.
func awaitLed(ctx context.Context, c *client.Client, name string) error {
	for {
		infos, err := c.Topics(ctx, name)
		if err == nil && len(infos) == 1 && allLed(infos[0]) {
			return nil
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("topic %s: no leader for every partition: %w", name, err)
		}
	}
}

func allLed(t client.TopicInfo) bool {
	for _, p := range t.Partitions {
		if p.Leader == "" {
			return false
		}
	}
	return len(t.Partitions) > 0
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func (s *nereusSystem) NewPublisher(ctx context.Context, stream string, inflightMax int) (publisher, error) {
	c, err := s.dial(ctx, "bench-pub")
	if err != nil {
		return nil, err
	}
	p, err := c.NewProducer(client.ProducerOptions{Topic: stream, MaxInFlight: inflightMax})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &nereusPublisher{conn: c, producer: p}, nil
}

func (s *nereusSystem) NewSubscriber(ctx context.Context, stream, group string, batchMax int) (subscriber, error) {
	c, err := s.dial(ctx, "bench-sub")
	if err != nil {
		return nil, err
	}
	co, err := c.Subscribe(ctx, stream, group, client.ConsumerOptions{Credit: batchMax})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &nereusSubscriber{conn: c, consumer: co, batchMax: batchMax}, nil
}

// Close stops every child. It is safe to call more than once.
func (s *nereusSystem) Close() error {
	if s.admin != nil {
		s.admin.Close()
	}
	var errs []error
	for _, p := range s.stops {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// nereusPublisher is an idempotent SDK producer on its own connection.
type nereusPublisher struct {
	conn     *client.Client
	producer *client.Producer
	// targets, when set, are the partitions its messages go to in turn
	// (an idempotent producer without keys puts every message on the
	// partition its identity picks); next counts the messages. Publish
	// and PublishAsync are called from one goroutine.
	targets []int
	next    int
}

// message returns the message of payload, on the next target partition
// when the publisher spreads its messages.
func (p *nereusPublisher) message(payload []byte) client.Message {
	m := client.Message{Value: payload}
	if len(p.targets) > 0 {
		m.TargetPartition = &p.targets[p.next%len(p.targets)]
		p.next++
	}
	return m
}

func (p *nereusPublisher) Publish(ctx context.Context, payload []byte) error {
	_, err := p.producer.Publish(ctx, p.message(payload))
	return err
}

func (p *nereusPublisher) PublishAsync(ctx context.Context, payload []byte, done func(error)) error {
	return p.producer.PublishAsync(ctx, p.message(payload), func(_ client.PublishResult, err error) { done(err) })
}

func (p *nereusPublisher) Flush(ctx context.Context) error { return p.producer.Flush(ctx) }

func (p *nereusPublisher) Close() error {
	err := p.producer.Close()
	return errors.Join(err, p.conn.Close())
}

// nereusSubscriber is an SDK consumer whose credit is the batch size.
type nereusSubscriber struct {
	conn     *client.Client
	consumer *client.Consumer
	batchMax int
}

func (s *nereusSubscriber) ReceiveBatch(ctx context.Context, wait time.Duration, handle func([]byte)) (int, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	m, err := s.consumer.Next(wctx)
	cancel()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return 0, nil // nothing arrived within wait
		}
		return 0, err
	}
	n := 0
	for {
		handle(m.Value)
		if err := m.Ack(); err != nil {
			return n, err
		}
		n++
		if n >= s.batchMax || s.consumer.Buffered() == 0 {
			return n, nil
		}
		if m, err = s.consumer.Next(ctx); err != nil {
			return n, err
		}
	}
}

func (s *nereusSubscriber) Close() error {
	err := s.consumer.Close()
	if st := s.consumer.Stats(); st.FailedAcks > 0 || st.StaleAcks > 0 {
		err = errors.Join(err, fmt.Errorf("nereus consumer: %d acks failed, %d stale", st.FailedAcks, st.StaleAcks))
	}
	return errors.Join(err, s.conn.Close())
}
