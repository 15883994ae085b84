package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// foldStore is a KVStore in memory for WatchApplied.
type foldStore struct {
	mu     sync.Mutex
	data   map[string]string
	cursor uint64
	keys   int // KVKeys calls: a resync reads the store's keys
}

func (s *foldStore) ApplyKV(_ context.Context, ops []client.KVOp, cursor uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
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

func (s *foldStore) KVCursor(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor, nil
}

func (s *foldStore) KVKeys(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys++
	var out []string
	for k := range s.data {
		out = append(out, k)
	}
	return out, nil
}

// TestClusterKVAcrossKills is issue 15's test on three real processes
// with an R=3 bucket: compare-and-set counters from three clients while
// the bucket's leader is killed -9 twice — the final value equals the
// successful CAS operations, and a watcher from revision 1 sees every
// revision once, in order, across the failovers; then, after compaction
// moved the floor past a stopped applied loop, resuming it meets
// CURSOR_EXPIRED and resyncs to a fold equal to the bucket.
func TestClusterKVAcrossKills(t *testing.T) {
	rc := startRealCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, client.Options{Servers: rc.addrs(), DialTimeout: 2 * time.Second, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	retry := func(what string, f func() error) {
		t.Helper()
		for {
			err := f()
			if err == nil {
				return
			}
			if !client.IsRetryable(err) || ctx.Err() != nil {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	retry("create ctr", func() error {
		_, err := c.CreateBucket(ctx, client.KVBucketConfig{Bucket: "ctr", History: 64, Replicas: 3})
		return err
	})
	watcher, err := c.KV("ctr").Watch(ctx, client.KVWatchOptions{FromRevision: 1, Credit: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()
	var watched []client.KVEvent
	var watchMu sync.Mutex
	go func() {
		for ev := range watcher.Events() {
			watchMu.Lock()
			watched = append(watched, ev)
			watchMu.Unlock()
		}
	}()

	const clients, perClient = 3, 30
	var mu sync.Mutex
	succeeded, ambiguous := 0, 0
	increment := func(kv *client.KV, who string, attempt int) {
		for ctx.Err() == nil {
			cur, err := kv.Get(ctx, "n")
			value, expected := 0, uint64(0)
			switch {
			case err == nil:
				value, _ = strconv.Atoi(strings.SplitN(string(cur.Value), ":", 2)[0])
				expected = cur.Revision
			case errors.Is(err, client.ErrKeyNotFound):
			default:
				time.Sleep(20 * time.Millisecond)
				continue // the leader is moving: read again
			}
			token := fmt.Sprintf("%d:%s-%d", value+1, who, attempt)
			_, err = kv.CAS(ctx, "n", []byte(token), expected)
			switch {
			case err == nil:
			case errors.Is(err, client.ErrRevisionMismatch):
				continue
			default:
				// Outcome unknown or connection lost: the key's history
				// says whether this attempt's token landed.
				mu.Lock()
				ambiguous++
				mu.Unlock()
				var h []client.KVEntry
				for {
					if h, err = kv.History(ctx, "n"); err == nil || errors.Is(err, client.ErrKeyNotFound) || ctx.Err() != nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				landed := false
				for _, r := range h {
					landed = landed || string(r.Value) == token
				}
				if !landed {
					continue
				}
			}
			mu.Lock()
			succeeded++
			mu.Unlock()
			return
		}
	}
	// Every client pauses at each third until the test is about to kill
	// the leader, so the kills fall mid-run, with writes in flight,
	// whatever the machine's speed.
	var wg sync.WaitGroup
	var reached [2]sync.WaitGroup
	resume := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	for ci := range clients {
		cl, err := client.Dial(ctx, client.Options{Servers: rc.addrs(), DialTimeout: 2 * time.Second, RequestTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Add(1)
		reached[0].Add(1)
		reached[1].Add(1)
		go func(kv *client.KV, who string) {
			defer wg.Done()
			for i := range perClient {
				if k := i / (perClient / 3); i%(perClient/3) == 0 && k >= 1 && k <= 2 {
					reached[k-1].Done()
					<-resume[k-1]
				}
				increment(kv, who, i)
			}
		}(cl.KV("ctr"), fmt.Sprintf("c%d", ci))
	}
	for k := range 2 {
		reached[k].Wait()
		var leader string
		retry("find the leader", func() error {
			info, err := c.Bucket(ctx, "ctr")
			if err == nil && info.Leader == "" {
				err = client.ErrNotLeader
			}
			leader = info.Leader
			return err
		})
		close(resume[k])
		time.Sleep(10 * time.Millisecond) // the clients' next writes are in flight
		rc.kill(leader)
		mu.Lock()
		t.Logf("killed %s, the bucket's leader, after %d increments", leader, succeeded)
		mu.Unlock()
		time.Sleep(time.Second)
		if err := rc.procs[leader].restart(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("increments did not finish: %d of %d", succeeded, clients*perClient)
	}
	var final client.KVEntry
	retry("read the counter", func() error { final, err = c.KV("ctr").Get(ctx, "n"); return err })
	value, _ := strconv.Atoi(strings.SplitN(string(final.Value), ":", 2)[0])
	if value != succeeded || succeeded != clients*perClient {
		t.Fatalf("counter %d after %d successful CAS (of %d)", value, succeeded, clients*perClient)
	}
	for watcher.Next() <= final.Revision && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	watchMu.Lock()
	for i, ev := range watched {
		got, _ := strconv.Atoi(strings.SplitN(string(ev.Entry.Value), ":", 2)[0])
		if got != i+1 || (i > 0 && ev.Entry.Revision <= watched[i-1].Entry.Revision) {
			t.Fatalf("watch event %d holds counter %d at revision %d", i+1, got, ev.Entry.Revision)
		}
	}
	if len(watched) != succeeded {
		t.Fatalf("the watcher saw %d revisions for %d increments", len(watched), succeeded)
	}
	watchMu.Unlock()
	t.Logf("%d increments across two kills, %d ambiguous answers resolved from the history; the watcher saw each once", succeeded, ambiguous)

	// An applied loop stopped behind a compaction resyncs.
	retry("create cfg", func() error {
		_, err := c.CreateBucket(ctx, client.KVBucketConfig{Bucket: "cfg", History: 1, TombstoneTTL: 200 * time.Millisecond, Replicas: 3})
		return err
	})
	kv := c.KV("cfg")
	for _, k := range []string{"a", "b", "c"} {
		retry("put "+k, func() error { _, err := kv.Put(ctx, k, []byte("1")); return err })
	}
	store := &foldStore{data: map[string]string{}}
	fold := func(until func() bool) {
		t.Helper()
		lctx, lcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- kv.WatchApplied(lctx, store, client.KVAppliedOptions{ProbeInterval: 50 * time.Millisecond})
		}()
		for !until() && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		lcancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("WatchApplied: %v", err)
		}
	}
	var rev uint64
	retry("list cfg", func() error { rev, _, err = kv.List(ctx, ""); return err })
	fold(func() bool { cur, _ := store.KVCursor(ctx); return cur >= rev })
	stoppedAt, _ := store.KVCursor(ctx)
	retry("delete a", func() error { _, err := kv.Delete(ctx, "a"); return err })
	retry("put d", func() error { _, err := kv.Put(ctx, "d", []byte("2")); return err })
	for {
		info, err := c.Bucket(ctx, "cfg")
		if err == nil && info.Floor > stoppedAt+1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("compaction never moved the floor past %d: %+v %v", stoppedAt, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A plain watch resumed from where the loop stopped is told so.
	w, err := kv.Watch(ctx, client.KVWatchOptions{FromRevision: stoppedAt + 1})
	if err != nil {
		t.Fatal(err)
	}
	for range w.Events() {
	}
	var expired *client.CursorExpiredError
	if !errors.As(w.Err(), &expired) {
		t.Fatalf("a watch from %d behind the floor ended with %v, want CURSOR_EXPIRED", stoppedAt+1, w.Err())
	}
	retry("list cfg", func() error { rev, _, err = kv.List(ctx, ""); return err })
	fold(func() bool { cur, _ := store.KVCursor(ctx); return cur >= rev })
	var entries []client.KVEntry
	retry("list cfg", func() error { _, entries, err = kv.List(ctx, ""); return err })
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.keys == 0 {
		t.Fatal("the applied loop never resynced")
	}
	if len(store.data) != len(entries) {
		t.Fatalf("fold %v, bucket %v", store.data, entries)
	}
	for _, e := range entries {
		if store.data[e.Key] != string(e.Value) {
			t.Fatalf("fold %v, bucket %v", store.data, entries)
		}
	}
}
