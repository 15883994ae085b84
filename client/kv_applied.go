package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nereus-broker/nereus/internal/kvfold"
)

// KVOp is one change WatchApplied makes to a KVStore: a put of Value
// under Key, or a delete of Key.
type KVOp struct {
	Key    string
	Value  []byte
	Delete bool
}

// KVStore is the user's store that WatchApplied folds a bucket into. Its
// methods are called from WatchApplied's goroutine, one at a time.
type KVStore interface {
	// ApplyKV writes ops, in order, and cursor in one atomic step: all of
	// it or none of it. An error means none of it (the batch is applied
	// again, with what followed, later).
	ApplyKV(ctx context.Context, ops []KVOp, cursor uint64) error
	// KVCursor reports the cursor the store persisted (0: empty).
	KVCursor(ctx context.Context) (uint64, error)
	// KVKeys lists the keys the store holds (a resync deletes those the
	// bucket no longer has).
	KVKeys(ctx context.Context) ([]string, error)
}

// KVAppliedOptions configures WatchApplied. Zero fields take defaults.
type KVAppliedOptions struct {
	// Prefix folds only the keys that start with it (the store then holds
	// only those).
	Prefix string
	// FlushInterval is how long changes may wait before they are applied
	// (default 20 ms); 256 pending changes are applied at once.
	FlushInterval time.Duration
	// ProbeInterval is how often the bucket's floor is checked while the
	// watch is idle (default 1 s): an idle watch would otherwise not learn
	// that compaction passed its cursor until its next event.
	ProbeInterval time.Duration
}

// WatchApplied folds the bucket into store until ctx ends or the fold
// fails, with cursor authority: the store's contents and its cursor move
// together (ApplyKV), a failed apply is applied again (never skipped),
// and a restart resumes from the store's persisted cursor. When the
// bucket no longer keeps the revisions after the store's cursor
// (CURSOR_EXPIRED), it resyncs: it lists the bucket and applies deletes of
// the store's keys the listing lacks, then the listing's puts, then what
// followed — the deletes strictly first. It returns ctx's error, or why
// the fold stopped (the store failing 16 times in a row, a listing that
// failed, the bucket deleted).
func (k *KV) WatchApplied(ctx context.Context, store KVStore, opts KVAppliedOptions) error {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = 20 * time.Millisecond
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = time.Second
	}
	cursor, err := store.KVCursor(ctx)
	if err != nil {
		return fmt.Errorf("nereus: kv %s: the store's cursor: %w", k.bucket, err)
	}
	f := &kvFold{k: k, store: store, prefix: opts.Prefix, loop: kvfold.New(kvfold.Config{})}
	defer f.stopWatch()
	f.queue = append(f.queue, kvfold.Restart{Persisted: kvfold.Revision(cursor)})
	flush := time.NewTicker(opts.FlushInterval)
	defer flush.Stop()
	probe := time.NewTicker(opts.ProbeInterval)
	defer probe.Stop()
	for {
		if err := f.drain(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-f.events:
			if !ok {
				if err := f.watchEnded(ctx); err != nil {
					return err
				}
				continue
			}
			f.queue = append(f.queue, kvfold.Delivery{Watch: f.watchID, Revision: kvfold.Revision(ev.Entry.Revision),
				Key: ev.Entry.Key, Value: ev.Entry.Value, Delete: ev.Entry.Deleted, Floor: kvfold.Revision(ev.Floor)})
		case <-flush.C:
			f.queue = append(f.queue, kvfold.Flush{})
		case <-probe.C:
			if info, err := k.c.Bucket(ctx, k.bucket); err == nil {
				f.queue = append(f.queue, kvfold.Probe{Floor: kvfold.Revision(info.Floor)})
			}
		}
	}
}

// kvFold is WatchApplied's shell around the kvfold loop: it turns the
// watch, the listing and the store's answers into events and carries out
// the loop's effects in order.
type kvFold struct {
	k       *KV
	store   KVStore
	prefix  string
	loop    *kvfold.Loop
	queue   []kvfold.Event
	watcher *KVWatcher
	watchID uint64
	events  <-chan KVEvent
}

// drain steps the loop through every queued event.
func (f *kvFold) drain(ctx context.Context) error {
	for len(f.queue) > 0 {
		ev := f.queue[0]
		f.queue = f.queue[1:]
		for _, eff := range f.loop.Step(ev) {
			if err := f.carry(ctx, eff); err != nil {
				return err
			}
		}
	}
	return nil
}

func (f *kvFold) carry(ctx context.Context, eff kvfold.Effect) error {
	switch e := eff.(type) {
	case kvfold.Apply:
		ops := make([]KVOp, len(e.Ops))
		for i, op := range e.Ops {
			ops[i] = KVOp{Key: op.Key, Value: op.Value, Delete: op.Delete}
		}
		err := f.store.ApplyKV(ctx, ops, uint64(e.Cursor))
		f.queue = append(f.queue, kvfold.Applied{Batch: e.ID, Err: err})
	case kvfold.Watch:
		f.stopWatch()
		w, err := f.k.Watch(ctx, KVWatchOptions{Prefix: f.prefix, FromRevision: uint64(e.From)})
		if err != nil {
			return err
		}
		f.watcher, f.watchID, f.events = w, e.ID, w.Events()
	case kvfold.List:
		f.stopWatch()
		rev, entries, err := f.k.List(ctx, f.prefix)
		listing := kvfold.Listing{Request: e.Request, Revision: kvfold.Revision(rev), Err: err}
		for _, en := range entries {
			listing.Entries = append(listing.Entries, kvfold.Entry{Key: en.Key, Value: en.Value})
		}
		f.queue = append(f.queue, listing)
	case kvfold.ReadKeys:
		keys, err := f.store.KVKeys(ctx)
		f.queue = append(f.queue, kvfold.StoreKeys{Request: e.Request, Keys: keys, Err: err})
	case kvfold.Fail:
		return fmt.Errorf("nereus: kv %s: applied loop stopped: %w", f.k.bucket, e.Err)
	}
	return nil
}

// watchEnded takes the end of the current watch: CURSOR_EXPIRED makes
// the loop resync; anything else the watcher could not resume from ends
// the fold.
func (f *kvFold) watchEnded(ctx context.Context) error {
	err := f.watcher.Err()
	id := f.watchID
	f.watcher, f.events = nil, nil
	var expired *CursorExpiredError
	switch {
	case errors.As(err, &expired):
		f.queue = append(f.queue, kvfold.CursorExpired{Watch: id, Floor: kvfold.Revision(expired.Floor)})
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("nereus: kv %s: applied loop's watch ended: %w", f.k.bucket, err)
}

func (f *kvFold) stopWatch() {
	if f.watcher != nil {
		f.watcher.Stop()
		f.watcher, f.events = nil, nil
	}
}
