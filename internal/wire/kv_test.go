package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// kvSampleFrames holds one populated value of every KV frame: the
// round-trip table and part of the fuzz seed corpus (FuzzDecodeFrame).
func kvSampleFrames() []Frame {
	entry := KVEntry{Key: []byte("a/b"), Revision: 7, Op: KVOpPut, TimestampMs: 1234, Value: []byte("v")}
	return []Frame{
		&KVBucketCreate{Config: KVBucketConfig{Bucket: "config", History: 5, TombstoneTTLMs: 60_000, Replicas: 3}},
		&KVBucketOK{Config: KVBucketConfig{Bucket: "config", History: 1, TombstoneTTLMs: 1, Replicas: 1}, Created: true},
		&KVBucketDelete{Bucket: "config"},
		&KVBucketList{Bucket: "config"},
		&KVBucketListOK{Buckets: []KVBucketInfo{{Config: KVBucketConfig{Bucket: "config", History: 5, TombstoneTTLMs: 9, Replicas: 3},
			Revision: 44, Floor: 3, Keys: 12, Leader: "n2", LeaderAddr: "127.0.0.1:4851"}, {Config: KVBucketConfig{Bucket: "b"}}}},
		&KVWrite{Bucket: "config", Op: KVOpPut, Key: []byte("k"), Value: []byte("v"), Conditional: true, Expected: 9},
		&KVWrite{Bucket: "config", Op: KVOpDelete, Key: []byte("k")},
		&KVWriteOK{Revision: 10},
		&KVGet{Bucket: "config", Key: []byte("k"), Revision: 3},
		&KVGetOK{Found: true, Entry: entry, BucketRevision: 9},
		&KVKeys{Bucket: "config", Prefix: []byte("a/"), After: []byte("a/b"), Limit: 100},
		&KVKeysOK{Keys: [][]byte{[]byte("a/c"), []byte("a/d")}, More: true, BucketRevision: 12},
		&KVHistory{Bucket: "config", Key: []byte("k")},
		&KVHistoryOK{Entries: []KVEntry{entry, {Key: []byte("a/b"), Revision: 9, Op: KVOpDelete, TimestampMs: 5}}},
		&KVWatch{Bucket: "config", Prefix: []byte("a/"), FromRevision: 3, Credit: 64},
		&KVEvent{Kind: KVEventPut, Entry: entry, Floor: 2},
		&KVEvent{Kind: KVEventSkipped, From: 3, To: 6, Reasons: 3, Floor: 2},
		&KVWatchCredit{Watch: 77, Credit: 32},
		&KVWatchCancel{Watch: 77},
		&KVList{Bucket: "config", Prefix: []byte("a/")},
		&KVListOK{BucketRevision: 12, Entries: []KVEntry{entry}},
		&KVListPage{Bucket: "config", Prefix: []byte("a/"), Listing: 1<<32 | 3, Offset: 500, Limit: 100},
		&KVListPageOK{Listing: 1<<32 | 3, BucketRevision: 12, Entries: []KVEntry{entry}, More: true},
	}
}

func TestKVFramesRoundTrip(t *testing.T) {
	seen := map[FrameType]bool{}
	for _, f := range kvSampleFrames() {
		seen[f.Type()] = true
		b := AppendFrame(nil, 42, f)
		corr, got, err := ReadFrame(bytes.NewReader(b), DefaultFrameBytesMax)
		if err != nil || corr != 42 {
			t.Fatalf("%s: corr=%d err=%v", f.Type(), corr, err)
		}
		if !reflect.DeepEqual(normalize(got), normalize(f)) {
			t.Fatalf("%s: round trip mismatch:\n got %#v\nwant %#v", f.Type(), got, f)
		}
	}
	for _, typ := range append([]FrameType{TypeKVListPage, TypeKVListPageOK}, kvFrameRange()...) {
		if !seen[typ] {
			t.Errorf("no sample of %s", typ)
		}
		if typ.String() == "" || typ.String()[0] == 'F' {
			t.Errorf("frame type %d has no name: %s", typ, typ)
		}
	}
}

// entry and entries normalize entries (normalizeKV).
func entry(e KVEntry) KVEntry {
	e.Key, e.Value = nilIfEmpty(e.Key), nilIfEmpty(e.Value)
	return e
}

func entries(es []KVEntry) (out []KVEntry) {
	for _, e := range es {
		out = append(out, entry(e))
	}
	return out
}

func kvFrameRange() (ts []FrameType) {
	for typ := TypeKVBucketCreate; typ <= TypeKVListOK; typ++ {
		ts = append(ts, typ)
	}
	return ts
}

func TestKVFramesRefuseBadEnums(t *testing.T) {
	for _, f := range []Frame{
		&KVWrite{Bucket: "b", Op: 3, Key: []byte("k")},
		&KVEvent{Kind: 4},
		&KVEvent{Kind: 0},
	} {
		_, _, err := ReadFrame(bytes.NewReader(AppendFrame(nil, 1, f)), DefaultFrameBytesMax)
		if !errors.Is(err, ErrBadFrame) {
			t.Errorf("%#v: err = %v, want BAD_FRAME", f, err)
		}
	}
}

func TestKVErrorsCarryTheirRevision(t *testing.T) {
	e := RevisionMismatch(17, "key %q expected %d", "k", 3)
	if !errors.Is(e, ErrRevisionMismatch) || e.Code.String() != "REVISION_MISMATCH" {
		t.Fatalf("%v", e)
	}
	if cur, ok := MismatchCurrent(e); !ok || cur != 17 {
		t.Fatalf("MismatchCurrent = %d, %v", cur, ok)
	}
	// Through the wire: the ERR frame keeps it.
	_, f, err := ReadFrame(bytes.NewReader(AppendFrame(nil, 1, &Err{Code: e.Code, Message: e.Message})), DefaultFrameBytesMax)
	if err != nil {
		t.Fatal(err)
	}
	if cur, ok := MismatchCurrent(f.(*Err).AsError()); !ok || cur != 17 {
		t.Fatalf("after the wire: %d, %v", cur, ok)
	}
	x := CursorExpired(40, "watch from %d", 3)
	if floor, ok := ExpiredFloor(x); !ok || floor != 40 || x.Code.String() != "CURSOR_EXPIRED" {
		t.Fatalf("ExpiredFloor = %d, %v (%v)", floor, ok, x)
	}
	if _, ok := MismatchCurrent(x); ok {
		t.Fatal("a CURSOR_EXPIRED read as a mismatch")
	}
	if _, ok := ExpiredFloor(&Error{Code: CodeCursorExpired, Message: "floor=x; no"}); ok {
		t.Fatal("a malformed floor parsed")
	}
}

func TestBucketNamesAndTheirTopics(t *testing.T) {
	long := string(bytes.Repeat([]byte("a"), KVBucketBytesMax))
	for _, ok := range []string{"config", "a.b-c_d", long} {
		if err := ValidateBucketName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
		if err := ValidateTopicOrInternal(KVTopic(ok)); err != nil {
			t.Errorf("topic of %q: %v", ok, err)
		}
		if ValidateName("topic", KVTopic(ok)) == nil {
			t.Errorf("a client may name the topic of %q", ok)
		}
	}
	for _, bad := range []string{"", "__x", "a/b", long + "a", ".."} {
		if err := ValidateBucketName(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: err = %v", bad, err)
		}
		if err := ValidateTopicOrInternal(KVTopic(bad)); err == nil {
			t.Errorf("topic of %q accepted", bad)
		}
	}
	if err := ValidateTopicOrInternal("__meta"); err == nil {
		t.Error("__meta accepted as a stored topic")
	}
}

// normalizeKV maps empty byte slices of KV frames to nil (FuzzDecodeFrame).
func normalizeKV(f Frame) Frame {
	switch v := f.(type) {
	case *KVWrite:
		c := *v
		c.Key, c.Value = nilIfEmpty(c.Key), nilIfEmpty(c.Value)
		return &c
	case *KVGet:
		c := *v
		c.Key = nilIfEmpty(c.Key)
		return &c
	case *KVGetOK:
		c := *v
		c.Entry = entry(c.Entry)
		return &c
	case *KVKeys:
		c := *v
		c.Prefix, c.After = nilIfEmpty(c.Prefix), nilIfEmpty(c.After)
		return &c
	case *KVKeysOK:
		c := *v
		c.Keys = nil
		for _, k := range v.Keys {
			c.Keys = append(c.Keys, nilIfEmpty(k))
		}
		return &c
	case *KVHistory:
		c := *v
		c.Key = nilIfEmpty(c.Key)
		return &c
	case *KVHistoryOK:
		c := *v
		c.Entries = entries(v.Entries)
		return &c
	case *KVWatch:
		c := *v
		c.Prefix = nilIfEmpty(c.Prefix)
		return &c
	case *KVEvent:
		c := *v
		c.Entry = entry(c.Entry)
		return &c
	case *KVListOK:
		c := *v
		c.Entries = entries(v.Entries)
		return &c
	case *KVList:
		c := *v
		c.Prefix = nilIfEmpty(c.Prefix)
		return &c
	case *KVListPage:
		c := *v
		c.Prefix = nilIfEmpty(c.Prefix)
		return &c
	case *KVListPageOK:
		c := *v
		c.Entries = entries(v.Entries)
		return &c
	}
	return f
}
