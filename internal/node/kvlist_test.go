package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// TestKVListPagesAtOneRevision: a listing larger than one frame comes in
// pages, every one at the first page's revision: a key written and one
// overwritten after the first page do not show in the later pages (the
// value listed is the one at that revision). A page named again (a lost
// answer) is the same page, but for the last one, which closes the
// listing. A listing idle for kvListingIdleMs, finished,
// or of a bucket re-created meanwhile is CURSOR_EXPIRED; one named with
// another prefix is INVALID_ARGUMENT; past kvListingsMax open listings a
// new one is UNAVAILABLE. Idle is measured on the monotonic clock: a step
// of the wall clock an hour forward expires nothing.
func TestKVListPagesAtOneRevision(t *testing.T) {
	h := newHarness(t)
	n := h.node
	if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "l"}); err != nil {
		t.Fatal(err)
	}
	page := func(prefix string, listing, offset uint64, limit uint32) (*wire.KVListPageOK, error) {
		return kvCall(t, "list page", func(done func(*wire.KVListPageOK, error)) {
			n.KVListPage(&wire.KVListPage{Bucket: "l", Prefix: []byte(prefix), Listing: listing, Offset: offset, Limit: limit}, done)
		})
	}
	big := strings.Repeat("v", wire.KVValueBytesMax)
	const bigs = 8 // 8 MiB: more than one KV_LIST_OK may carry
	for i := range bigs {
		kvPut(t, n, "l", fmt.Sprintf("big/%d", i), big)
	}
	first, err := page("big/", 0, 0, 0)
	if err != nil || !first.More || len(first.Entries) == 0 || len(first.Entries) >= bigs {
		t.Fatalf("first page: %d entries, more %v, %v", len(first.Entries), first.More, err)
	}
	rev := first.BucketRevision
	kvPut(t, n, "l", "big/9", "new")                           // after the listing's revision
	kvPut(t, n, "l", fmt.Sprintf("big/%d", bigs-1), "changed") // likewise
	got := first.Entries
	for more := first.More; more; {
		p, err := page("big/", first.Listing, uint64(len(got)), 0)
		if err != nil {
			t.Fatalf("page at %d: %v", len(got), err)
		}
		if p.More {
			again, err := page("big/", first.Listing, uint64(len(got)), 0)
			if err != nil || len(again.Entries) != len(p.Entries) || !again.More {
				t.Fatalf("the page at %d asked again: %+v, %v; want %d entries", len(got), again, err, len(p.Entries))
			}
		}
		if p.BucketRevision != rev || len(p.Entries) == 0 {
			t.Fatalf("page at %d: revision %d (first %d), %d entries", len(got), p.BucketRevision, rev, len(p.Entries))
		}
		got, more = append(got, p.Entries...), p.More
		if !more {
			// The last page closed the listing.
			_, err := page("big/", first.Listing, uint64(len(got)), 0)
			wantCode(t, err, wire.CodeCursorExpired)
		}
	}
	if len(got) != bigs {
		t.Fatalf("listed %d entries, want %d (the ones at revision %d)", len(got), bigs, rev)
	}
	for i, e := range got {
		if string(e.Key) != fmt.Sprintf("big/%d", i) || string(e.Value) != big || e.Revision > rev {
			t.Fatalf("entry %d: %s at revision %d (%d bytes), want big/%d at or below %d", i, e.Key, e.Revision, len(e.Value), i, rev)
		}
	}

	// Small pages; the wrong prefix; idle expiry.
	small, err := page("big/", 0, 0, 2)
	if err != nil || len(small.Entries) != 2 || !small.More {
		t.Fatalf("a page of 2: %d entries, more %v, %v", len(small.Entries), small.More, err)
	}
	_, err = page("other/", small.Listing, 2, 2)
	wantCode(t, err, wire.CodeInvalidArgument)
	h.wallStepMs.Store(time.Hour.Milliseconds())
	if _, err := page("big/", small.Listing, 2, 2); err != nil {
		t.Fatalf("a page right after the wall clock stepped an hour forward: %v", err)
	}
	h.nowMs.Add(kvListingIdleMs)
	_, err = page("big/", small.Listing, 2, 2)
	wantCode(t, err, wire.CodeCursorExpired)

	// A bounded number open at once.
	var open []uint64
	for range kvListingsMax {
		p, err := page("big/", 0, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, p.Listing)
	}
	_, err = page("big/", 0, 0, 1)
	wantCode(t, err, wire.CodeUnavailable)

	// Delete and re-create the bucket: its listings are another bucket's.
	if _, err := kvCall(t, "delete", func(done func(struct{}, error)) {
		n.KVDeleteBucket("l", func(err error) { done(struct{}{}, err) })
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := kvCreate(t, n, wire.KVBucketConfig{Bucket: "l"}); err != nil {
		t.Fatal(err)
	}
	kvPut(t, n, "l", "big/0", "again")
	_, err = page("big/", open[0], 1, 1)
	wantCode(t, err, wire.CodeCursorExpired)
	if p, err := page("big/", 0, 0, 0); err != nil || len(p.Entries) != 1 || string(p.Entries[0].Value) != "again" || p.More {
		t.Fatalf("a listing of the new bucket: %+v, %v", p, err)
	}
}
