package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// dialSeeds connects to the given nodes of fs only.
func dialSeeds(t *testing.T, fs *fakeServer, seeds ...int) *Client {
	t.Helper()
	var servers []string
	for _, i := range seeds {
		servers = append(servers, fs.nodeAddr(i))
	}
	c, err := Dial(testCtx(t), Options{Servers: servers, Token: testToken, ClientName: t.Name(), RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sessionsByNode counts open connections per node.
func (fs *fakeServer) sessionsByNode() []int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := make([]int, len(fs.nodes))
	for s := range fs.sessions {
		n[s.node.idx]++
	}
	return n
}

// subNodeLocked returns the node holding a subscription of key, -1 if none.
func (fs *fakeServer) subNodeLocked(key subKey) int {
	for s := range fs.sessions {
		if s.subs[key] != nil {
			return s.node.idx
		}
	}
	return -1
}

// framesOf returns the PUB frames received for one producer sequence.
func (fs *fakeServer) framesOf(producerID, seq uint64) []fakePubFrame {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []fakePubFrame
	for _, f := range fs.pubFrames {
		if f.producerID == producerID && f.producerSeq == seq {
			out = append(out, f)
		}
	}
	return out
}

// With the metadata known, every publish goes straight to its partition's
// leader over a pooled connection (no NOT_LEADER at all), and the result
// names the record the leader stored.
func TestClusterPublishRoutesToLeaders(t *testing.T) {
	fs := newFakeCluster(t, testToken, 3)
	c := dialSeeds(t, fs, 1)
	ctx := testCtx(t)
	if _, err := c.DeclareTopic(ctx, TopicConfig{Name: "t", Partitions: 3, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	infos, err := c.Topics(ctx, "t")
	if err != nil || len(infos) != 1 || len(infos[0].Partitions) != 3 {
		t.Fatalf("Topics = %+v, %v", infos, err)
	}
	for _, pi := range infos[0].Partitions {
		leader := pi.Partition % 3
		if pi.Leader != fmt.Sprintf("n%d", leader) || pi.LeaderAddr != fs.nodeAddr(leader) || pi.ReadOnly || len(pi.Replicas) != 3 {
			t.Fatalf("partition info = %+v, want leader n%d at %s and 3 replicas", pi, leader, fs.nodeAddr(leader))
		}
	}

	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	check := func(res PublishResult, value string) {
		t.Helper()
		fs.mu.Lock()
		defer fs.mu.Unlock()
		recs := fs.topics["t"].parts[res.Partition]
		if res.Seq == 0 || res.Seq > uint64(len(recs)) || string(recs[res.Seq-1].Value) != value {
			t.Fatalf("result %+v does not name the stored record %q", res, value)
		}
	}
	for i := range 30 {
		key, value := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		res, err := p.Publish(ctx, Message{Key: []byte(key), Value: []byte(value)})
		if err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
		if want := int(wire.PartitionForKey([]byte(key), 3)); res.Partition != want {
			t.Fatalf("key %s landed on partition %d, want %d", key, res.Partition, want)
		}
		check(res, value)
	}
	for i := range 6 { // unkeyed idempotent: by producer identity
		value := fmt.Sprintf("u%d", i)
		res, err := p.Publish(ctx, Message{Value: []byte(value)})
		if err != nil {
			t.Fatal(err)
		}
		if want := int(wire.PartitionForProducer(p.ID(), res.ProducerSeq, 3)); res.Partition != want {
			t.Fatalf("seq %d landed on partition %d, want %d", res.ProducerSeq, res.Partition, want)
		}
		check(res, value)
	}
	res, err := p.Publish(ctx, Message{Value: []byte("pinned"), TargetPartition: PartitionOf(2)})
	if err != nil || res.Partition != 2 {
		t.Fatalf("pinned publish = %+v, %v", res, err)
	}
	check(res, "pinned")

	np, err := c.NewProducer(ProducerOptions{Topic: "t", DisableIdempotence: true})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	spread := map[int]bool{}
	for i := range 6 { // round-robin: the SDK picks, so it knows the leader
		res, err := np.Publish(ctx, Message{Value: fmt.Appendf(nil, "rr%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		check(res, fmt.Sprintf("rr%d", i))
		spread[res.Partition] = true
	}
	if len(spread) != 3 {
		t.Fatalf("round-robin used partitions %v, want all 3", spread)
	}

	fs.mu.Lock()
	for _, f := range fs.pubFrames {
		if f.code != wire.CodeOK || f.auto {
			fs.mu.Unlock()
			t.Fatalf("PUB %+v: want every PUB sent to its leader with an explicit partition", f)
		}
	}
	fs.mu.Unlock()
	// One pooled connection per node, whatever the number of producers.
	if got := fs.sessionsByNode(); got[0] != 1 || got[1] != 1 || got[2] != 1 {
		t.Fatalf("connections by node = %v, want one to each", got)
	}
	c.Close()
	fs.waitFor(5*time.Second, "every connection closed", func() bool { return len(fs.sessions) == 0 })
}

// The leader of every partition moves twice mid-stream: once stepping down
// after appending (the PUB_OK is lost, NOT_LEADER instead), once crashing
// after appending. In-flight publishes are retried at the new leaders with
// the same producer id and sequence, on the same partition; none is lost or
// stored twice.
func TestClusterLeaderMoveRetriesAtNewLeader(t *testing.T) {
	fs := newFakeCluster(t, testToken, 3)
	fs.onPub = func(n int) fakeAction {
		switch n {
		case 150:
			return fakeAppendThenStepDown
		case 400:
			return fakeAppendThenCrash
		}
		return fakeNormal
	}
	c := dialSeeds(t, fs, 0, 1, 2)
	ctx := testCtx(t)
	declare(t, c, "t", 3)
	p, err := c.NewProducer(ProducerOptions{Topic: "t", MaxInFlight: 64, RetryBackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 600
	var mu sync.Mutex
	results := map[uint64][]PublishResult{}
	var failures []error
	for i := range n {
		err := p.PublishAsync(ctx, Message{Value: fmt.Appendf(nil, "m%d", i+1)}, func(r PublishResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err)
				return
			}
			results[r.ProducerSeq] = append(results[r.ProducerSeq], r)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(failures) > 0 {
		t.Fatalf("failures: %v", failures)
	}
	duplicates := 0
	for seq := uint64(1); seq <= n; seq++ {
		rs := results[seq]
		if len(rs) != 1 {
			t.Fatalf("producer seq %d completed %d times", seq, len(rs))
		}
		if want := int(wire.PartitionForProducer(p.ID(), seq, 3)); rs[0].Partition != want {
			t.Fatalf("seq %d acked on partition %d, want %d", seq, rs[0].Partition, want)
		}
		if rs[0].Duplicate {
			duplicates++
		}
		frames := fs.framesOf(p.ID(), seq)
		for _, f := range frames {
			if f.partition != uint32(rs[0].Partition) {
				t.Fatalf("seq %d was sent to partitions %d and %d: a retry changed partition", seq, f.partition, rs[0].Partition)
			}
		}
	}
	if duplicates == 0 {
		t.Fatal("no retry was answered from the dedup table: the appended-then-moved PUBs were not retried")
	}
	fs.mu.Lock()
	notLeader := 0
	for _, f := range fs.pubFrames {
		if f.code == wire.CodeNotLeader {
			notLeader++
		}
	}
	moved := fs.leaderLocked("t", 0) == 2
	fs.mu.Unlock()
	if notLeader == 0 || !moved {
		t.Fatalf("%d NOT_LEADER answers, leader of partition 0 moved twice: %v; the faults did not fire", notLeader, moved)
	}
	recs := fs.records("t")
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[string(r.Value)] {
			t.Fatalf("value %s stored twice", r.Value)
		}
		seen[string(r.Value)] = true
	}
	if len(recs) != n {
		t.Fatalf("broker stored %d records, want %d", len(recs), n)
	}
}

// While a partition's leader is unknown (election running), a publish goes
// to a seed; its NOT_LEADER leads to metadata refreshes until the new
// leader shows up, which then gets the publish. NOT_LEADER means nothing
// was appended, so a non-idempotent publish is retried too.
func TestClusterUnknownLeaderGoesToSeedThenFollows(t *testing.T) {
	fs := newFakeCluster(t, testToken, 3)
	c := dialSeeds(t, fs, 0)
	ctx := testCtx(t)
	declare(t, c, "t", 2)
	fs.setLeader("t", 1, -1)
	infos, err := c.Topics(ctx, "t")
	if err != nil || infos[0].Partitions[1].Leader != "" || infos[0].Partitions[1].LeaderAddr != "" {
		t.Fatalf("Topics during an election = %+v, %v", infos, err)
	}
	p, err := c.NewProducer(ProducerOptions{Topic: "t", RetryBackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	np, err := c.NewProducer(ProducerOptions{Topic: "t", RetryBackoffMax: 50 * time.Millisecond, DisableIdempotence: true})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	type result struct {
		res PublishResult
		err error
	}
	done := make(chan result, 2)
	for _, pr := range []*Producer{p, np} {
		go func() {
			res, err := pr.Publish(ctx, Message{Value: []byte("x"), TargetPartition: PartitionOf(1)})
			done <- result{res, err}
		}()
	}
	fs.waitFor(10*time.Second, "NOT_LEADER from the seed to both producers", func() bool {
		refused := map[uint64]bool{}
		for _, f := range fs.pubFrames {
			if f.node == 0 && f.code == wire.CodeNotLeader {
				refused[f.producerID] = true
			}
		}
		return refused[p.ID()] && refused[0]
	})
	fs.setLeader("t", 1, 2)
	for range 2 {
		if r := <-done; r.err != nil || r.res.Partition != 1 {
			t.Fatalf("Publish = %+v, %v", r.res, r.err)
		}
	}
	for _, pub := range [][2]uint64{{p.ID(), 1}, {0, 0}} { // (producer id, seq)
		frames := fs.framesOf(pub[0], pub[1])
		if last := frames[len(frames)-1]; last.node != 2 || last.code != wire.CodeOK {
			t.Fatalf("last PUB %+v, want accepted by n2", last)
		}
	}
}

// QUORUM_LOST is retried with backoff; once the leader regains its quorum
// the publish succeeds. When it persists, the publish fails at its
// deadline with an error that carries QUORUM_LOST.
func TestClusterQuorumLostRetriedThenSurfaced(t *testing.T) {
	fs := newFakeCluster(t, testToken, 3)
	c := dialSeeds(t, fs, 0)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	fs.mu.Lock()
	fs.readOnly[fakePart{"t", 0}] = true
	fs.mu.Unlock()
	infos, err := c.Topics(ctx, "t")
	if err != nil || !infos[0].Partitions[0].ReadOnly {
		t.Fatalf("Topics of a read-only partition = %+v, %v", infos, err)
	}
	p, err := c.NewProducer(ProducerOptions{Topic: "t", RetryBackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	quorumLost := func(seq uint64) int { // call with fs.mu held
		n := 0
		for _, f := range fs.pubFrames {
			if f.producerID == p.ID() && f.producerSeq == seq && f.code == wire.CodeQuorumLost {
				n++
			}
		}
		return n
	}

	done := make(chan error, 1)
	go func() {
		_, err := p.Publish(ctx, Message{Value: []byte("first")})
		done <- err
	}()
	fs.waitFor(10*time.Second, "3 QUORUM_LOST answers", func() bool { return quorumLost(1) >= 3 })
	fs.mu.Lock()
	fs.readOnly[fakePart{"t", 0}] = false
	fs.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatalf("publish after the quorum came back: %v", err)
	}

	fs.mu.Lock()
	fs.readOnly[fakePart{"t", 0}] = true
	fs.mu.Unlock()
	// A Publish whose ctx ends reports the last refusal along with ctx's error.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, err := p.Publish(cctx, Message{Value: []byte("second")})
		done <- err
	}()
	fs.waitFor(10*time.Second, "seq 2 refused 3 times", func() bool { return quorumLost(2) >= 3 })
	cancel()
	if err := <-done; !errors.Is(err, ErrQuorumLost) || !errors.Is(err, context.Canceled) || !IsRetryable(err) {
		t.Fatalf("Publish given up: err = %v, want Canceled carrying QUORUM_LOST", err)
	}
	// A publish past its DeliveryTimeout fails with QUORUM_LOST.
	ap, err := c.NewProducer(ProducerOptions{Topic: "t", RetryBackoffMax: 20 * time.Millisecond, DeliveryTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	asyncErr := make(chan error, 1)
	if err := ap.PublishAsync(ctx, Message{Value: []byte("third")}, func(_ PublishResult, err error) { asyncErr <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-asyncErr; !errors.Is(err, ErrQuorumLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PublishAsync past DeliveryTimeout: err = %v, want DeadlineExceeded carrying QUORUM_LOST", err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if recs := fs.topics["t"].parts[0]; len(recs) != 1 {
		t.Fatalf("%d records stored, want only the first", len(recs))
	}
}

// The consumer follows its group's coordinator (partition 0's leader):
// first when the old one ends the subscription with NOT_LEADER, then when
// the coordinator's node crashes. Every message is acked in the end.
func TestClusterConsumerFollowsCoordinator(t *testing.T) {
	fs := newFakeCluster(t, testToken, 3)
	c := dialSeeds(t, fs, 1)
	ctx := testCtx(t)
	declare(t, c, "t", 2)
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 60
	publishRange(ctx, t, p, 0, n)
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	key := subKey{"t", "g"}
	acked := map[string]bool{}
	consume := func(until int) {
		for len(acked) < until {
			m, err := co.Next(ctx)
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if err := m.AckSync(ctx); err != nil {
				if errors.Is(err, ErrStaleDelivery) || errors.Is(err, ErrNotLeader) || errors.Is(err, ErrDisconnected) {
					continue // delivered by a former coordinator: it comes again
				}
				t.Fatalf("AckSync: %v", err)
			}
			acked[string(m.Value)] = true
		}
	}
	consume(20)
	fs.mu.Lock()
	first := fs.subNodeLocked(key)
	fs.mu.Unlock()
	if first != 0 {
		t.Fatalf("subscribed on node %d, want the coordinator n0", first)
	}

	fs.setLeader("t", 0, 2)
	consume(40)
	fs.waitFor(5*time.Second, "subscription at n2", func() bool { return fs.subNodeLocked(key) == 2 })

	fs.mu.Lock()
	fs.setLeaderLocked("t", 0, 1)
	fs.dropNodeLocked(2)
	fs.mu.Unlock()
	consume(n)
	fs.waitFor(5*time.Second, "subscription at n1", func() bool { return fs.subNodeLocked(key) == 1 })
	fs.waitFor(5*time.Second, "every message acked", func() bool { return len(fs.groups[key].acked) == n })
	if st := co.Stats(); st.Resubscribe < 2 {
		t.Fatalf("stats = %+v, want at least 2 resubscriptions", st)
	}
	fs.checkViolations()
}

// A coordinator that moves without ending the subscription refuses the
// next ACK with NOT_LEADER (one ACK, not retried at the old node): the
// ack may have been durable, so it is asked again at the partition's
// leader, the new coordinator, which answers STALE_DELIVERY — it delivers
// the message again — and AckSync reports that; the consumer moves and
// the message is redelivered by the new coordinator.
func TestClusterAckAtOldCoordinatorIsAskedAgainAndRedelivered(t *testing.T) {
	fs, ctx, co, first := consumeFromSilentCoordinator(t, 1, 0)
	fs.setLeader("t", 0, 1)
	if err := first.AckSync(ctx); !errors.Is(err, ErrStaleDelivery) {
		t.Fatalf("ack at the former coordinator, asked again at the new one: err = %v, want STALE_DELIVERY", err)
	}
	second, err := co.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second.Seq != first.Seq || second.DeliveryID == first.DeliveryID || second.DeliveryCount != 2 {
		t.Fatalf("redelivery = %+v after %+v", second, first)
	}
	if err := second.AckSync(ctx); err != nil {
		t.Fatalf("ack at the new coordinator: %v", err)
	}
	fs.mu.Lock()
	acks := append([]int(nil), fs.acksAt...)
	fs.mu.Unlock()
	if acks[0] != 1 || acks[1] != 2 {
		t.Fatalf("ACK frames by node = %v, want one at n0 (refused) and two at n1 (the first asked again, the second)", acks)
	}
	if st := co.Stats(); st.Acked != 1 || st.StaleAcks != 1 || st.FailedAcks != 0 {
		t.Fatalf("stats = %+v, want 1 acked and 1 stale", st)
	}
}

// consumeFromSilentCoordinator makes a fake cluster of 3 whose
// coordinator (partition 0's leader, n0) delivers topic "t" of partitions
// partitions and keeps its subscriptions when it moves (silentMoves),
// publishes one message to partition part, and takes it from a consumer
// of group "g".
func consumeFromSilentCoordinator(t *testing.T, partitions, part int) (*fakeServer, context.Context, *Consumer, *Message) {
	t.Helper()
	fs := newFakeCluster(t, testToken, 3)
	fs.silentMoves = true
	c := dialSeeds(t, fs, 0)
	ctx := testCtx(t)
	declare(t, c, "t", partitions)
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	co, m := publishAndTakeOne(ctx, t, c, p, part, 1, 4)
	return fs, ctx, co, m
}

// publishAndTakeOne publishes n messages to partition part of topic "t"
// and takes the first from a new consumer of group "g" with credit.
func publishAndTakeOne(ctx context.Context, t *testing.T, c *Client, p *Producer, part, n, credit int) (*Consumer, *Message) {
	t.Helper()
	publishTo(ctx, t, p, part, n, "x")
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: credit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { co.Close() })
	m, err := co.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return co, m
}

// On a broker whose one coordinator delivers the whole topic, an ack the
// former coordinator refused goes to the partition's leader, which
// refuses it too (it is not the coordinator): the metadata still names
// it, so the ack fails at once, naming it, instead of waiting out every
// round for a leader that would take it.
func TestAckRefusedByItsNamedLeaderFailsAtOnce(t *testing.T) {
	fs, ctx, _, m := consumeFromSilentCoordinator(t, 2, 1) // partition 1, led by n1
	fs.setLeader("t", 0, 2)                                // the coordinator moves to n2
	err := m.AckSync(ctx)
	if !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), "(n1, named the leader of partition 1, refuses seq 1)") {
		t.Fatalf("ack refused by its partition's named leader: err = %v, want NOT_LEADER naming n1", err)
	}
	fs.wantAckFrames("one at n0 (the former coordinator) and one at n1 (partition 1's leader)", 1, 1, 0)
}

// A single node advertises an address the client cannot use (say, behind
// NAT): after a disconnection the client redials its seeds, as before
// clustering, and opens no connection to the advertised address.
func TestSingleNodeReconnectsThroughSeeds(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.advertised = map[int]string{0: "unreachable.invalid:4850"}
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 2)
	if _, err := c.Topics(ctx, "t"); err != nil { // routes known: both on n0
		t.Fatal(err)
	}
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 10 {
		if i == 5 {
			seed := c.liveConn()
			fs.dropAll()
			<-seed.done // the next publish finds no live connection
		}
		if _, err := p.Publish(ctx, Message{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}); err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
	}
	c.mu.Lock()
	pooled := len(c.pool)
	c.mu.Unlock()
	if pooled != 0 {
		t.Fatalf("%d pooled connections; the single node must be reached through the seeds", pooled)
	}
}

func TestDeclareTopicValidatesReplicasAndAck(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	for _, cfg := range []TopicConfig{
		{Name: "t", Partitions: 1, Replicas: 2},
		{Name: "t", Partitions: 1, Replicas: 4},
		{Name: "t", Partitions: 1, Replicas: -1},
		{Name: "t", Partitions: 1, Replicas: 7},
		{Name: "t", Partitions: 1, Ack: "sync"},
		{Name: "t", Partitions: 1, Ack: "majority"},
	} {
		if _, err := c.DeclareTopic(ctx, cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("DeclareTopic(%+v): err = %v, want INVALID_ARGUMENT", cfg, err)
		}
	}
	fs.mu.Lock()
	declares := fs.declares
	fs.mu.Unlock()
	if declares != 0 {
		t.Fatalf("%d invalid DECLAREs reached the broker", declares)
	}

	if _, err := c.DeclareTopic(ctx, TopicConfig{Name: "r3", Partitions: 2, Replicas: 3, Ack: "all"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeclareTopic(ctx, TopicConfig{Name: "d", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	fs.mu.Lock()
	got := fs.topics["r3"].cfg
	fs.mu.Unlock()
	if got.Replicas != 3 || got.Ack != wire.AckAll {
		t.Fatalf("broker got %+v, want replicas 3, ack all", got)
	}
	infos, err := c.Topics(ctx, "r3", "d")
	if err != nil || len(infos) != 2 {
		t.Fatalf("Topics = %+v, %v", infos, err)
	}
	if cfg := infos[0].Config; cfg.Replicas != 3 || cfg.Ack != "all" {
		t.Fatalf("r3 config = %+v", cfg)
	}
	if cfg := infos[1].Config; cfg.Replicas != 0 || cfg.Ack != "quorum" {
		t.Fatalf("d config = %+v, want the defaults (0, quorum)", cfg)
	}
	// A single node leads every partition itself and lists no replicas.
	for _, pi := range infos[0].Partitions {
		if pi.Leader != "n0" || pi.LeaderAddr != fs.addr() || pi.ReadOnly || len(pi.Replicas) != 0 {
			t.Fatalf("single-node partition info = %+v", pi)
		}
	}
}

// A message still being retried holds back sequences more than SeqSpanMax
// ahead of it: the broker's dedup window must still cover its retry, or it
// could only be answered PRODUCER_SEQ_TOO_OLD.
func TestProducerSeqSpanStaysInsideTheDedupWindow(t *testing.T) {
	fs := newFakeCluster(t, testToken, 1)
	c := dialSeeds(t, fs, 0)
	ctx := testCtx(t)
	declare(t, c, "t", 2)
	fs.mu.Lock()
	fs.readOnly[fakePart{"t", 0}] = true
	fs.mu.Unlock()
	p, err := c.NewProducer(ProducerOptions{Topic: "t", RetryBackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	stuck := make(chan error, 1)
	if err := p.PublishAsync(ctx, Message{Value: []byte("stuck"), TargetPartition: PartitionOf(0)},
		func(_ PublishResult, err error) { stuck <- err }); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < SeqSpanMax; i++ {
		if _, err := p.Publish(ctx, Message{Value: []byte("ok"), TargetPartition: PartitionOf(1)}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = p.Publish(short, Message{Value: []byte("too far"), TargetPartition: PartitionOf(1)})
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ahead of one still being retried") {
		t.Fatalf("a publish %d sequences ahead of a retrying one: %v", SeqSpanMax, err)
	}
	// A publisher waiting on the span must not stop the retry that would
	// release it.
	retriesOfFirst := func() int { // call with fs.mu held
		n := 0
		for _, f := range fs.pubFrames {
			if f.producerSeq == 1 {
				n++
			}
		}
		return n
	}
	fs.mu.Lock()
	before := retriesOfFirst()
	fs.mu.Unlock()
	waiter := make(chan error, 1)
	go func() {
		res, err := p.Publish(ctx, Message{Value: []byte("now"), TargetPartition: PartitionOf(1)})
		if err == nil && res.Seq != SeqSpanMax {
			err = fmt.Errorf("landed at seq %d, want %d", res.Seq, SeqSpanMax)
		}
		waiter <- err
	}()
	fs.waitFor(10*time.Second, "the stuck message retried while a publisher waits", func() bool { return retriesOfFirst() >= before+3 })
	fs.mu.Lock()
	fs.readOnly[fakePart{"t", 0}] = false
	fs.mu.Unlock()
	if err := <-stuck; err != nil {
		t.Fatalf("the retried message: %v", err)
	}
	if err := <-waiter; err != nil {
		t.Fatalf("the publish that waited for the span: %v", err)
	}
}

// dialShortTimeouts connects to all three nodes of fs, n0 first, with a
// short request timeout (a silent node is noticed after 500 ms) and the
// given dial timeout.
func dialShortTimeouts(t *testing.T, fs *fakeServer, dialTimeout time.Duration) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), Options{Servers: []string{fs.nodeAddr(0), fs.nodeAddr(1), fs.nodeAddr(2)}, Token: testToken,
		ClientName: t.Name(), RequestTimeout: 500 * time.Millisecond, DialTimeout: dialTimeout})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A partition leader stops answering but keeps its connections open (a
// SIGSTOPped broker) while the cluster moves its leadership to another
// node. The producer's attempts there time out; the silent connection is
// given up, the metadata refreshed, and publishing resumes at the new
// leader about one request timeout later — not after the one-minute
// DeliveryTimeout, with the window full of retries sent back to the silent
// node, nor after a redial of the silent node, whose kernel would take the
// connection and leave HELLO unanswered for the whole (here long) dial
// timeout. The silent leader is the seed (n0, whose connection also
// carries the metadata requests), or a leader reached over a pooled
// connection (n1; the seed keeps answering).
func TestClusterProducerLeavesASilentLeader(t *testing.T) {
	for _, silent := range []int{0, 1} {
		t.Run(fmt.Sprintf("n%d", silent), func(t *testing.T) {
			fs := newFakeCluster(t, testToken, 3)
			c := dialShortTimeouts(t, fs, 5*time.Second)
			ctx := testCtx(t)
			declare(t, c, "t", 1)
			fs.setLeader("t", 0, silent)
			p, err := c.NewProducer(ProducerOptions{Topic: "t", MaxInFlight: 16, DeliveryTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for i := range 5 {
				if _, err := p.Publish(ctx, Message{Value: fmt.Appendf(nil, "before-%d", i)}); err != nil {
					t.Fatal(err)
				}
			}
			// No refresh may be under way: one would learn the move below
			// by itself, and the publishes would never meet the silent node.
			// And the retry loop sleeps, as it does whenever nothing is
			// pending.
			waitRefreshIdle(t, c, "t")
			waitRetryLoopAsleep(t, p)
			fs.freeze(silent, true)
			fs.setLeader("t", 0, 2)
			// From the freeze to the last PUB_OK: about one request timeout
			// (500 ms) and a refresh on a quiet machine; the bound only has to
			// be far below the one-minute DeliveryTimeout it tells apart (3 s
			// was once missed on a machine running two simulator soaks beside
			// the race-enabled suite).
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var mu sync.Mutex
			var failures []error
			for i := range 50 {
				err := p.PublishAsync(fctx, Message{Value: fmt.Appendf(nil, "after-%d", i)}, func(_ PublishResult, err error) {
					if err != nil {
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
					}
				})
				if err != nil {
					t.Fatalf("publishing did not resume at the new leader within 10 s: %v", err)
				}
			}
			if err := p.Flush(fctx); err != nil {
				t.Fatalf("publishing did not resume at the new leader within 10 s: %v", err)
			}
			if len(failures) > 0 {
				t.Fatalf("%d publishes failed, first: %v", len(failures), failures[0])
			}
			if got := len(fs.records("t")); got != 55 {
				t.Fatalf("broker holds %d records, want 55", got)
			}
		})
	}
}

// waitRefreshIdle waits until no metadata refresh of topic is queued or
// running.
func waitRefreshIdle(t *testing.T, c *Client, topic string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		c.mu.Lock()
		idle := c.meta[topic] == nil || c.meta[topic].refreshing == nil
		c.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a metadata refresh never ended")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitRetryLoopAsleep waits until p's retry loop has nothing to look at
// before a kick: every message completed, no timer armed.
func waitRetryLoopAsleep(t *testing.T, p *Producer) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		p.mu.Lock()
		asleep := p.loopWakeAt.IsZero() && len(p.inflight) == 0 && len(p.retry) == 0
		p.mu.Unlock()
		if asleep {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the retry loop never went idle")
		}
		time.Sleep(time.Millisecond)
	}
}

// A publish sent while the retry loop sleeps (nothing was pending) to a
// broker that never answers still ends: its attempt times out and, the
// broker staying silent, its DeliveryTimeout fails it. Without a watchdog
// it would hold its window slot for good.
func TestProducerSilentBrokerFailsPublishAtDeliveryTimeout(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c, err := Dial(testCtx(t), Options{Servers: []string{fs.addr()}, Token: testToken, ClientName: t.Name(),
		RequestTimeout: 300 * time.Millisecond, DialTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	p, err := c.NewProducer(ProducerOptions{Topic: "t", DeliveryTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Publish(ctx, Message{Value: []byte("answered")}); err != nil {
		t.Fatal(err)
	}
	waitRetryLoopAsleep(t, p)
	fs.freeze(0, true)
	done := make(chan error, 1)
	if err := p.PublishAsync(ctx, Message{Value: []byte("unanswered")}, func(_ PublishResult, err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("publish to a silent broker ended with %v, want its DeliveryTimeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a publish to a silent broker was still pending 5 s after its 1 s DeliveryTimeout")
	}
}

// Metadata requests (any node answers them) leave a seed that stopped
// answering: the first one times out, the next is answered by another node.
func TestClusterMetadataLeavesASilentSeed(t *testing.T) {
	fs := newFakeCluster(t, testToken, 3)
	c := dialShortTimeouts(t, fs, 500*time.Millisecond)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	fs.freeze(0, true)
	if _, err := c.Topics(ctx, "t"); err == nil {
		t.Fatal("a frozen seed answered METADATA")
	}
	infos, err := c.Topics(ctx, "t")
	if err != nil || len(infos) != 1 {
		t.Fatalf("METADATA after the seed went silent = %+v, %v; want an answer from another node", infos, err)
	}
}
