package client

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

const testToken = "s3cret"

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dialFake(t *testing.T, fs *fakeServer) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), Options{Servers: []string{fs.addr()}, Token: testToken, ClientName: t.Name(), RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func declare(t *testing.T, c *Client, name string, partitions int) {
	t.Helper()
	created, err := c.DeclareTopic(testCtx(t), TopicConfig{Name: name, Partitions: partitions})
	if err != nil || !created {
		t.Fatalf("DeclareTopic(%s) = %v, %v", name, created, err)
	}
}

func TestParseServers(t *testing.T) {
	got := ParseServers(" a:1, ,b:2,c ")
	want := []string{"a:1", "b:2", "c:4850"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseServers = %q, want %q", got, want)
	}
}

func TestAuthFailure(t *testing.T) {
	fs := newFakeServer(t, testToken)
	_, err := Dial(testCtx(t), Options{Servers: []string{fs.addr()}, Token: "wrong"})
	if !errors.Is(err, ErrAuthFailed) || !errors.Is(err, wire.ErrAuthFailed) {
		t.Fatalf("Dial with a bad token: err = %v, want AUTH_FAILED", err)
	}
	if IsRetryable(err) {
		t.Fatalf("auth failure reported retryable: %v", err)
	}
}

func TestDialUnreachableIsDisconnected(t *testing.T) {
	fs := newFakeServer(t, testToken)
	addr := fs.addr()
	fs.close()
	_, err := Dial(testCtx(t), Options{Servers: []string{addr}, DialTimeout: time.Second})
	if !errors.Is(err, ErrDisconnected) {
		t.Fatalf("err = %v, want ErrDisconnected", err)
	}
}

func TestDeclareAndTopics(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "orders", 3)
	created, err := c.DeclareTopic(ctx, TopicConfig{Name: "orders", Partitions: 3})
	if err != nil || created {
		t.Fatalf("identical re-declare = %v, %v; want exists", created, err)
	}
	_, err = c.DeclareTopic(ctx, TopicConfig{Name: "orders", Partitions: 4})
	if !errors.Is(err, ErrTopicConflict) {
		t.Fatalf("conflicting declare: err = %v", err)
	}
	if _, err := c.DeclareTopic(ctx, TopicConfig{Name: "bad name", Partitions: 1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("invalid name: err = %v", err)
	}
	infos, err := c.Topics(ctx)
	if err != nil || len(infos) != 1 || infos[0].Config.Name != "orders" || len(infos[0].Partitions) != 3 {
		t.Fatalf("Topics = %+v, %v", infos, err)
	}
	if infos, err := c.Topics(ctx, "missing"); err != nil || len(infos) != 0 {
		t.Fatalf("Topics(missing) = %+v, %v", infos, err)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func TestPublishConsumeAckRoundTrip(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 2)
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ts := time.UnixMilli(1700000000123)
	res, err := p.Publish(ctx, Message{Key: []byte("k1"), Value: []byte("hello"), Timestamp: ts,
		Headers: []Header{{Key: "h", Value: []byte("v")}}})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if res.Seq != 1 || res.Duplicate || res.ProducerSeq != 1 || res.Partition != int(wire.PartitionForKey([]byte("k1"), 2)) {
		t.Fatalf("Publish result = %+v", res)
	}
	if _, err := p.Publish(ctx, Message{Value: []byte("pinned"), TargetPartition: PartitionOf(1)}); err != nil {
		t.Fatal(err)
	}

	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 16})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer co.Close()
	got := map[string]*Message{}
	for range 2 {
		m, err := co.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		got[string(m.Value)] = m
		if err := m.AckSync(ctx); err != nil {
			t.Fatalf("AckSync: %v", err)
		}
	}
	m := got["hello"]
	if m == nil || string(m.Key) != "k1" || !m.Timestamp.Equal(ts) || m.DeliveryCount != 1 ||
		len(m.Headers) != 1 || m.Headers[0].Key != "h" || string(m.Headers[0].Value) != "v" || m.Topic != "t" {
		t.Fatalf("delivered message = %+v", m)
	}
	if pinned := got["pinned"]; pinned == nil || pinned.Partition != 1 {
		t.Fatalf("pinned message = %+v", pinned)
	}
	if st := co.Stats(); st.Acked != 2 || st.Delivered != 2 {
		t.Fatalf("stats = %+v", st)
	}
	if _, err := c.Subscribe(ctx, "nope", "g", ConsumerOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Subscribe to a missing topic: err = %v", err)
	}
	if _, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("second consumer of the same group on one client: err = %v", err)
	}
}

func TestAsyncPublishIsPipelinedInSeqOrder(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.reorderReplies = true
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 4)
	p, err := c.NewProducer(ProducerOptions{Topic: "t", MaxInFlight: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 2000
	var mu sync.Mutex
	results := map[uint64]PublishResult{}
	var failures []error
	for i := range n {
		err := p.PublishAsync(ctx, Message{Value: fmt.Appendf(nil, "m%d", i)}, func(r PublishResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err)
				return
			}
			results[r.ProducerSeq] = r
		})
		if err != nil {
			t.Fatalf("PublishAsync %d: %v", i, err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if len(failures) > 0 || len(results) != n {
		t.Fatalf("%d results, failures %v", len(results), failures)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.pubLog) != n {
		t.Fatalf("broker got %d PUBs, want %d", len(fs.pubLog), n)
	}
	for i, pub := range fs.pubLog {
		if pub.ProducerSeq != uint64(i+1) || pub.ProducerID != p.ID() || string(pub.Value) != fmt.Sprintf("m%d", i) {
			t.Fatalf("PUB %d arrived with seq %d value %q", i, pub.ProducerSeq, pub.Value)
		}
	}
}

// TestReconnectRetryIsExactlyOnce drops the connection mid-stream, both after
// an append (the retry must be answered from the dedup table) and before one
// (the retry must append): every message is acked once and stored once.
func TestReconnectRetryIsExactlyOnce(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.onPub = func(n int) fakeAction {
		switch n {
		case 100, 700:
			return fakeAppendThenDrop
		case 400:
			return fakeDropBeforeAppend
		}
		return fakeNormal
	}
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 3)
	p, err := c.NewProducer(ProducerOptions{Topic: "t", MaxInFlight: 32, RetryBackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 1000
	var mu sync.Mutex
	acked := map[uint64]int{}
	duplicates := 0
	var failures []error
	for i := range n {
		err := p.PublishAsync(ctx, Message{Value: fmt.Appendf(nil, "%d", i+1)}, func(r PublishResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err)
				return
			}
			acked[r.ProducerSeq]++
			if r.Duplicate {
				duplicates++
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Synchronous publishes ride through a drop too.
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fs.dropAll()
	res, err := p.Publish(ctx, Message{Value: []byte("after")})
	if err != nil || res.ProducerSeq != n+1 {
		t.Fatalf("Publish after drop = %+v, %v", res, err)
	}
	if len(failures) > 0 {
		t.Fatalf("failures: %v", failures)
	}
	for seq := uint64(1); seq <= n; seq++ {
		if acked[seq] != 1 {
			t.Fatalf("producer seq %d acked %d times", seq, acked[seq])
		}
	}
	if duplicates == 0 {
		t.Fatal("no retry was answered from the dedup table; the drop hooks did not fire")
	}
	recs := fs.records("t")
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[string(r.Value)] {
			t.Fatalf("value %s stored twice", r.Value)
		}
		seen[string(r.Value)] = true
	}
	if len(recs) != n+1 {
		t.Fatalf("broker stored %d records, want %d", len(recs), n+1)
	}
	fs.mu.Lock()
	accepts := fs.accepts
	fs.mu.Unlock()
	if accepts < 5 {
		t.Fatalf("only %d connections; expected reconnects", accepts)
	}
}

func TestNonIdempotentPublishIsNotRetriedAfterSend(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.onPub = func(n int) fakeAction {
		if n == 1 {
			return fakeAppendThenDrop
		}
		return fakeNormal
	}
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	p, err := c.NewProducer(ProducerOptions{Topic: "t", DisableIdempotence: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Publish(ctx, Message{Value: []byte("x")}); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("err = %v, want ErrDisconnected", err)
	}
	if _, err := p.Publish(ctx, Message{Value: []byte("y")}); err != nil {
		t.Fatalf("publish after reconnect: %v", err)
	}
}

func TestCreditBatchingDeliversEverything(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.creditLimit = 64
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 4)
	p, _ := c.NewProducer(ProducerOptions{Topic: "t"})
	defer p.Close()
	const n = 1000
	publishRange(ctx, t, p, 0, n)
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 64})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[fakeRef]bool{}
	for len(seen) < n {
		m, err := co.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %d: %v", len(seen), err)
		}
		if b := co.Buffered(); b > 64 {
			t.Fatalf("buffer holds %d > credit 64", b)
		}
		seen[fakeRef{uint32(m.Partition), m.Seq}] = true
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if err := co.Close(); err != nil {
		t.Fatal(err)
	}
	if st := co.Stats(); st.Acked != n || st.StaleAcks != 0 || st.FailedAcks != 0 {
		t.Fatalf("stats after Close = %+v", st)
	}
	fs.waitFor(5*time.Second, "all acks", func() bool { return len(fs.groups[subKey{"t", "g"}].acked) == n })
	fs.checkViolations()
}

// TestCreditNeverExceeded consumes slowly: the broker may never hold more
// unused credit than Credit, and grants never run ahead of consumption.
func TestCreditNeverExceeded(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.creditLimit = 10
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	p, _ := c.NewProducer(ProducerOptions{Topic: "t"})
	defer p.Close()
	publishRange(ctx, t, p, 0, 100)
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	sub := func() *fakeSub {
		for s := range fs.sessions {
			if sub := s.subs[subKey{"t", "g"}]; sub != nil {
				return sub
			}
		}
		return nil
	}
	for consumed := 0; consumed < 100; {
		// Wait until the broker has used all credit it was given.
		fs.waitFor(5*time.Second, "credit used", func() bool { s := sub(); return s != nil && (s.credit == 0 || s.sent == 100) })
		// Buffered first: more may be sent meanwhile, never fewer.
		b := co.Buffered()
		fs.mu.Lock()
		sent := sub().sent
		fs.mu.Unlock()
		if sent > consumed+10 {
			t.Fatalf("broker sent %d messages with %d consumed and credit 10", sent, consumed)
		}
		if b > sent-consumed {
			t.Fatalf("buffered %d, more than the %d sent and not consumed", b, sent-consumed)
		}
		for range 3 {
			if _, err := co.Next(ctx); err != nil {
				t.Fatal(err)
			}
			consumed++
			if consumed == 100 {
				break
			}
		}
	}
	fs.checkViolations()
}

// TestCreditReturnedByTimer: with Credit 8 neither the 32-message batch nor
// the low watermark (2) triggers after 3 messages; the 20 ms timer must.
func TestCreditReturnedByTimer(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	p, _ := c.NewProducer(ProducerOptions{Topic: "t"})
	defer p.Close()
	for range 3 {
		if _, err := p.Publish(ctx, Message{Value: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	for range 3 {
		if _, err := co.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fs.waitFor(5*time.Second, "credit 8+3 granted", func() bool {
		for s := range fs.sessions {
			if sub := s.subs[subKey{"t", "g"}]; sub != nil && sub.granted == 11 {
				return true
			}
		}
		return false
	})
}

func TestStaleDeliveryAndNack(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	p, _ := c.NewProducer(ProducerOptions{Topic: "t"})
	defer p.Close()
	if _, err := p.Publish(ctx, Message{Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	first, err := co.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fs.redeliver("t", "g") // AckWait expired: new delivery id
	second, err := co.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second.Seq != first.Seq || second.DeliveryID == first.DeliveryID || second.DeliveryCount != 2 {
		t.Fatalf("redelivery = %+v after %+v", second, first)
	}
	if err := first.AckSync(ctx); !errors.Is(err, ErrStaleDelivery) {
		t.Fatalf("AckSync of a stale delivery: err = %v", err)
	}
	if err := first.Ack(); err != nil { // async: counted, not returned
		t.Fatal(err)
	}
	if err := second.Nack(ctx, 0); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	third, err := co.Next(ctx)
	if err != nil || third.Seq != first.Seq || third.DeliveryCount != 3 {
		t.Fatalf("after nack: %+v, %v", third, err)
	}
	if err := third.AckSync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := co.Close(); err != nil {
		t.Fatal(err)
	}
	if st := co.Stats(); st.StaleAcks != 2 || st.Acked != 1 {
		t.Fatalf("stats = %+v, want 2 stale and 1 acked", st)
	}
}

func TestConsumerResubscribesAfterReconnect(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 2)
	p, _ := c.NewProducer(ProducerOptions{Topic: "t"})
	defer p.Close()
	publishRange(ctx, t, p, 0, 50)
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	acked := map[string]bool{}
	consume := func(until int) {
		for len(acked) < until {
			m, err := co.Next(ctx)
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if err := m.AckSync(ctx); err != nil {
				if errors.Is(err, ErrStaleDelivery) || errors.Is(err, ErrDisconnected) {
					continue // redelivered after the drop
				}
				t.Fatalf("AckSync: %v", err)
			}
			acked[string(m.Value)] = true
		}
	}
	consume(20)
	fs.dropAll()
	publishRange(ctx, t, p, 50, 100)
	consume(100)
	if co.Stats().Resubscribe == 0 {
		t.Fatal("consumer never resubscribed")
	}
	fs.checkViolations()
}

func TestCloseFailsPendingWork(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	p, _ := c.NewProducer(ProducerOptions{Topic: "t"})
	co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := p.Publish(ctx, Message{Value: []byte("x")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish on a closed client: err = %v", err)
	}
	if _, err := co.Next(ctx); err == nil {
		t.Fatal("Next on a closed client succeeded")
	}
	p.Close()
	co.Close()
	if _, err := c.Topics(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Topics on a closed client: err = %v", err)
	}
}

// PublishAsync's ctx bounds only the wait for a window slot: a message
// handed over before ctx ends is still retried and delivered after it.
func TestPublishAsyncOutlivesItsContext(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	declare(t, c, "t", 1)
	fs.mu.Lock()
	fs.onPub = func(n int) fakeAction {
		if n == 1 {
			return fakeDropBeforeAppend // the first attempt is lost with its connection
		}
		return fakeNormal
	}
	fs.mu.Unlock()
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	done := make(chan error, 1)
	if err := p.PublishAsync(ctx, Message{Value: []byte("x")}, func(_ PublishResult, err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("async publish bounded by its handover context: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no outcome")
	}
}

// An ACK refused with a retryable error (the broker's ledger write failed)
// is asked again, so AckSync reports the real outcome.
func TestAckRetriedAfterRetryableError(t *testing.T) {
	frames, err := ackOneMessage(t, func(fs *fakeServer) {
		fs.onAck = func(n int) *wire.Err {
			if n == 1 {
				return &wire.Err{Code: wire.CodeStorage, Message: "ledger write failed"}
			}
			return nil
		}
	})
	if err != nil {
		t.Fatalf("ack after one retryable refusal: %v", err)
	}
	if frames != 2 {
		t.Fatalf("%d ACK frames, want 2 (one refused, one retried)", frames)
	}
}

// An ACK entry answered UNAVAILABLE — its partition's only replica is on
// that node and not delivering yet (restarting, taking office) — is asked
// there again a moment later, so AckSync reports the real outcome; it
// used to fail at once though the ack may have been durable.
func TestAckEntryUnavailableIsAskedAgain(t *testing.T) {
	frames, err := ackOneMessage(t, func(fs *fakeServer) {
		fs.onAckEntries = func(n, entries int) []wire.Code {
			if n > 2 {
				return nil
			}
			codes := make([]wire.Code, entries)
			for i := range codes {
				codes[i] = wire.CodeUnavailable
			}
			return codes
		}
	})
	if err != nil {
		t.Fatalf("ack after two entries answered UNAVAILABLE: %v", err)
	}
	if frames != 3 {
		t.Fatalf("%d ACK frames, want 3 (two answered UNAVAILABLE, one applied)", frames)
	}
}

// ackOneMessage publishes one message to a fake server set up by setup,
// consumes it and acks it with AckSync: the ACK frames the server took,
// and AckSync's outcome.
func ackOneMessage(t *testing.T, setup func(*fakeServer)) (int, error) {
	t.Helper()
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	declare(t, c, "t", 1)
	p, err := c.NewProducer(ProducerOptions{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(testCtx(t), Message{Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	fs.mu.Lock()
	setup(fs)
	fs.mu.Unlock()
	cons, err := c.Subscribe(testCtx(t), "t", "g", ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	ackErr := m.AckSync(testCtx(t))
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.ackCount, ackErr
}

// publishRange publishes the values from..to-1 (as decimal text) and
// waits until all are acknowledged.
func publishRange(ctx context.Context, t *testing.T, p *Producer, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := p.PublishAsync(ctx, Message{Value: fmt.Appendf(nil, "%d", i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMessagesMaxBoundsGrantedCredit: a consumer that will take 6 messages
// grants the broker exactly 6 credits in all — whether its credit window
// is smaller (Next frees credit after each message) or larger (the first
// grant) — so none is delivered only to be dropped at Close.
func TestMessagesMaxBoundsGrantedCredit(t *testing.T) {
	for _, credit := range []int{4, 10} {
		t.Run(fmt.Sprintf("credit=%d", credit), func(t *testing.T) {
			fs := newFakeServer(t, testToken)
			c := dialFake(t, fs)
			ctx := testCtx(t)
			declare(t, c, "t", 1)
			p, _ := c.NewProducer(ProducerOptions{Topic: "t"})
			defer p.Close()
			publishRange(ctx, t, p, 0, 20)
			co, err := c.Subscribe(ctx, "t", "g", ConsumerOptions{Credit: credit, MessagesMax: 6})
			if err != nil {
				t.Fatal(err)
			}
			defer co.Close()
			for range 6 {
				if _, err := co.Next(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// taken + buffered + outstanding + unreturned is all credit ever granted.
			co.mu.Lock()
			granted := co.grantedLocked()
			co.mu.Unlock()
			if granted != 6 {
				t.Fatalf("consumer granted %d credits for 6 messages", granted)
			}
			fs.waitFor(5*time.Second, "6 credits granted", func() bool {
				for s := range fs.sessions {
					if sub := s.subs[subKey{"t", "g"}]; sub != nil && sub.granted == 6 {
						return true
					}
				}
				return false
			})
			if _, err := c.Subscribe(ctx, "t", "h", ConsumerOptions{MessagesMax: -1}); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("negative MessagesMax: err = %v", err)
			}
		})
	}
}

func TestRetentionMustBeWholeMilliseconds(t *testing.T) {
	for _, bad := range []time.Duration{time.Nanosecond, 999 * time.Microsecond, 1500 * time.Microsecond} {
		if _, err := (TopicConfig{Name: "t", Partitions: 1, Retention: bad}).toWire(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("retention %v: err = %v", bad, err)
		}
	}
	wc, err := TopicConfig{Name: "t", Partitions: 1, Retention: 2 * time.Second}.toWire()
	if err != nil || wc.RetentionMs != 2000 {
		t.Fatalf("retention 2s: %+v, %v", wc, err)
	}
}

// Async publishes travel in PUB_BATCH frames; each gets its own record's
// result out of the batch's answer, not a neighbour's.
func TestAsyncPublishesGetTheirOwnResults(t *testing.T) {
	fs := newFakeServer(t, testToken)
	c := dialFake(t, fs)
	ctx := testCtx(t)
	declare(t, c, "t", 1)
	p, err := c.NewProducer(ProducerOptions{Topic: "t", MaxInFlight: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 50
	var mu sync.Mutex
	results := map[uint64]PublishResult{}
	for i := range n {
		if err := p.PublishAsync(ctx, Message{Value: []byte(fmt.Sprint(i))}, func(res PublishResult, err error) {
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			results[res.ProducerSeq] = res
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for seq := uint64(1); seq <= n; seq++ {
		if res, ok := results[seq]; !ok || res.Seq != seq || res.Partition != 0 {
			t.Fatalf("producer seq %d: result %+v (present %v), want log seq %d", seq, res, ok, seq)
		}
	}
}

// A group delete whose answer is lost — the coordinator applied it, then
// the connection dropped — is sent again naming the incarnation the call
// learnt first: the retry is answered OK and the group's incarnation moved
// once (GroupDeleteRetryDeletesOnce; a retry that asked for the current
// incarnation again would delete the next one). An incarnation above the
// current one is ErrNotFound.
func TestDeleteGroupRetryNamesItsIncarnation(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.groupsDeleted = map[string]uint64{"g": 2}
	fs.onGroupDelete = func(n int) fakeAction {
		if n == 1 {
			return fakeAppendThenDrop
		}
		return fakeNormal
	}
	c := dialFake(t, fs)
	if err := c.DeleteGroupForce(testCtx(t), "g"); err != nil {
		t.Fatalf("DeleteGroupForce with its first answer lost: %v", err)
	}
	fs.mu.Lock()
	sent, deleted := slices.Clone(fs.groupDeletes), fs.groupsDeleted["g"]
	fs.mu.Unlock()
	want := wire.GroupDeleteIncarnation{GroupRef: wire.GroupRef{Group: "g", Incarnation: 3}, Force: true}
	if len(sent) != 2 || sent[0] != want || sent[1] != want || deleted != 3 {
		t.Fatalf("GROUP_DELETE_INCARNATION frames %+v, last deleted %d; want two naming incarnation 3, and 3", sent, deleted)
	}
	if _, err := c.DeleteGroupIncarnation(testCtx(t), "g", 9, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of incarnation 9 of a group at 4: %v, want ErrNotFound", err)
	}
}

// TestDeleteGroupOnABrokerOfBefore: a broker of before protocol version 3
// knows no group incarnation on the wire; the SDK deletes there with the
// frames it knows (GROUP_DELETE_FORCE, GROUP_DELETE), once, and refuses a
// delete naming an incarnation instead of sending frames it cannot
// decode (which would close the connection).
func TestDeleteGroupOnABrokerOfBefore(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.version = wire.VersionPubBatch
	c := dialFake(t, fs)
	if err := c.DeleteGroupForce(testCtx(t), "g"); err != nil {
		t.Fatalf("DeleteGroupForce on a version %d broker: %v", fs.version, err)
	}
	if err := c.DeleteGroup(testCtx(t), "h"); err != nil {
		t.Fatalf("DeleteGroup on a version %d broker: %v", fs.version, err)
	}
	if _, err := c.DeleteGroupIncarnation(testCtx(t), "g", 2, true); err == nil {
		t.Fatal("a delete naming incarnation 2 on a broker that names none: no error")
	}
	fs.mu.Lock()
	old, named := slices.Clone(fs.oldGroupDeletes), len(fs.groupDeletes)
	fs.mu.Unlock()
	want := []wire.Frame{&wire.GroupDeleteForce{Group: "g"}, &wire.GroupDelete{Group: "h"}}
	if !reflect.DeepEqual(old, want) || named != 0 {
		t.Fatalf("frames the broker got: %+v and %d GROUP_DELETE_INCARNATION; want %+v alone", old, named, want)
	}
}

// TestUpdateTopicRefusesWhatNoBrokerTakes: UpdateTopic says what is wrong
// before sending anything — no setting given, a retention that is not a
// whole number of milliseconds, a negative size — and refuses a broker of
// before protocol version 4, which would not decode TOPIC_UPDATE.
func TestUpdateTopicRefusesWhatNoBrokerTakes(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.version = wire.VersionGroupIncarnation
	c := dialFake(t, fs)
	sub, negative, hour := 1500*time.Microsecond, int64(-1), time.Hour
	for _, tc := range []struct {
		u    TopicUpdate
		want string
	}{
		{TopicUpdate{}, "sets nothing"},
		{TopicUpdate{Retention: &sub}, "not a whole number of milliseconds"},
		{TopicUpdate{RetentionBytes: &negative}, "must not be negative"},
		{TopicUpdate{Retention: &hour}, "protocol version below 4"},
	} {
		if _, _, err := c.UpdateTopic(testCtx(t), "orders", tc.u); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("UpdateTopic(%+v): %v, want an error saying %q", tc.u, err, tc.want)
		}
	}
}

// TestUpdateGroupRefusesWhatNoBrokerTakes: UpdateGroup says what is wrong
// before sending anything — no setting given, an ack wait that is not a
// whole number of milliseconds or out of range, a max deliveries of 0 —
// and refuses a broker of before protocol version 5, which would not
// decode GROUP_UPDATE.
func TestUpdateGroupRefusesWhatNoBrokerTakes(t *testing.T) {
	fs := newFakeServer(t, testToken)
	fs.version = wire.VersionTopicUpdate
	c := dialFake(t, fs)
	sub, zero, huge, second := 1500*time.Microsecond, time.Duration(0), 50*24*time.Hour, time.Second
	var none, three uint32 = 0, 3
	for _, tc := range []struct {
		u    GroupUpdate
		want string
	}{
		{GroupUpdate{}, "sets nothing"},
		{GroupUpdate{AckWait: &sub}, "whole number of milliseconds"},
		{GroupUpdate{AckWait: &zero}, "from 1 ms"},
		{GroupUpdate{AckWait: &huge}, "from 1 ms"},
		{GroupUpdate{MaxDeliver: &none}, "at least 1"},
		{GroupUpdate{AckWait: &second, MaxDeliver: &three}, "protocol version below 5"},
	} {
		if _, err := c.UpdateGroup(testCtx(t), "g", tc.u); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("UpdateGroup(%+v): %v, want an error saying %q", tc.u, err, tc.want)
		}
	}
}
