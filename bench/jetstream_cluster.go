package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bounds of a JetStream cluster.
const (
	natsBuildTimeout = 2 * time.Minute
	// jetStreamAttemptTimeout bounds one JetStream API request of the
	// cluster's set-up (a stream create, a stream info) while the cluster
	// may be electing; the set-up retries until its own deadline.
	jetStreamAttemptTimeout = 2 * time.Second
	// clusterPollInterval paces the waits for a leader or replicas in sync:
	// there is no event to wait on from outside the processes.
	clusterPollInterval = 5 * time.Millisecond
	// clusterRetryInterval paces the retries of a set-up request that failed.
	clusterRetryInterval = 50 * time.Millisecond
)

// natsCluster is n nats-server child processes with JetStream, routed to
// each other on loopback, each with its own store directory. They run as
// processes (not in the harness, as the r1 server does) so that the
// failover workload can kill -9 the stream leader, and so that they cross
// the same process boundaries as the Nereus r3 cluster.
type natsCluster struct {
	procs []*childProc
	urls  []string // client URL of procs[i]
}

// buildNATSServer builds nats-server from the module cache, at the version
// go.mod requires, once per run into dir.
func buildNATSServer(ctx context.Context, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, natsBuildTimeout)
	defer cancel()
	bin := filepath.Join(dir, "nats-server")
	fmt.Fprintln(os.Stderr, "bench: building nats-server")
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go tool to build nats-server: %w", err)
	}
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build nats-server (run the harness from bench/): %w\n%s", err, out)
	}
	return bin, nil
}

// natsServerConfig is the configuration file of server name: client and
// cluster listen addresses, routes to every cluster address (its own
// included, which nats-server ignores), and its store directory.
func natsServerConfig(name, clientAddr, clusterAddr string, clusterAddrs []string, storeDir string, syncAlways bool) string {
	var routes []string
	for _, a := range clusterAddrs {
		routes = append(routes, fmt.Sprintf("%q", "nats://"+a))
	}
	sync := ""
	if syncAlways {
		sync = `, sync_interval: "always"`
	}
	return fmt.Sprintf(`server_name: %q
listen: %q
jetstream { store_dir: %q%s }
cluster { name: "bench", listen: %q, routes: [%s] }
`, name, clientAddr, storeDir, sync, clusterAddr, strings.Join(routes, ", "))
}

// startJetStreamCluster returns the start function of an n-server
// JetStream cluster whose streams have n replicas, with the default
// sync_interval (2 min) or, when syncAlways, an fsync per write.
func startJetStreamCluster(n int, syncAlways bool) func(context.Context, *environment, string) (system, error) {
	return func(ctx context.Context, env *environment, dataDir string) (system, error) {
		bin, err := env.natsServerBinary(ctx)
		if err != nil {
			return nil, err
		}
		addrs, err := freeLoopbackAddrs(2 * n)
		if err != nil {
			return nil, err
		}
		clientAddrs, clusterAddrs := addrs[:n], addrs[n:]
		cl := &natsCluster{}
		isReady := func(line string) bool { return strings.HasSuffix(line, "Server is ready") }
		for i := range n {
			name := fmt.Sprintf("n%d", i+1)
			conf := filepath.Join(dataDir, name+".conf")
			text := natsServerConfig(name, clientAddrs[i], clusterAddrs[i], clusterAddrs, filepath.Join(dataDir, name), syncAlways)
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return nil, err
			}
			p, err := startChild(ctx, env, name, filepath.Join(dataDir, name+".log"), isReady, nil, bin, "-c", conf)
			if err != nil {
				return nil, err
			}
			cl.procs = append(cl.procs, p)
			cl.urls = append(cl.urls, "nats://"+clientAddrs[i])
		}
		s := &jetStreamSystem{cluster: cl, url: strings.Join(cl.urls, ","), replicas: n}
		// The admin connection outlives the kills of the failover workload.
		s.admin, err = nats.Connect(s.url, nats.Name("bench-admin"), nats.Timeout(jetStreamReadyTimeout),
			nats.MaxReconnects(-1), nats.ReconnectWait(clusterRetryInterval))
		if err != nil {
			cl.Close()
			return nil, err
		}
		if s.js, err = jetstream.New(s.admin); err != nil {
			s.Close()
			return nil, err
		}
		return s, ctx.Err()
	}
}

// createStream creates the stream, retrying while the cluster elects its
// metadata leader, and waits until the stream has a leader.
func (cl *natsCluster) createStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	return cl.create(ctx, js, cfg.Name, func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, cfg)
		return err
	})
}

// create runs create (which creates stream, or a KV bucket on it) until
// it succeeds, retrying while the cluster elects its metadata leader, and
// waits until the stream has a leader.
func (cl *natsCluster) create(ctx context.Context, js jetstream.JetStream, stream string, create func(context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, jetStreamAttemptTimeout)
		last := create(actx)
		cancel()
		if last == nil {
			break
		}
		if err := sleepCtx(ctx, clusterRetryInterval); err != nil {
			return fmt.Errorf("create stream %s: %w (last error: %v)", stream, err, last)
		}
	}
	_, err := cl.await(ctx, js, stream, func(c *jetstream.ClusterInfo) bool { return c.Leader != "" })
	return err
}

// await polls the stream's cluster information until done accepts it,
// and returns it.
func (cl *natsCluster) await(ctx context.Context, js jetstream.JetStream, stream string, done func(*jetstream.ClusterInfo) bool) (*jetstream.ClusterInfo, error) {
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, jetStreamAttemptTimeout)
		st, err := js.Stream(actx, stream)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = st.Info(actx)
		}
		cancel()
		if err == nil && info.Cluster != nil && done(info.Cluster) {
			return info.Cluster, nil
		}
		if err != nil {
			last = err
		}
		if err := sleepCtx(ctx, clusterPollInterval); err != nil {
			return nil, fmt.Errorf("stream %s: %w (last error: %v)", stream, err, last)
		}
	}
}

// leader returns the process that leads stream.
func (cl *natsCluster) leader(ctx context.Context, js jetstream.JetStream, stream string) (*childProc, int, error) {
	info, err := cl.await(ctx, js, stream, func(c *jetstream.ClusterInfo) bool { return c.Leader != "" })
	if err != nil {
		return nil, 0, err
	}
	i := slices.IndexFunc(cl.procs, func(p *childProc) bool { return p.name == info.Leader })
	if i < 0 {
		return nil, 0, fmt.Errorf("stream %s: leader %q is not one of the cluster's servers", stream, info.Leader)
	}
	return cl.procs[i], i, nil
}

// leaderFirst returns the cluster's client URLs, the stream leader's first.
func (cl *natsCluster) leaderFirst(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	_, i, err := cl.leader(ctx, js, stream)
	if err != nil {
		return "", err
	}
	urls := append([]string{cl.urls[i]}, slices.Delete(slices.Clone(cl.urls), i, i+1)...)
	return strings.Join(urls, ","), nil
}

// Close stops every server (SIGTERM, then SIGKILL after a timeout).
func (cl *natsCluster) Close() error {
	var errs []error
	for _, p := range cl.procs {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// AwaitInSync returns once the stream leader reports every other replica
// current and online.
func (s *jetStreamSystem) AwaitInSync(ctx context.Context, stream string) error {
	if s.cluster == nil {
		return errors.New("jetstream: not a cluster")
	}
	_, err := s.cluster.await(ctx, s.js, stream, func(c *jetstream.ClusterInfo) bool {
		if c.Leader == "" || len(c.Replicas) != s.replicas-1 {
			return false
		}
		for _, r := range c.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
		return true
	})
	return err
}

// KillLeader kills -9 the server that leads stream.
func (s *jetStreamSystem) KillLeader(ctx context.Context, stream string) (string, time.Time, error) {
	if s.cluster == nil {
		return "", time.Time{}, errors.New("jetstream: not a cluster")
	}
	p, _, err := s.cluster.leader(ctx, s.js, stream)
	if err != nil {
		return "", time.Time{}, err
	}
	at, err := p.kill()
	return p.name, at, err
}

// Restart starts a killed server again with its configuration: the same
// addresses and store directory.
func (s *jetStreamSystem) Restart(ctx context.Context, name string) error {
	if s.cluster == nil {
		return errors.New("jetstream: not a cluster")
	}
	i := slices.IndexFunc(s.cluster.procs, func(p *childProc) bool { return p.name == name })
	if i < 0 {
		return fmt.Errorf("jetstream: no server %q", name)
	}
	return s.cluster.procs[i].start(ctx)
}

// NewFailoverPublisher connects to the stream leader first (so that the
// kill takes the publisher's connection down, as it does the Nereus SDK's)
// with reconnects to the other servers, and retries a publish until its
// context ends: each attempt waits at most failoverAttemptTimeout for the
// PubAck, and a failed attempt is retried after failoverRetryWait.
func (s *jetStreamSystem) NewFailoverPublisher(ctx context.Context, stream string) (publisher, error) {
	nc, js, err := s.connectJetStream(ctx, stream, "bench-failover",
		nats.MaxReconnects(-1), nats.ReconnectWait(failoverRetryWait), nats.ReconnectJitter(0, 0))
	if err != nil {
		return nil, err
	}
	return &jetStreamRetryingPublisher{conn: nc, js: js, subject: stream}, nil
}

// jetStreamRetryingPublisher publishes one message at a time and retries
// it until its context ends. It serves the failover workload only.
type jetStreamRetryingPublisher struct {
	conn    *nats.Conn
	js      jetstream.JetStream
	subject string
}

func (p *jetStreamRetryingPublisher) Publish(ctx context.Context, payload []byte) error {
	for {
		actx, cancel := context.WithTimeout(ctx, failoverAttemptTimeout)
		_, last := p.js.Publish(actx, p.subject, payload, jetstream.WithRetryAttempts(0))
		cancel()
		if last == nil {
			return nil
		}
		if err := sleepCtx(ctx, failoverRetryWait); err != nil {
			return fmt.Errorf("publish: %w (last error: %v)", err, last)
		}
	}
}

var errFailoverPublisherOnly = errors.New("the failover publisher publishes synchronously only")

func (p *jetStreamRetryingPublisher) PublishAsync(context.Context, []byte, func(error)) error {
	return errFailoverPublisherOnly
}

func (p *jetStreamRetryingPublisher) Flush(context.Context) error { return nil }

func (p *jetStreamRetryingPublisher) Close() error {
	p.conn.Close()
	return nil
}
