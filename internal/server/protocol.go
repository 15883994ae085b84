package server

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Protocol is the transport-independent half of a client connection: it
// turns decoded frames into node calls and replies into frames passed to
// send. The TCP session drives it in production; the simulator drives it
// over its simulated network. It is not safe for concurrent use except that
// send may be called from any goroutine (replies and deliveries arrive from
// the node's goroutines).
type Protocol struct {
	srv    *Server
	send   func(corr uint64, f wire.Frame)
	corker node.Corker // of the connection send writes to; nil: none
	remote string
	subs   map[subKey]*node.Subscription
	perms  perms // of the token HELLO presented
	// version is the protocol version HELLO_OK chose.
	version uint16
	// declaring: a DECLARE is in progress and the frames after it wait in
	// held, so that a pipelined DECLARE-then-PUB (or PULL) finds its
	// topic. Only a Manual cluster node answers a DECLARE later than the
	// call (production answers before DeclareAsync returns).
	declaring bool
	held      []heldFrame
	// broken: a held frame, handled late, asked for the connection to
	// close; the next Handle says so.
	broken bool
	// members joined on this connection (their notices stop at Close);
	// JOIN answers may come from the metadata applier's goroutine, after
	// Close (closed).
	membersMu sync.Mutex
	members   []wire.MemberRef
	closed    bool
	// kv: the connection's KV watches (kv.go).
	kv kvSession
}

type heldFrame struct {
	corr uint64
	f    wire.Frame
	buf  *readBuf
}

// heldFramesMax bounds the frames a connection may pipeline behind a
// DECLARE in progress.
const heldFramesMax = 1024

type subKey struct{ topic, group string }

// NewProtocol returns the protocol state of one new connection. remote
// names the peer in logs.
func (s *Server) NewProtocol(send func(corr uint64, f wire.Frame), remote string) *Protocol {
	return &Protocol{srv: s, send: send, remote: remote, subs: map[subKey]*node.Subscription{}}
}

// HelloVerdict is the answer to a connection's first frame: send Reply after
// Delay; close the connection unless Accepted.
type HelloVerdict struct {
	Accepted bool
	Delay    time.Duration
	Reply    wire.Frame
}

// Hello checks a connection's first frame: it must be HELLO with a valid
// token and a common version. A bad token gets a generic AUTH_FAILED after a
// fixed delay, so timing tells an attacker nothing.
func (p *Protocol) Hello(corr uint64, f wire.Frame) HelloVerdict {
	hello, ok := f.(*wire.Hello)
	if !ok {
		return HelloVerdict{Reply: errFrame(wire.Errorf(wire.CodeNotAuthenticated, "first frame must be HELLO, got %s", f.Type()))}
	}
	granted, ok := p.srv.authenticate(hello.Token)
	if !ok {
		p.srv.node.Metrics().AuthFailures.Inc()
		p.srv.log.Warn("authentication failed", "remote", p.remote)
		return HelloVerdict{Delay: p.srv.cfg.AuthFailDelay, Reply: errFrame(wire.ErrAuthFailed)}
	}
	if hello.VersionMax < wire.VersionMin || hello.VersionMin > wire.VersionMax || hello.VersionMin > hello.VersionMax {
		return HelloVerdict{Reply: errFrame(wire.Errorf(wire.CodeUnsupportedVer, "server speaks %d-%d, client %d-%d",
			wire.VersionMin, wire.VersionMax, hello.VersionMin, hello.VersionMax))}
	}
	p.perms = granted
	p.version = min(hello.VersionMax, wire.VersionMax)
	return HelloVerdict{Accepted: true, Reply: &wire.HelloOK{Version: p.version,
		NodeID: p.srv.node.NodeID(), FrameBytesMax: uint32(p.srv.cfg.FrameBytesMax)}}
}

// ReadFailed answers a frame that could not be decoded with its ERR
// (BAD_FRAME, FRAME_TOO_LARGE) and reports whether it was such a protocol
// error. The connection must close either way.
func (p *Protocol) ReadFailed(corr uint64, err error) bool {
	var we *wire.Error
	if !errors.As(err, &we) {
		return false
	}
	p.srv.log.Warn("bad frame; closing connection", "remote", p.remote, "err", err)
	p.sendErr(corr, we)
	return true
}

// Close ends the connection's subscriptions (their deliveries are released).
func (p *Protocol) Close() {
	for _, h := range p.held {
		releaseReadBuf(h.buf)
	}
	p.held = nil
	for _, sub := range p.subs {
		sub.Close()
	}
	p.subs = nil
	p.kv.close()
	p.membersMu.Lock()
	members := p.members
	p.members = nil
	p.closed = true
	p.membersMu.Unlock()
	for _, m := range members {
		p.srv.node.DropNotices(m)
	}
}

func errFrame(err error) *wire.Err {
	var we *wire.Error
	if !errors.As(err, &we) {
		we = wire.Errorf(wire.CodeStorage, "%v", err)
	}
	return &wire.Err{Code: we.Code, Message: we.Message}
}

func (p *Protocol) sendErr(corr uint64, err error) { p.send(corr, errFrame(err)) }

// protocolSink delivers a subscription's MSG frames with its correlation id.
type protocolSink struct {
	p    *Protocol
	corr uint64
}

func (k protocolSink) SendMsg(m *wire.Msg) { k.p.send(k.corr, m) }

// End answers the subscription's PULL corr with the error; the next PULL
// subscribes again (Protocol.pull checks Ended).
func (k protocolSink) End(err *wire.Error) { k.p.sendErr(k.corr, err) }

// Handle routes one request after the handshake; it returns false when the
// connection must close.
func (p *Protocol) Handle(corr uint64, f wire.Frame) bool { return p.handle(corr, f, nil) }

// handle is Handle for a frame read into the pooled buffer buf (nil: not
// pooled), which it releases once the frame's bytes are no longer needed.
func (p *Protocol) handle(corr uint64, f wire.Frame, buf *readBuf) bool {
	if p.broken {
		releaseReadBuf(buf)
		return false
	}
	if p.declaring {
		if len(p.held) >= heldFramesMax {
			releaseReadBuf(buf)
			p.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "more than %d requests pipelined behind a DECLARE in progress", heldFramesMax))
			return false
		}
		p.held = append(p.held, heldFrame{corr, f, buf})
		return true
	}
	if f, ok := f.(*wire.PubBatch); ok {
		if p.version < wire.VersionPubBatch {
			releaseReadBuf(buf)
			p.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "PUB_BATCH needs protocol version %d; this connection speaks %d", wire.VersionPubBatch, p.version))
			return false
		}
		p.publishBatch(f, buf)
		return true
	}
	if err := p.authorize(f); err != nil {
		releaseReadBuf(buf)
		p.sendErr(corr, err)
		return true
	}
	if f, ok := f.(*wire.Pub); ok {
		p.publish(corr, f, buf)
		return true
	}
	// Only PUB frames alias their buffer beyond this call.
	defer releaseReadBuf(buf)
	if err := p.authorizeKV(f); err != nil {
		p.sendErr(corr, err)
		return true
	}
	if p.handleKV(corr, f) {
		return true
	}
	n := p.srv.node
	switch f := f.(type) {
	case *wire.Declare:
		p.declaring = true
		n.DeclareAsync(f.Topic, func(created bool, err error) {
			if err != nil {
				p.sendErr(corr, err)
			} else {
				p.send(corr, &wire.DeclareOK{Topic: f.Topic, Created: created})
			}
			p.declaring = false
			p.handleHeld()
		})
	case *wire.Metadata:
		if topics, err := p.metadata(f); err != nil {
			p.sendErr(corr, err)
		} else {
			p.send(corr, &wire.MetadataOK{Topics: topics})
		}
	case *wire.Describe:
		if topics, err := p.metadata(&f.Metadata); err != nil {
			p.sendErr(corr, err)
		} else {
			p.send(corr, &wire.DescribeOK{Topics: topics})
		}
	case *wire.TopicDelete:
		n.DeleteTopic(f.Topic, f.Incarnation, func(deleted uint64, err error) {
			if err != nil {
				p.sendErr(corr, err)
				return
			}
			p.send(corr, &wire.TopicDeleteOK{TopicRef: wire.TopicRef{Topic: f.Topic, Incarnation: deleted}})
		})
	case *wire.TopicUpdate:
		if p.version < wire.VersionTopicUpdate {
			p.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "TOPIC_UPDATE needs protocol version %d; this connection speaks %d", wire.VersionTopicUpdate, p.version))
			return true
		}
		n.UpdateTopic(*f, func(cfg wire.TopicConfig, incarnation uint64, err error) {
			if err != nil {
				p.sendErr(corr, err)
				return
			}
			p.send(corr, &wire.TopicUpdateOK{Topic: cfg, Incarnation: incarnation})
		})
	case *wire.Pull:
		p.pull(corr, f)
	case *wire.Ack:
		n.Ack(f.Topic, f.Group, f.Entries, p.ackReply(corr))
	case *wire.Nack:
		n.Nack(f.Topic, f.Group, f.Entries, int64(f.DelayMs), p.ackReply(corr))
	case *wire.Join:
		p.join(corr, f)
	case *wire.GroupList:
		infos, err := n.GroupInfos(f.Group)
		if err != nil {
			p.sendErr(corr, err)
			break
		}
		p.send(corr, &wire.GroupListOK{Groups: infos})
	case *wire.GroupDelete:
		p.deleteGroup(corr, f.Group, false, 0)
	case *wire.GroupDeleteForce:
		p.deleteGroup(corr, f.Group, true, 0)
	case *wire.GroupDeleteIncarnation:
		p.deleteGroup(corr, f.Group, f.Force, f.Incarnation)
	case *wire.GroupUpdate:
		if p.version < wire.VersionGroupUpdate {
			p.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "GROUP_UPDATE needs protocol version %d; this connection speaks %d", wire.VersionGroupUpdate, p.version))
			return true
		}
		n.UpdateGroup(*f, func(ok wire.GroupUpdateOK, err error) {
			if err != nil {
				p.sendErr(corr, err)
				return
			}
			p.send(corr, &ok)
		})
	case *wire.GroupIncarnation:
		inc, err := n.CoordinatorGroupIncarnation(f.Group)
		if err != nil {
			p.sendErr(corr, err)
			break
		}
		p.send(corr, &wire.GroupIncarnationOK{GroupRef: wire.GroupRef{Group: f.Group, Incarnation: inc}})
	case *wire.Leave, *wire.Heartbeat, *wire.ControlAck:
		n.GroupRequest(f, func(epoch uint64, err error) {
			if err != nil {
				p.sendErr(corr, err)
				return
			}
			p.send(corr, &wire.GroupOK{MembershipEpoch: epoch})
		})
	case *wire.Schedule:
		p.schedule(corr, f)
	case *wire.SchedAdmin:
		p.schedAdmin(corr, f)
	case *wire.SchedListPage:
		p.schedListPage(corr, f)
	case *wire.Ping:
		p.send(corr, &wire.Pong{})
	case *wire.Hello:
		p.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "HELLO after the handshake"))
		return false
	default:
		p.sendErr(corr, wire.Errorf(wire.CodeBadFrame, "%s is not a request", f.Type()))
		return false
	}
	return true
}

// metadata answers METADATA and DESCRIBE.
func (p *Protocol) metadata(f *wire.Metadata) ([]wire.TopicInfo, error) {
	for _, name := range f.Topics {
		if name == wire.CoordinatorTopic || name == wire.SchedTopic {
			continue // where the groups' coordinator is, or the schedule shards' leaders
		}
		if err := wire.ValidateName("topic", name); err != nil {
			return nil, err
		}
	}
	return p.srv.node.Metadata(f.Topics), nil
}

// handleHeld handles the frames that waited for a DECLARE, in order, until
// another DECLARE makes the rest wait again.
func (p *Protocol) handleHeld() {
	for len(p.held) > 0 && !p.declaring && !p.broken {
		h := p.held[0]
		p.held[0] = heldFrame{}
		p.held = p.held[1:]
		if !p.handle(h.corr, h.f, h.buf) {
			p.broken = true
		}
	}
}

// publish hands a PUB to the node. Its key, value and headers alias buf,
// which is released when the node answers: it copies the record first.
func (p *Protocol) publish(corr uint64, f *wire.Pub, buf *readBuf) {
	p.srv.node.PublishCorked(f, answerOnce(func(ok wire.PubOK, err *wire.Error) {
		releaseReadBuf(buf)
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.send(corr, &ok)
	}), p.corker)
}

// answerOnce returns a reply that passes on only its first answer. The
// node answers once; a second answer must not put a frame's buffer back
// in the pool twice (two frames would share it), nor send a second reply.
func answerOnce(answer node.PubReply) node.PubReply {
	var answered atomic.Bool
	return func(ok wire.PubOK, err *wire.Error) {
		if !answered.Swap(true) {
			answer(ok, err)
		}
	}
}

// publishBatch hands each record of a PUB_BATCH to the node as the PUB it
// stands for, in order, and answers them all in one PUB_BATCH_OK once the
// last has its outcome. Their keys, values and headers alias buf, released
// then. A refusal that concerns the whole frame (the token may not publish
// to the topic) is each record's result.
func (p *Protocol) publishBatch(f *wire.PubBatch, buf *readBuf) {
	b := newBatchResults(len(f.Records))
	answer := func(i int, ok wire.PubOK, err *wire.Error) {
		if b.add(i, f.Records[i].Corr, ok, err) {
			releaseReadBuf(buf)
			p.send(0, &wire.PubBatchOK{Results: b.results})
		}
	}
	if !p.perms.canPublish(f.Topic) {
		err := wire.Errorf(wire.CodeUnauthorized, "token may not publish to %q", f.Topic)
		for i := range f.Records {
			answer(i, wire.PubOK{}, err)
		}
		return
	}
	pubs := make([]wire.Pub, len(f.Records)) // the node copies what it keeps of them before returning
	for i := range f.Records {
		pubs[i] = f.Pub(i)
	}
	p.srv.node.PublishBatchCorked(pubs, answer, p.corker)
}

// batchResults gathers the results of a PUB_BATCH's records as they come,
// from any goroutine.
type batchResults struct {
	results  []wire.PubResult
	answered []atomic.Bool
	left     atomic.Int32
}

func newBatchResults(n int) *batchResults {
	b := &batchResults{results: make([]wire.PubResult, n), answered: make([]atomic.Bool, n)}
	b.left.Store(int32(n))
	return b
}

// add records record i's outcome and reports whether it was the last
// one missing: the caller then sends the results. A record answered again
// is ignored (the node answers once): counted twice, it would send the
// frame before its last result and release the frame's buffer twice.
func (b *batchResults) add(i int, corr uint64, ok wire.PubOK, err *wire.Error) (complete bool) {
	if b.answered[i].Swap(true) {
		return false
	}
	b.results[i] = wire.NewPubResult(corr, ok, err)
	return b.left.Add(-1) == 0
}

// authorize checks a request against the token's permissions.
func (p *Protocol) authorize(f wire.Frame) error {
	switch f := f.(type) {
	case *wire.Declare:
		if !p.perms.canDeclare() {
			return wire.Errorf(wire.CodeUnauthorized, "token may not declare topics")
		}
	case *wire.Pub:
		if !p.perms.canPublish(f.Topic) {
			return wire.Errorf(wire.CodeUnauthorized, "token may not publish to %q", f.Topic)
		}
	case *wire.Pull:
		if !p.perms.canConsume(f.Topic) {
			return wire.Errorf(wire.CodeUnauthorized, "token may not consume %q", f.Topic)
		}
	case *wire.Ack:
		if !p.perms.canConsume(f.Topic) {
			return wire.Errorf(wire.CodeUnauthorized, "token may not consume %q", f.Topic)
		}
	case *wire.Nack:
		if !p.perms.canConsume(f.Topic) {
			return wire.Errorf(wire.CodeUnauthorized, "token may not consume %q", f.Topic)
		}
	case *wire.GroupDelete, *wire.GroupDeleteForce, *wire.GroupDeleteIncarnation:
		if !p.perms.canDeclare() {
			return wire.Errorf(wire.CodeUnauthorized, "token may not delete groups")
		}
	case *wire.TopicDelete:
		if !p.perms.canDeclare() {
			return wire.Errorf(wire.CodeUnauthorized, "token may not delete topics")
		}
	case *wire.TopicUpdate:
		if !p.perms.canDeclare() {
			return wire.Errorf(wire.CodeUnauthorized, "token may not update topics")
		}
	case *wire.GroupUpdate:
		if !p.perms.canDeclare() {
			return wire.Errorf(wire.CodeUnauthorized, "token may not update groups")
		}
	case *wire.Schedule:
		if !p.perms.canPublish(f.Pub.Topic) {
			return wire.Errorf(wire.CodeUnauthorized, "token may not publish to %q", f.Pub.Topic)
		}
	case *wire.SchedAdmin:
		if (f.Op == wire.SchedCancel || f.Op == wire.SchedLane) && !p.perms.canDeclare() {
			return wire.Errorf(wire.CodeUnauthorized, "token may not cancel schedules or command lanes")
		}
	case *wire.Join:
		for _, t := range f.Topics {
			if !p.perms.canConsume(t) {
				return wire.Errorf(wire.CodeUnauthorized, "token may not consume %q", t)
			}
		}
	}
	return nil
}

// deleteGroup answers GROUP_DELETE (force: GROUP_DELETE_FORCE; with an
// incarnation: GROUP_DELETE_INCARNATION).
func (p *Protocol) deleteGroup(corr uint64, name string, force bool, incarnation uint64) {
	p.srv.node.DeleteGroup(name, force, incarnation, func(err error) {
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.send(corr, &wire.GroupOK{})
	})
}

// join joins the connection's member to its group; the member's NOTICEs
// come with corr until the connection closes.
func (p *Protocol) join(corr uint64, f *wire.Join) {
	p.srv.node.JoinGroup(f, noticeSink{p: p, corr: corr}, func(ok *wire.JoinOK, err error) {
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		ref := wire.MemberRef{Group: f.Group, Member: f.Member, Incarnation: ok.Incarnation}
		p.membersMu.Lock()
		closed := p.closed
		if !closed {
			p.members = append(p.members, ref)
		}
		p.membersMu.Unlock()
		if closed {
			// Answered after the connection closed: Close could not drop
			// this member's notices, which nobody would hear.
			p.srv.node.DropNotices(ref)
			return
		}
		p.send(corr, ok)
	})
}

// noticeSink pushes a member's NOTICEs with its JOIN's correlation id.
type noticeSink struct {
	p    *Protocol
	corr uint64
}

func (k noticeSink) SendNotice(n *wire.Notice) { k.p.send(k.corr, n) }

func (p *Protocol) ackReply(corr uint64) node.AckReply {
	return func(results []wire.Code, err *wire.Error) {
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.send(corr, &wire.AckOK{Results: results})
	}
}

func (p *Protocol) pull(corr uint64, f *wire.Pull) {
	key := subKey{topic: f.Topic, group: f.Group}
	sub, ok := p.subs[key]
	if ok && sub.Ended() {
		delete(p.subs, key)
		ok = false
	}
	if ok && !sub.Serves(f.Member, f.Incarnation) {
		// Another member incarnation on this connection (it joined
		// again): the old subscription's deliveries are released.
		sub.Close()
		delete(p.subs, key)
		ok = false
	}
	if !ok {
		var err error
		sub, err = p.srv.node.Subscribe(f.Topic, f.Group,
			node.GroupOptions{AckWaitMs: int64(f.AckWaitMs), MaxDeliver: f.MaxDeliver, Member: f.Member, Incarnation: f.Incarnation},
			protocolSink{p: p, corr: corr})
		if err != nil {
			p.sendErr(corr, err)
			return
		}
		p.subs[key] = sub
	}
	if f.Credit > 0 {
		sub.AddCredit(f.Credit)
	}
}
