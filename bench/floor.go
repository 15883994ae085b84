package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The floor is no broker: the data movement of a replicated publish and
// nothing else, in child processes like the brokers'. The publisher sends
// length-prefixed payloads to a leader over TCP; the leader forwards each
// to its followers as it reads it and appends what it read to a file, a
// batch a write; every replica
// fdatasyncs what it has written, as often as it can (group commit), on a
// goroutine of its own; the leader acks (a cumulative count) what it and
// one follower have made durable, a follower what it has. No checksums,
// no encoding, no protocol state, one reused buffer per connection. What
// it reaches is a ceiling for any broker that acks after a quorum fsync on
// this machine, and floor r3 ÷ floor r1 is what replication itself costs
// here (floor.go's rows in the "Against the floor" table).

// floorReplicaArg, as the first argument, makes the harness binary a floor
// replica process (floorReplicaMain) instead of the harness.
const floorReplicaArg = "floor-replica"

// Bounds of the floor's processes.
const (
	floorFrameBytesMax = 16 << 20
	floorBufferBytes   = 256 << 10
	floorReadyPrefix   = "floor replica listening on "
)

// floorReplicaMain runs a floor replica: it listens on -listen, writes its
// files under -dir and forwards to the comma-separated -followers. It
// prints floorReadyPrefix and its address once it listens, then serves
// until killed.
func floorReplicaMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(floorReplicaArg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	dir := fs.String("dir", "", "directory of the replica's files")
	followers := fs.String("followers", "", "comma-separated follower addresses (a leader)")
	if err := fs.Parse(args); err != nil || *dir == "" {
		fmt.Fprintln(stderr, "floor replica: -dir is required")
		return 2
	}
	var peers []string
	if *followers != "" {
		peers = strings.Split(*followers, ",")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(stderr, "floor replica:", err)
		return 1
	}
	fmt.Fprintln(stdout, floorReadyPrefix+ln.Addr().String())
	for {
		conn, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(stderr, "floor replica:", err)
			return 1
		}
		go func() {
			if err := serveFloorStream(conn, *dir, peers); err != nil && !errors.Is(err, io.EOF) {
				fmt.Fprintln(stderr, "floor replica:", err)
			}
		}()
	}
}

// floorAcks is what one stream of a replica has written and made durable,
// and what each follower acked, in frames.
type floorAcks struct {
	mu       sync.Mutex
	changed  *sync.Cond
	written  uint64
	synced   uint64
	follower []uint64
	done     bool
}

// quorum is the count of frames a quorum holds durably: this replica's
// own without followers, else its own and the best follower's (two of
// three).
func (a *floorAcks) quorum() uint64 {
	if len(a.follower) == 0 {
		return a.synced
	}
	best := uint64(0)
	for _, n := range a.follower {
		best = max(best, n)
	}
	return min(a.synced, best)
}

// serveFloorStream serves one upstream connection — the publisher's at the
// leader, the leader's at a follower — with a file of its own, until the
// upstream closes.
func serveFloorStream(up net.Conn, dir string, followers []string) error {
	f, err := os.CreateTemp(dir, "floor-*.dat")
	if err != nil {
		up.Close()
		return err
	}
	a := &floorAcks{follower: make([]uint64, len(followers))}
	a.changed = sync.NewCond(&a.mu)
	var (
		wg    sync.WaitGroup
		conns []net.Conn
	)
	defer func() { // stop the goroutines, then drop the file
		a.mu.Lock()
		a.done = true
		a.mu.Unlock()
		a.changed.Broadcast()
		up.Close()
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
		f.Close()
		os.Remove(f.Name())
	}()

	var outs []*bufio.Writer
	for i, addr := range followers {
		conn, err := net.DialTimeout("tcp", addr, childReadyTimeout)
		if err != nil {
			return err
		}
		conns = append(conns, conn)
		outs = append(outs, bufio.NewWriterSize(conn, floorBufferBytes))
		go readFloorAcks(conn, func(n uint64) {
			a.mu.Lock()
			a.follower[i] = n
			a.mu.Unlock()
			a.changed.Broadcast()
		})
	}
	wg.Add(2)
	go func() { // group commit
		defer wg.Done()
		a.mu.Lock()
		defer a.mu.Unlock()
		for {
			for !a.done && a.written == a.synced {
				a.changed.Wait()
			}
			if a.done {
				return
			}
			n := a.written
			a.mu.Unlock()
			err := dataSync(f)
			a.mu.Lock()
			if err != nil {
				a.done = true
				a.changed.Broadcast()
				return
			}
			a.synced = n
			a.changed.Broadcast()
		}
	}()
	go func() { // acks upstream
		defer wg.Done()
		var sent uint64
		var b [8]byte
		a.mu.Lock()
		defer a.mu.Unlock()
		for {
			for !a.done && a.quorum() == sent {
				a.changed.Wait()
			}
			if a.done {
				return
			}
			sent = a.quorum()
			a.mu.Unlock()
			binary.BigEndian.PutUint64(b[:], sent)
			_, err := up.Write(b[:])
			a.mu.Lock()
			if err != nil {
				return
			}
		}
	}()

	// Payloads are read into pending, each right after the one before,
	// and written to the file together once nothing more is at hand (or
	// pending is full): one write for a batch, as a broker's group commit.
	r := bufio.NewReaderSize(up, floorBufferBytes)
	pending := make([]byte, 0, floorBufferBytes)
	frames := uint64(0) // in pending
	write := func() error {
		if len(pending) == 0 {
			return nil
		}
		if _, err := f.Write(pending); err != nil {
			return err
		}
		a.mu.Lock()
		a.written += frames
		a.mu.Unlock()
		a.changed.Broadcast()
		pending, frames = pending[:0], 0
		return nil
	}
	var head [4]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(head[:]))
		if n > floorFrameBytesMax {
			return fmt.Errorf("frame of %d bytes exceeds %d", n, floorFrameBytesMax)
		}
		if len(pending)+n > cap(pending) {
			if err := write(); err != nil {
				return err
			}
			if n > cap(pending) {
				pending = make([]byte, 0, n)
			}
		}
		payload := pending[len(pending) : len(pending)+n]
		if _, err := io.ReadFull(r, payload); err != nil {
			return err
		}
		pending, frames = pending[:len(pending)+n], frames+1
		for _, w := range outs {
			w.Write(head[:])
			w.Write(payload)
		}
		if r.Buffered() > 0 {
			continue
		}
		// Nothing more at hand: forward what is batched, then write it.
		for _, w := range outs {
			if err := w.Flush(); err != nil {
				return err
			}
		}
		if err := write(); err != nil {
			return err
		}
	}
}

// readFloorAcks calls acked with each cumulative ack read from conn until
// it fails.
func readFloorAcks(conn net.Conn, acked func(uint64)) error {
	r := bufio.NewReader(conn)
	var b [8]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return err
		}
		acked(binary.BigEndian.Uint64(b[:]))
	}
}

// floorSystem is the floor in one or three child processes.
type floorSystem struct {
	procs  []*childProc
	leader string // the leader's address
}

// startFloor returns the start function of a floor of n replicas.
func startFloor(n int) func(context.Context, *environment, string) (system, error) {
	return func(ctx context.Context, env *environment, dataDir string) (system, error) {
		bin, err := os.Executable()
		if err != nil {
			return nil, err
		}
		s := &floorSystem{}
		start := func(name string, followers []string) (string, error) {
			dir := filepath.Join(dataDir, name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", err
			}
			args := []string{floorReplicaArg, "-dir", dir}
			if len(followers) > 0 {
				args = append(args, "-followers", strings.Join(followers, ","))
			}
			isReady := func(line string) bool { return strings.HasPrefix(line, floorReadyPrefix) }
			p, err := startChild(ctx, env, name, filepath.Join(dataDir, name+".log"), isReady, nil, bin, args...)
			if err != nil {
				return "", err
			}
			s.procs = append(s.procs, p)
			return strings.TrimPrefix(p.readyLine, floorReadyPrefix), nil
		}
		var followers []string
		for i := 2; i <= n; i++ {
			addr, err := start(fmt.Sprintf("n%d", i), nil)
			if err != nil {
				return nil, err
			}
			followers = append(followers, addr)
		}
		if s.leader, err = start("n1", followers); err != nil {
			return nil, err
		}
		return s, nil
	}
}

// errFloorPublishOnly: the floor has no consumers.
var errFloorPublishOnly = errors.New("the floor runs publish workloads only")

func (s *floorSystem) CreateStream(context.Context, string) error { return nil }

func (s *floorSystem) NewPublisher(ctx context.Context, _ string, inflightMax int) (publisher, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.leader)
	if err != nil {
		return nil, err
	}
	p := &floorPublisher{conn: conn, window: make(chan func(error), inflightMax), readerDone: make(chan struct{})}
	p.wake = sync.NewCond(&p.mu)
	go p.writeLoop()
	go func() {
		err := readFloorAcks(conn, p.acked)
		p.fail(fmt.Errorf("floor leader: %w", err))
		close(p.readerDone)
	}()
	return p, nil
}

func (s *floorSystem) NewSubscriber(context.Context, string, string, int) (subscriber, error) {
	return nil, errFloorPublishOnly
}

func (s *floorSystem) Close() error {
	var errs []error
	for _, p := range s.procs {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// pids implements processGroup: the floor's CPU is measured as a
// broker's.
func (s *floorSystem) pids() []int {
	var out []int
	for _, p := range s.procs {
		out = append(out, p.pid())
	}
	return out
}

// floorPublisher sends frames from a write loop, batching what
// PublishAsync handed over meanwhile, and completes the publishes in order
// as the leader's cumulative acks cover them. PublishAsync is called from
// one goroutine at a time (the workloads do): the window's order is the
// frames'.
type floorPublisher struct {
	conn net.Conn
	// window holds the done functions of the publishes awaiting their
	// ack, in order; its capacity is inflightMax.
	window     chan func(error)
	readerDone chan struct{}

	mu   sync.Mutex
	wake *sync.Cond // pending or err changed
	// pending are the frames not yet handed to the write loop: each a
	// length prefix (in heads) and the caller's payload, not copied.
	pending net.Buffers
	heads   []byte
	sent    uint64 // publishes handed over
	acks    uint64 // publishes acked
	err     error  // the connection's failure, once it failed
}

func (p *floorPublisher) PublishAsync(ctx context.Context, payload []byte, done func(error)) error {
	select {
	case p.window <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	if err := p.err; err != nil {
		p.mu.Unlock()
		p.completeWindow(err) // done included
		return nil
	}
	defer p.mu.Unlock()
	if cap(p.heads)-len(p.heads) < 4 { // a new array: the pieces taken stay valid
		p.heads = make([]byte, 0, 4<<10)
	}
	n := len(p.heads)
	p.heads = binary.BigEndian.AppendUint32(p.heads, uint32(len(payload)))
	p.pending = append(p.pending, p.heads[n:], payload)
	p.sent++
	p.wake.Broadcast()
	return nil
}

func (p *floorPublisher) Publish(ctx context.Context, payload []byte) error {
	res := make(chan error, 1)
	if err := p.PublishAsync(ctx, payload, func(err error) { res <- err }); err != nil {
		return err
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeLoop writes what is pending, all of it at once, until the
// connection fails.
func (p *floorPublisher) writeLoop() {
	var spare net.Buffers
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		for p.err == nil && len(p.pending) == 0 {
			p.wake.Wait()
		}
		if p.err != nil {
			return
		}
		out := p.pending
		p.pending = spare[:0]
		p.mu.Unlock()
		unwritten := out // WriteTo consumes what it is called on
		_, err := unwritten.WriteTo(p.conn)
		clear(out)
		p.mu.Lock()
		spare = out[:0]
		if err != nil {
			p.failLocked(err)
			return
		}
	}
}

// acked completes the publishes up to the cumulative count n.
func (p *floorPublisher) acked(n uint64) {
	p.mu.Lock()
	from := p.acks
	p.acks = max(p.acks, n)
	p.wake.Broadcast()
	p.mu.Unlock()
	for ; from < n; from++ {
		(<-p.window)(nil)
	}
}

func (p *floorPublisher) fail(err error) {
	p.mu.Lock()
	p.failLocked(err)
	p.mu.Unlock()
	p.completeWindow(err)
}

// completeWindow completes with err every publish in the window.
func (p *floorPublisher) completeWindow(err error) {
	for {
		select {
		case done := <-p.window:
			done(err)
		default:
			return
		}
	}
}

func (p *floorPublisher) failLocked(err error) {
	if p.err == nil {
		p.err = err
	}
	p.wake.Broadcast()
}

func (p *floorPublisher) Flush(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.wake.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.err == nil && p.acks < p.sent && ctx.Err() == nil {
		p.wake.Wait()
	}
	if p.err != nil { // some publish failed, or may have
		return p.err
	}
	if p.acks < p.sent {
		return ctx.Err()
	}
	return nil
}

func (p *floorPublisher) Close() error {
	err := p.conn.Close()
	select {
	case <-p.readerDone:
	case <-time.After(childStopTimeout):
	}
	return err
}
