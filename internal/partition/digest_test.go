package partition

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
)

func memberDigest(m *Member[uint64]) []byte {
	return m.AppendDigest(nil, binary.BigEndian.AppendUint64)
}

// A clone encodes like its original and changes independently of it,
// one-reply slices included.
func TestMemberCloneIsIndependent(t *testing.T) {
	cfg := Config{DedupWindowMax: 2, ProducersMax: 2}
	m := NewMember[uint64](cfg, 1, Mutations{})
	v := View{Leader: true, Epoch: 1, InstallSeq: 1}
	for _, e := range []Entry{{Seq: 1, Epoch: 1}, {Seq: 2, Epoch: 1, ProducerID: 1, ProducerSeq: 1},
		{Seq: 3, Epoch: 1, ProducerID: 1, ProducerSeq: 2}, {Seq: 4, Epoch: 1, ProducerID: 1, ProducerSeq: 3}} {
		if err := m.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	if d := m.Publish(v, 2, 1, 10); d.Action != Propose {
		t.Fatalf("publish: %v", d.Action)
	}
	m.Degraded()
	if d := m.Publish(v, 3, 1, 11); d.Action != Propose {
		t.Fatalf("publish: %v", d.Action)
	}
	before := memberDigest(m)
	c := m.Clone()
	if !bytes.Equal(memberDigest(c), before) {
		t.Fatal("a clone encodes differently from its original")
	}
	// Both cut their next one-reply slice; the clone also applies,
	// retries, completes and seals.
	if d := c.Publish(v, 4, 1, 20); d.Action != Propose {
		t.Fatalf("clone publish: %v", d.Action)
	}
	if d := m.Publish(v, 4, 1, 30); d.Action != Propose {
		t.Fatalf("publish: %v", d.Action)
	}
	c.Publish(v, 3, 1, 21)
	if err := c.Apply(Entry{Seq: 5, Epoch: 1, ProducerID: 2, ProducerSeq: 1}); err != nil {
		t.Fatal(err)
	}
	c.Completed(ProposalKey{2, 1}, 5, 1, nil)
	c.LogStart(9)
	c.Admit(View{Leader: true, Epoch: 2, InstallSeq: 8})
	if got := m.Close(); !slices.Equal(got, []uint64{11, 30}) {
		t.Fatalf("the original's replies: %v, want [11 30] (a clone's change leaked)", got)
	}
	m2 := c.Clone()
	if !bytes.Equal(memberDigest(m2), memberDigest(c)) || bytes.Equal(memberDigest(c), before) {
		t.Fatal("digests do not follow the state")
	}
	if got := c.Close(); !slices.Equal(got, []uint64{11, 21, 20}) {
		t.Fatalf("the clone's replies: %v, want [11 21 20]", got)
	}
}

// The table's encoding is its content, not its layout: a window whose
// ring wrapped encodes like one built with the same entries, and the
// encoding tells apart what Check would.
func TestProducersDigestIsCanonical(t *testing.T) {
	a := NewProducers(2, 4)
	a.Record(1, 1, 1, 1)
	a.Record(1, 2, 2, 1)
	a.Record(1, 3, 3, 1) // evicts 1: floor 2, ring wrapped
	a.Record(1, 4, 4, 1) // evicts 2: floor 3
	b := NewProducers(2, 4)
	b.Record(1, 3, 3, 1)
	b.Record(1, 4, 4, 1)
	b.byID[1].floor = 3
	if !bytes.Equal(a.AppendDigest(nil), b.AppendDigest(nil)) {
		t.Fatal("equal tables encode differently")
	}
	if !bytes.Equal(a.Clone().AppendDigest(nil), a.AppendDigest(nil)) {
		t.Fatal("a clone encodes differently")
	}
	b.SealHistory() // floor stays 3: the same
	b.Record(2, 1, 5, 1)
	if bytes.Equal(a.AppendDigest(nil), b.AppendDigest(nil)) {
		t.Fatal("different tables encode alike")
	}
	c := a.Clone()
	c.Record(1, 5, 6, 2)
	if v, _, _ := a.Check(1, 5); v != VerdictNew {
		t.Fatalf("the original learnt its clone's record: %v", v)
	}
}
