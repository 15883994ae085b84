package server

import (
	"sync"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// kvSession is a connection's KV state: its watches, by the corr of the
// KV_WATCH that started each.
type kvSession struct {
	mu      sync.Mutex // watches end from the bucket's goroutine
	watches map[uint64]*node.KVWatch
}

func (s *kvSession) close() {
	s.mu.Lock()
	watches := s.watches
	s.watches = nil
	s.mu.Unlock()
	for _, w := range watches {
		w.Cancel()
	}
}

// handleKV routes a KV request; it reports false for any other frame.
func (p *Protocol) handleKV(corr uint64, f wire.Frame) bool {
	n := p.srv.node
	switch f := f.(type) {
	case *wire.KVBucketCreate:
		n.KVCreateBucket(f.Config, func(cfg wire.KVBucketConfig, created bool, err error) {
			if err != nil {
				p.sendErr(corr, err)
				return
			}
			p.send(corr, &wire.KVBucketOK{Config: cfg, Created: created})
		})
	case *wire.KVBucketDelete:
		bucket := f.Bucket
		n.KVDeleteBucket(bucket, func(err error) {
			if err != nil {
				p.sendErr(corr, err)
				return
			}
			p.send(corr, &wire.KVBucketOK{Config: wire.KVBucketConfig{Bucket: bucket}})
		})
	case *wire.KVBucketList:
		if f.Bucket != "" && !p.perms.canReadKV(f.Bucket) {
			p.sendErr(corr, kvDenied(f.Bucket, false))
			return true
		}
		infos, err := n.KVBuckets(f.Bucket)
		if err != nil {
			p.sendErr(corr, err)
			return true
		}
		readable := infos[:0]
		for _, b := range infos {
			if p.perms.canReadKV(b.Config.Bucket) {
				readable = append(readable, b)
			}
		}
		p.send(corr, &wire.KVBucketListOK{Buckets: readable})
	case *wire.KVWrite:
		n.KVWrite(f, func(revision uint64, err error) {
			if err != nil {
				p.sendErr(corr, err)
				return
			}
			p.send(corr, &wire.KVWriteOK{Revision: revision})
		})
	case *wire.KVGet:
		n.KVGet(f, kvReply[*wire.KVGetOK](p, corr))
	case *wire.KVKeys:
		n.KVKeys(f, kvReply[*wire.KVKeysOK](p, corr))
	case *wire.KVHistory:
		n.KVHistory(f, kvReply[*wire.KVHistoryOK](p, corr))
	case *wire.KVList:
		n.KVList(f, kvReply[*wire.KVListOK](p, corr))
	case *wire.KVListPage:
		n.KVListPage(f, kvReply[*wire.KVListPageOK](p, corr))
	case *wire.KVWatch:
		p.kvWatch(corr, f)
	case *wire.KVWatchCredit:
		p.kv.mu.Lock()
		w := p.kv.watches[f.Watch]
		p.kv.mu.Unlock()
		if w != nil {
			w.AddCredit(f.Credit)
		}
	case *wire.KVWatchCancel:
		p.kv.mu.Lock()
		w := p.kv.watches[f.Watch]
		delete(p.kv.watches, f.Watch)
		p.kv.mu.Unlock()
		if w != nil {
			w.Cancel()
		}
	default:
		return false
	}
	return true
}

func (p *Protocol) kvWatch(corr uint64, f *wire.KVWatch) {
	p.kv.mu.Lock()
	_, dup := p.kv.watches[corr]
	p.kv.mu.Unlock()
	if dup {
		p.sendErr(corr, wire.Errorf(wire.CodeInvalidArgument, "a watch with corr %d is running on this connection", corr))
		return
	}
	w, err := p.srv.node.KVStartWatch(f, kvWatchSink{p: p, corr: corr})
	if err != nil {
		p.sendErr(corr, err)
		return
	}
	p.kv.mu.Lock()
	if p.kv.watches == nil {
		p.kv.watches = map[uint64]*node.KVWatch{}
	}
	p.kv.watches[corr] = w
	p.kv.mu.Unlock()
}

// kvWatchSink sends a watch's events and its end on its KV_WATCH's corr.
type kvWatchSink struct {
	p    *Protocol
	corr uint64
}

func (k kvWatchSink) SendEvent(ev *wire.KVEvent) { k.p.send(k.corr, ev) }

func (k kvWatchSink) End(err *wire.Error) {
	k.p.kv.mu.Lock()
	delete(k.p.kv.watches, k.corr)
	k.p.kv.mu.Unlock()
	k.p.sendErr(k.corr, err)
}

// kvReply sends a read's answer, or its error, on corr.
func kvReply[T wire.Frame](p *Protocol, corr uint64) func(T, error) {
	return func(ok T, err error) {
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.send(corr, ok)
	}
}

// authorizeKV checks a KV request against the token: bucket creation and
// deletion need admin; writes need kv:GLOB, reads and watches kv:GLOB or
// kvread:GLOB matching the bucket's name. A bucket list is filtered
// instead (handleKV answers only the buckets the token may read).
func (p *Protocol) authorizeKV(f wire.Frame) error {
	var bucket string
	write := false
	switch f := f.(type) {
	case *wire.KVBucketCreate, *wire.KVBucketDelete:
		if !p.perms.canDeclare() {
			return wire.Errorf(wire.CodeUnauthorized, "token may not create or delete buckets")
		}
		return nil
	case *wire.KVWrite:
		bucket, write = f.Bucket, true
	case *wire.KVGet:
		bucket = f.Bucket
	case *wire.KVKeys:
		bucket = f.Bucket
	case *wire.KVHistory:
		bucket = f.Bucket
	case *wire.KVList:
		bucket = f.Bucket
	case *wire.KVListPage:
		bucket = f.Bucket
	case *wire.KVWatch:
		bucket = f.Bucket
	default:
		return nil
	}
	if write && !p.perms.canWriteKV(bucket) || !write && !p.perms.canReadKV(bucket) {
		return kvDenied(bucket, write)
	}
	return nil
}

func kvDenied(bucket string, write bool) error {
	if write {
		return wire.Errorf(wire.CodeUnauthorized, "token may not write bucket %q (needs kv:%s)", bucket, bucket)
	}
	return wire.Errorf(wire.CodeUnauthorized, "token may not read bucket %q (needs kv:%s or kvread:%s)", bucket, bucket, bucket)
}
