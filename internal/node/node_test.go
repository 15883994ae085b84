package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// harness runs a node on an in-memory, crashable file system with a clock
// the test advances.
type harness struct {
	t     testing.TB
	fs    *vfs.MemFS
	nowMs atomic.Int64
	// wallStepMs steps the wall clock alone (testClock.wallStepMs).
	wallStepMs atomic.Int64
	node       *Node
	// tune, when set, adjusts the config of every open.
	tune func(*Config)
}

// testClock is the wall clock with a NowMs the test sets: the node's
// timers still fire in real time, but what it stamps and compares is the
// test's time.
type testClock struct {
	env.Wall
	nowMs *atomic.Int64
	// wallStepMs, when set, moves the wall clock (NowMs) alone: a step
	// of it, as NTP makes one.
	wallStepMs *atomic.Int64
}

func (c testClock) NowMs() int64 { return c.nowMs.Load() + c.stepMs() }

// NowNanos follows the test's clock too, without its wall-clock steps.
func (c testClock) NowNanos() int64 { return c.nowMs.Load() * int64(time.Millisecond) }

func (c testClock) stepMs() int64 {
	if c.wallStepMs == nil {
		return 0
	}
	return c.wallStepMs.Load()
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, fs: vfs.NewMem()}
	h.nowMs.Store(1_000_000)
	h.open()
	t.Cleanup(func() { h.node.Close() })
	return h
}

func (h *harness) open() {
	h.t.Helper()
	if err := h.tryOpen(); err != nil {
		h.t.Fatalf("Open: %v", err)
	}
}

// tryOpen is open that returns Open's error.
func (h *harness) tryOpen() error {
	cfg := Config{DataDir: "/data", Env: env.Env{FS: h.fs, Clock: testClock{nowMs: &h.nowMs, wallStepMs: &h.wallStepMs}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if h.tune != nil {
		h.tune(&cfg)
	}
	n, err := Open(cfg)
	if err == nil {
		h.node = n
	}
	return err
}

func (h *harness) restart() {
	h.node.Close()
	h.open()
}

func (h *harness) declare(name string, partitions uint32) {
	h.t.Helper()
	if _, err := h.node.Declare(wire.TopicConfig{Name: name, Partitions: partitions}); err != nil {
		h.t.Fatalf("Declare: %v", err)
	}
}

const waitMax = 10 * time.Second

// openManual opens a node in Manual mode on a fresh file system, its
// clock at now: the test's goroutine drives it (Step) and owns its runners.
func openManual(t *testing.T, now *atomic.Int64) *Node {
	t.Helper()
	n, err := Open(Config{DataDir: "/data", Env: env.Env{FS: vfs.NewMem(), Clock: testClock{nowMs: now}}, Manual: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func (h *harness) publish(pub *wire.Pub) (wire.PubOK, error) {
	h.t.Helper()
	type res struct {
		ok  wire.PubOK
		err *wire.Error
	}
	ch := make(chan res, 1)
	h.node.Publish(pub, func(ok wire.PubOK, err *wire.Error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		if r.err != nil {
			return r.ok, r.err
		}
		return r.ok, nil
	case <-time.After(waitMax):
		h.t.Fatal("publish: no reply")
		return wire.PubOK{}, nil
	}
}

func (h *harness) mustPublish(pub *wire.Pub) wire.PubOK {
	h.t.Helper()
	ok, err := h.publish(pub)
	if err != nil {
		h.t.Fatalf("publish: %v", err)
	}
	return ok
}

func (h *harness) ack(topic, group string, nack bool, entries ...wire.AckEntry) []wire.Code {
	h.t.Helper()
	ch := make(chan []wire.Code, 1)
	reply := func(res []wire.Code, err *wire.Error) {
		if err != nil {
			h.t.Errorf("ack: %v", err)
		}
		ch <- res
	}
	if nack {
		h.node.Nack(topic, group, entries, 0, reply)
	} else {
		h.node.Ack(topic, group, entries, reply)
	}
	select {
	case r := <-ch:
		return r
	case <-time.After(waitMax):
		h.t.Fatal("ack: no reply")
		return nil
	}
}

// sync makes the group goroutine finish an iteration: an ack of nothing is
// answered only after the loop that handled every earlier command ran.
func (h *harness) sync(topic, group string) {
	h.ack(topic, group, false)
	h.ack(topic, group, false)
}

// sink collects MSG frames and the error that ended the subscription.
type sink struct {
	mu    sync.Mutex
	msgs  []*wire.Msg
	ended *wire.Error
	ch    chan struct{}
}

func (s *sink) End(err *wire.Error) {
	s.mu.Lock()
	s.ended = err
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

func newSink() *sink { return &sink{ch: make(chan struct{}, 1)} }

func (s *sink) SendMsg(m *wire.Msg) {
	s.mu.Lock()
	s.msgs = append(s.msgs, m)
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

func (s *sink) waitFor(t testing.TB, n int) []*wire.Msg {
	t.Helper()
	deadline := time.After(waitMax)
	for {
		s.mu.Lock()
		if len(s.msgs) >= n {
			out := append([]*wire.Msg(nil), s.msgs...)
			s.mu.Unlock()
			return out
		}
		s.mu.Unlock()
		select {
		case <-s.ch:
		case <-deadline:
			t.Fatalf("got %d messages, want %d", s.count(), n)
		}
	}
}

func TestPublishThenRestartKeepsEverySeq(t *testing.T) {
	h := newHarness(t)
	h.declare("orders", 3)
	acked := map[string]wire.PubOK{}
	for i := 0; i < 60; i++ {
		key := fmt.Sprintf("k%d", i)
		acked[key] = h.mustPublish(&wire.Pub{Topic: "orders", Partition: wire.PartitionAuto, Key: []byte(key), Value: []byte("v" + key)})
	}
	h.restart()
	s := newSink()
	sub, err := h.node.Subscribe("orders", "g", GroupOptions{}, s)
	if err != nil {
		t.Fatal(err)
	}
	sub.AddCredit(1000)
	got := s.waitFor(t, 60)
	for _, m := range got {
		ok := acked[string(m.Key)]
		if ok.Partition != m.Partition || ok.Seq != m.Seq || string(m.Value) != "v"+string(m.Key) {
			t.Fatalf("message %s at %d/%d, acked at %d/%d", m.Key, m.Partition, m.Seq, ok.Partition, ok.Seq)
		}
		if ok.Partition != wire.PartitionForKey(m.Key, 3) {
			t.Fatalf("key %s in partition %d, want hash partition", m.Key, ok.Partition)
		}
	}
	h.sync("orders", "g")
	if n := s.count(); n != 60 {
		t.Fatalf("delivered %d, want exactly 60", n)
	}
	// Each restart starts a new epoch.
	for _, p := range h.node.Metadata([]string{"orders"})[0].Partitions {
		if p.Epoch != 2 {
			t.Fatalf("partition %d epoch %d after one restart, want 2", p.Partition, p.Epoch)
		}
	}
}

func TestDeclareIsIdempotentAndConflictsAreErrors(t *testing.T) {
	h := newHarness(t)
	created, err := h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 2})
	if err != nil || !created {
		t.Fatalf("first declare: created=%v err=%v", created, err)
	}
	created, err = h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 2})
	if err != nil || created {
		t.Fatalf("identical declare: created=%v err=%v", created, err)
	}
	if _, err := h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 3}); !errors.Is(err, wire.ErrTopicConflict) {
		t.Fatalf("conflicting declare: %v", err)
	}
	for _, bad := range []wire.TopicConfig{{Name: "t", Partitions: 0}, {Name: "a b", Partitions: 1}, {Name: "x", Partitions: 1, RetentionMs: -1}} {
		if _, err := h.node.Declare(bad); !errors.Is(err, wire.ErrInvalidArgument) {
			t.Fatalf("declare %+v: %v", bad, err)
		}
	}
	h.restart()
	if _, err := h.node.Declare(wire.TopicConfig{Name: "t", Partitions: 3}); !errors.Is(err, wire.ErrTopicConflict) {
		t.Fatalf("conflict after restart: %v", err)
	}
	if _, err := h.publish(&wire.Pub{Topic: "missing", Partition: wire.PartitionAuto}); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("publish to missing topic: %v", err)
	}
	if _, err := h.publish(&wire.Pub{Topic: "t", Partition: 5}); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("publish to missing partition: %v", err)
	}
}

func TestProducerReplayReturnsOriginalAcrossRestart(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 4)
	orig := map[uint64]wire.PubOK{}
	for seq := uint64(1); seq <= 20; seq++ {
		orig[seq] = h.mustPublish(&wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 77, ProducerSeq: seq, Value: []byte{byte(seq)}})
	}
	h.restart()
	for seq := uint64(1); seq <= 20; seq++ {
		again := h.mustPublish(&wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 77, ProducerSeq: seq, Value: []byte{byte(seq)}})
		want := orig[seq]
		want.Duplicate = true
		if again != want {
			t.Fatalf("replay of %d = %+v, want %+v", seq, again, want)
		}
	}
	var total uint64
	for _, p := range h.node.Metadata([]string{"t"})[0].Partitions {
		total += p.CommitSeq
	}
	if total != 20 {
		t.Fatalf("%d records stored, want 20 (a replay appended)", total)
	}
}

func TestConcurrentDuplicatesInOneBatchAppendOnce(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	var wg sync.WaitGroup
	results := make([]wire.PubOK, 50)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 5, ProducerSeq: 1})
		}()
	}
	wg.Wait()
	for _, r := range results {
		if r.Seq != 1 {
			t.Fatalf("duplicate publish landed at seq %d", r.Seq)
		}
	}
	if c := h.node.Metadata([]string{"t"})[0].Partitions[0].CommitSeq; c != 1 {
		t.Fatalf("commit seq %d, want 1", c)
	}
}

func TestCrashKeepsEveryAckedRecord(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			h := newHarness(t)
			h.declare("t", 2)
			rng := rand.New(rand.NewPCG(seed, 0))
			acked := map[string]wire.PubOK{}
			var mu sync.Mutex
			publish := func(i int) {
				value := fmt.Sprint("v", i)
				ok, err := h.publish(&wire.Pub{Topic: "t", Partition: wire.PartitionAuto, ProducerID: 9, ProducerSeq: uint64(i + 1), Value: []byte(value)})
				if err == nil {
					mu.Lock()
					acked[value] = ok
					mu.Unlock()
				}
			}
			for i := 0; i < 10; i++ {
				publish(i)
			}
			// Concurrent publishes with a crash (unsynced data lost, torn
			// tail) in the middle, then a second crash after the last ack:
			// nothing acked may depend on a clean shutdown.
			var wg sync.WaitGroup
			for i := 10; i < 40; i++ {
				wg.Add(1)
				go func() { defer wg.Done(); publish(i) }()
				if i == 25 {
					h.fs.Crash(rng)
				}
			}
			wg.Wait()
			h.fs.Crash(rng)
			h.node.Close()
			h.open()
			if len(acked) < 10 {
				t.Fatalf("only %d publishes acked", len(acked))
			}
			tp, _ := h.node.topic("t")
			for value, ok := range acked {
				entries, err := tp.partitions[ok.Partition].read(ok.Seq, 1, 1)
				if err != nil || len(entries) != 1 || string(entries[0].Record.Value) != value {
					t.Fatalf("acked %s at %d/%d: read %v %v", value, ok.Partition, ok.Seq, entries, err)
				}
			}
		})
	}
}

func TestFsyncFailureFailsPublishThenRecovers(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("a")})
	var fail atomic.Bool
	fail.Store(true)
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSync && fail.CompareAndSwap(true, false) {
			return errors.New("injected fsync error")
		}
		return nil
	})
	_, err := h.publish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 3, ProducerSeq: 1, Value: []byte("b")})
	if !errors.Is(err, wire.ErrStorage) {
		t.Fatalf("publish during fsync failure: %v, want STORAGE_ERROR", err)
	}
	// The retry is answered exactly once, whether or not the failed write
	// reached the disk, and later publishes work.
	again := h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, ProducerID: 3, ProducerSeq: 1, Value: []byte("b")})
	next := h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte("c")})
	if next.Seq != again.Seq+1 {
		t.Fatalf("retry at %d, next at %d", again.Seq, next.Seq)
	}
}

// TestPipelinedCommitUnderFsyncFailures keeps many publishes in flight
// while fsyncs are slow and some fail, so that one fsync request queues
// behind the running one: every publish is answered exactly once, and every
// acked record survives a crash.
func TestPipelinedCommitUnderFsyncFailures(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	var syncs atomic.Int64
	h.fs.SetInjector(func(op vfs.Op, name string) error {
		if op != vfs.OpSync || !strings.Contains(name, "topics/t/") {
			return nil
		}
		time.Sleep(100 * time.Microsecond) // let publishes pile up behind it
		if syncs.Add(1)%7 == 0 {
			return errors.New("injected fsync error")
		}
		return nil
	})
	const workers, each = 64, 40 // 64 in flight, renewed as they are answered
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		replies = make([]int, workers*each)
		acked   = map[uint64]string{} // seq → value
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				i := w*each + j
				value := fmt.Sprint("v", i)
				answered := make(chan struct{})
				h.node.Publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte(value)}, func(ok wire.PubOK, err *wire.Error) {
					mu.Lock()
					replies[i]++
					first := replies[i] == 1
					if err == nil {
						acked[ok.Seq] = value
					}
					mu.Unlock()
					if first {
						close(answered)
					}
				})
				<-answered
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitMax):
		t.Fatal("publishes not all answered")
	}
	for i, r := range replies {
		if r != 1 {
			t.Fatalf("publish %d answered %d times", i, r)
		}
	}
	t.Logf("%d acked, %d fsyncs", len(acked), syncs.Load())
	if len(acked) == 0 || syncs.Load() < 7 {
		t.Fatalf("%d acked with %d fsyncs: the test exercised nothing", len(acked), syncs.Load())
	}
	h.fs.SetInjector(nil)
	h.fs.CrashClean() // every unsynced write is lost: an early ack shows
	h.restart()
	tp, _ := h.node.topic("t")
	for seq, value := range acked {
		entries, err := tp.partitions[0].read(seq, 1, 1)
		if err != nil || len(entries) != 1 || string(entries[0].Record.Value) != value {
			t.Fatalf("acked %s at seq %d: read %v %v", value, seq, entries, err)
		}
	}
}

// heldSyncFS holds each fsync of a partition log file in hold before it
// runs, outside the MemFS lock, so appends proceed while it waits (as with
// a slow disk).
type heldSyncFS struct {
	vfs.FS
	hold func(name string)
}

func (h heldSyncFS) OpenRW(name string) (vfs.File, error) {
	f, err := h.FS.OpenRW(name)
	if err != nil || !strings.HasPrefix(name, "/data/topics/") || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return heldSyncFile{File: f, hold: func() { h.hold(name) }}, nil
}

type heldSyncFile struct {
	vfs.File
	hold func()
}

func (f heldSyncFile) Sync() error {
	f.hold()
	return f.File.Sync()
}

// openWithTopic opens a node with cfg (and a quiet logger), closed when
// the test ends, with the one-partition topic "t" declared.
func openWithTopic(t *testing.T, cfg Config) *Node {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	if _, err := n.Declare(wire.TopicConfig{Name: "t", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPipelinedFsyncAnswersOnlyWhatItCovered holds each fsync of the
// partition log until the test releases it: a publish appended while an
// fsync runs is answered only after an fsync that started after it
// returns — not when the running one does.
func TestPipelinedFsyncAnswersOnlyWhatItCovered(t *testing.T) {
	// Buffered: fsyncs the test does not wait for (a request queued behind
	// b's) block neither on entered nor, once holding ends, on release.
	entered, release := make(chan struct{}, 8), make(chan struct{}, 8)
	var holding atomic.Bool
	fsys := heldSyncFS{FS: vfs.NewMem(), hold: func(string) {
		if holding.Load() {
			entered <- struct{}{}
			<-release
		}
	}}
	n := openWithTopic(t, Config{DataDir: "/data", Env: env.Env{FS: fsys}})
	holding.Store(true)
	defer func() {
		holding.Store(false)
		for range cap(release) {
			release <- struct{}{}
		}
	}()
	publish := func(value string) chan *wire.Error {
		answered := make(chan *wire.Error, 1)
		n.Publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte(value)}, func(_ wire.PubOK, err *wire.Error) { answered <- err })
		return answered
	}
	waitFor := func(what string, ch chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(waitMax):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	answer := func(what string, ch chan *wire.Error) {
		t.Helper()
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(waitMax):
			t.Fatalf("%s was not answered after its fsync", what)
		}
	}
	a := publish("a")
	waitFor("the fsync of a", entered)
	b := publish("b")
	tp, _ := n.topic("t")
	for deadline := time.Now().Add(waitMax); tp.partitions[0].store.(*localStore).log.NextSeq() < 3; {
		if time.Now().After(deadline) {
			t.Fatal("b was never appended")
		}
		time.Sleep(time.Millisecond)
	}
	release <- struct{}{} // the first fsync returns: it covered a only
	waitFor("the fsync of b", entered)
	answer("a", a)
	select {
	case err := <-b:
		t.Fatalf("b answered (%v) while the fsync covering it is still held", err)
	default:
	}
	release <- struct{}{}
	answer("b", b)
}

// TestReadBelowTheCommitIsNotTheEnd: a read of seqs the node published as
// committed that finds its log ending below them (a replica that has just
// cut a damaged range, before its status caught up) is an error to retry,
// not an empty answer: a group replaying its acks would take it for the
// end and redeliver what was acknowledged after it (cluster soak, seed
// 105140).
func TestReadBelowTheCommitIsNotTheEnd(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	for i := 0; i < 3; i++ {
		h.mustPublish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte{byte(i)}})
	}
	tp, err := h.node.topic("t")
	if err != nil {
		t.Fatal(err)
	}
	p := tp.partitions[0]
	if es, err := p.read(1, 10, 1<<20); err != nil || len(es) != 3 {
		t.Fatalf("setup: read %d entries, %v", len(es), err)
	}
	p.commitSeq.Store(5) // what the log no longer holds
	es, err := p.read(4, 10, 1<<20)
	var werr *wire.Error
	if !errors.As(err, &werr) || werr.Code != wire.CodeUnavailable || len(es) != 0 {
		t.Fatalf("read above the log's end, below the commit: %d entries, %v; want UNAVAILABLE", len(es), err)
	}
	if es, err := p.read(6, 10, 1<<20); err != nil || len(es) != 0 {
		t.Fatalf("a read above the commit: %d entries, %v; want none, no error", len(es), err)
	}
}

// Records whose bytes are in their headers (a scheduler shard's
// checkpoint chunks are) are cut into log batches by their whole encoded
// size: a burst of them used to be appended as one batch over the
// storage's 16 MiB, refused with STORAGE_ERROR (found at 4 million
// pending schedules, when a shard checkpointed).
func TestBurstOfHeaderHeavyRecordsIsCutIntoBatches(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	big := bytes.Repeat([]byte("h"), 256<<10)
	const n = 100 // 25 MiB of headers
	errs := make(chan *wire.Error, n)
	for i := range n {
		h.node.Publish(&wire.Pub{Topic: "t", Partition: 0, Value: []byte{byte(i)}, Headers: []wire.Header{{Key: "chunk", Value: big}}},
			func(_ wire.PubOK, err *wire.Error) { errs <- err })
	}
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatalf("publish of a header-heavy record: %v", err)
			}
		case <-time.After(waitMax):
			t.Fatal("publish: no reply")
		}
	}
}
