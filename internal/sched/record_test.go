package sched

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

var sampleRecords = []Record{
	{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: 1767225600000, Topic: "orders", Incarnation: 42, Partition: 3}},
	{Kind: KindSchedule, Schedule: Schedule{DeliverAtMs: -1, Topic: strings.Repeat("t", TopicBytesMax)}},
	{Kind: KindIntent, Epoch: 7, Incarnation: 42, Intents: []Intent{{ID: 5, Partition: 1, FireSeq: 9}, {ID: 6, FireSeq: 10}}},
	{Kind: KindFired, Fired: []Fired{{ID: 5, DestSeq: 1000}}},
	{Kind: KindUnknown, IDs: []uint64{6}},
	{Kind: KindCancel, IDs: []uint64{1, 2, 3}},
	{Kind: KindLane, Lane: LaneCommand{Topic: "orders", Op: LaneResume, Incarnation: 43}},
	{Kind: KindLane, Lane: LaneCommand{Topic: "orders", Op: LaneBreak, Incarnation: 42}},
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords {
		b, err := r.Encode()
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("decoded %+v, want %+v", got, r)
		}
		for n := range len(b) {
			if _, err := Decode(b[:n]); err == nil {
				t.Fatalf("%v record cut to %d of %d bytes decoded", r.Kind, n, len(b))
			}
		}
		if _, err := Decode(append(b, 0)); err == nil {
			t.Fatalf("%v record with a trailing byte decoded", r.Kind)
		}
	}
}

func TestRecordRefusesWhatItCannotDecode(t *testing.T) {
	for _, r := range []Record{
		{Kind: KindSchedule},
		{Kind: KindSchedule, Schedule: Schedule{Topic: strings.Repeat("t", TopicBytesMax+1)}},
		{Kind: KindIntent},
		{Kind: KindCancel, IDs: make([]uint64, RecordEntriesMax+1)},
		{Kind: KindLane, Lane: LaneCommand{Topic: "t"}},
		{Kind: 99},
	} {
		if b, err := r.Encode(); err == nil {
			t.Fatalf("encoded %v %+v as %x", r.Kind, r, b)
		}
	}
	// A count the value cannot hold is refused before allocating.
	if _, err := Decode([]byte{byte(KindCancel), 0, 1, 0, 0, 1, 2, 3}); err == nil {
		t.Fatal("decoded a count of 65536 ids from 3 bytes")
	}
}

// FuzzDecode: any value decodes to an error or to a record that
// encodes back to the same bytes (the layout is canonical).
func FuzzDecode(f *testing.F) {
	for _, r := range sampleRecords {
		b, _ := r.Encode()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			return
		}
		again, err := r.Encode()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", r, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, r, again)
		}
	})
}
