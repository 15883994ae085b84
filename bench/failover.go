package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// Bounds of the failover workload. Both systems' publishers retry with the
// same bounds: an attempt waits at most failoverAttemptTimeout for its ack,
// and the next attempt starts at most failoverRetryWait after a failed one.
const (
	failoverAttemptTimeout = 250 * time.Millisecond
	failoverRetryWait      = 50 * time.Millisecond
	// failoverPublishTimeout bounds the wait for the first ack after a kill.
	failoverPublishTimeout = 30 * time.Second
	// failoverSteadyCount publishes precede each kill (the steady stream).
	failoverSteadyCount = 200
	// failoverInSyncTimeout bounds the wait for every replica to be in sync
	// before a kill, and for a restarted node to be ready.
	failoverInSyncTimeout = 30 * time.Second
)

// failoverSystem is a replicated system whose stream leader the failover
// workload can kill -9 and start again.
type failoverSystem interface {
	system
	// AwaitInSync returns once stream's leader reports every replica in
	// sync, so that a kill leaves a full quorum of current replicas.
	AwaitInSync(ctx context.Context, stream string) error
	// KillLeader sends SIGKILL to the process that leads stream and returns
	// once it has exited, with its name and the time the signal was sent.
	KillLeader(ctx context.Context, stream string) (name string, at time.Time, err error)
	// Restart starts the killed process again on its data and addresses
	// and returns once it is ready.
	Restart(ctx context.Context, name string) error
	// NewFailoverPublisher opens a synchronous publisher (Publish only)
	// that retries a publish across a leader change until its context ends.
	NewFailoverPublisher(ctx context.Context, stream string) (publisher, error)
}

// runFailover measures, lim.FailoverKills times, the time from kill -9 of
// a stream's leader to the next acknowledged publish. Each kill is on a new
// stream: failoverSteadyCount synchronous publishes, a wait until every
// replica is in sync, one more publish, then the kill; the publisher issues
// its next publish as soon as the killed process has exited, and the sample
// runs from the SIGKILL to that publish's ack. The killed process is
// started again before the next kill. Messages is the number of kills; the
// row's latencies are the samples.
func runFailover(ctx context.Context, sys system, stream string, payload []byte, lim limits, prog *progress) (runResult, error) {
	fs, ok := sys.(failoverSystem)
	if !ok {
		return runResult{}, errors.New("the failover workload needs a replicated system of child processes")
	}
	var samples []time.Duration
	for kill := 1; kill <= lim.FailoverKills; kill++ {
		name := stream
		if kill > 1 {
			name = fmt.Sprintf("%s-k%d", stream, kill)
			sctx, cancel := context.WithTimeout(ctx, setupTimeout)
			err := sys.CreateStream(sctx, name)
			cancel()
			if err != nil {
				return runResult{}, fmt.Errorf("create stream %s: %w", name, err)
			}
		}
		prog.phase(fmt.Sprintf("kill %d/%d", kill, lim.FailoverKills))
		took, err := failoverOnce(ctx, fs, name, payload)
		if err != nil {
			return runResult{}, fmt.Errorf("kill %d: %w", kill, err)
		}
		samples = append(samples, took)
		prog.count.Store(int64(kill))
	}
	return runResult{Messages: int64(len(samples)), Latencies: samples}, ctx.Err()
}

// failoverOnce runs one kill on stream and starts the killed process again.
func failoverOnce(ctx context.Context, fs failoverSystem, stream string, payload []byte) (time.Duration, error) {
	pctx, cancel := context.WithTimeout(ctx, setupTimeout)
	pub, err := fs.NewFailoverPublisher(pctx, stream)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("new publisher: %w", err)
	}
	defer pub.Close()
	steady := func(n int) error {
		sctx, cancel := context.WithTimeout(ctx, setupTimeout)
		defer cancel()
		for range n {
			if err := pub.Publish(sctx, payload); err != nil {
				return err
			}
		}
		return nil
	}
	if err := steady(failoverSteadyCount); err != nil {
		return 0, fmt.Errorf("steady publishes: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, failoverInSyncTimeout)
	err = fs.AwaitInSync(ictx, stream)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("replicas in sync: %w", err)
	}
	if err := steady(1); err != nil {
		return 0, fmt.Errorf("steady publishes: %w", err)
	}
	killed, at, err := fs.KillLeader(ctx, stream)
	if err != nil {
		return 0, err
	}
	fctx, cancel := context.WithTimeout(ctx, failoverPublishTimeout)
	err = pub.Publish(fctx, payload)
	took := time.Since(at)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("no ack within %s of killing %s: %w", failoverPublishTimeout, killed, err)
	}
	rctx, cancel := context.WithTimeout(ctx, failoverInSyncTimeout)
	defer cancel()
	if err := fs.Restart(rctx, killed); err != nil {
		return 0, fmt.Errorf("restart %s: %w", killed, err)
	}
	return took, nil
}

// leaderOf returns the state of stream's partition once it names a leader.
func (s *nereusSystem) leaderOf(ctx context.Context, stream string) (client.PartitionInfo, error) {
	var last error
	for {
		infos, err := s.admin.Topics(ctx, stream)
		if err == nil && len(infos) == 1 && allLed(infos[0]) {
			return infos[0].Partitions[0], nil
		}
		if err != nil {
			last = err
		}
		if err := sleepCtx(ctx, clusterPollInterval); err != nil {
			return client.PartitionInfo{}, fmt.Errorf("topic %s: no leader: %w (last error: %v)", stream, err, last)
		}
	}
}

// AwaitInSync asks the partition's leader itself (only a leader knows its
// followers' states) until every replica is InSync and has flushed all
// that is committed.
func (s *nereusSystem) AwaitInSync(ctx context.Context, stream string) error {
	p, err := s.leaderOf(ctx, stream)
	if err != nil {
		return err
	}
	c, err := client.Dial(ctx, client.Options{Servers: []string{p.LeaderAddr}, ClientName: "bench-insync"})
	if err != nil {
		return err
	}
	defer c.Close()
	inSync := func(p client.PartitionInfo) bool {
		if len(p.Replicas) != s.replicas {
			return false
		}
		for _, r := range p.Replicas {
			if r.State != "InSync" || r.FlushedSeq < p.CommitSeq {
				return false
			}
		}
		return true
	}
	var last error
	for {
		infos, err := c.Topics(ctx, stream)
		if err == nil && len(infos) == 1 && len(infos[0].Partitions) == 1 && inSync(infos[0].Partitions[0]) {
			return nil
		}
		if err != nil {
			last = err
		}
		if err := sleepCtx(ctx, clusterPollInterval); err != nil {
			return fmt.Errorf("topic %s: replicas not in sync: %w (last error: %v)", stream, err, last)
		}
	}
}

// KillLeader kills -9 the `nereus serve` child that leads the partition.
func (s *nereusSystem) KillLeader(ctx context.Context, stream string) (string, time.Time, error) {
	p, err := s.leaderOf(ctx, stream)
	if err != nil {
		return "", time.Time{}, err
	}
	i := slices.IndexFunc(s.procs, func(np *nereusProc) bool { return np.name == p.Leader })
	if i < 0 {
		return "", time.Time{}, fmt.Errorf("topic %s: leader %q is not a child process of the harness", stream, p.Leader)
	}
	at, err := s.procs[i].kill()
	return p.Leader, at, err
}

// Restart starts a killed child again on its data and addresses.
func (s *nereusSystem) Restart(ctx context.Context, name string) error {
	i := slices.IndexFunc(s.procs, func(np *nereusProc) bool { return np.name == name })
	if i < 0 {
		return fmt.Errorf("nereus: no child %q", name)
	}
	return s.procs[i].restart(ctx)
}

// NewFailoverPublisher opens an idempotent SDK producer with one message
// in flight whose attempts are bounded as the JetStream one's: the SDK
// refreshes the topic's metadata and retries at the new leader by itself.
func (s *nereusSystem) NewFailoverPublisher(ctx context.Context, stream string) (publisher, error) {
	c, err := client.Dial(ctx, client.Options{Servers: s.addrs, ClientName: "bench-failover", RequestTimeout: failoverAttemptTimeout})
	if err != nil {
		return nil, err
	}
	p, err := c.NewProducer(client.ProducerOptions{Topic: stream, MaxInFlight: 1, RetryBackoffMax: failoverRetryWait})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &nereusPublisher{conn: c, producer: p}, nil
}
