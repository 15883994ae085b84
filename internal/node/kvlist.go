package node

import (
	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A listing of any size (KV_LIST_PAGE): the first page takes every live
// entry with the prefix at the bucket's revision and keeps them on the
// leader; later pages are cut from that copy, so every page is at the
// first page's revision whatever is written meanwhile. A listing lives
// while pages keep coming (kvListingIdleMs), in the reign and the bucket
// it was opened in; past that its pages are CURSOR_EXPIRED and the client
// starts it again. Its entries share the bucket's key and value bytes
// (never changed in place), so it costs a slice header per entry until it
// ends, and a bucket holds at most kvListingsMax of them.
const (
	kvListingsMax   = 8
	kvListingIdleMs = 30_000
)

// kvListing is one open listing.
type kvListing struct {
	confSeq  uint64 // the bucket it lists (a re-created bucket is another)
	prefix   string
	revision uint64
	entries  []kv.Revision
	lastMs   int64 // when it last served a page
}

// kvListings are a bucket runner's open listings, by id. An id is the
// reign's epoch and a count, so a listing named to a later leader (or to
// this one after a restart) is never another client's.
type kvListings struct {
	epoch uint64
	count uint32
	open  map[uint64]*kvListing
}

// KVListPage answers one page of a listing at the bucket's leader.
func (n *Node) KVListPage(f *wire.KVListPage, done func(*wire.KVListPageOK, error)) {
	kvRead(n, f.Bucket, nil, done, func(r *kvRunner, b *kv.Bucket) (*wire.KVListPageOK, error) {
		l, id, err := r.listings.find(r, b, f, n.monoMs()) // idle is a wait: monotonic
		if err != nil {
			return nil, err
		}
		ok := &wire.KVListPageOK{Listing: id, BucketRevision: l.revision}
		limit := int(f.Limit)
		if limit == 0 || limit > wire.KVListEntriesMax {
			limit = wire.KVListEntriesMax
		}
		bytes := 0
		for _, rev := range l.entries[min(f.Offset, uint64(len(l.entries))):] {
			if bytes += len(rev.Key) + len(rev.Value); len(ok.Entries) == limit || bytes > wire.KVListBytesMax && len(ok.Entries) > 0 {
				ok.More = true
				break
			}
			ok.Entries = append(ok.Entries, kvEntry(rev))
		}
		if !ok.More {
			delete(r.listings.open, id) // done (a retry of the last page after a lost answer lists again)
		}
		return ok, nil
	})
}

// find returns the listing a page names, opening a new one for Listing 0.
func (ls *kvListings) find(r *kvRunner, b *kv.Bucket, f *wire.KVListPage, now int64) (*kvListing, uint64, error) {
	if ls.epoch != r.epoch {
		ls.epoch, ls.count, ls.open = r.epoch, 0, nil // another reign: its listings are gone
	}
	for id, l := range ls.open {
		if now-l.lastMs >= kvListingIdleMs || l.confSeq != r.confSeq {
			delete(ls.open, id)
		}
	}
	if f.Listing != 0 {
		l := ls.open[f.Listing]
		switch {
		case l == nil:
			return nil, 0, wire.Errorf(wire.CodeCursorExpired, "bucket %q: listing %d is not open (finished, idle for %d s, another leader, or the bucket was re-created); list again",
				r.bucket, f.Listing, kvListingIdleMs/1000)
		case l.prefix != string(f.Prefix):
			return nil, 0, wire.Errorf(wire.CodeInvalidArgument, "bucket %q: listing %d lists prefix %q, not %q", r.bucket, f.Listing, l.prefix, f.Prefix)
		}
		l.lastMs = now
		return l, f.Listing, nil
	}
	if len(ls.open) >= kvListingsMax {
		return nil, 0, wire.Errorf(wire.CodeUnavailable, "bucket %q: %d listings in progress; retry", r.bucket, kvListingsMax)
	}
	if ls.open == nil {
		ls.open = map[uint64]*kvListing{}
	}
	l := &kvListing{confSeq: r.confSeq, prefix: string(f.Prefix), revision: b.Applied(), lastMs: now}
	for _, k := range b.Keys(l.prefix) {
		rev, _ := b.Get(k)
		l.entries = append(l.entries, rev)
	}
	ls.count++
	id := ls.epoch<<32 | uint64(ls.count)
	ls.open[id] = l
	return l, id, nil
}
