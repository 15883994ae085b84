package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/server"
	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// kvBroker is a real node and its client server on loopback.
type kvBroker struct {
	node *node.Node
	srv  *server.Server
	addr string
}

func (b *kvBroker) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.srv.Close(ctx)
	b.node.Close()
}

// startKVBroker opens a node on fs (dir) and serves it on lis.
func startKVBroker(t *testing.T, fs vfs.FS, dir string, lis net.Listener, cluster *node.ClusterConfig) *kvBroker {
	t.Helper()
	return startBrokerWith(t, fs, dir, lis, cluster, server.Config{})
}

// startBrokerWith is startKVBroker with the server's settings scfg (its
// auth and logger set here).
func startBrokerWith(t *testing.T, fs vfs.FS, dir string, lis net.Listener, cluster *node.ClusterConfig, scfg server.Config) *kvBroker {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := node.Config{NodeID: "n1", DataDir: dir, Env: env.Env{FS: fs}, Logger: logger, ClientAddr: lis.Addr().String(), Cluster: cluster}
	if cluster != nil {
		cfg.NodeID = strings.TrimPrefix(dir, "/")
	}
	n, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	scfg.AllowNoAuth, scfg.Logger = true, logger
	s, err := server.New(scfg, n)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	return &kvBroker{node: n, srv: s, addr: lis.Addr().String()}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func dialKV(t *testing.T, addrs ...string) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), Options{Servers: addrs, ClientName: t.Name(), RequestTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The SDK end to end against a real node: bucket create/list/delete,
// put, get, CAS with the current revision on a mismatch, history, keys,
// and a watch that sees every write in order.
func TestKVOnANode(t *testing.T) {
	b := startKVBroker(t, vfs.NewMem(), "/d", listen(t), nil)
	t.Cleanup(b.stop)
	c := dialKV(t, b.addr)
	ctx := testCtx(t)
	if created, err := c.CreateBucket(ctx, KVBucketConfig{Bucket: "cfg", History: 4}); err != nil || !created {
		t.Fatalf("CreateBucket = %v, %v", created, err)
	}
	if _, err := c.CreateBucket(ctx, KVBucketConfig{Bucket: "cfg", History: 2}); !errors.Is(err, ErrTopicConflict) {
		t.Fatalf("conflicting create: %v", err)
	}
	kv := c.KV("cfg")
	w, err := kv.Watch(ctx, KVWatchOptions{Credit: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	r1, err := kv.Put(ctx, "a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := kv.CAS(ctx, "a", []byte("2"), r1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kv.CAS(ctx, "a", []byte("x"), r1)
	var mismatch *RevisionMismatchError
	if !errors.As(err, &mismatch) || mismatch.Current != r2 || !errors.Is(err, ErrRevisionMismatch) {
		t.Fatalf("stale CAS: %v", err)
	}
	if _, err := kv.CAS(ctx, "b", []byte("new"), 0); err != nil {
		t.Fatalf("create-only CAS: %v", err)
	}
	rd, err := kv.Delete(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "a"); err != nil || string(e.Value) != "2" || e.Revision != r2 {
		t.Fatalf("Get = %+v, %v", e, err)
	}
	if _, err := kv.Get(ctx, "b"); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("Get of a deleted key: %v", err)
	}
	if e, err := kv.GetRevision(ctx, "a", r1); err != nil || string(e.Value) != "1" {
		t.Fatalf("GetRevision = %+v, %v", e, err)
	}
	if h, err := kv.History(ctx, "b"); err != nil || len(h) != 2 || !h[1].Deleted || h[1].Revision != rd {
		t.Fatalf("History = %+v, %v", h, err)
	}
	if keys, err := kv.Keys(ctx, ""); err != nil || strings.Join(keys, ",") != "a" {
		t.Fatalf("Keys = %v, %v", keys, err)
	}
	var seen []string
	for len(seen) < 4 { // the refused CAS wrote nothing
		select {
		case ev := <-w.Events():
			seen = append(seen, fmt.Sprintf("%d:%s:%v", ev.Entry.Revision, ev.Entry.Key, ev.Entry.Deleted))
		case <-ctx.Done():
			t.Fatalf("watch saw only %v", seen)
		}
	}
	if seen[0] != fmt.Sprintf("%d:a:false", r1) || seen[3] != fmt.Sprintf("%d:b:true", rd) {
		t.Fatalf("watch saw %v", seen)
	}
	if rev, entries, err := kv.List(ctx, ""); err != nil || rev != rd || len(entries) != 1 || entries[0].Key != "a" || string(entries[0].Value) != "2" {
		t.Fatalf("List = %d, %+v, %v", rev, entries, err)
	}
	if infos, err := c.Buckets(ctx); err != nil || len(infos) != 1 || infos[0].Config.History != 4 || infos[0].Revision != rd {
		t.Fatalf("Buckets = %+v, %v", infos, err)
	}
	if _, err := c.KV("nope").Get(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get in a missing bucket: %v", err)
	}
	if err := c.DeleteBucket(ctx, "cfg"); err != nil {
		t.Fatal(err)
	}
	if err := w.Err(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("watch of a deleted bucket ended with %v", err)
	}
}

// kvCluster runs three nodes with their client servers on loopback.
type kvCluster struct {
	t       *testing.T
	fs      *vfs.MemFS
	members []node.Member
	clients map[string]net.Listener // client listeners, kept across restarts by address
	addrs   map[string]string
	brokers map[string]*kvBroker
}

func newKVCluster(t *testing.T) *kvCluster {
	kc := &kvCluster{t: t, fs: vfs.NewMem(), clients: map[string]net.Listener{}, addrs: map[string]string{}, brokers: map[string]*kvBroker{}}
	peers := map[string]net.Listener{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("n%d", i)
		peers[id] = listen(t)
		kc.members = append(kc.members, node.Member{ID: id, PeerAddr: peers[id].Addr().String()})
		lis := listen(t)
		kc.clients[id], kc.addrs[id] = lis, lis.Addr().String()
	}
	for id, l := range peers {
		kc.start(id, l)
	}
	t.Cleanup(func() {
		for _, b := range kc.brokers {
			b.stop()
		}
	})
	return kc
}

func (kc *kvCluster) start(id string, peer net.Listener) {
	lis := kc.clients[id]
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", kc.addrs[id]); err != nil {
			kc.t.Fatalf("listen again on %s: %v", kc.addrs[id], err)
		}
	}
	delete(kc.clients, id)
	cc := &node.ClusterConfig{Members: kc.members, Secret: []byte("test-cluster-secret-0123456789"),
		Tick: 5 * time.Millisecond, ElectionTicks: 30, PeerListener: peer}
	kc.brokers[id] = startKVBroker(kc.t, kc.fs, "/"+id, lis, cc)
}

func (kc *kvCluster) stop(id string) {
	kc.brokers[id].stop()
	delete(kc.brokers, id)
}

func (kc *kvCluster) seeds() []string {
	return []string{kc.addrs["n1"], kc.addrs["n2"], kc.addrs["n3"]}
}

// Two clients increment a counter with CAS while the bucket's leader is
// killed: the counter ends equal to the number of increments that
// succeeded, and a watcher from revision 1 sees every revision of it
// exactly once, in order, across the failover.
func TestKVCASCountersAcrossALeaderFailover(t *testing.T) {
	kc := newKVCluster(t)
	ctx := testCtx(t)
	admin := dialKV(t, kc.seeds()...)
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := admin.CreateBucket(ctx, KVBucketConfig{Bucket: "ctr", History: 64, Replicas: 3})
		if err == nil {
			break
		}
		if time.Now().After(deadline) || !IsRetryable(err) {
			t.Fatalf("CreateBucket: %v", err)
		}
	}
	watcher, err := admin.KV("ctr").Watch(ctx, KVWatchOptions{FromRevision: 1, Credit: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()
	// Read the watch as it goes (a key keeps its last 64 revisions: a
	// watcher that fell further behind would rightly skip overwritten ones).
	var watched []KVEvent
	watchDone := make(chan struct{})
	stopWatching := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case ev, ok := <-watcher.Events():
				if !ok {
					return
				}
				watched = append(watched, ev)
			case <-stopWatching:
				return
			}
		}
	}()

	const perClient = 30
	var mu sync.Mutex
	succeeded, ambiguous := 0, 0
	var wrote []uint64 // revisions of acknowledged (or confirmed) increments
	increment := func(kv *KV, who string, attempt int) {
		for {
			if ctx.Err() != nil {
				return
			}
			cur, err := kv.Get(ctx, "n")
			value, expected := 0, uint64(0)
			switch {
			case err == nil:
				value, _ = strconv.Atoi(strings.SplitN(string(cur.Value), ":", 2)[0])
				expected = cur.Revision
			case errors.Is(err, ErrKeyNotFound):
			default:
				continue // the leader is moving: read again
			}
			token := fmt.Sprintf("%d:%s-%d", value+1, who, attempt)
			rev, err := kv.CAS(ctx, "n", []byte(token), expected)
			switch {
			case err == nil:
			case errors.Is(err, ErrRevisionMismatch):
				continue // another client won: read and try again
			default:
				// Ambiguous (outcome unknown, connection lost) or refused:
				// the key says whether this attempt's token landed.
				mu.Lock()
				ambiguous++
				mu.Unlock()
				var e KVEntry
				for {
					if e, err = kv.Get(ctx, "n"); err == nil || errors.Is(err, ErrKeyNotFound) || ctx.Err() != nil {
						break
					}
				}
				if string(e.Value) != token {
					// Not (or not yet visibly) ours: a later write may hide
					// ours, so look at the key's history too.
					h, herr := kv.History(ctx, "n")
					landed := false
					for _, r := range h {
						if string(r.Value) == token {
							landed, rev = true, r.Revision
						}
					}
					if herr != nil || !landed {
						continue
					}
				} else {
					rev = e.Revision
				}
			}
			mu.Lock()
			succeeded++
			wrote = append(wrote, rev)
			mu.Unlock()
			return
		}
	}
	// Both clients stop half-way until the leader is stopped, so the
	// second half of the increments runs across the failover whatever
	// the machine's speed.
	var wg, halfway sync.WaitGroup
	stopped := make(chan struct{})
	for ci := 0; ci < 2; ci++ {
		c := dialKV(t, kc.seeds()...)
		wg.Add(1)
		halfway.Add(1)
		go func(kv *KV, who string) {
			defer wg.Done()
			for i := 0; i < perClient; i++ {
				if i == perClient/2 {
					halfway.Done()
					<-stopped
				}
				increment(kv, who, i)
			}
		}(c.KV("ctr"), fmt.Sprintf("c%d", ci))
	}
	halfway.Wait()
	info, err := admin.Bucket(ctx, "ctr")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	beforeKill := succeeded
	mu.Unlock()
	kc.stop(info.Leader) // the leader dies mid-run
	close(stopped)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("increments did not finish: %d of %d", succeeded, 2*perClient)
	}
	final, err := admin.KV("ctr").Get(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	value, _ := strconv.Atoi(strings.SplitN(string(final.Value), ":", 2)[0])
	if beforeKill != perClient {
		t.Fatalf("%d increments before the leader was stopped, want %d", beforeKill, perClient)
	}
	if value != succeeded || succeeded != 2*perClient {
		t.Fatalf("counter %d after %d successful increments (of %d)", value, succeeded, 2*perClient)
	}
	// The watcher sees each increment once, in revision order, values 1..N.
	for watcher.Next() <= final.Revision && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(stopWatching)
	<-watchDone
	if len(watched) != succeeded {
		t.Fatalf("watcher saw %d events for %d increments", len(watched), succeeded)
	}
	for i, ev := range watched {
		got, _ := strconv.Atoi(strings.SplitN(string(ev.Entry.Value), ":", 2)[0])
		if got != i+1 || (i > 0 && ev.Entry.Revision <= watched[i-1].Entry.Revision) {
			t.Fatalf("watch event %d holds counter %d at revision %d", i+1, got, ev.Entry.Revision)
		}
	}
	if watcher.Next() != final.Revision+1 {
		t.Fatalf("watcher's next revision %d, last write %d", watcher.Next(), final.Revision)
	}
	t.Logf("%d increments (%d before the leader %s stopped), %d ambiguous answers resolved by reading; final revision %d",
		succeeded, beforeKill, info.Leader, ambiguous, final.Revision)
}

// cutProxy forwards connections to a broker, frame by frame, and cuts
// the connection (both ways, nothing forwarded) at the first frame of
// each type in cut.
type cutProxy struct {
	mu      sync.Mutex
	cut     map[wire.FrameType]bool
	cutDone []wire.FrameType
}

func startCutProxy(t *testing.T, backend string, cut ...wire.FrameType) (string, *cutProxy) {
	t.Helper()
	lis := listen(t)
	t.Cleanup(func() { lis.Close() })
	p := &cutProxy{cut: map[wire.FrameType]bool{}}
	for _, typ := range cut {
		p.cut[typ] = true
	}
	go func() {
		for {
			cn, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", backend)
			if err != nil {
				cn.Close()
				continue
			}
			go func() { io.Copy(cn, up); cn.Close() }()
			go func() {
				defer up.Close()
				defer cn.Close()
				r := bufio.NewReader(cn)
				for {
					corr, f, err := wire.ReadFrame(r, wire.DefaultFrameBytesMax)
					if err != nil {
						return
					}
					p.mu.Lock()
					cutNow := p.cut[f.Type()]
					if cutNow {
						delete(p.cut, f.Type())
						p.cutDone = append(p.cutDone, f.Type())
					}
					p.mu.Unlock()
					if cutNow {
						return
					}
					if _, err := up.Write(wire.AppendFrame(nil, corr, f)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return lis.Addr().String(), p
}

// A read whose connection is lost is sent again (it changes nothing); a
// write is not (it may have been applied): the caller gets
// ErrDisconnected and decides.
func TestKVReadsRetryAfterALostConnectionWritesDoNot(t *testing.T) {
	b := startKVBroker(t, vfs.NewMem(), "/d", listen(t), nil)
	t.Cleanup(b.stop)
	ctx := testCtx(t)
	if _, err := dialKV(t, b.addr).CreateBucket(ctx, KVBucketConfig{Bucket: "r"}); err != nil {
		t.Fatal(err)
	}
	addr, proxy := startCutProxy(t, b.addr, wire.TypeKVGet, wire.TypeKVWrite)
	kv := dialKV(t, addr).KV("r")
	if _, err := kv.Get(ctx, "k"); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("Get after a cut connection: %v", err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Put on a cut connection: %v", err)
	}
	proxy.mu.Lock()
	cuts := len(proxy.cutDone)
	proxy.mu.Unlock()
	if cuts != 2 {
		t.Fatalf("%d cuts", cuts)
	}
}

// memStore is a KVStore in memory whose applies can be made to fail.
type memStore struct {
	mu       sync.Mutex
	data     map[string]string
	cursor   uint64
	failNext int // applies to refuse
	failed   int
	applies  int
}

func (s *memStore) ApplyKV(_ context.Context, ops []KVOp, cursor uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failNext > 0 {
		s.failNext--
		s.failed++
		return errors.New("disk full (test)")
	}
	s.applies++
	for _, op := range ops {
		if op.Delete {
			delete(s.data, op.Key)
		} else {
			s.data[op.Key] = string(op.Value)
		}
	}
	s.cursor = cursor
	return nil
}

func (s *memStore) KVCursor(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor, nil
}

func (s *memStore) KVKeys(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.data {
		keys = append(keys, k)
	}
	return keys, nil
}

// state is the store as "k=v,..." (sorted) and its cursor.
func (s *memStore) state() (string, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for k, v := range s.data {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ","), s.cursor
}

// WatchApplied folds a bucket into a store with cursor authority: a
// failed apply is applied again, never skipped; stopped and restarted
// after compaction purged a delete it had not seen, it resyncs — the
// store loses the purged key and ends equal to the bucket at its cursor.
func TestKVWatchAppliedFoldsAndResyncs(t *testing.T) {
	b := startKVBroker(t, vfs.NewMem(), "/d", listen(t), nil)
	t.Cleanup(b.stop)
	ctx := testCtx(t)
	c := dialKV(t, b.addr)
	if _, err := c.CreateBucket(ctx, KVBucketConfig{Bucket: "fold", TombstoneTTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	kv := c.KV("fold")
	store := &memStore{data: map[string]string{}, failNext: 2}
	run := func() (stop func()) {
		loopCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- kv.WatchApplied(loopCtx, store, KVAppliedOptions{ProbeInterval: 50 * time.Millisecond})
		}()
		return func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("WatchApplied ended with %v", err)
			}
		}
	}
	waitFor := func(want string, rev uint64) {
		t.Helper()
		for {
			got, cursor := store.state()
			if got == want && cursor == rev {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("store %q at %d, want %q at %d", got, cursor, want, rev)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	stop := run()
	kv.Put(ctx, "a", []byte("1"))
	kv.Put(ctx, "b", []byte("2"))
	kv.Delete(ctx, "a")
	last, _ := kv.Put(ctx, "c", []byte("3"))
	waitFor("b=2,c=3", last)
	if store.failed != 2 {
		t.Fatalf("%d applies failed, want the 2 injected", store.failed)
	}
	stop()

	// While the loop is stopped: b is deleted and its tombstone purged.
	del, _ := kv.Delete(ctx, "b")
	kv.Put(ctx, "d", []byte("4"))
	for {
		info, err := c.Bucket(ctx, "fold")
		if err == nil && info.Floor > del {
			last = info.Revision // the compaction record's: the bucket's revision
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("compaction never purged the tombstone at %d (floor %d, %v)", del, info.Floor, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	applies := store.applies
	stop = run()
	defer stop()
	waitFor("c=3,d=4", last) // b is gone although its delete was never delivered
	if store.applies == applies {
		t.Fatal("resync applied nothing")
	}
	last, _ = kv.Put(ctx, "e", []byte("5"))
	waitFor("c=3,d=4,e=5", last)
}

// BenchmarkKVPut measures sequential Put round trips (each answered once
// fsynced and applied) and, with -cpu or parallel clients, group commit:
// go test ./client -run xxx -bench KV -benchtime 2000x
func BenchmarkKVPut(b *testing.B) {
	for _, par := range []int{1, 16} {
		b.Run(fmt.Sprintf("writers=%d", par), func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			n, err := node.Open(node.Config{DataDir: dir, Logger: logger, ClientAddr: lis.Addr().String()})
			if err != nil {
				b.Fatal(err)
			}
			srv, err := server.New(server.Config{AllowNoAuth: true, Logger: logger}, n)
			if err != nil {
				b.Fatal(err)
			}
			go srv.Serve(lis)
			defer func() { srv.Close(context.Background()); n.Close() }()
			ctx := context.Background()
			c, err := Dial(ctx, Options{Servers: []string{lis.Addr().String()}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if _, err := c.CreateBucket(ctx, KVBucketConfig{Bucket: "bench"}); err != nil {
				b.Fatal(err)
			}
			kv := c.KV("bench")
			value := make([]byte, 100)
			var next atomic.Int64
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := 0; w < par; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						if _, err := kv.Put(ctx, fmt.Sprintf("k%d", i%1000), value); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

// TestKVListBeyondOneFrame: List reads a listing larger than one frame
// page by page (KV_LIST_PAGE), all at one revision.
func TestKVListBeyondOneFrame(t *testing.T) {
	b := startKVBroker(t, vfs.NewMem(), "/d", listen(t), nil)
	t.Cleanup(b.stop)
	c := dialKV(t, b.addr)
	ctx := testCtx(t)
	if _, err := c.CreateBucket(ctx, KVBucketConfig{Bucket: "big"}); err != nil {
		t.Fatal(err)
	}
	kv := c.KV("big")
	value := bytes.Repeat([]byte("v"), 1<<20)
	var last uint64
	for i := range 8 { // 8 MiB: beyond one frame
		rev, err := kv.Put(ctx, fmt.Sprintf("k%d", i), value)
		if err != nil {
			t.Fatal(err)
		}
		last = rev
	}
	rev, entries, err := kv.List(ctx, "k")
	if err != nil || rev != last || len(entries) != 8 {
		t.Fatalf("List = revision %d (want %d), %d entries (want 8), %v", rev, last, len(entries), err)
	}
	for i, e := range entries {
		if e.Key != fmt.Sprintf("k%d", i) || !bytes.Equal(e.Value, value) {
			t.Fatalf("entry %d: %s (%d bytes)", i, e.Key, len(e.Value))
		}
	}
}
