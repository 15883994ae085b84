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
	{Kind: KindCarry, Carry: Carry{ID: 5, Topic: "orders", DeliverAtMs: 1767225600000, Partition: 2, From: 5}},
	{Kind: KindCheckpoint, Checkpoint: Checkpoint{Base: 99, Chunk: 0, Chunks: 2, Counts: Counts{Admitted: 9, Fired: 3, Unknown: 1, Cancelled: 2, Rejected: 1},
		Topics: []string{"orders", "mail"},
		Lanes:  []CheckpointLane{{Topic: 0, Gate: GateOpen, Incarnation: 42}, {Topic: 1, Gate: GateRetired, Incarnation: 1}},
		Fires:  []CheckpointFire{{Topic: 0, Partition: 3, Last: 7}},
		Entries: []CheckpointEntry{{Topic: 0, Status: StatusPending, ID: 5, DeliverAtMs: 1767225600000, Partition: 3, At: 77},
			{Topic: 0, Status: StatusFiring, ID: 6, DeliverAtMs: -1, Partition: 3, At: 6, FireSeq: 7, Epoch: 2, Incarnation: 42}},
		Refusing: []CheckpointSpan{{Topic: 0, From: 10, To: 20}, {Topic: 1, From: 40}}}},
	{Kind: KindCheckpoint, Checkpoint: Checkpoint{Base: 99, Chunk: 1, Chunks: 2}},
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
		{Kind: KindCarry},
		{Kind: KindCheckpoint},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunk: 2, Chunks: 2}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: CheckpointChunksMax + 1}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Lanes: []CheckpointLane{{Topic: 0, Gate: GateOpen}}}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Topics: []string{"t"}, Lanes: []CheckpointLane{{Topic: 0, Gate: 9}}}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Topics: []string{"t"}, Entries: []CheckpointEntry{{Status: 3}}}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Topics: []string{"t"}, Entries: []CheckpointEntry{{Status: StatusPending, FireSeq: 1}}}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Topics: []string{""}}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Topics: []string{"t"}, Refusing: []CheckpointSpan{{Topic: 1, From: 1}}}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Topics: []string{"t"}, Refusing: []CheckpointSpan{{From: 5, To: 5}}}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunks: 1, Topics: []string{"t"}, Refusing: make([]CheckpointSpan, RefusingSpansMax+1)}},
		{Kind: KindCheckpoint, Checkpoint: Checkpoint{Chunk: 1, Chunks: 2, Topics: []string{"t"}, Refusing: []CheckpointSpan{{From: 1}}}},
		{Kind: 99},
	} {
		if b, err := r.Encode(); err == nil {
			t.Fatalf("encoded %v %+v as %x", r.Kind, r, b)
		}
	}
	// An empty list of refusing spans is not canonical: a checkpoint
	// without any has the chunk's high bit clear and ends before it.
	plain, err := sampleRecords[len(sampleRecords)-1].Encode()
	if err != nil {
		t.Fatal(err)
	}
	flagged := append(plain, 0, 0, 0, 0)
	flagged[1+8] |= 0x80 // the chunk's high bit: refusing spans follow
	if _, err := Decode(flagged); err == nil || !strings.Contains(err.Error(), "empty list") {
		t.Fatalf("a checkpoint with an empty list of refusing spans: %v", err)
	}
	// A count the value cannot hold is refused before allocating.
	if _, err := Decode([]byte{byte(KindCancel), 0, 1, 0, 0, 1, 2, 3}); err == nil {
		t.Fatal("decoded a count of 65536 ids from 3 bytes")
	}
	// So is a checkpoint's: topics, lanes, fires, entries.
	head := append([]byte{byte(KindCheckpoint)}, make([]byte, 8+4)...)
	head = append(head, 0, 0, 0, 1)           // chunks 1
	head = append(head, make([]byte, 5*8)...) // counts
	for _, tail := range [][]byte{
		{0xff, 0xff},                            // 65535 topics
		{0, 0, 0, 1, 0, 0},                      // 65536 lanes
		{0, 0, 0, 0, 0, 0, 0, 0xff, 0, 0},       // 255 fires
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 1}, // 9 entries
	} {
		if _, err := Decode(append(head[:len(head):len(head)], tail...)); err == nil {
			t.Fatalf("decoded a checkpoint whose counts %x the value cannot hold", tail)
		}
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
