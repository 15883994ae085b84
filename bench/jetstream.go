package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bounds of the in-process JetStream server and its clients.
const (
	jetStreamReadyTimeout = 10 * time.Second
	jetStreamAckTimeout   = 30 * time.Second // one async publish awaiting its PubAck
	jetStreamAckSlack     = 16               // extra nats.go pending slots beyond our own window
)

// jetStreamSystem is a nats-server with JetStream running in this process on
// a loopback port the kernel picks, or a cluster of nats-server child
// processes (jetstream_cluster.go), storing streams on files under its data
// directory.
type jetStreamSystem struct {
	server  *server.Server // the in-process server; nil for a cluster
	cluster *natsCluster   // the child processes; nil in process
	// url is the client URL, or for a cluster the list of them.
	url      string
	replicas int // of the streams it creates
	// consumerCreateMu serializes consumer creates of concurrent workers.
	consumerCreateMu sync.Mutex
	admin            *nats.Conn
	js               jetstream.JetStream
}

// startJetStreamMode returns the start function of JetStream with file
// storage and, when syncAlways, an fsync per write (sync_interval: always,
// server.Options.SyncAlways); otherwise the default sync_interval of 2 min.
func startJetStreamMode(syncAlways bool) func(context.Context, *environment, string) (system, error) {
	return func(ctx context.Context, env *environment, dataDir string) (system, error) {
		opts := &server.Options{
			ServerName:             "bench",
			Host:                   "127.0.0.1",
			Port:                   server.RANDOM_PORT,
			JetStream:              true,
			StoreDir:               filepath.Join(dataDir, "jetstream"),
			SyncAlways:             syncAlways,
			NoLog:                  true,
			NoSigs:                 true,
			DisableJetStreamBanner: true,
		}
		ns, err := server.NewServer(opts)
		if err != nil {
			return nil, fmt.Errorf("nats-server: %w", err)
		}
		ns.Start()
		s := &jetStreamSystem{server: ns, url: ns.ClientURL(), replicas: 1}
		env.track(s)
		if !ns.ReadyForConnections(jetStreamReadyTimeout) {
			return nil, fmt.Errorf("nats-server not ready after %s", jetStreamReadyTimeout)
		}
		s.url = ns.ClientURL()
		if s.admin, err = s.connect("bench-admin"); err != nil {
			return nil, err
		}
		if s.js, err = jetstream.New(s.admin); err != nil {
			return nil, err
		}
		return s, ctx.Err()
	}
}

func (s *jetStreamSystem) connect(name string) (*nats.Conn, error) {
	return nats.Connect(s.url, nats.Name(name), nats.Timeout(jetStreamReadyTimeout), nats.MaxReconnects(0))
}

// connectNear connects a client of stream: in a cluster to the server that
// leads the stream (the Nereus SDK, too, talks to the partition leader), in
// process to the one server.
func (s *jetStreamSystem) connectNear(ctx context.Context, stream, name string, extra ...nats.Option) (*nats.Conn, error) {
	if s.cluster == nil {
		return s.connect(name)
	}
	url, err := s.cluster.leaderFirst(ctx, s.js, stream)
	if err != nil {
		return nil, err
	}
	return nats.Connect(url, append([]nats.Option{nats.Name(name), nats.Timeout(jetStreamReadyTimeout),
		nats.DontRandomize(), nats.MaxReconnects(0)}, extra...)...)
}

// connectJetStream is connectNear with a JetStream context on the
// connection.
func (s *jetStreamSystem) connectJetStream(ctx context.Context, stream, name string, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := s.connectNear(ctx, stream, name, extra...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// CreateStream creates the stream; in a cluster it retries while the
// cluster elects its metadata leader, and returns once the stream has a
// leader, as Nereus's CreateStream does.
func (s *jetStreamSystem) CreateStream(ctx context.Context, name string) error {
	cfg := jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{name},
		Storage:  jetstream.FileStorage,
		Replicas: s.replicas,
	}
	if s.cluster == nil {
		_, err := s.js.CreateStream(ctx, cfg)
		return err
	}
	return s.cluster.createStream(ctx, s.js, cfg)
}

func (s *jetStreamSystem) NewPublisher(ctx context.Context, stream string, inflightMax int) (publisher, error) {
	nc, err := s.connectNear(ctx, stream, "bench-pub")
	if err != nil {
		return nil, err
	}
	// Our semaphore bounds the window; nats.go's own bound is set above it
	// so that its stall timeout never fires.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(inflightMax+jetStreamAckSlack))
	if err != nil {
		nc.Close()
		return nil, err
	}
	p := &jetStreamPublisher{
		conn:    nc,
		js:      js,
		subject: stream,
		slots:   make(chan struct{}, inflightMax),
		pending: make(chan pendingPublish, inflightMax),
		closing: make(chan struct{}),
		stopped: make(chan struct{}),
	}
	go p.complete()
	return p, nil
}

// NewSubscriber opens the consume and e2e workloads' one consumer, as a
// worker of the group workload is opened: a create answered "no
// responders" is retried, and so is a Fetch (jetStreamWorker). Both
// failed runs of the consume row (Rounds 27 and 28 at the create, the
// session after at a Fetch).
func (s *jetStreamSystem) NewSubscriber(ctx context.Context, stream, group string, batchMax int) (subscriber, error) {
	return s.newWorker(ctx, stream, group, batchMax, 2*batchMax)
}

// createRetryingNoResponders calls create until it succeeds, fails
// otherwise than "no responders" (a cluster's API, or an R3 stream just
// created, not answering yet) or ctx ends; retried, when not nil, counts
// the retries.
func createRetryingNoResponders(ctx context.Context, group string, retried func(), create func() (subscriber, error)) (subscriber, error) {
	for {
		sub, err := create()
		if err == nil || !errors.Is(err, nats.ErrNoResponders) {
			return sub, err
		}
		if retried != nil {
			retried()
		}
		if err := sleepCtx(ctx, clusterRetryInterval); err != nil {
			return nil, fmt.Errorf("create consumer %s: %w (last error: %v)", group, err, nats.ErrNoResponders)
		}
	}
}

// newPullSubscriber opens a connection that fetches from the durable pull
// consumer group (created or updated with maxAckPending).
func (s *jetStreamSystem) newPullSubscriber(ctx context.Context, stream, group string, batchMax, maxAckPending int) (subscriber, error) {
	nc, js, err := s.connectJetStream(ctx, stream, "bench-sub")
	if err != nil {
		return nil, err
	}
	// Workers of one consumer are opened concurrently (group.go); their
	// creates go one at a time.
	s.consumerCreateMu.Lock()
	consumer, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:       group,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: maxAckPending,
	})
	s.consumerCreateMu.Unlock()
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &jetStreamSubscriber{conn: nc, consumer: consumer, batchMax: batchMax}, nil
}

// Close closes the admin connection and shuts the server down. It is safe
// to call more than once.
func (s *jetStreamSystem) Close() error {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.cluster != nil {
		return s.cluster.Close()
	}
	s.server.Shutdown()
	s.server.WaitForShutdown()
	return nil
}

// jetStreamPublisher publishes with nats.go's async publisher; one
// goroutine (complete) waits for the futures in publish order and calls the
// done callbacks, which is what the Nereus SDK does for its producer.
type jetStreamPublisher struct {
	conn    *nats.Conn
	js      jetstream.JetStream
	subject string
	// slots holds one token per publish in flight; its capacity is the window.
	slots chan struct{}
	// pending carries the futures to complete, in publish order.
	pending chan pendingPublish
	// closing is closed by Close: complete then fails what is still pending
	// instead of waiting for it.
	closing chan struct{}
	// stopped is closed when complete has returned.
	stopped chan struct{}
}

// pendingPublish is one async publish awaiting its PubAck.
type pendingPublish struct {
	future jetstream.PubAckFuture
	done   func(error)
}

func (p *jetStreamPublisher) Publish(ctx context.Context, payload []byte) error {
	_, err := p.js.Publish(ctx, p.subject, payload)
	return err
}

func (p *jetStreamPublisher) PublishAsync(ctx context.Context, payload []byte, done func(error)) error {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	future, err := p.js.PublishAsync(p.subject, payload)
	if err != nil {
		<-p.slots
		return err
	}
	p.pending <- pendingPublish{future: future, done: done} // never blocks: cap = slots
	return nil
}

// complete runs until pending is closed (by Close).
func (p *jetStreamPublisher) complete() {
	defer close(p.stopped)
	timer := time.NewTimer(jetStreamAckTimeout)
	defer timer.Stop()
	for pp := range p.pending {
		timer.Reset(jetStreamAckTimeout)
		select {
		case <-pp.future.Ok():
			pp.done(nil)
		case err := <-pp.future.Err():
			pp.done(err)
		case <-timer.C:
			pp.done(fmt.Errorf("no PubAck within %s", jetStreamAckTimeout))
		case <-p.closing:
			pp.done(errors.New("jetstream publisher closed"))
		}
		<-p.slots
	}
}

// Flush takes every slot of the window, which it gets once no publish is
// in flight, and gives them back.
func (p *jetStreamPublisher) Flush(ctx context.Context) error {
	taken := 0
	defer func() {
		for range taken {
			<-p.slots
		}
	}()
	for taken < cap(p.slots) {
		select {
		case p.slots <- struct{}{}:
			taken++
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (p *jetStreamPublisher) Close() error {
	close(p.closing)
	close(p.pending)
	p.conn.Close()
	timer := time.NewTimer(jetStreamAckTimeout)
	defer timer.Stop()
	select {
	case <-p.stopped:
		return nil
	case <-timer.C:
		return errors.New("jetstream publisher: completions did not stop")
	}
}

// jetStreamSubscriber is a durable pull consumer read with Fetch(batchMax).
type jetStreamSubscriber struct {
	conn     *nats.Conn
	consumer jetstream.Consumer
	batchMax int
}

func (s *jetStreamSubscriber) ReceiveBatch(ctx context.Context, wait time.Duration, handle func([]byte)) (int, error) {
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d))
	}
	if wait < time.Millisecond {
		return 0, ctx.Err()
	}
	batch, err := s.consumer.Fetch(s.batchMax, jetstream.FetchMaxWait(wait))
	if err != nil {
		return 0, err
	}
	n := 0
	for m := range batch.Messages() {
		handle(m.Data())
		if err := m.Ack(); err != nil {
			return n, err
		}
		n++
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return n, err
	}
	return n, nil
}

func (s *jetStreamSubscriber) Close() error {
	// Acks are fire-and-forget publishes; flush them before closing.
	err := s.conn.FlushTimeout(jetStreamReadyTimeout)
	s.conn.Close()
	return err
}
