package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nereus-broker/nereus/client"
)

// Nereus KV: a bucket is a one-partition replicated topic; every request
// goes to its leader (client.KV), which answers reads from its applied
// state under its lease, and serves watches with credit.

func (s *nereusSystem) CreateBucket(ctx context.Context, bucket string) error {
	cfg := client.KVBucketConfig{Bucket: bucket, History: 1, Replicas: s.replicas}
	err := retryWhileRetryable(ctx, clusterRetryInterval, func() error {
		_, err := s.admin.CreateBucket(ctx, cfg)
		return err
	})
	if err != nil {
		return err
	}
	// Ready once its leader answers a read (under its lease).
	return retryWhileRetryable(ctx, clusterPollInterval, func() error {
		_, err := s.admin.KV(bucket).Get(ctx, "bench-ready")
		if errors.Is(err, client.ErrKeyNotFound) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("bucket %s: a new bucket holds a key", bucket)
		}
		return err
	})
}

// retryWhileRetryable calls f until it returns nil or an error that
// client.IsRetryable refuses, waiting interval between calls, while ctx
// lasts.
func retryWhileRetryable(ctx context.Context, interval time.Duration, f func() error) error {
	for {
		err := f()
		if err == nil || !client.IsRetryable(err) {
			return err
		}
		if serr := sleepCtx(ctx, interval); serr != nil {
			return fmt.Errorf("%w (last error: %v)", serr, err)
		}
	}
}

func (s *nereusSystem) NewKVClient(ctx context.Context, bucket, name string) (kvClient, error) {
	c, err := s.dial(ctx, name)
	if err != nil {
		return nil, err
	}
	return &nereusKV{conn: c, bucket: bucket, kv: c.KV(bucket)}, nil
}

// nereusKV is the SDK's KV handle on a client of its own.
type nereusKV struct {
	conn   *client.Client
	bucket string
	kv     *client.KV
}

func (k *nereusKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.kv.Put(ctx, key, value)
}

func (k *nereusKV) Get(ctx context.Context, key string) ([]byte, error) {
	e, err := k.kv.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return e.Value, nil
}

// Watch watches every key from the revision after the bucket's current
// one (as its leader reports it), so it delivers what is written after
// it started.
func (k *nereusKV) Watch(ctx context.Context) (kvWatcher, error) {
	info, err := k.conn.Bucket(ctx, k.bucket)
	if err != nil {
		return nil, err
	}
	w, err := k.kv.Watch(ctx, client.KVWatchOptions{FromRevision: info.Revision + 1})
	if err != nil {
		return nil, err
	}
	return &nereusKVWatcher{w: w}, nil
}

func (k *nereusKV) Close() error { return k.conn.Close() }

// nereusKVWatcher reads a KVWatcher's events.
type nereusKVWatcher struct{ w *client.KVWatcher }

func (w *nereusKVWatcher) Next(ctx context.Context) (kvUpdate, error) {
	select {
	case ev, ok := <-w.w.Events():
		if !ok {
			return kvUpdate{}, fmt.Errorf("nereus kv watch ended: %v", w.w.Err())
		}
		if ev.Entry.Deleted {
			return kvUpdate{}, fmt.Errorf("nereus kv watch: delete of %s", ev.Entry.Key)
		}
		return kvUpdate{Key: ev.Entry.Key, Value: ev.Entry.Value, Revision: ev.Entry.Revision}, nil
	case <-ctx.Done():
		return kvUpdate{}, ctx.Err()
	}
}

func (w *nereusKVWatcher) Stop() error {
	w.w.Stop()
	return nil
}
