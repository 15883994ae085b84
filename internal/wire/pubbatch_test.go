package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// TestPubBatchWriterBuildsTheFramesOfItsPUBs: PUBs added one at a time,
// with other frames between them, read back as PUB_BATCH frames holding
// exactly those PUBs under their correlation ids, in order, sealed where
// the producer, topic or partition changes and where a frame cuts in.
func TestPubBatchWriterBuildsTheFramesOfItsPUBs(t *testing.T) {
	pubs := []*Pub{
		{Topic: "t", Partition: 0, ProducerID: 1, ProducerSeq: 1, Value: []byte("a")},
		{Topic: "t", Partition: 0, ProducerID: 1, ProducerSeq: 2, Key: []byte("k"), Value: []byte("b"), Headers: []Header{{Key: "h", Value: []byte("v")}}},
		{Topic: "t", Partition: 1, ProducerID: 1, ProducerSeq: 3, Value: []byte("c")}, // another partition: a new batch
		{Topic: "t", Partition: 1, ProducerID: 1, ProducerSeq: 4, TimestampMs: 5, Value: []byte("d")},
	}
	var w PubBatchWriter
	var buf []byte
	add := func(corr uint64, p *Pub) {
		if w.Fits(buf, p, PubRecordBytes(p), DefaultFrameBytesMax) {
			buf = w.Add(buf, corr, p)
		} else {
			buf = w.Open(buf, corr, p)
		}
	}
	add(10, pubs[0])
	add(11, pubs[1])
	add(12, pubs[2])
	buf = w.Seal(buf) // a PING cuts in
	buf = AppendFrame(buf, 13, &Ping{})
	add(14, pubs[3])
	buf = w.Seal(buf)
	if w.IsOpen() || len(w.Seal(buf)) != len(buf) {
		t.Fatal("a sealed writer sealed again")
	}

	r := bytes.NewReader(buf)
	want := []Frame{
		&PubBatch{Topic: "t", Partition: 0, ProducerID: 1, Records: []PubRecord{
			{Corr: 10, ProducerSeq: 1, Value: []byte("a")},
			{Corr: 11, ProducerSeq: 2, Key: []byte("k"), Value: []byte("b"), Headers: []Header{{Key: "h", Value: []byte("v")}}},
		}},
		pubs[2], // a batch of one is a PUB, under its record's corr
		&Ping{},
		pubs[3],
	}
	wantCorrs := []uint64{0, 12, 13, 14}
	for i, wf := range want {
		corr, f, err := ReadFrame(r, DefaultFrameBytesMax)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if corr != wantCorrs[i] || !reflect.DeepEqual(normalize(f), normalize(wf)) {
			t.Fatalf("frame %d: %#v on corr %d, want %#v on %d", i, f, corr, wf, wantCorrs[i])
		}
		if i == 1 && !bytes.Equal(buf[len(AppendFrame(nil, 0, want[0])):][:len(AppendFrame(nil, 12, pubs[2]))], AppendFrame(nil, 12, pubs[2])) {
			t.Fatal("a batch of one is not byte for byte the PUB it stands for")
		}
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes left", r.Len())
	}
	// The record's size as Fits counts it is what it adds to the frame.
	for _, p := range pubs {
		var w PubBatchWriter
		two := w.Open(nil, 1, p)
		two = w.Seal(w.Add(two, 2, p))
		three := w.Open(nil, 1, p)
		three = w.Seal(w.Add(w.Add(three, 2, p), 3, p))
		if got := len(three) - len(two); got != PubRecordBytes(p) {
			t.Fatalf("a record of %+v adds %d bytes, PubRecordBytes says %d", p, got, PubRecordBytes(p))
		}
	}
}

// TestPubBatchFitsItsBounds: a batch takes no record of another producer,
// none past PubBatchRecordsMax, and none that would make the frame larger
// than the limit.
func TestPubBatchFitsItsBounds(t *testing.T) {
	p := &Pub{Topic: "t", ProducerID: 1, Value: make([]byte, 100)}
	var w PubBatchWriter
	buf := w.Open(nil, 1, p)
	if other := *p; w.Fits(buf, &Pub{Topic: "t", ProducerID: 2}, 0, DefaultFrameBytesMax) || w.Fits(buf, &Pub{Topic: "u", ProducerID: 1}, 0, DefaultFrameBytesMax) || !w.Fits(buf, &other, PubRecordBytes(p), DefaultFrameBytesMax) {
		t.Fatal("Fits judged the producer, topic or partition wrong")
	}
	size := len(buf) - 4 + 4 // the sealed frame's length prefix: all but itself, and the checksum
	if w.Fits(buf, p, PubRecordBytes(p), size+PubRecordBytes(p)-1) || !w.Fits(buf, p, PubRecordBytes(p), size+PubRecordBytes(p)) {
		t.Fatal("Fits judged the frame limit wrong")
	}
	for w.count < PubBatchRecordsMax {
		buf = w.Add(buf, 1, p)
	}
	if w.Fits(buf, p, PubRecordBytes(p), 1<<30) {
		t.Fatalf("a batch of %d records takes one more", PubBatchRecordsMax)
	}
	buf = w.Seal(buf)
	if _, _, err := ReadFrame(bytes.NewReader(buf), 1<<30); err != nil {
		t.Fatalf("a full batch: %v", err)
	}
	over := &PubBatch{Topic: "t", Records: make([]PubRecord, PubBatchRecordsMax+1)}
	if _, _, err := ReadFrame(bytes.NewReader(AppendFrame(nil, 0, over)), 1<<30); err == nil {
		t.Fatal("a batch over the record bound decoded")
	}
	if _, _, err := ReadFrame(bytes.NewReader(AppendFrame(nil, 0, &PubBatch{Topic: "t"})), 1<<30); err == nil {
		t.Fatal("a batch of no records decoded")
	}
}
