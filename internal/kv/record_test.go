package kv

import (
	"errors"
	"reflect"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, w := range []Write{
		{Op: OpPut, Key: []byte("a"), Value: []byte("v"), TimestampMs: 7},
		{Op: OpPut, Key: []byte("a/b"), TimestampMs: -1},
		{Op: OpPut, Key: []byte("k"), Value: []byte("v"), Conditional: true, Expected: 0},
		{Op: OpPut, Key: []byte("k"), Value: []byte("v"), Conditional: true, Expected: 1 << 60},
		{Op: OpDelete, Key: []byte("k"), TimestampMs: 1e12},
		{Op: OpDelete, Key: []byte("k"), Conditional: true, Expected: 3},
		{Op: OpCompact, TimestampMs: 99},
		{Op: OpFence},
		{Op: OpFence, Value: FenceRecord([]Span{{3, 5}, {9, 9}}).Value},
	} {
		got, err := DecodeRecord(EncodeRecord(w))
		if err != nil {
			t.Fatalf("%+v: %v", w, err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("round trip of %+v gave %+v", w, got)
		}
	}
}

func TestDecodeRecordRefusesMalformed(t *testing.T) {
	op := func(name string) Header { return Header{Key: OpHeader, Value: []byte(name)} }
	expect := Header{Key: ExpectHeader, Value: make([]byte, 8)}
	long := make([]byte, KeyBytesLimit+1)
	for _, tc := range []struct {
		name string
		r    Record
		want error
	}{
		{"no headers", Record{Key: []byte("k")}, ErrNotKV},
		{"control record", Record{Headers: []Header{{Key: "nereus-control", Value: []byte("install")}}}, ErrNotKV},
		{"op header second", Record{Key: []byte("k"), Headers: []Header{{Key: "x"}, op("put")}}, ErrNotKV},
		{"unknown op", Record{Key: []byte("k"), Headers: []Header{op("get")}}, ErrMalformed},
		{"empty key", Record{Headers: []Header{op("put")}}, ErrEmptyKey},
		{"key too long", Record{Key: long, Headers: []Header{op("put")}}, ErrKeyTooLarge},
		{"value too long", Record{Key: []byte("k"), Value: make([]byte, ValueBytesLimit+1), Headers: []Header{op("put")}}, ErrValueTooLarge},
		{"delete with value", Record{Key: []byte("k"), Value: []byte("v"), Headers: []Header{op("del")}}, ErrMalformed},
		{"compact with key", Record{Key: []byte("k"), Headers: []Header{op("compact")}}, ErrMalformed},
		{"conditional compact", Record{Headers: []Header{op("compact"), expect}}, ErrMalformed},
		{"short expect", Record{Key: []byte("k"), Headers: []Header{op("put"), {Key: ExpectHeader, Value: []byte{1}}}}, ErrMalformed},
		{"foreign second header", Record{Key: []byte("k"), Headers: []Header{op("put"), {Key: "x", Value: make([]byte, 8)}}}, ErrMalformed},
		{"three headers", Record{Key: []byte("k"), Headers: []Header{op("put"), expect, expect}}, ErrMalformed},
		{"fence with key", Record{Key: []byte("k"), Headers: []Header{op("fence")}}, ErrMalformed},
		{"conditional fence", Record{Headers: []Header{op("fence"), expect}}, ErrMalformed},
		{"fence of a partial span", Record{Value: make([]byte, 15), Headers: []Header{op("fence")}}, ErrMalformed},
		{"fence of seq 0", Record{Value: make([]byte, 16), Headers: []Header{op("fence")}}, ErrMalformed},
		{"fence of a span backwards", Record{Value: FenceRecord([]Span{{5, 4}}).Value, Headers: []Header{op("fence")}}, ErrMalformed},
		{"fence of too many spans", Record{Value: FenceRecord(make([]Span, FenceSpansMax+1)).Value, Headers: []Header{op("fence")}}, ErrMalformed},
	} {
		_, err := DecodeRecord(tc.r)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
		if tc.want != ErrNotKV && !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v is not ErrMalformed", tc.name, err)
		}
	}
}

// FuzzDecodeRecord: any record of up to two headers decodes or fails with
// ErrNotKV or ErrMalformed, never panics, and what decodes encodes back to
// the same record.
func FuzzDecodeRecord(f *testing.F) {
	for _, w := range []Write{
		{Op: OpPut, Key: []byte("a"), Value: []byte("v"), TimestampMs: 7},
		{Op: OpDelete, Key: []byte("k"), Conditional: true, Expected: 3},
		{Op: OpCompact, TimestampMs: 99},
		{Op: OpCheckpoint, Value: []byte("chunk"), TimestampMs: 3, Chunk: CheckpointChunk{Base: 9, Index: 1, Count: 2}},
		{Op: OpFence, Value: FenceRecord([]Span{{3, 5}}).Value},
	} {
		r := EncodeRecord(w)
		var k1 string
		var v1 []byte
		if len(r.Headers) > 1 {
			k1, v1 = r.Headers[1].Key, r.Headers[1].Value
		}
		f.Add(r.TimestampMs, r.Key, r.Value, uint8(len(r.Headers)), r.Headers[0].Key, r.Headers[0].Value, k1, v1)
	}
	f.Add(int64(0), []byte{}, []byte{}, uint8(1), "nereus-control", []byte("install"), "", []byte{})
	f.Fuzz(func(t *testing.T, ts int64, key, value []byte, headers uint8, k0 string, v0 []byte, k1 string, v1 []byte) {
		r := Record{TimestampMs: ts, Key: key, Value: value}
		all := []Header{{Key: k0, Value: v0}, {Key: k1, Value: v1}, {Key: k1, Value: v0}}
		r.Headers = all[:int(headers)%(len(all)+1)]
		w, err := DecodeRecord(r)
		if err != nil {
			if !errors.Is(err, ErrNotKV) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is neither ErrNotKV nor ErrMalformed", err)
			}
			return
		}
		again := EncodeRecord(w)
		if again.TimestampMs != r.TimestampMs || string(again.Key) != string(r.Key) || string(again.Value) != string(r.Value) || len(again.Headers) != len(r.Headers) {
			t.Fatalf("%+v decoded to %+v, encoded back to %+v", r, w, again)
		}
		for i := range again.Headers {
			if again.Headers[i].Key != r.Headers[i].Key || string(again.Headers[i].Value) != string(r.Headers[i].Value) {
				t.Fatalf("header %d: %+v encoded back to %+v", i, r.Headers[i], again.Headers[i])
			}
		}
	})
}
