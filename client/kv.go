package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// KV errors.
var (
	// ErrKeyNotFound: Get of a key that is absent or deleted.
	ErrKeyNotFound = errors.New("nereus: key not found")
	// ErrRevisionMismatch matches a refused compare-and-set (errors.Is);
	// errors.As with *RevisionMismatchError gives the current revision.
	ErrRevisionMismatch = wire.ErrRevisionMismatch
	// ErrCursorExpired matches the end of a watch whose next revision
	// fell below the bucket's floor (a revision it had not seen was
	// purged); errors.As with *CursorExpiredError gives the floor.
	ErrCursorExpired = wire.ErrCursorExpired
	// ErrOutcomeUnknown: a write reached the bucket's leader, which lost
	// its office (or its quorum) before the write committed: it may or
	// may not have been applied. Read the key before retrying.
	ErrOutcomeUnknown = wire.ErrOutcomeUnknown
)

// RevisionMismatchError is a refused CAS: Current is the key's latest
// revision (0: absent or deleted) when the leader refused it.
type RevisionMismatchError struct {
	Bucket, Key       string
	Expected, Current uint64
	err               *wire.Error
}

func (e *RevisionMismatchError) Error() string {
	return fmt.Sprintf("nereus: kv %s/%s: REVISION_MISMATCH: expected revision %d, current %d", e.Bucket, e.Key, e.Expected, e.Current)
}

// Unwrap lets errors.Is(err, ErrRevisionMismatch) match.
func (e *RevisionMismatchError) Unwrap() error { return e.err }

// CursorExpiredError ends a watch whose next revision is below Floor.
type CursorExpiredError struct {
	Bucket string
	Next   uint64 // the first revision the watch had not seen
	Floor  uint64 // the bucket's lowest revision a watch can resume from
	err    *wire.Error
}

func (e *CursorExpiredError) Error() string {
	return fmt.Sprintf("nereus: kv %s: CURSOR_EXPIRED: next revision %d is below the floor %d; list the bucket and watch from its revision", e.Bucket, e.Next, e.Floor)
}

// Unwrap lets errors.Is(err, ErrCursorExpired) match.
func (e *CursorExpiredError) Unwrap() error { return e.err }

// KVBucketConfig configures a bucket. Zero fields take the broker's
// defaults: History 1, TombstoneTTL 24h, Replicas 1 on a single node and
// 3 in a cluster of three or more.
type KVBucketConfig struct {
	Bucket string
	// History is how many revisions each key keeps (1-64).
	History int
	// TombstoneTTL is how long a deleted key's tombstone is kept (and a
	// watch behind it can still see the delete) before compaction purges
	// it. Millisecond resolution.
	TombstoneTTL time.Duration
	// Replicas is 1, 3 or 5.
	Replicas int
}

func (c KVBucketConfig) toWire() (wire.KVBucketConfig, error) {
	if err := wire.ValidateBucketName(c.Bucket); err != nil {
		return wire.KVBucketConfig{}, err
	}
	if c.History < 0 || c.History > wire.KVHistoryMax {
		return wire.KVBucketConfig{}, wire.Errorf(wire.CodeInvalidArgument, "history must be 1-%d, got %d", wire.KVHistoryMax, c.History)
	}
	if c.TombstoneTTL < 0 {
		return wire.KVBucketConfig{}, wire.Errorf(wire.CodeInvalidArgument, "tombstone TTL must not be negative, got %v", c.TombstoneTTL)
	}
	if c.Replicas < 0 || c.Replicas > 255 {
		return wire.KVBucketConfig{}, wire.Errorf(wire.CodeInvalidArgument, "replicas must be 1, 3 or 5, got %d", c.Replicas)
	}
	return wire.KVBucketConfig{Bucket: c.Bucket, History: uint32(c.History), TombstoneTTLMs: c.TombstoneTTL.Milliseconds(), Replicas: uint8(c.Replicas)}, nil
}

func kvBucketConfigFromWire(w wire.KVBucketConfig) KVBucketConfig {
	return KVBucketConfig{Bucket: w.Bucket, History: int(w.History), TombstoneTTL: time.Duration(w.TombstoneTTLMs) * time.Millisecond, Replicas: int(w.Replicas)}
}

// KVBucketInfo describes a bucket as the answering node sees it: its
// configuration, its last revision and floor, its live keys, and the
// leader that serves it. A node that holds no replica of the bucket knows
// only its name, replicas and leader (History 0).
type KVBucketInfo struct {
	Config             KVBucketConfig
	Revision, Floor    uint64
	Keys               int
	Leader, LeaderAddr string
}

// KVEntry is one revision of a key: a value, or (Deleted) a tombstone.
type KVEntry struct {
	Key      string
	Value    []byte
	Revision uint64
	Deleted  bool
	Time     time.Time // the leader's clock when it took the write
}

func kvEntryFromWire(e wire.KVEntry) KVEntry {
	return KVEntry{Key: string(e.Key), Value: e.Value, Revision: e.Revision, Deleted: e.Op == wire.KVOpDelete,
		Time: time.UnixMilli(e.TimestampMs)}
}

// CreateBucket creates a bucket, or confirms that one with the same
// configuration exists (created is then false); a different one fails
// with ErrTopicConflict. In a cluster it goes to the bucket's leader.
func (c *Client) CreateBucket(ctx context.Context, cfg KVBucketConfig) (created bool, err error) {
	wc, err := cfg.toWire()
	if err != nil {
		return false, fmt.Errorf("nereus: create bucket %q: %w", cfg.Bucket, err)
	}
	reply, err := c.KV(cfg.Bucket).request(ctx, &wire.KVBucketCreate{Config: wc}, true)
	if err != nil {
		return false, fmt.Errorf("nereus: create bucket %q: %w", cfg.Bucket, err)
	}
	ok, isOK := reply.(*wire.KVBucketOK)
	if !isOK {
		return false, unexpected("KV_BUCKET_CREATE", reply)
	}
	return ok.Created, nil
}

// DeleteBucket deletes a bucket: its keys are gone and its watches end
// with ErrNotFound. Its name may be created again.
func (c *Client) DeleteBucket(ctx context.Context, bucket string) error {
	if err := wire.ValidateBucketName(bucket); err != nil {
		return fmt.Errorf("nereus: delete bucket: %w", err)
	}
	reply, err := c.KV(bucket).request(ctx, &wire.KVBucketDelete{Bucket: bucket}, true)
	if err != nil {
		return fmt.Errorf("nereus: delete bucket %q: %w", bucket, err)
	}
	if _, isOK := reply.(*wire.KVBucketOK); !isOK {
		return unexpected("KV_BUCKET_DELETE", reply)
	}
	return nil
}

// Buckets lists the buckets the answering node knows.
func (c *Client) Buckets(ctx context.Context) ([]KVBucketInfo, error) {
	return c.buckets(ctx, "")
}

// Bucket describes one bucket, as its leader sees it; ErrNotFound when it
// does not exist.
func (c *Client) Bucket(ctx context.Context, bucket string) (KVBucketInfo, error) {
	if err := wire.ValidateBucketName(bucket); err != nil {
		return KVBucketInfo{}, fmt.Errorf("nereus: bucket: %w", err)
	}
	reply, err := c.KV(bucket).request(ctx, &wire.KVBucketList{Bucket: bucket}, false)
	if err != nil {
		return KVBucketInfo{}, fmt.Errorf("nereus: bucket %q: %w", bucket, err)
	}
	ok, isOK := reply.(*wire.KVBucketListOK)
	if !isOK || len(ok.Buckets) != 1 {
		return KVBucketInfo{}, unexpected("KV_BUCKET_LIST", reply)
	}
	return kvBucketInfoFromWire(ok.Buckets[0]), nil
}

func (c *Client) buckets(ctx context.Context, bucket string) ([]KVBucketInfo, error) {
	reply, err := c.idempotentRequest(ctx, &wire.KVBucketList{Bucket: bucket})
	if err != nil {
		return nil, fmt.Errorf("nereus: buckets: %w", err)
	}
	ok, isOK := reply.(*wire.KVBucketListOK)
	if !isOK {
		return nil, unexpected("KV_BUCKET_LIST", reply)
	}
	out := make([]KVBucketInfo, 0, len(ok.Buckets))
	for _, b := range ok.Buckets {
		out = append(out, kvBucketInfoFromWire(b))
	}
	return out, nil
}

func kvBucketInfoFromWire(b wire.KVBucketInfo) KVBucketInfo {
	return KVBucketInfo{Config: kvBucketConfigFromWire(b.Config), Revision: b.Revision, Floor: b.Floor, Keys: int(b.Keys),
		Leader: b.Leader, LeaderAddr: b.LeaderAddr}
}

// KV is a handle on one bucket. Its requests go to the bucket's leader
// (reads through the leader are linearizable up to the leader's lease; see
// KVNODE_NOTES.md), following it across failovers. Safe for concurrent
// use; it holds nothing but names.
type KV struct {
	c      *Client
	bucket string
	topic  string
}

// KV returns a handle on bucket; it does not check that the bucket exists
// (requests fail with ErrNotFound when it does not).
func (c *Client) KV(bucket string) *KV {
	return &KV{c: c, bucket: bucket, topic: wire.KVTopic(bucket)}
}

// Put writes value under key and returns its revision.
func (k *KV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return k.write(ctx, &wire.KVWrite{Bucket: k.bucket, Op: wire.KVOpPut, Key: []byte(key), Value: value})
}

// Delete writes a tombstone for key and returns its revision.
func (k *KV) Delete(ctx context.Context, key string) (uint64, error) {
	return k.write(ctx, &wire.KVWrite{Bucket: k.bucket, Op: wire.KVOpDelete, Key: []byte(key)})
}

// CAS writes value under key only if the key's latest revision is
// expected (0: the key must be absent or deleted), and returns the new
// revision. A refusal is a *RevisionMismatchError naming the current
// revision.
func (k *KV) CAS(ctx context.Context, key string, value []byte, expected uint64) (uint64, error) {
	return k.write(ctx, &wire.KVWrite{Bucket: k.bucket, Op: wire.KVOpPut, Key: []byte(key), Value: value, Conditional: true, Expected: expected})
}

// CASDelete deletes key only if its latest revision is expected.
func (k *KV) CASDelete(ctx context.Context, key string, expected uint64) (uint64, error) {
	return k.write(ctx, &wire.KVWrite{Bucket: k.bucket, Op: wire.KVOpDelete, Key: []byte(key), Conditional: true, Expected: expected})
}

func (k *KV) write(ctx context.Context, f *wire.KVWrite) (uint64, error) {
	reply, err := k.request(ctx, f, true)
	var we *wire.Error
	if errors.As(err, &we) && we.Code == wire.CodeRevisionMismatch {
		current, _ := wire.MismatchCurrent(we)
		return 0, &RevisionMismatchError{Bucket: k.bucket, Key: string(f.Key), Expected: f.Expected, Current: current, err: we}
	}
	if err != nil {
		return 0, fmt.Errorf("nereus: kv %s/%s: %w", k.bucket, f.Key, err)
	}
	ok, isOK := reply.(*wire.KVWriteOK)
	if !isOK {
		return 0, unexpected("KV_WRITE", reply)
	}
	return ok.Revision, nil
}

// Get returns key's current value; ErrKeyNotFound when it is absent or
// deleted.
func (k *KV) Get(ctx context.Context, key string) (KVEntry, error) {
	return k.get(ctx, key, 0)
}

// GetRevision returns key's revision rev (a value or a tombstone) while
// the bucket keeps it; ErrNotFound otherwise.
func (k *KV) GetRevision(ctx context.Context, key string, rev uint64) (KVEntry, error) {
	if rev == 0 {
		return KVEntry{}, fmt.Errorf("nereus: kv %s/%s: revision 0: %w", k.bucket, key, ErrInvalidArgument)
	}
	return k.get(ctx, key, rev)
}

func (k *KV) get(ctx context.Context, key string, rev uint64) (KVEntry, error) {
	reply, err := k.request(ctx, &wire.KVGet{Bucket: k.bucket, Key: []byte(key), Revision: rev}, false)
	if err != nil {
		return KVEntry{}, fmt.Errorf("nereus: kv %s/%s: %w", k.bucket, key, err)
	}
	ok, isOK := reply.(*wire.KVGetOK)
	if !isOK {
		return KVEntry{}, unexpected("KV_GET", reply)
	}
	if !ok.Found {
		return KVEntry{}, fmt.Errorf("nereus: kv %s/%s: %w", k.bucket, key, ErrKeyNotFound)
	}
	return kvEntryFromWire(ok.Entry), nil
}

// Keys returns the live keys that start with prefix, sorted.
func (k *KV) Keys(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	var after []byte
	for {
		reply, err := k.request(ctx, &wire.KVKeys{Bucket: k.bucket, Prefix: []byte(prefix), After: after}, false)
		if err != nil {
			return nil, fmt.Errorf("nereus: kv %s keys: %w", k.bucket, err)
		}
		ok, isOK := reply.(*wire.KVKeysOK)
		if !isOK {
			return nil, unexpected("KV_KEYS", reply)
		}
		for _, key := range ok.Keys {
			out = append(out, string(key))
		}
		if !ok.More || len(ok.Keys) == 0 {
			return out, nil
		}
		after = ok.Keys[len(ok.Keys)-1]
	}
}

// List returns every live entry whose key starts with prefix, sorted by
// key, as of one revision (returned). It reads the listing a page at a
// time (KV_LIST_PAGE, about 6 MiB each), every page at the first page's
// revision; a listing the leader dropped meanwhile (another leader, idle
// too long) is started again, up to kvListRestartsMax times.
func (k *KV) List(ctx context.Context, prefix string) (uint64, []KVEntry, error) {
	for restarts := 0; ; restarts++ {
		rev, out, err := k.list(ctx, prefix)
		if errors.Is(err, wire.ErrCursorExpired) && restarts < kvListRestartsMax && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return 0, nil, fmt.Errorf("nereus: kv %s list: %w", k.bucket, err)
		}
		return rev, out, nil
	}
}

const kvListRestartsMax = 5

// list reads one listing, page by page.
func (k *KV) list(ctx context.Context, prefix string) (uint64, []KVEntry, error) {
	var out []KVEntry
	req := &wire.KVListPage{Bucket: k.bucket, Prefix: []byte(prefix)}
	for {
		reply, err := k.request(ctx, req, false)
		if err != nil {
			return 0, nil, err
		}
		ok, isOK := reply.(*wire.KVListPageOK)
		if !isOK {
			return 0, nil, unexpected("KV_LIST_PAGE", reply)
		}
		for _, e := range ok.Entries {
			out = append(out, kvEntryFromWire(e))
		}
		if !ok.More {
			return ok.BucketRevision, out, nil
		}
		if len(ok.Entries) == 0 {
			return 0, nil, fmt.Errorf("listing %d: an empty page with more to come", ok.Listing)
		}
		req.Listing, req.Offset = ok.Listing, uint64(len(out))
	}
}

// History returns key's kept revisions, oldest first, tombstones included.
func (k *KV) History(ctx context.Context, key string) ([]KVEntry, error) {
	reply, err := k.request(ctx, &wire.KVHistory{Bucket: k.bucket, Key: []byte(key)}, false)
	if err != nil {
		return nil, fmt.Errorf("nereus: kv %s/%s history: %w", k.bucket, key, err)
	}
	ok, isOK := reply.(*wire.KVHistoryOK)
	if !isOK {
		return nil, unexpected("KV_HISTORY", reply)
	}
	out := make([]KVEntry, 0, len(ok.Entries))
	for _, e := range ok.Entries {
		out = append(out, kvEntryFromWire(e))
	}
	return out, nil
}

// request sends f to the bucket's leader and waits for its reply,
// following the leader (NOT_LEADER, UNAVAILABLE: refused before anything
// was written) until ctx, bounded by RequestTimeout, ends. A write is not
// sent again after a lost connection (it may have been applied); a read
// is.
func (k *KV) request(ctx context.Context, f wire.Frame, write bool) (wire.Frame, error) {
	ctx, cancel := k.c.withRequestTimeout(ctx)
	defer cancel()
	var last error
	for attempt := 1; ; attempt++ {
		cn, err := k.c.leaderConn(ctx, k.topic, 0, true)
		if err != nil {
			return nil, err
		}
		reply, err := cn.roundTrip(ctx, f)
		if err == nil {
			return reply, nil
		}
		retry := hasCode(err, wire.CodeNotLeader, wire.CodeUnavailable) || (!write && errors.Is(err, ErrDisconnected))
		if !retry || ctx.Err() != nil {
			if ctx.Err() != nil && last != nil {
				return nil, ctxError(ctx, last)
			}
			return nil, err
		}
		last = err
		k.refreshRoute(ctx)
		if !retryPause(ctx, attempt) {
			return nil, ctxError(ctx, last)
		}
	}
}

// refreshRoute asks any node where the bucket's leader is and caches it
// as the route of the bucket's topic (METADATA refuses reserved names).
func (k *KV) refreshRoute(ctx context.Context) {
	infos, err := k.c.buckets(ctx, k.bucket)
	if err != nil || len(infos) != 1 {
		return
	}
	in := infos[0]
	k.c.storeMetadata([]wire.TopicInfo{{Config: wire.TopicConfig{Name: k.topic, Partitions: 1},
		Partitions: []wire.PartitionInfo{{Partition: 0, Leader: in.Leader, LeaderAddr: in.LeaderAddr}}}})
}

// KVWatchOptions configures a watch.
type KVWatchOptions struct {
	// Prefix limits the watch to keys that start with it ("" = all).
	Prefix string
	// FromRevision is the first revision to deliver (0 = 1: everything
	// the bucket keeps, if its floor is still 1).
	FromRevision uint64
	// Credit is how many events the broker may send ahead of the caller
	// (default 256).
	Credit int
}

// KVEvent is one watch event: a put or a delete (Entry.Deleted) at
// Entry.Revision. Floor is the bucket's floor when the broker sent it: the
// lowest revision a watch can still resume from.
type KVEvent struct {
	Bucket string
	Entry  KVEntry
	Floor  uint64
}

// KVWatcher delivers a watch's events in revision order, each once,
// across reconnections and leader changes (it resumes after the last
// revision it delivered). It ends when its context ends, on Stop, or on
// an error it cannot resume from (Err): a *CursorExpiredError, the
// bucket's deletion (ErrNotFound), a refused token.
type KVWatcher struct {
	events chan KVEvent
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before events closes

	mu   sync.Mutex
	next uint64 // the first revision not delivered yet
}

// Events returns the channel of events; it closes when the watch ends.
func (w *KVWatcher) Events() <-chan KVEvent { return w.events }

// Err tells why the watch ended, once Events is closed (nil: stopped).
func (w *KVWatcher) Err() error {
	<-w.done
	return w.err
}

// Next is the first revision the watcher has not delivered.
func (w *KVWatcher) Next() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// Stop ends the watch and waits for its goroutine.
func (w *KVWatcher) Stop() {
	w.cancel()
	<-w.done
}

// Watch starts a watch of the bucket. Events come on the watcher's
// channel in revision order, without gaps the broker did not account for
// (skipped revisions hold nothing for this watch).
func (k *KV) Watch(ctx context.Context, opts KVWatchOptions) (*KVWatcher, error) {
	if err := wire.ValidateBucketName(k.bucket); err != nil {
		return nil, fmt.Errorf("nereus: kv watch: %w", err)
	}
	credit := opts.Credit
	if credit <= 0 {
		credit = 256
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &KVWatcher{events: make(chan KVEvent), cancel: cancel, done: make(chan struct{}), next: max(opts.FromRevision, 1)}
	go k.runWatch(ctx, w, opts.Prefix, credit)
	return w, nil
}

// watchFrames is the queue a watch's stream handler fills from the
// connection's reader (which must never block on a slow watcher).
type watchFrames struct {
	mu     sync.Mutex
	frames []wire.Frame
	err    error
	signal chan struct{}
}

func (q *watchFrames) push(f wire.Frame, err error) {
	q.mu.Lock()
	if err != nil {
		if q.err == nil {
			q.err = err
		}
	} else {
		q.frames = append(q.frames, f)
	}
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *watchFrames) take() ([]wire.Frame, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	frames := q.frames
	q.frames = nil
	if len(frames) > 0 {
		return frames, nil
	}
	return nil, q.err
}

func (k *KV) runWatch(ctx context.Context, w *KVWatcher, prefix string, credit int) {
	defer close(w.done)
	defer close(w.events)
	defer w.cancel()
	for attempt := 1; ; attempt++ {
		err := k.watchOnce(ctx, w, prefix, credit)
		if ctx.Err() != nil {
			return
		}
		retry := errors.Is(err, ErrDisconnected) || hasCode(err, wire.CodeNotLeader, wire.CodeUnavailable, wire.CodeQuorumLost)
		if !retry {
			w.err = err
			return
		}
		k.refreshRoute(ctx)
		if !retryPause(ctx, attempt) {
			return
		}
	}
}

// watchOnce runs one KV_WATCH on the leader's connection until it ends.
func (k *KV) watchOnce(ctx context.Context, w *KVWatcher, prefix string, credit int) error {
	cn, err := k.c.leaderConn(ctx, k.topic, 0, true)
	if err != nil {
		return err
	}
	q := &watchFrames{signal: make(chan struct{}, 1)}
	from := w.Next()
	corr, err := cn.openStream(ctx, &wire.KVWatch{Bucket: k.bucket, Prefix: []byte(prefix), FromRevision: from, Credit: uint32(credit)}, q.push)
	if err != nil {
		return err
	}
	cn.flush()
	defer func() {
		cn.closeStream(corr)
		_ = cn.send(context.Background(), corr, &wire.KVWatchCancel{Watch: corr})
		cn.flush()
	}()
	used := 0
	for {
		frames, err := q.take()
		if len(frames) == 0 && err == nil {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-q.signal:
			}
			continue
		}
		for _, f := range frames {
			ev, ok := f.(*wire.KVEvent)
			if !ok {
				return unexpected("KV_WATCH", f)
			}
			if ev.Kind == wire.KVEventSkipped {
				w.setNext(ev.To + 1) // the broker accounts for every revision: nothing for us up to To
				continue
			}
			select {
			case w.events <- KVEvent{Bucket: k.bucket, Entry: kvEntryFromWire(ev.Entry), Floor: ev.Floor}:
			case <-ctx.Done():
				return ctx.Err()
			}
			w.setNext(ev.Entry.Revision + 1)
			if used++; used >= (credit+1)/2 {
				if err := cn.send(ctx, corr, &wire.KVWatchCredit{Watch: corr, Credit: uint32(used)}); err != nil {
					return err
				}
				cn.flush()
				used = 0
			}
		}
		if err != nil {
			var we *wire.Error
			if errors.As(err, &we) && we.Code == wire.CodeCursorExpired {
				floor, _ := wire.ExpiredFloor(we)
				return &CursorExpiredError{Bucket: k.bucket, Next: w.Next(), Floor: floor, err: we}
			}
			return err
		}
	}
}

func (w *KVWatcher) setNext(next uint64) {
	w.mu.Lock()
	w.next = next
	w.mu.Unlock()
}
