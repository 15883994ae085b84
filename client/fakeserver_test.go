package client

import (
	"bufio"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// fakeServer is an in-test broker implementing just enough of protocol v1:
// HELLO with a token, DECLARE, METADATA, PUB with dedup by (topic, producer
// id, seq), PULL/MSG with credit accounting, ACK/NACK with stale delivery
// ids, PING. All state sits under one mutex; every connection has a reader
// goroutine and a writer goroutine.
type fakeServer struct {
	t     testing.TB
	ln    net.Listener
	token string

	mu         sync.Mutex
	cond       *sync.Cond // broadcast on every state change, for waitFor
	topics     map[string]*fakeTopic
	dedup      map[fakeDedupKey]wire.PubOK
	groups     map[subKey]*fakeGroup
	sessions   map[*fakeSession]bool
	pubLog     []wire.Pub // every PUB received, in arrival order
	pubCount   int        // PUB frames received (including replays)
	nextDeliv  uint64
	violations []string
	// Test hooks, set before use.
	onPub func(n int) fakeAction // n counts PUB frames from 1
	// onAck, when set, may refuse the nth ACK frame with an error frame.
	onAck          func(n int) *wire.Err
	ackCount       int
	reorderReplies bool // answer PUBs in reverse batches
	creditLimit    int  // if > 0: unused credit of a sub must stay ≤ it
	accepts        int
}

type fakeAction int

const (
	fakeNormal           fakeAction = iota
	fakeAppendThenDrop              // append, then close the connection without replying
	fakeDropBeforeAppend            // close the connection without appending
)

type fakeDedupKey struct {
	topic       string
	producerID  uint64
	producerSeq uint64
}

type fakeTopic struct {
	cfg   wire.TopicConfig
	parts [][]*wire.Msg // records by partition; seq = index+1
	rr    uint32
}

type fakeRef struct {
	partition uint32
	seq       uint64
}

type fakeGroup struct {
	queue   []fakeRef            // to deliver, in order
	current map[fakeRef]uint64   // delivered, unacked: current delivery id
	owner   map[fakeRef]*fakeSub // who holds the current delivery
	count   map[fakeRef]uint32   // deliveries so far
	acked   map[fakeRef]bool
}

type fakeSub struct {
	key     subKey
	corr    uint64
	credit  int // unused credit
	granted int // total credit granted
	sent    int // total MSGs sent
}

type fakeSession struct {
	nc   net.Conn
	out  chan []byte
	subs map[subKey]*fakeSub
	dead bool
}

func newFakeServer(t testing.TB, token string) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeServer{
		t: t, ln: ln, token: token,
		topics:   map[string]*fakeTopic{},
		dedup:    map[fakeDedupKey]wire.PubOK{},
		groups:   map[subKey]*fakeGroup{},
		sessions: map[*fakeSession]bool{},
	}
	fs.cond = sync.NewCond(&fs.mu)
	go fs.acceptLoop()
	t.Cleanup(fs.close)
	return fs
}

func (fs *fakeServer) addr() string { return fs.ln.Addr().String() }

func (fs *fakeServer) close() {
	fs.ln.Close()
	fs.mu.Lock()
	for s := range fs.sessions {
		s.nc.Close()
	}
	fs.mu.Unlock()
}

func (fs *fakeServer) acceptLoop() {
	for {
		nc, err := fs.ln.Accept()
		if err != nil {
			return
		}
		s := &fakeSession{nc: nc, out: make(chan []byte, 1<<14), subs: map[subKey]*fakeSub{}}
		fs.mu.Lock()
		fs.accepts++
		fs.sessions[s] = true
		fs.mu.Unlock()
		go s.writeLoop()
		go fs.serve(s)
	}
}

func (s *fakeSession) writeLoop() {
	bw := bufio.NewWriter(s.nc)
	for b := range s.out {
		if _, err := bw.Write(b); err != nil {
			s.nc.Close()
			for range s.out {
			}
			return
		}
		if len(s.out) == 0 {
			if bw.Flush() != nil {
				s.nc.Close()
			}
		}
	}
	bw.Flush()
	s.nc.Close()
}

// sendLocked queues a frame; fs.mu is held so ordering matches state.
func (fs *fakeServer) sendLocked(s *fakeSession, corr uint64, f wire.Frame) {
	if s.dead {
		return
	}
	select {
	case s.out <- wire.AppendFrame(nil, corr, f):
	default:
		fs.violations = append(fs.violations, "fake server: session out queue full")
	}
}

// dropLocked ends a session: its unacked deliveries are requeued at once
// (as if their AckWait expired) with new delivery ids.
func (fs *fakeServer) dropLocked(s *fakeSession) { fs.endLocked(s, false) }

// endLocked ends a session; graceful lets queued frames out first.
func (fs *fakeServer) endLocked(s *fakeSession, graceful bool) {
	if s.dead {
		return
	}
	s.dead = true
	close(s.out)
	if !graceful {
		s.nc.Close()
	}
	delete(fs.sessions, s)
	for _, sub := range s.subs {
		g := fs.groups[sub.key]
		var refs []fakeRef
		for ref, owner := range g.owner {
			if owner == sub {
				refs = append(refs, ref)
			}
		}
		sortRefs(refs)
		for _, ref := range refs {
			delete(g.owner, ref)
			delete(g.current, ref)
			g.queue = append(g.queue, ref)
		}
	}
	fs.deliverLocked()
	fs.cond.Broadcast()
}

func sortRefs(refs []fakeRef) {
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].partition != refs[j].partition {
			return refs[i].partition < refs[j].partition
		}
		return refs[i].seq < refs[j].seq
	})
}

func (fs *fakeServer) serve(s *fakeSession) {
	br := bufio.NewReader(s.nc)
	graceful := false
	defer func() {
		fs.mu.Lock()
		fs.endLocked(s, graceful)
		fs.mu.Unlock()
	}()
	corr, f, err := wire.ReadFrame(br, wire.DefaultFrameBytesMax)
	if err != nil {
		return
	}
	hello, ok := f.(*wire.Hello)
	fs.mu.Lock()
	if !ok || hello.Token != fs.token {
		fs.sendLocked(s, corr, &wire.Err{Code: wire.CodeAuthFailed, Message: "authentication failed"})
		graceful = true
		fs.mu.Unlock()
		return
	}
	fs.sendLocked(s, corr, &wire.HelloOK{Version: wire.VersionMax, NodeID: "fake", FrameBytesMax: wire.DefaultFrameBytesMax})
	fs.mu.Unlock()
	type held struct {
		corr uint64
		f    wire.Frame
	}
	var heldReplies []held
	for {
		corr, f, err := wire.ReadFrame(br, wire.DefaultFrameBytesMax)
		if err != nil {
			return
		}
		fs.mu.Lock()
		if s.dead {
			fs.mu.Unlock()
			return
		}
		reply, drop := fs.handleLocked(s, corr, f)
		if drop {
			fs.dropLocked(s)
			fs.mu.Unlock()
			return
		}
		if reply != nil {
			if _, isPubOK := reply.(*wire.PubOK); isPubOK && fs.reorderReplies {
				heldReplies = append(heldReplies, held{corr, reply})
			} else {
				fs.sendLocked(s, corr, reply)
			}
		}
		if len(heldReplies) >= 8 || (len(heldReplies) > 0 && br.Buffered() == 0) {
			for i := len(heldReplies) - 1; i >= 0; i-- {
				fs.sendLocked(s, heldReplies[i].corr, heldReplies[i].f)
			}
			heldReplies = heldReplies[:0]
		}
		fs.cond.Broadcast()
		fs.mu.Unlock()
	}
}

func errFrame(code wire.Code, format string, args ...any) *wire.Err {
	return &wire.Err{Code: code, Message: fmt.Sprintf(format, args...)}
}

// handleLocked applies one request and returns its reply (nil for none)
// and whether to drop the connection instead.
func (fs *fakeServer) handleLocked(s *fakeSession, corr uint64, f wire.Frame) (wire.Frame, bool) {
	switch f := f.(type) {
	case *wire.Ping:
		return &wire.Pong{}, false
	case *wire.Declare:
		if t, ok := fs.topics[f.Topic.Name]; ok {
			if t.cfg != f.Topic {
				return errFrame(wire.CodeTopicConflict, "topic %s exists with another configuration", f.Topic.Name), false
			}
			return &wire.DeclareOK{Topic: t.cfg, Created: false}, false
		}
		fs.topics[f.Topic.Name] = &fakeTopic{cfg: f.Topic, parts: make([][]*wire.Msg, f.Topic.Partitions)}
		return &wire.DeclareOK{Topic: f.Topic, Created: true}, false
	case *wire.Metadata:
		names := f.Topics
		if len(names) == 0 {
			for n := range fs.topics {
				names = append(names, n)
			}
			sort.Strings(names)
		}
		ok := &wire.MetadataOK{}
		for _, n := range names {
			t, found := fs.topics[n]
			if !found {
				continue
			}
			info := wire.TopicInfo{Config: t.cfg}
			for p, recs := range t.parts {
				info.Partitions = append(info.Partitions, wire.PartitionInfo{Partition: uint32(p), Epoch: 1, StartSeq: 1, CommitSeq: uint64(len(recs))})
			}
			ok.Topics = append(ok.Topics, info)
		}
		return ok, false
	case *wire.Pub:
		return fs.pubLocked(f)
	case *wire.Pull:
		return fs.pullLocked(s, corr, f), false
	case *wire.Ack:
		fs.ackCount++
		if fs.onAck != nil {
			if e := fs.onAck(fs.ackCount); e != nil {
				return e, false
			}
		}
		return fs.ackLocked(f.Topic, f.Group, f.Entries, false, 0), false
	case *wire.Nack:
		return fs.ackLocked(f.Topic, f.Group, f.Entries, true, f.DelayMs), false
	default:
		return errFrame(wire.CodeBadFrame, "unexpected %s", f.Type()), true
	}
}

func (fs *fakeServer) pubLocked(f *wire.Pub) (wire.Frame, bool) {
	fs.pubCount++
	action := fakeNormal
	if fs.onPub != nil {
		action = fs.onPub(fs.pubCount)
	}
	if action == fakeDropBeforeAppend {
		return nil, true
	}
	t, ok := fs.topics[f.Topic]
	if !ok {
		return errFrame(wire.CodeNotFound, "topic %s", f.Topic), false
	}
	key := fakeDedupKey{f.Topic, f.ProducerID, f.ProducerSeq}
	if f.ProducerID != 0 {
		if prev, dup := fs.dedup[key]; dup {
			prev.Duplicate = true
			return &prev, action == fakeAppendThenDrop
		}
	}
	n := t.cfg.Partitions
	var p uint32
	switch {
	case f.Partition != wire.PartitionAuto:
		if uint32(f.Partition) >= n {
			return errFrame(wire.CodeInvalidArgument, "partition %d", f.Partition), false
		}
		p = uint32(f.Partition)
	case len(f.Key) > 0:
		p = wire.PartitionForKey(f.Key, n)
	case f.ProducerID != 0:
		p = wire.PartitionForProducer(f.ProducerID, f.ProducerSeq, n)
	default:
		p = t.rr % n
		t.rr++
	}
	ts := f.TimestampMs
	if ts == 0 {
		ts = time.Now().UnixMilli()
	}
	seq := uint64(len(t.parts[p]) + 1)
	t.parts[p] = append(t.parts[p], &wire.Msg{
		Topic: f.Topic, Partition: p, Seq: seq, TimestampMs: ts,
		Key: f.Key, Value: f.Value, Headers: f.Headers,
	})
	fs.pubLog = append(fs.pubLog, *f)
	ok2 := wire.PubOK{Partition: p, Seq: seq, Epoch: 1}
	if f.ProducerID != 0 {
		fs.dedup[key] = ok2
	}
	for gk, g := range fs.groups {
		if gk.topic == f.Topic {
			g.queue = append(g.queue, fakeRef{p, seq})
		}
	}
	fs.deliverLocked()
	return &ok2, action == fakeAppendThenDrop
}

func (fs *fakeServer) groupLocked(key subKey) *fakeGroup {
	g := fs.groups[key]
	if g == nil {
		g = &fakeGroup{current: map[fakeRef]uint64{}, owner: map[fakeRef]*fakeSub{}, count: map[fakeRef]uint32{}, acked: map[fakeRef]bool{}}
		t := fs.topics[key.topic]
		for p, recs := range t.parts {
			for i := range recs {
				g.queue = append(g.queue, fakeRef{uint32(p), uint64(i + 1)})
			}
		}
		fs.groups[key] = g
	}
	return g
}

func (fs *fakeServer) pullLocked(s *fakeSession, corr uint64, f *wire.Pull) wire.Frame {
	if _, ok := fs.topics[f.Topic]; !ok {
		return errFrame(wire.CodeNotFound, "topic %s", f.Topic)
	}
	key := subKey{f.Topic, f.Group}
	fs.groupLocked(key)
	sub := s.subs[key]
	if sub == nil {
		sub = &fakeSub{key: key, corr: corr}
		s.subs[key] = sub
	}
	sub.credit += int(f.Credit)
	sub.granted += int(f.Credit)
	if fs.creditLimit > 0 && sub.credit > fs.creditLimit {
		fs.violations = append(fs.violations, fmt.Sprintf("unused credit %d exceeds the consumer's limit %d", sub.credit, fs.creditLimit))
	}
	fs.deliverLocked()
	return nil
}

// deliverLocked sends queued records to subscriptions with credit.
func (fs *fakeServer) deliverLocked() {
	sessions := make([]*fakeSession, 0, len(fs.sessions))
	for s := range fs.sessions {
		sessions = append(sessions, s)
	}
	for _, s := range sessions {
		for _, sub := range s.subs {
			g := fs.groups[sub.key]
			for sub.credit > 0 && len(g.queue) > 0 && !s.dead {
				ref := g.queue[0]
				g.queue = g.queue[1:]
				if g.acked[ref] {
					continue
				}
				fs.nextDeliv++
				g.current[ref] = fs.nextDeliv
				g.owner[ref] = sub
				g.count[ref]++
				rec := *fs.topics[sub.key.topic].parts[ref.partition][ref.seq-1]
				rec.DeliveryID, rec.DeliveryCount = fs.nextDeliv, g.count[ref]
				sub.credit--
				sub.sent++
				fs.sendLocked(s, sub.corr, &rec)
			}
		}
	}
}

func (fs *fakeServer) ackLocked(topic, group string, entries []wire.AckEntry, nack bool, _ uint32) wire.Frame {
	g := fs.groups[subKey{topic, group}]
	if g == nil {
		return errFrame(wire.CodeNotFound, "group %s/%s", topic, group)
	}
	res := &wire.AckOK{}
	for _, e := range entries {
		ref := fakeRef{e.Partition, e.Seq}
		if id, ok := g.current[ref]; !ok || id != e.DeliveryID {
			res.Results = append(res.Results, wire.CodeStaleDelivery)
			continue
		}
		delete(g.current, ref)
		delete(g.owner, ref)
		if nack {
			g.queue = append(g.queue, ref)
		} else {
			g.acked[ref] = true
		}
		res.Results = append(res.Results, wire.CodeOK)
	}
	fs.deliverLocked()
	return res
}

// redeliver makes every unacked delivery of (topic, group) expire now: it is
// queued again and will get a new delivery id.
func (fs *fakeServer) redeliver(topic, group string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	g := fs.groups[subKey{topic, group}]
	var refs []fakeRef
	for ref := range g.current {
		refs = append(refs, ref)
	}
	sortRefs(refs)
	for _, ref := range refs {
		delete(g.current, ref)
		delete(g.owner, ref)
		g.queue = append(g.queue, ref)
	}
	fs.deliverLocked()
	fs.cond.Broadcast()
}

// dropAll closes every connection.
func (fs *fakeServer) dropAll() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for s := range fs.sessions {
		fs.dropLocked(s)
	}
}

// waitFor waits until cond (called with fs.mu held) is true, failing the
// test after timeout. No sleeping: it wakes on every state change, and a
// timer broadcasts once at the deadline.
func (fs *fakeServer) waitFor(timeout time.Duration, what string, cond func() bool) {
	fs.t.Helper()
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		fs.mu.Lock()
		fs.cond.Broadcast()
		fs.mu.Unlock()
	})
	defer timer.Stop()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for !cond() {
		if !time.Now().Before(deadline) {
			fs.t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		fs.cond.Wait()
	}
}

func (fs *fakeServer) checkViolations() {
	fs.t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, v := range fs.violations {
		fs.t.Error(v)
	}
}

// records returns the values of every record of topic, partition by partition.
func (fs *fakeServer) records(topic string) []*wire.Msg {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out []*wire.Msg
	for _, recs := range fs.topics[topic].parts {
		out = append(out, recs...)
	}
	return out
}
