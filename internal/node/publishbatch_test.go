package node

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// batchAnswers collects the answers of one PublishBatchCorked, counting
// how often each index was answered.
type batchAnswers struct {
	mu    sync.Mutex
	oks   []wire.PubOK
	errs  []*wire.Error
	times []int
	left  int
	done  chan struct{}
}

func publishBatchOn(n *Node, pubs []wire.Pub) *batchAnswers {
	a := &batchAnswers{oks: make([]wire.PubOK, len(pubs)), errs: make([]*wire.Error, len(pubs)),
		times: make([]int, len(pubs)), left: len(pubs), done: make(chan struct{})}
	n.PublishBatchCorked(pubs, func(i int, ok wire.PubOK, err *wire.Error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.oks[i], a.errs[i] = ok, err
		if a.times[i]++; a.times[i] == 1 {
			if a.left--; a.left == 0 {
				close(a.done)
			}
		}
	}, nil)
	return a
}

// wait waits for every index's answer and fails t unless each came once.
func (a *batchAnswers) wait(t testing.TB) {
	t.Helper()
	select {
	case <-a.done:
	case <-time.After(waitMax):
		t.Fatalf("batch: %d of %d records unanswered", a.left, len(a.times))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, n := range a.times {
		if n != 1 {
			t.Fatalf("record %d answered %d times", i, n)
		}
	}
}

// A batch's records go to their partitions in one hand-off each: every
// record is answered once, a bad one with its own error and in its place,
// each partition takes its records in the batch's order, and a record
// naming another topic lands in that one.
func TestPublishBatchAnswersEachRecordInItsPartition(t *testing.T) {
	h := newHarness(t)
	h.declare("orders", 3)
	h.declare("audit", 1)
	var pubs []wire.Pub
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		pubs = append(pubs, wire.Pub{Topic: "orders", Partition: wire.PartitionAuto, Key: []byte(key), Value: []byte("v" + key)})
	}
	pubs[5].Topic = wire.DeadLetterPrefix + "orders"                                    // clients may not write there
	pubs[10].Partition = 7                                                              // no such partition
	pubs[20].Headers = []wire.Header{{Key: "nereus-control", Value: []byte("install")}} // reserved for the log
	pubs[25].Topic, pubs[25].Partition = "audit", 0
	a := publishBatchOn(h.node, pubs)
	a.wait(t)
	for _, i := range []int{5, 10, 20} {
		if a.errs[i] == nil {
			t.Fatalf("record %d accepted: %+v", i, a.oks[i])
		}
	}
	if a.errs[5].Code != wire.CodeInvalidArgument || a.errs[10].Code != wire.CodeNotFound {
		t.Fatalf("records 5 and 10: %v and %v, want INVALID_ARGUMENT and NOT_FOUND", a.errs[5], a.errs[10])
	}
	if es, err := h.node.Read("audit", 0, a.oks[25].Seq, 1); err != nil || len(es) != 1 || string(es[0].Record.Value) != "vk25" {
		t.Fatalf("record 25 (topic audit) at seq %d reads %v, %v", a.oks[25].Seq, es, err)
	}
	last := map[uint32]uint64{}
	for i := range pubs {
		if i == 5 || i == 10 || i == 20 || i == 25 {
			continue
		}
		ok, err := a.oks[i], a.errs[i]
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if want := wire.PartitionForKey(pubs[i].Key, 3); ok.Partition != want {
			t.Fatalf("record %d in partition %d, want %d", i, ok.Partition, want)
		}
		if ok.Seq <= last[ok.Partition] {
			t.Fatalf("record %d at %d/%d, after seq %d there: not in the batch's order", i, ok.Partition, ok.Seq, last[ok.Partition])
		}
		last[ok.Partition] = ok.Seq
		es, rerr := h.node.Read("orders", ok.Partition, ok.Seq, 1)
		if rerr != nil || len(es) != 1 || string(es[0].Record.Value) != string(pubs[i].Value) {
			t.Fatalf("record %d at %d/%d reads %v, %v", i, ok.Partition, ok.Seq, es, rerr)
		}
	}
}

// On a replicated partition the batch's records are proposed in one
// hand-off, commit at consecutive seqs in the batch's order and reach a
// follower so.
func TestPublishBatchReplicatedCommitsInOrder(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "orders", Partitions: 1, Replicas: 3})
	leader, first := tc.publishAnywhere(&wire.Pub{Topic: "orders", Partition: 0, Value: []byte("first")})
	var pubs []wire.Pub
	for i := range 50 {
		pubs = append(pubs, wire.Pub{Topic: "orders", Partition: 0, ProducerID: 9, ProducerSeq: uint64(i + 1), Value: []byte(fmt.Sprintf("v%02d", i))})
	}
	a := publishBatchOn(tc.nodes[leader], pubs)
	a.wait(t)
	want := []string{fmt.Sprintf("%d:first", first.Seq)}
	for i := range pubs {
		if a.errs[i] != nil {
			t.Fatalf("record %d: %v", i, a.errs[i])
		}
		if a.oks[i].Seq != first.Seq+uint64(i)+1 {
			t.Fatalf("record %d at seq %d, want %d", i, a.oks[i].Seq, first.Seq+uint64(i)+1)
		}
		want = append(want, fmt.Sprintf("%d:%s", a.oks[i].Seq, pubs[i].Value))
	}
	follower := "n1"
	if leader == follower {
		follower = "n2"
	}
	got := tc.readAll(follower, "orders", 0, a.oks[len(pubs)-1].Seq)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s holds %v, want %v", follower, got, want)
	}
}

// A node that hosts no replica of the partition answers each record of a
// batch NOT_LEADER, not only the first of the chain.
func TestPublishBatchToAPartitionNotHostedAnswersEach(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "solo", Partitions: 1, Replicas: 1})
	var outside *Node
	for _, n := range tc.nodes {
		if _, ok := n.topics["solo"].partitions[0].store.(unhostedStore); ok {
			outside = n
		}
	}
	if outside == nil {
		t.Fatal("every node hosts the R1 partition")
	}
	pubs := []wire.Pub{{Topic: "solo", Partition: 0, Value: []byte("a")}, {Topic: "solo", Partition: 0, Value: []byte("b")},
		{Topic: "solo", Partition: 0, Value: []byte("c")}}
	a := publishBatchOn(outside, pubs)
	a.wait(t)
	for i, err := range a.errs {
		if err == nil || err.Code != wire.CodeNotLeader {
			t.Fatalf("record %d: %v, want NOT_LEADER", i, err)
		}
	}
}
