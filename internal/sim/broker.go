package sim

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/server"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

const dataDir = "/data"

// killSignal unwinds the broker's stack at a kill point: the simulated
// kill -9 happens in the middle of whatever the broker was doing.
type killSignal struct{ at string }

var (
	errInjectedFsync = errors.New("injected fsync error")
	errInjectedWrite = errors.New("injected write error (EIO)")
)

// broker is the simulated broker process: the real node and protocol over a
// crashable MemFS that survives its crashes.
type broker struct {
	w         *World
	fs        *vfs.MemFS
	mutations node.Mutations
	node      *node.Node
	srv       *server.Server
	up        bool
	started   int // incarnations so far
	conns     []*conn
	nextConn  int
	chk       *checker

	// Faults.
	fsyncErrorP   float64                           // per fsync while a burst lasts
	writeErrorP   float64                           // per write while a burst lasts
	killOnDisk    func(op vfs.Op, name string) bool // kill before this disk op
	killOnSend    func(f wire.Frame) bool           // kill as the broker sends this frame
	traceDisk     bool                              // golden traces list disk ops
	restartDelay  func() int64
	stopRestarts  bool
	damaged       map[uint32]bool // partitions whose files took a bit flip
	discardLogger *slog.Logger
	// onLog sees every WARN and ERROR line the node logs, the INFO lines
	// a checker follows (infoWatched), and every failed start as an ERROR
	// line (nil: nobody watches).
	onLog func(r slog.Record)
	// beforeStart, when set, runs before each start opens the node.
	beforeStart func()
	// cleanCrash (scripted scenarios only) makes a crash lose every
	// unsynced write whole, tearing nothing: one outcome of fs.Crash,
	// chosen instead of drawn.
	cleanCrash bool

	// A cluster member (cluster.go): its node id, the cluster and the
	// simulated peer network; nil cluster runs the single node "sim".
	id      string
	cluster *node.ClusterConfig
	peers   env.PeerNetwork
	onCrash func() // a cluster takes the dead incarnation off the network
	// A cluster member's own clock skew (ms) and pause (a stopped
	// process: nothing addressed to it runs until pausedUntil).
	skewMs      int64
	pausedUntil int64
	// stalledUntil: its replica members are held up until then (virtual
	// time; ClusterFaults.Stall).
	stalledUntil int64
	// Node settings of a cluster run with retention (0: the defaults).
	segmentBytesMax, retentionCheckMs int64
	// schedCompact: the scheduled workload's nodes checkpoint their
	// shards every few records in tiny segments, so shards are carried,
	// checkpointed and compacted (and followers rebuilt) under faults.
	schedCompact bool
	// ledgerCompactBytes is node.Config.LedgerCompactBytes: small, so
	// campaigns compact ack ledgers (and crash inside compaction) often;
	// a one-ack golden run stays below it.
	ledgerCompactBytes int64
	// kvCheckpointMinBytes is node.Config.KVCheckpointMinBytes (0: the
	// default): small in KV runs, so buckets checkpoint and truncate
	// their logs under the faults.
	kvCheckpointMinBytes int64
	// dedupSnapshotBytes is node.Config.DedupSnapshotBytes: a snapshot
	// every few records, so restarts start from them under every fault
	// (and replay the log after them); < 0 in a scenario about the log's
	// replay itself.
	dedupSnapshotBytes int64
	// schedPublish is node.Config.SchedPublishObserver (the scheduler
	// ghost's, schedghost.go; nil: none).
	schedPublish func(shard uint32, p sched.Publish)
	// schedCompact counts what the runners saw of their shards'
	// compaction (node.Config.SchedCompactObserver).
	schedCompacted func(shard uint32, event string)
	// replicaDrop is node.Config.ReplicaDropObserver (a cluster run's
	// checker: sim.beforeDrop).
	replicaDrop func(topic string, partition uint32, st replica.Status, synced uint64)
	// groupApply is node.Config.GroupApplyObserver (a cluster run's
	// checker: sim.groupApplied).
	groupApply func(seq uint64, before, after *group.State, partitions group.Topics)
}

func (b *broker) paused() bool { return b.w.nowMs < b.pausedUntil }

func (b *broker) stalled() bool { return b.w.nowMs < b.stalledUntil }

func newBroker(w *World, chk *checker, mutations node.Mutations) *broker {
	b := &broker{w: w, fs: vfs.NewMem(), mutations: mutations, chk: chk, damaged: map[uint32]bool{},
		discardLogger: slog.New(slog.DiscardHandler),
		restartDelay:  func() int64 { return w.between(20, 400) }, ledgerCompactBytes: 1024}
	b.fs.SetInjector(b.inject)
	return b
}

// inject is the MemFS hook: disk tracing, kill points and fsync errors. It
// runs under the MemFS lock, on the simulator's goroutine.
func (b *broker) inject(op vfs.Op, name string) error {
	rel := strings.TrimPrefix(name, dataDir+"/")
	if b.traceDisk && (op == vfs.OpWrite || op == vfs.OpSync || op == vfs.OpTruncate) {
		b.w.tracef("disk %s %s", op, rel)
	}
	if b.killOnDisk != nil && b.killOnDisk(op, rel) {
		b.killOnDisk = nil
		panic(killSignal{at: fmt.Sprintf("disk %s %s", op, rel)})
	}
	if op == vfs.OpSync && b.w.chance(b.fsyncErrorP) {
		b.w.tracef("fault fsync error %s", rel)
		return errInjectedFsync
	}
	if op == vfs.OpWrite && b.w.chance(b.writeErrorP) {
		b.w.tracef("fault write error %s", rel)
		return errInjectedWrite
	}
	return nil
}

// start opens the node (recovery included) as a new incarnation.
func (b *broker) start() {
	if b.up {
		return
	}
	b.started++
	if b.beforeStart != nil {
		b.beforeStart()
	}
	var n *node.Node
	err := b.guard(func() error {
		var err error
		checkpointEvery, schedSegment := 0, int64(0)
		if b.schedCompact {
			checkpointEvery, schedSegment = schedCheckpointEvery, schedSegmentBytes
		}
		e := b.w.brokerEnv(b.fs)
		if b.cluster != nil {
			e.Clock, e.Peers = nodeClock{b}, b.peers
		}
		n, err = node.Open(node.Config{NodeID: cmp.Or(b.id, "sim"), ClientAddr: b.id, DataDir: dataDir, Env: e, Manual: true,
			Cluster:         b.cluster,
			Logger:          b.nodeLogger(),
			Mutations:       b.mutations,
			SegmentBytesMax: b.segmentBytesMax, RetentionCheckMs: b.retentionCheckMs,
			LedgerCompactBytes: b.ledgerCompactBytes, SchedPublishObserver: b.schedPublish, SchedCompactObserver: b.schedCompacted, ReplicaDropObserver: b.replicaDrop, GroupApplyObserver: b.groupApply,
			KVCheckpointMinBytes: b.kvCheckpointMinBytes,
			DedupSnapshotBytes:   b.dedupSnapshotBytes, SyncedMarkMs: syncedMarkMs,
			// A tiny window, so the scheduler's spill runs under every
			// fault (its files take write errors, crashes, power loss).
			SchedWindow: 4, SchedCheckpointEvery: checkpointEvery, SchedSegmentBytesMax: schedSegment})
		return err
	})
	if err != nil {
		b.w.tracef("broker start failed: %v", err)
		if b.onLog != nil && err != errKilled {
			b.onLog(slog.NewRecord(time.Time{}, slog.LevelError, err.Error(), 0))
		}
		b.scheduleRestart()
		return
	}
	srv, err := server.New(server.Config{AllowNoAuth: true, Logger: b.discardLogger}, n)
	if err != nil {
		panic(err) // configuration is fixed; this is a programmer error
	}
	b.node, b.srv, b.up = n, srv, true
	b.w.tracef("%s up (incarnation %d)", cmp.Or(b.id, "broker"), b.started)
}

// guard runs fn and turns a kill point into a crash. It returns fn's error,
// or errKilled when the broker died inside.
func (b *broker) guard(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			k, ok := r.(killSignal)
			if !ok {
				panic(r)
			}
			b.w.tracef("kill -9 at %s", k.at)
			b.crashNow()
			err = errKilled
		}
	}()
	return fn()
}

var errKilled = errors.New("broker killed")

// crash is kill -9 at an event boundary.
func (b *broker) crash() {
	if !b.up {
		return
	}
	b.w.tracef("kill -9")
	b.crashNow()
}

func (b *broker) crashNow() {
	b.up = false       // the node is gone: nothing below may call into it
	b.stalledUntil = 0 // its held-up members die with it
	if b.onCrash != nil {
		b.onCrash()
	}
	for _, c := range b.conns {
		c.breakConn("broker crashed")
	}
	b.conns = nil
	if b.cleanCrash {
		b.fs.CrashClean()
	} else {
		b.fs.Crash(b.w.rng) // unsynced data lost, last write maybe torn
	}
	b.node, b.srv = nil, nil
	b.scheduleRestart()
}

func (b *broker) scheduleRestart() {
	if b.stopRestarts {
		return
	}
	b.w.after(b.restartDelay(), b.start)
}

// step runs the node's due work (group commit, deliveries, redeliveries).
func (b *broker) step() {
	if !b.up || b.paused() {
		return
	}
	b.guard(func() error { b.node.Step(); return nil })
}

// conn is one client connection: FIFO in each direction like TCP, with a
// random latency per frame. Frames cross it encoded, so the codec runs.
type conn struct {
	id     int
	b      *broker
	cl     client
	proto  *server.Protocol
	open   bool
	hello  bool
	c2sAt  int64 // arrival time of the last frame sent each way (FIFO)
	s2cAt  int64
	closed bool // the client has been told
	// repliesLost models a one-way partition: the broker still receives
	// the client's frames, but nothing it sends arrives.
	repliesLost bool
	// ackOKInc: the group's incarnation the broker served when it sent
	// each ACK_OK in flight, by corr (runs with group deletes only;
	// checker.ackConfirms).
	ackOKInc map[uint64]uint64
}

// client is a workload participant that owns connections.
type client interface {
	name() string
	onFrame(c *conn, corr uint64, f wire.Frame)
	onClose(c *conn)
}

// dial opens a connection, or fails it (the client hears onClose) when the
// broker is down or the client is partitioned away.
func (b *broker) dial(cl client, partitioned bool) *conn {
	b.nextConn++
	c := &conn{id: b.nextConn, b: b, cl: cl}
	if !b.up || partitioned {
		b.w.tracef("%s dial #%d refused", cl.name(), c.id)
		b.w.after(b.w.between(1, 20), func() { c.notifyClosed() })
		return c
	}
	c.open = true
	c.proto = b.srv.NewProtocol(c.serverSend, fmt.Sprintf("%s#%d", cl.name(), c.id))
	b.conns = append(b.conns, c)
	b.w.tracef("%s dial #%d", cl.name(), c.id)
	return c
}

func (b *broker) latency() int64 {
	if b.w.chance(0.1) {
		return b.w.between(5, 50)
	}
	return b.w.between(1, 5)
}

// send carries a frame from the client to the broker.
func (c *conn) send(corr uint64, f wire.Frame) {
	if !c.open {
		return
	}
	if line := describe(f); line != "" {
		c.w().tracef("%s -> %s", c.cl.name(), line)
	}
	frame := wire.AppendFrame(nil, corr, f)
	c.c2sAt = max(c.w().nowMs+c.b.latency(), c.c2sAt)
	c.w().after(c.c2sAt-c.w().nowMs, func() { c.arriveAtBroker(frame) })
}

func (c *conn) w() *World { return c.b.w }

func (c *conn) arriveAtBroker(frame []byte) {
	if !c.open {
		return
	}
	if c.b.paused() {
		c.w().after(c.b.pausedUntil-c.w().nowMs, func() { c.arriveAtBroker(frame) })
		return
	}
	corr, f, err := wire.ReadFrame(bytes.NewReader(frame), wire.DefaultFrameBytesMax)
	if err != nil {
		c.proto.ReadFailed(corr, err)
		c.breakConn("bad frame")
		return
	}
	if !c.hello {
		v := c.proto.Hello(corr, f)
		c.hello = v.Accepted
		c.w().after(v.Delay.Milliseconds(), func() {
			c.serverSend(corr, v.Reply)
			if !v.Accepted {
				c.breakConn("handshake refused")
			}
		})
		return
	}
	var keep bool
	c.b.guard(func() error { keep = c.proto.Handle(corr, f); return nil })
	if c.open && !keep {
		c.breakConn("protocol error")
	}
}

// serverSend is the Protocol's send: frames to the client, FIFO.
func (c *conn) serverSend(corr uint64, f wire.Frame) {
	if !c.open {
		return
	}
	if c.b.killOnSend != nil && c.b.killOnSend(f) {
		c.b.killOnSend = nil
		panic(killSignal{at: "send " + f.Type().String()})
	}
	c.b.chk.brokerSends(c.b, f)
	if c.repliesLost {
		return
	}
	if _, ok := f.(*wire.AckOK); ok && c.b.chk.groupInc > 0 { // noted only for an answer that arrives
		if c.ackOKInc == nil {
			c.ackOKInc = map[uint64]uint64{}
		}
		c.ackOKInc[corr] = c.b.node.GroupIncarnation(simGroup)
	}
	frame := wire.AppendFrame(nil, corr, f)
	c.s2cAt = max(c.w().nowMs+c.b.latency(), c.s2cAt)
	c.w().after(c.s2cAt-c.w().nowMs, func() {
		if !c.open {
			return
		}
		corr, f, err := wire.ReadFrame(bytes.NewReader(frame), wire.DefaultFrameBytesMax)
		if err != nil {
			panic(fmt.Sprintf("sim: broker sent an undecodable frame: %v", err))
		}
		c.cl.onFrame(c, corr, f)
	})
}

// breakConn closes the connection at both ends; frames in flight are lost.
func (c *conn) breakConn(why string) {
	if !c.open {
		return
	}
	c.open = false
	c.w().tracef("%s conn #%d closed: %s", c.cl.name(), c.id, why)
	if c.b.up && c.proto != nil {
		c.b.guard(func() error { c.proto.Close(); return nil })
	}
	c.w().after(c.b.w.between(1, 10), c.notifyClosed)
}

func (c *conn) notifyClosed() {
	if c.closed {
		return
	}
	c.closed = true
	c.cl.onClose(c)
}

// describe summarizes the client requests worth a trace line.
func describe(f wire.Frame) string {
	switch f := f.(type) {
	case *wire.Pub:
		return fmt.Sprintf("PUB pid=%d pseq=%d", f.ProducerID, f.ProducerSeq)
	case *wire.Pull:
		return fmt.Sprintf("PULL credit=%d", f.Credit)
	case *wire.Ack:
		return "ACK " + describeEntries(f.Entries)
	case *wire.Nack:
		return "NACK " + describeEntries(f.Entries)
	}
	return ""
}

func describeEntries(es []wire.AckEntry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%d/%d@%d", e.Partition, e.Seq, e.DeliveryID)
	}
	return strings.Join(parts, ",")
}

// nodeLogger is the logger of b's node: discarded, unless the run's
// options ask for the nodes' logs (ClusterOptions.Logs). Its WARN and
// ERROR lines go to b.onLog too: what an operator watching it would see.
func (b *broker) nodeLogger() *slog.Logger {
	h := b.discardLogger.Handler()
	if b.w.logs != nil {
		h = slog.NewTextHandler(b.w.logs, &slog.HandlerOptions{Level: slog.LevelDebug,
			ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey && len(groups) == 0 {
					return slog.Int64("t", b.w.nowMs-epochMs)
				}
				return a
			}})
	}
	return slog.New(logWatch{Handler: h, b: b}).With("sim_node", b.id)
}

// logWatch passes a node's log records on and shows its WARN and ERROR
// lines to the broker's onLog.
type logWatch struct {
	slog.Handler
	b *broker
}

// infoWatched: the INFO lines onLog sees too — a bucket loaded from a
// checkpoint holds what a repair's gap below its base dropped (kvloss.go).
var infoWatched = map[string]bool{node.KVRebuiltMessage: true}

func (e logWatch) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || l == slog.LevelInfo && e.b.onLog != nil || e.Handler.Enabled(ctx, l)
}

func (e logWatch) Handle(ctx context.Context, r slog.Record) error {
	if (r.Level >= slog.LevelWarn || infoWatched[r.Message]) && e.b.onLog != nil {
		e.b.onLog(r)
	}
	if !e.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return e.Handler.Handle(ctx, r)
}

func (e logWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return logWatch{Handler: e.Handler.WithAttrs(as), b: e.b}
}

func (e logWatch) WithGroup(name string) slog.Handler {
	return logWatch{Handler: e.Handler.WithGroup(name), b: e.b}
}
