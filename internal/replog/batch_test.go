package replog

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
)

// batchValue is the value of the i-th record of the batch tests: one of
// them larger than a slab, so the batch takes a slab of its own for it.
func batchValue(i int) []byte {
	if i == 5 {
		return bytes.Repeat([]byte{'L'}, batchSlabBytes+1)
	}
	return []byte(fmt.Sprintf("value-%03d", i))
}

// TestProposeBatchCommitsEachInOrder: the proposals of one Batch reach the
// member in one hand-off, each is answered exactly once with its tag, their
// seqs follow the order of Add, and each committed entry holds its own
// record — across blocks of Proposals and slabs of encodings, and after
// someone appended to an earlier entry's data.
func TestProposeBatchCommitsEachInOrder(t *testing.T) {
	g := newManualGroup(t, 3, nil)
	l := g.elect()
	const n = batchPropsBlock + 6 // two blocks of Proposals
	seqs := make([]uint64, n)
	answers := make([]int, n)
	done := func(tag Tag, seq, _ uint64, err error) {
		if err != nil {
			t.Errorf("proposal %d: %v", tag[0], err)
		}
		answers[tag[0]]++
		seqs[tag[0]] = seq
	}
	var b Batch
	for i := range n {
		b.Add(&storage.Record{Value: batchValue(i)}, Tag{uint64(i), 7}, done)
	}
	// An entry's data is capped at its own record: an append copies it
	// instead of writing over the next record in the slab.
	_ = append(b.head.data, bytes.Repeat([]byte{0xff}, 64)...)
	l.ProposeBatch(&b)
	if b.head != nil || b.tail != nil {
		t.Fatal("ProposeBatch left the batch holding what it sent")
	}
	g.run(100)
	for i := range n {
		if answers[i] != 1 {
			t.Fatalf("proposal %d answered %d times", i, answers[i])
		}
		if i > 0 && seqs[i] != seqs[i-1]+1 {
			t.Fatalf("proposal %d at seq %d after %d: not in the order of Add", i, seqs[i], seqs[i-1])
		}
	}
	entries := applyCommitted(l, seqs[0], n)
	if len(entries) != n {
		t.Fatalf("%d committed entries from %d, want %d", len(entries), seqs[0], n)
	}
	for i, e := range entries {
		if !bytes.Equal(e.Record.Value, batchValue(i)) {
			t.Fatalf("entry %d (seq %d) holds %.20q, want %.20q", i, e.Seq, e.Record.Value, batchValue(i))
		}
	}
}

// TestProposeBatchFailsEachWhenClosed: a batch sent to a closed log fails
// every proposal in it once, not only the first.
func TestProposeBatchFailsEachWhenClosed(t *testing.T) {
	g := newManualGroup(t, 1, nil)
	l := g.logs[0]
	l.Campaign()
	g.run(50)
	if l.Status().Role != replica.Leader {
		t.Fatal("a group of one did not elect itself")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[uint64][]error{}
	var b Batch
	for i := range 3 {
		b.Add(&storage.Record{Value: batchValue(i)}, Tag{uint64(i)}, func(tag Tag, _, _ uint64, err error) {
			got[tag[0]] = append(got[tag[0]], err)
		})
	}
	l.ProposeBatch(&b)
	for i := range uint64(3) {
		if len(got[i]) != 1 || !errors.Is(got[i][0], ErrClosed) {
			t.Fatalf("proposal %d answered %v, want ErrClosed once", i, got[i])
		}
	}
}
