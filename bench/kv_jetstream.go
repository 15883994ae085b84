package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS KV: a bucket is the stream KV_<bucket> (nats.go's KeyValue API
// creates it with MaxMsgsPerSubject = History, AllowDirect and the
// stream's other KV settings); a put is a JetStream publish acknowledged
// by a PubAck, a get a direct get (answered by a replica on the server
// the client is connected to), a watch an ordered push consumer.

// kvStreamName is the stream that holds a NATS KV bucket.
func kvStreamName(bucket string) string { return "KV_" + bucket }

func (s *jetStreamSystem) CreateBucket(ctx context.Context, bucket string) error {
	cfg := jetstream.KeyValueConfig{Bucket: bucket, History: 1, Storage: jetstream.FileStorage, Replicas: s.replicas}
	create := func(ctx context.Context) error {
		_, err := s.js.CreateKeyValue(ctx, cfg)
		return err
	}
	if s.cluster == nil {
		return create(ctx)
	}
	return s.cluster.create(ctx, s.js, kvStreamName(bucket), create)
}

func (s *jetStreamSystem) NewKVClient(ctx context.Context, bucket, name string) (kvClient, error) {
	nc, js, err := s.connectJetStream(ctx, kvStreamName(bucket), name)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &jetStreamKV{conn: nc, kv: kv}, nil
}

// jetStreamKV is nats.go's KeyValue on a connection of its own.
type jetStreamKV struct {
	conn *nats.Conn
	kv   jetstream.KeyValue
}

func (k *jetStreamKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.kv.Put(ctx, key, value)
}

func (k *jetStreamKV) Get(ctx context.Context, key string) ([]byte, error) {
	e, err := k.kv.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

// Watch watches every key with UpdatesOnly: an ordered consumer that
// delivers what is stored after it was created.
func (k *jetStreamKV) Watch(ctx context.Context) (kvWatcher, error) {
	w, err := k.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	return &jetStreamKVWatcher{w: w}, nil
}

func (k *jetStreamKV) Close() error {
	k.conn.Close()
	return nil
}

// jetStreamKVWatcher reads a KeyWatcher's updates.
type jetStreamKVWatcher struct{ w jetstream.KeyWatcher }

func (w *jetStreamKVWatcher) Next(ctx context.Context) (kvUpdate, error) {
	for {
		select {
		case e, ok := <-w.w.Updates():
			if !ok {
				return kvUpdate{}, errors.New("nats kv watch ended")
			}
			if e == nil {
				continue // the end of the initial values (none with UpdatesOnly)
			}
			if e.Operation() != jetstream.KeyValuePut {
				return kvUpdate{}, fmt.Errorf("nats kv watch: %s of %s", e.Operation(), e.Key())
			}
			return kvUpdate{Key: e.Key(), Value: e.Value(), Revision: e.Revision()}, nil
		case <-ctx.Done():
			return kvUpdate{}, ctx.Err()
		}
	}
}

func (w *jetStreamKVWatcher) Stop() error { return w.w.Stop() }
