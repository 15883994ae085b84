package server

import (
	"fmt"
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

// expectErr reads the next frame and checks it is an ERR with code on corr.
func (c *rawConn) expectErr(corr uint64, code wire.Code) {
	c.t.Helper()
	gotCorr, f := c.read()
	e, ok := f.(*wire.Err)
	if !ok || e.Code != code || gotCorr != corr {
		c.t.Fatalf("got %#v on corr %d, want ERR %s on %d", f, gotCorr, code, corr)
	}
}

// KV frames over a connection: a write answered with its revision, a
// watch streaming events on its corr, credit granted later, a second
// watch on a corr already watching refused, and a token's permissions
// applied to buckets.
func TestKVOverAConnection(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"all", "reader kvread:b", "writer kv:b*", "orders pub:* sub:* kv:orders"}})
	c := dialRaw(t, addr)
	c.hello("all")
	c.write(2, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: "b", History: 5}})
	if _, f := c.read(); !f.(*wire.KVBucketOK).Created {
		t.Fatalf("create answered %#v", f)
	}
	c.write(3, &wire.KVWatch{Bucket: "b", Credit: 1})
	c.write(4, &wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k"), Value: []byte("1")})
	c.write(5, &wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k"), Value: []byte("2")})
	// The watch's events: SKIPPED over the bucket's config record, then
	// the first put (its one credit).
	got := map[uint64][]wire.Frame{}
	puts := func() (n int) {
		for _, f := range got[3] {
			if f.(*wire.KVEvent).Kind == wire.KVEventPut {
				n++
			}
		}
		return n
	}
	for len(got[4])+len(got[5]) < 2 || puts() < 1 {
		corr, f := c.read()
		got[corr] = append(got[corr], f)
	}
	rev1, rev2 := got[4][0].(*wire.KVWriteOK).Revision, got[5][0].(*wire.KVWriteOK).Revision
	if ev := got[3][0].(*wire.KVEvent); ev.Kind != wire.KVEventSkipped || ev.From != 1 || ev.To != rev1-1 {
		t.Fatalf("first event %#v", ev)
	}
	if ev := got[3][1].(*wire.KVEvent); ev.Kind != wire.KVEventPut || ev.Entry.Revision != rev1 || string(ev.Entry.Value) != "1" {
		t.Fatalf("second event %#v", ev)
	}
	// A second watch on a corr already watching is refused; the first
	// one goes on: credit 1 is used up, so the second put comes only with
	// more credit.
	c.write(3, &wire.KVWatch{Bucket: "b", Credit: 1})
	c.expectErr(3, wire.CodeInvalidArgument)
	c.write(0, &wire.KVWatchCredit{Watch: 3, Credit: 5})
	if corr, f := c.read(); corr != 3 || f.(*wire.KVEvent).Entry.Revision != rev2 {
		t.Fatalf("after more credit: %#v on %d", f, corr)
	}
	c.write(0, &wire.KVWatchCancel{Watch: 3})
	c.write(7, &wire.KVGet{Bucket: "b", Key: []byte("k")})
	if _, f := c.read(); string(f.(*wire.KVGetOK).Entry.Value) != "2" {
		t.Fatalf("get answered %#v", f)
	}

	// Bucket permissions: kvread reads, kv reads and writes, admin
	// creates and deletes; pub:* and sub:* do not reach buckets; a list
	// shows only the buckets the token may read.
	c.write(8, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: "other"}})
	if _, f := c.read(); !f.(*wire.KVBucketOK).Created {
		t.Fatalf("create answered %#v", f)
	}
	put := &wire.KVWrite{Bucket: "b", Op: wire.KVOpPut, Key: []byte("k"), Value: []byte("3")}
	for _, tc := range []struct {
		token             string
		read, write, list bool
	}{
		{"reader", true, false, true},
		{"writer", true, true, true},
		{"orders", false, false, false},
	} {
		conn := dialRaw(t, addr)
		conn.hello(tc.token)
		want := func(corr uint64, ok bool, okType wire.FrameType) {
			t.Helper()
			if !ok {
				conn.expectErr(corr, wire.CodeUnauthorized)
				return
			}
			if gotCorr, f := conn.read(); gotCorr != corr || f.Type() != okType {
				t.Fatalf("token %s: %#v on corr %d, want %v", tc.token, f, gotCorr, okType)
			}
		}
		conn.write(1, &wire.KVGet{Bucket: "b", Key: []byte("k")})
		want(1, tc.read, wire.TypeKVGetOK)
		conn.write(3, put)
		want(3, tc.write, wire.TypeKVWriteOK)
		conn.write(4, &wire.KVBucketList{Bucket: "b"})
		want(4, tc.list, wire.TypeKVBucketListOK)
		conn.write(5, &wire.KVBucketList{})
		corr, f := conn.read()
		var names []string
		for _, b := range f.(*wire.KVBucketListOK).Buckets {
			names = append(names, b.Config.Bucket)
		}
		if wantNames := map[bool]string{true: "[b]", false: "[]"}[tc.list]; corr != 5 || fmt.Sprint(names) != wantNames {
			t.Fatalf("token %s: list of all buckets answered %v on corr %d, want %s", tc.token, names, corr, wantNames)
		}
		conn.write(6, &wire.KVBucketDelete{Bucket: "b"})
		conn.expectErr(6, wire.CodeUnauthorized)
		conn.write(7, &wire.KVWatch{Bucket: "b", Credit: 1})
		want(7, tc.read, wire.TypeKVEvent)
	}
}
