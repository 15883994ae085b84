package server

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

// helloVersion opens a connection at protocol version v and returns the
// version HELLO_OK chose.
func (c *rawConn) helloVersion(token string, v uint16) uint16 {
	c.t.Helper()
	c.write(1, &wire.Hello{VersionMin: 1, VersionMax: v, Token: token})
	_, f := c.read()
	ok, isOK := f.(*wire.HelloOK)
	if !isOK {
		c.t.Fatalf("hello answered %#v", f)
	}
	return ok.Version
}

// TestPubBatchAnswersEveryRecordInOneFrame: the records of a PUB_BATCH
// are the PUBs they stand for — appended in order, a replay answered from
// the dedup table, a bad record refused alone — and one PUB_BATCH_OK
// answers each under its own correlation id.
func TestPubBatchAnswersEveryRecordInOneFrame(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	if v := c.helloVersion("", wire.VersionMax); v != wire.VersionMax {
		t.Fatalf("version %d chosen, want %d", v, wire.VersionMax)
	}
	c.write(2, &wire.Declare{Topic: wire.TopicConfig{Name: "t", Partitions: 2}})
	if _, f := c.read(); f.Type() != wire.TypeDeclareOK {
		t.Fatalf("declare: %#v", f)
	}
	c.write(0, &wire.PubBatch{Topic: "t", Partition: 1, ProducerID: 9, Records: []wire.PubRecord{
		{Corr: 10, ProducerSeq: 1, Value: []byte("a")},
		{Corr: 11, ProducerSeq: 2, Value: []byte("b"), Headers: []wire.Header{{Key: "", Value: []byte("x")}}}, // an empty header key
		{Corr: 12, ProducerSeq: 3, Value: []byte("c")},
		{Corr: 13, ProducerSeq: 1, Value: []byte("a")}, // a replay of seq 1
	}})
	_, f := c.read()
	ok, isOK := f.(*wire.PubBatchOK)
	if !isOK || len(ok.Results) != 4 {
		t.Fatalf("answer %#v", f)
	}
	want := []wire.PubResult{
		{Corr: 10, Partition: 1, Seq: 1, Epoch: ok.Results[0].Epoch},
		{Corr: 11, Code: wire.CodeInvalidArgument, Message: ok.Results[1].Message},
		{Corr: 12, Partition: 1, Seq: 2, Epoch: ok.Results[0].Epoch},
		{Corr: 13, Partition: 1, Seq: 1, Epoch: ok.Results[0].Epoch, Duplicate: true},
	}
	for i, w := range want {
		if ok.Results[i] != w {
			t.Errorf("result %d: %+v, want %+v", i, ok.Results[i], w)
		}
	}
	// What was appended is what a PULL reads: a, c at seqs 1 and 2.
	c.write(20, &wire.Pull{Topic: "t", Group: "g", Credit: 10})
	for _, v := range []string{"a", "c"} {
		corr, f := c.read()
		m, isMsg := f.(*wire.Msg)
		if !isMsg || corr != 20 || string(m.Value) != v || m.Partition != 1 {
			t.Fatalf("read %#v on corr %d, want %q", f, corr, v)
		}
	}
}

// TestPubBatchRefusedAsAWholeAnswersEachRecord: a token that may not
// publish to the topic gets UNAUTHORIZED for every record, under each
// record's id, and the connection stays open.
func TestPubBatchRefusedAsAWholeAnswersEachRecord(t *testing.T) {
	addr := startServer(t, Config{Tokens: []string{"reader sub:t"}})
	c := dialRaw(t, addr)
	c.helloVersion("reader", wire.VersionMax)
	c.write(0, &wire.PubBatch{Topic: "t", Partition: 0, Records: []wire.PubRecord{{Corr: 5, Value: []byte("a")}, {Corr: 6, Value: []byte("b")}}})
	_, f := c.read()
	ok, isOK := f.(*wire.PubBatchOK)
	if !isOK || len(ok.Results) != 2 || ok.Results[0].Corr != 5 || ok.Results[1].Corr != 6 ||
		ok.Results[0].Code != wire.CodeUnauthorized || ok.Results[1].Code != wire.CodeUnauthorized {
		t.Fatalf("answer %#v", f)
	}
	c.write(7, &wire.Ping{})
	if corr, f := c.read(); f.Type() != wire.TypePong || corr != 7 {
		t.Fatalf("after the refused batch: %#v on %d", f, corr)
	}
}

// TestPubBatchNeedsVersion2: a connection that agreed on version 1 may
// not send PUB_BATCH: BAD_FRAME, and the connection closes.
func TestPubBatchNeedsVersion2(t *testing.T) {
	addr := startServer(t, Config{AllowNoAuth: true})
	c := dialRaw(t, addr)
	if v := c.helloVersion("", 1); v != 1 {
		t.Fatalf("version %d chosen for a client of version 1", v)
	}
	c.write(3, &wire.PubBatch{Topic: "t", Partition: 0, Records: []wire.PubRecord{{Corr: 5, Value: []byte("a")}}})
	if _, f := c.read(); f.Type() != wire.TypeErr || f.(*wire.Err).Code != wire.CodeBadFrame {
		t.Fatalf("answer %#v", f)
	}
	c.expectClosed()
}

// A record the node answered twice counts once: the batch completes on its
// last record's first answer, and a repeat neither completes it again nor
// replaces the result.
func TestBatchResultsCountEachRecordOnce(t *testing.T) {
	b := newBatchResults(2)
	if b.add(0, 10, wire.PubOK{Seq: 5}, nil) {
		t.Fatal("complete after one of two records")
	}
	if b.add(0, 10, wire.PubOK{Seq: 6}, nil) {
		t.Fatal("a repeated answer completed the batch")
	}
	if !b.add(1, 11, wire.PubOK{}, wire.Errorf(wire.CodeNotLeader, "moved")) {
		t.Fatal("not complete once every record was answered")
	}
	if b.add(1, 11, wire.PubOK{Seq: 7}, nil) {
		t.Fatal("a repeated answer completed the batch twice")
	}
	if r := b.results[0]; r.Corr != 10 || r.Seq != 5 {
		t.Fatalf("record 0's result %+v, want its first answer (seq 5)", r)
	}
	if r := b.results[1]; r.Corr != 11 || r.Code != wire.CodeNotLeader {
		t.Fatalf("record 1's result %+v, want NOT_LEADER", r)
	}
}

// A PUB's reply passes on the node's first answer only: a second would
// release the frame's buffer twice and send a second reply.
func TestAnswerOncePassesOnTheFirstAnswer(t *testing.T) {
	var got []wire.PubOK
	reply := answerOnce(func(ok wire.PubOK, err *wire.Error) { got = append(got, ok) })
	reply(wire.PubOK{Seq: 1}, nil)
	reply(wire.PubOK{Seq: 2}, nil)
	reply(wire.PubOK{}, wire.Errorf(wire.CodeUnavailable, "late"))
	if len(got) != 1 || got[0].Seq != 1 {
		t.Fatalf("answers passed on: %+v, want only the first (seq 1)", got)
	}
}
