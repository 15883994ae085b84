package client

import (
	"bufio"
	"cmp"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// fakeServer is an in-test broker implementing just enough of protocol v1:
// HELLO with a token, DECLARE, METADATA, PUB with dedup by (topic,
// partition, producer id, seq), PULL/MSG with credit accounting, ACK/NACK
// with stale delivery ids, PING. All state sits under one mutex; every
// connection has a reader goroutine and a writer goroutine.
//
// It may run as a cluster of nodes, each with its own listener, sharing one
// (as if perfectly replicated) state. Each partition has a leader node: PUB
// elsewhere is answered NOT_LEADER, and so are PULL, ACK and NACK away from
// the topic's coordinator (the leader of partition 0). A single node leads
// everything. With perPartition set it follows the contract of delivery at
// each partition's leader instead: a PULL subscribes at any node, a node
// delivers only the partitions it leads, and an ACK or NACK entry counts
// only at the node that made the delivery while it still leads the
// partition (else STALE_DELIVERY).
type fakeServer struct {
	t     testing.TB
	nodes []*fakeNode
	token string

	mu         sync.Mutex
	cond       *sync.Cond // broadcast on every state change, for waitFor
	topics     map[string]*fakeTopic
	dedup      map[fakeDedupKey]wire.PubOK
	groups     map[subKey]*fakeGroup
	sessions   map[*fakeSession]bool
	leaders    map[fakePart]int  // leader node index (absent: partition % nodes; -1: election)
	staleMeta  map[fakePart]int  // the leader METADATA names, when set, whatever leaders says
	readOnly   map[fakePart]bool // PUBs fail with QUORUM_LOST
	pubLog     []wire.Pub        // every PUB appended, in arrival order
	pubFrames  []fakePubFrame    // every PUB received, with its outcome
	accepted   int               // PUB frames a leader accepted (including replays)
	acksAt     []int             // ACK frames received, by node
	pullsAt    []int             // PULL frames received, by node
	refusedAt  []int             // PULL frames refused with NOT_LEADER, by node
	ackedAt    map[fakeRef]int   // the node whose ACK completed a record
	declares   int               // DECLARE frames received
	advertised map[int]string    // LeaderAddr of a node, if not its listener's
	nextDeliv  uint64
	violations []string
	// Test hooks, set before use.
	onPub func(n int) fakeAction // n counts PUB frames a leader accepts, from 1
	// silentMoves: a coordinator that loses its role does not end its
	// subscriptions: it takes their credit but delivers nothing, and it
	// refuses ACKs.
	silentMoves bool
	// perPartition: delivery at each partition's leader (see fakeServer).
	perPartition bool
	// onAck, when set, may refuse the nth ACK frame with an error frame.
	onAck func(n int) *wire.Err
	// onAckEntries, when set, may answer the nth ACK frame with these
	// per-entry results, applying nothing.
	onAckEntries func(n, entries int) []wire.Code
	// onAckApplied, when set, applies a fault to the nth ACK frame after
	// applying it (a leader that made the ack durable, then lost office or
	// its connection before it answered).
	onAckApplied   func(n int) fakeAction
	ackCount       int
	reorderReplies bool // answer PUBs in reverse batches
	creditLimit    int  // if > 0: unused credit of a sub must stay ≤ it
	accepts        int
	// frozen nodes read nothing more and so answer nothing, HELLO
	// included, while their connections stay open and they keep accepting
	// (a SIGSTOPped broker: its kernel still accepts and buffers).
	frozen map[int]bool
	closed bool
	// groupsDeleted: a group's last deleted incarnation (the current is
	// the next); groupDeletes: every GROUP_DELETE_INCARNATION received;
	// onGroupDelete, when set, may drop the connection after the nth is
	// applied, without an answer.
	groupsDeleted map[string]uint64
	groupDeletes  []wire.GroupDeleteIncarnation
	onGroupDelete func(n int) fakeAction
	// version, when not 0, is the protocol version its HELLO_OK names (a
	// broker of before: below wire.VersionGroupIncarnation it refuses the
	// incarnation frames, and oldGroupDeletes records the GROUP_DELETE
	// and GROUP_DELETE_FORCE frames it gets).
	version         uint16
	oldGroupDeletes []wire.Frame
}

type fakeAction int

const (
	fakeNormal              fakeAction = iota
	fakeAppendThenDrop                 // append, then close the connection without replying
	fakeDropBeforeAppend               // close the connection without appending
	fakeAppendThenStepDown             // append, move the topic's leaders to the next node, answer NOT_LEADER
	fakeAppendThenCrash                // append, move the topic's leaders, close every connection of this node
	fakeAppendThenElection             // append, leave the topic's partitions leaderless (an election), answer NOT_LEADER
	fakeAppendThenStaleMeta            // fakeAppendThenElection, METADATA still naming this node the leader
)

type fakeNode struct {
	idx int
	id  string
	ln  net.Listener
}

type fakePart struct {
	topic     string
	partition uint32
}

// fakePubFrame is one PUB as received: where it went and how it ended.
type fakePubFrame struct {
	node        int
	partition   uint32 // the partition it was routed to
	auto        bool   // sent with PartitionAuto
	producerID  uint64
	producerSeq uint64
	code        wire.Code // CodeOK when appended or deduplicated
}

type fakeDedupKey struct {
	topic       string
	partition   uint32 // dedup is per partition, as in the broker
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
	node    int // the node of its session
	member  string
	inc     uint64 // the member incarnation it serves
	key     subKey
	corr    uint64
	credit  int // unused credit
	granted int // total credit granted
	sent    int // total MSGs sent
}

type fakeSession struct {
	node *fakeNode
	nc   net.Conn
	out  chan []byte
	subs map[subKey]*fakeSub
	dead bool
}

func newFakeServer(t testing.TB, token string) *fakeServer {
	return newFakeCluster(t, token, 1)
}

// newFakeCluster starts n nodes with ids n0, n1, ...
func newFakeCluster(t testing.TB, token string, n int) *fakeServer {
	t.Helper()
	fs := &fakeServer{
		t: t, token: token,
		topics:    map[string]*fakeTopic{},
		dedup:     map[fakeDedupKey]wire.PubOK{},
		groups:    map[subKey]*fakeGroup{},
		sessions:  map[*fakeSession]bool{},
		leaders:   map[fakePart]int{},
		frozen:    map[int]bool{},
		readOnly:  map[fakePart]bool{},
		acksAt:    make([]int, n),
		pullsAt:   make([]int, n),
		refusedAt: make([]int, n),
		ackedAt:   map[fakeRef]int{},
	}
	fs.cond = sync.NewCond(&fs.mu)
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		node := &fakeNode{idx: i, id: fmt.Sprintf("n%d", i), ln: ln}
		fs.nodes = append(fs.nodes, node)
		go fs.acceptLoop(node)
	}
	t.Cleanup(fs.close)
	return fs
}

// addr is the client address of node 0.
func (fs *fakeServer) addr() string { return fs.nodeAddr(0) }

func (fs *fakeServer) nodeAddr(i int) string { return fs.nodes[i].ln.Addr().String() }

func (fs *fakeServer) close() {
	for _, n := range fs.nodes {
		n.ln.Close()
	}
	fs.mu.Lock()
	fs.closed = true
	fs.cond.Broadcast()
	for s := range fs.sessions {
		s.nc.Close()
	}
	fs.mu.Unlock()
}

func (fs *fakeServer) acceptLoop(node *fakeNode) {
	for {
		nc, err := node.ln.Accept()
		if err != nil {
			return
		}
		s := &fakeSession{node: node, nc: nc, out: make(chan []byte, 1<<14), subs: map[subKey]*fakeSub{}}
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
		fs.releaseLocked(sub)
	}
	fs.deliverLocked()
	fs.cond.Broadcast()
}

// releaseLocked queues the unacked deliveries of sub for redelivery.
func (fs *fakeServer) releaseLocked(sub *fakeSub) {
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

// releasePartitionLocked queues the unacked deliveries of partition in g
// for redelivery.
func (fs *fakeServer) releasePartitionLocked(g *fakeGroup, partition uint32) {
	var refs []fakeRef
	for ref := range g.owner {
		if ref.partition == partition {
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

// leaderLocked returns the leader node of (topic, partition), -1 if none.
func (fs *fakeServer) leaderLocked(topic string, partition uint32) int {
	if l, ok := fs.leaders[fakePart{topic, partition}]; ok {
		return l
	}
	return int(partition) % len(fs.nodes)
}

// setLeader moves the leadership of (topic, partition) to node (-1: an
// election is running).
func (fs *fakeServer) setLeader(topic string, partition uint32, node int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.setLeaderLocked(topic, partition, node)
}

// setLeaderLocked moves a leadership. When partition 0 moves, the topic's
// group coordinator moves with it: the old coordinator's unacked deliveries
// are redelivered, and unless silentMoves its subscriptions end with ERR
// NOT_LEADER.
func (fs *fakeServer) setLeaderLocked(topic string, partition uint32, node int) {
	old := fs.leaderLocked(topic, partition)
	fs.leaders[fakePart{topic, partition}] = node
	if fs.perPartition {
		// The new leader redelivers what the old one left unacked; every
		// subscription stays.
		if old != node {
			for key, g := range fs.groups {
				if key.topic == topic {
					fs.releasePartitionLocked(g, partition)
				}
			}
			fs.deliverLocked()
		}
		fs.cond.Broadcast()
		return
	}
	if partition == 0 && old != node && old >= 0 {
		for s := range fs.sessions {
			if s.node.idx != old {
				continue
			}
			for key, sub := range s.subs {
				if key.topic != topic {
					continue
				}
				fs.releaseLocked(sub)
				if !fs.silentMoves {
					fs.sendLocked(s, sub.corr, errFrame(wire.CodeNotLeader, "coordinator moved"))
					delete(s.subs, key)
				}
			}
		}
		fs.deliverLocked()
	}
	fs.cond.Broadcast()
}

// rotateLeadersLocked moves every partition of topic to the next node.
func (fs *fakeServer) rotateLeadersLocked(topic string) {
	for p := range fs.topics[topic].cfg.Partitions {
		if l := fs.leaderLocked(topic, p); l >= 0 {
			fs.setLeaderLocked(topic, p, (l+1)%len(fs.nodes))
		}
	}
}

// dropNodeLocked closes every connection of node, as if it crashed.
func (fs *fakeServer) dropNodeLocked(node int) {
	for s := range fs.sessions {
		if s.node.idx == node {
			fs.dropLocked(s)
		}
	}
}

// isCoordinatorLocked reports whether s's node serves topic's groups.
func (fs *fakeServer) isCoordinatorLocked(s *fakeSession, topic string) bool {
	return fs.leaderLocked(topic, 0) == s.node.idx
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
	fs.waitThawedLocked(s)
	if !ok || hello.Token != fs.token {
		fs.sendLocked(s, corr, &wire.Err{Code: wire.CodeAuthFailed, Message: "authentication failed"})
		graceful = true
		fs.mu.Unlock()
		return
	}
	fs.sendLocked(s, corr, &wire.HelloOK{Version: cmp.Or(fs.version, wire.VersionMax), NodeID: s.node.id, FrameBytesMax: wire.DefaultFrameBytesMax})
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
		fs.waitThawedLocked(s)
		if s.dead {
			fs.mu.Unlock()
			return
		}
		if b, ok := f.(*wire.PubBatch); ok {
			// Each record is the PUB it stands for; one frame answers them.
			var results []wire.PubResult
			drop := false
			for i, r := range b.Records {
				pub := b.Pub(i)
				reply, d := fs.handleLocked(s, r.Corr, &pub)
				if drop = d; drop {
					break
				}
				results = append(results, fakePubResult(r.Corr, reply))
			}
			if drop {
				fs.dropLocked(s)
				fs.mu.Unlock()
				return
			}
			if fs.reorderReplies {
				slices.Reverse(results)
			}
			fs.sendLocked(s, 0, &wire.PubBatchOK{Results: results})
			fs.cond.Broadcast()
			fs.mu.Unlock()
			continue
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

// fakePubResult is a PUB's reply as a record's result in a PUB_BATCH_OK.
func fakePubResult(corr uint64, reply wire.Frame) wire.PubResult {
	switch r := reply.(type) {
	case *wire.PubOK:
		return wire.NewPubResult(corr, *r, nil)
	case *wire.Err:
		return wire.NewPubResult(corr, wire.PubOK{}, r.AsError())
	}
	panic(fmt.Sprintf("a PUB answered %T", reply))
}

// waitThawedLocked holds a frame just read by a session of a frozen node
// until the node thaws (or the server closes). Caller holds fs.mu.
func (fs *fakeServer) waitThawedLocked(s *fakeSession) {
	for fs.frozen[s.node.idx] && !fs.closed {
		fs.cond.Wait()
	}
}

// freeze stops (or, with false, resumes) node's reading: see frozen.
func (fs *fakeServer) freeze(node int, frozen bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.frozen[node] = frozen
	fs.cond.Broadcast()
}

func errFrame(code wire.Code, format string, args ...any) *wire.Err {
	return &wire.Err{Code: code, Message: fmt.Sprintf(format, args...)}
}

// handleLocked applies one request and returns its reply (nil for none)
// and whether to drop the connection instead.
func (fs *fakeServer) handleLocked(s *fakeSession, corr uint64, f wire.Frame) (wire.Frame, bool) {
	switch f.(type) {
	case *wire.GroupIncarnation, *wire.GroupDeleteIncarnation:
		if fs.version != 0 && fs.version < wire.VersionGroupIncarnation {
			// A broker of before cannot decode them.
			return errFrame(wire.CodeBadFrame, "unknown frame type %d", uint8(f.Type())), true
		}
	}
	switch f := f.(type) {
	case *wire.Ping:
		return &wire.Pong{}, false
	case *wire.Declare:
		fs.declares++ // any node takes it, as if forwarded
		if t, ok := fs.topics[f.Topic.Name]; ok {
			if t.cfg != f.Topic {
				return errFrame(wire.CodeTopicConflict, "topic %s exists with another configuration", f.Topic.Name), false
			}
			return &wire.DeclareOK{Topic: t.cfg, Created: false}, false
		}
		fs.topics[f.Topic.Name] = &fakeTopic{cfg: f.Topic, parts: make([][]*wire.Msg, f.Topic.Partitions)}
		return &wire.DeclareOK{Topic: f.Topic, Created: true}, false
	case *wire.Describe:
		reply, closeConn := fs.handleLocked(s, corr, &f.Metadata)
		ok := reply.(*wire.MetadataOK)
		for i := range ok.Topics {
			ok.Topics[i].Incarnation = 1 // the fake never deletes a topic
		}
		return &wire.DescribeOK{Topics: ok.Topics}, closeConn
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
				pi := wire.PartitionInfo{Partition: uint32(p), Epoch: 1, StartSeq: 1, CommitSeq: uint64(len(recs)),
					ReadOnly: fs.readOnly[fakePart{n, uint32(p)}]}
				leader := fs.leaderLocked(n, uint32(p))
				if l, ok := fs.staleMeta[fakePart{n, uint32(p)}]; ok {
					leader = l // nodes that have not noticed the change yet
				}
				if leader >= 0 {
					pi.Leader, pi.LeaderAddr = fs.nodes[leader].id, fs.nodeAddr(leader)
					if a, ok := fs.advertised[leader]; ok {
						pi.LeaderAddr = a
					}
				}
				if len(fs.nodes) > 1 {
					for _, node := range fs.nodes {
						ri := wire.ReplicaInfo{Node: node.id, FlushedSeq: uint64(len(recs))}
						if leader == s.node.idx {
							ri.State = "InSync"
						}
						pi.Replicas = append(pi.Replicas, ri)
					}
				}
				info.Partitions = append(info.Partitions, pi)
			}
			ok.Topics = append(ok.Topics, info)
		}
		return ok, false
	case *wire.Pub:
		return fs.pubLocked(s, f)
	case *wire.Pull:
		return fs.pullLocked(s, corr, f), false
	case *wire.Ack:
		fs.acksAt[s.node.idx]++
		if !fs.isCoordinatorLocked(s, f.Topic) && !fs.perPartition {
			return errFrame(wire.CodeNotLeader, "not the coordinator of %s", f.Topic), false
		}
		fs.ackCount++
		if fs.onAck != nil {
			if e := fs.onAck(fs.ackCount); e != nil {
				return e, false
			}
		}
		if fs.onAckEntries != nil {
			if codes := fs.onAckEntries(fs.ackCount, len(f.Entries)); codes != nil {
				return &wire.AckOK{Results: codes}, false
			}
		}
		reply := fs.ackLocked(s, f.Topic, f.Group, f.Entries, false, 0)
		if fs.onAckApplied != nil {
			return fs.afterAppendLocked(s, f.Topic, fs.onAckApplied(fs.ackCount), reply)
		}
		return reply, false
	case *wire.Nack:
		if !fs.isCoordinatorLocked(s, f.Topic) && !fs.perPartition {
			return errFrame(wire.CodeNotLeader, "not the coordinator of %s", f.Topic), false
		}
		return fs.ackLocked(s, f.Topic, f.Group, f.Entries, true, f.DelayMs), false
	case *wire.GroupDelete, *wire.GroupDeleteForce:
		fs.oldGroupDeletes = append(fs.oldGroupDeletes, f)
		return &wire.GroupOK{}, false
	case *wire.GroupIncarnation:
		return &wire.GroupIncarnationOK{GroupRef: wire.GroupRef{Group: f.Group, Incarnation: fs.groupsDeleted[f.Group] + 1}}, false
	case *wire.GroupDeleteIncarnation:
		return fs.groupDeleteLocked(f)
	default:
		return errFrame(wire.CodeBadFrame, "unexpected %s", f.Type()), true
	}
}

// groupDeleteLocked deletes a group's incarnation as the coordinator
// does: an incarnation deleted before is OK and deletes nothing, one
// above the current is NOT_FOUND.
func (fs *fakeServer) groupDeleteLocked(f *wire.GroupDeleteIncarnation) (wire.Frame, bool) {
	fs.groupDeletes = append(fs.groupDeletes, *f)
	current := fs.groupsDeleted[f.Group] + 1
	switch {
	case f.Incarnation > current:
		return errFrame(wire.CodeNotFound, "group %s incarnation %d does not exist", f.Group, f.Incarnation), false
	case f.Incarnation == 0 || f.Incarnation == current:
		if fs.groupsDeleted == nil {
			fs.groupsDeleted = map[string]uint64{}
		}
		fs.groupsDeleted[f.Group] = current
	}
	if fs.onGroupDelete != nil && fs.onGroupDelete(len(fs.groupDeletes)) == fakeAppendThenDrop {
		return nil, true
	}
	return &wire.GroupOK{}, false
}

func (fs *fakeServer) pubLocked(s *fakeSession, f *wire.Pub) (wire.Frame, bool) {
	t, ok := fs.topics[f.Topic]
	if !ok {
		return errFrame(wire.CodeNotFound, "topic %s", f.Topic), false
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
	frame := fakePubFrame{node: s.node.idx, partition: p, auto: f.Partition == wire.PartitionAuto,
		producerID: f.ProducerID, producerSeq: f.ProducerSeq}
	refuse := func(code wire.Code) (wire.Frame, bool) {
		frame.code = code
		fs.pubFrames = append(fs.pubFrames, frame)
		return errFrame(code, "partition %d", p), false
	}
	switch {
	case fs.leaderLocked(f.Topic, p) != s.node.idx:
		return refuse(wire.CodeNotLeader)
	case fs.readOnly[fakePart{f.Topic, p}]:
		return refuse(wire.CodeQuorumLost)
	}
	fs.pubFrames = append(fs.pubFrames, frame)
	fs.accepted++
	action := fakeNormal
	if fs.onPub != nil {
		action = fs.onPub(fs.accepted)
	}
	if action == fakeDropBeforeAppend {
		return nil, true
	}
	key := fakeDedupKey{f.Topic, p, f.ProducerID, f.ProducerSeq}
	if f.ProducerID != 0 {
		if prev, dup := fs.dedup[key]; dup {
			prev.Duplicate = true
			return fs.afterAppendLocked(s, f.Topic, action, &prev)
		}
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
	return fs.afterAppendLocked(s, f.Topic, action, &ok2)
}

// afterAppendLocked applies the fault of action to an appended PUB (or an
// applied ACK) whose reply is ok, returning handleLocked's results.
func (fs *fakeServer) afterAppendLocked(s *fakeSession, topic string, action fakeAction, ok wire.Frame) (wire.Frame, bool) {
	switch action {
	case fakeAppendThenDrop:
		return nil, true
	case fakeAppendThenStepDown:
		fs.rotateLeadersLocked(topic)
		return errFrame(wire.CodeNotLeader, "stepped down"), false
	case fakeAppendThenCrash:
		fs.rotateLeadersLocked(topic)
		fs.dropNodeLocked(s.node.idx)
		return nil, true
	case fakeAppendThenElection, fakeAppendThenStaleMeta:
		for p := range fs.topics[topic].cfg.Partitions {
			fs.setLeaderLocked(topic, p, -1)
			if action == fakeAppendThenStaleMeta {
				if fs.staleMeta == nil {
					fs.staleMeta = map[fakePart]int{}
				}
				fs.staleMeta[fakePart{topic, p}] = s.node.idx
			}
		}
		return errFrame(wire.CodeNotLeader, "lost the lease"), false
	}
	return ok, false
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
	sub := s.subs[key]
	fs.pullsAt[s.node.idx]++
	if !fs.isCoordinatorLocked(s, f.Topic) && !(fs.silentMoves && sub != nil) && !fs.perPartition {
		fs.refusedAt[s.node.idx]++
		return errFrame(wire.CodeNotLeader, "not the coordinator of %s", f.Topic)
	}
	fs.groupLocked(key)
	if sub != nil && (sub.member != f.Member || sub.inc != f.Incarnation) {
		// Another incarnation on this connection: the old subscription
		// ends, its deliveries are released.
		fs.releaseLocked(sub)
		delete(s.subs, key)
		sub = nil
	}
	if sub == nil {
		sub = &fakeSub{node: s.node.idx, key: key, corr: corr, member: f.Member, inc: f.Incarnation}
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
			if fs.perPartition {
				fs.deliverLedLocked(s, sub)
				continue
			}
			if !fs.isCoordinatorLocked(s, sub.key.topic) {
				continue // a former coordinator (silentMoves)
			}
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

// deliverLedLocked sends sub the queued records of the partitions its node
// leads (perPartition), while it has credit.
func (fs *fakeServer) deliverLedLocked(s *fakeSession, sub *fakeSub) {
	g := fs.groups[sub.key]
	kept := g.queue[:0]
	for i, ref := range g.queue {
		if sub.credit == 0 || s.dead {
			kept = append(kept, g.queue[i:]...)
			break
		}
		if g.acked[ref] {
			continue
		}
		if fs.leaderLocked(sub.key.topic, ref.partition) != s.node.idx {
			kept = append(kept, ref)
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
	g.queue = kept
}

func (fs *fakeServer) ackLocked(s *fakeSession, topic, group string, entries []wire.AckEntry, nack bool, _ uint32) wire.Frame {
	g := fs.groups[subKey{topic, group}]
	if g == nil {
		return errFrame(wire.CodeNotFound, "group %s/%s", topic, group)
	}
	res := &wire.AckOK{}
	for _, e := range entries {
		ref := fakeRef{e.Partition, e.Seq}
		if fs.perPartition && fs.leaderLocked(topic, e.Partition) != s.node.idx {
			// This node does not lead the partition (any more): it
			// cannot tell whether the ack was durable.
			res.Results = append(res.Results, wire.CodeNotLeader)
			continue
		}
		if g.acked[ref] && !nack {
			res.Results = append(res.Results, wire.CodeOK) // acks are idempotent
			continue
		}
		if id, ok := g.current[ref]; !ok || id != e.DeliveryID {
			res.Results = append(res.Results, wire.CodeStaleDelivery)
			continue
		}
		if fs.perPartition && g.owner[ref].node != s.node.idx {
			res.Results = append(res.Results, wire.CodeStaleDelivery) // delivered by another node
			continue
		}
		delete(g.current, ref)
		delete(g.owner, ref)
		if nack {
			g.queue = append(g.queue, ref)
		} else {
			g.acked[ref] = true
			fs.ackedAt[ref] = s.node.idx
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

// wantAckFrames fails the test unless the fake received exactly want ACK
// frames at each node, in node order; why says what that means.
func (fs *fakeServer) wantAckFrames(why string, want ...int) {
	fs.t.Helper()
	fs.mu.Lock()
	got := slices.Clone(fs.acksAt)
	fs.mu.Unlock()
	if !slices.Equal(got, want) {
		fs.t.Fatalf("ACK frames by node = %v, want %v: %s", got, want, why)
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
