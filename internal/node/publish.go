package node

import (
	"sync/atomic"

	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Publish validates a client's PUB, routes it to its partition and arranges
// for reply to be called exactly once: with PUB_OK after the record is
// durable and visible, or with an error. It blocks only while the
// partition's queue is full. The frame's byte slices must stay valid until
// reply is called. A client may not publish into a dead-letter topic.
func (n *Node) Publish(pub *wire.Pub, reply PubReply) { n.PublishCorked(pub, reply, nil) }

// Corker is a connection that can hold its replies back and send a burst
// of them at once: between Cork and Uncork, replies are only queued.
type Corker interface {
	Cork()
	Uncork()
}

// PublishCorked is Publish for a reply that goes out on c (nil: none): the
// node corks c around a burst of PUB_OKs it sends from one goroutine, so
// that the burst leaves in one write, made on that goroutine.
func (n *Node) PublishCorked(pub *wire.Pub, reply PubReply, c Corker) {
	if err := wire.ValidateWritableTopic(pub.Topic); err != nil {
		reply(wire.PubOK{}, asWire(err))
		return
	}
	n.publish(pub, reply, c)
}

// publish is PublishCorked without the client's name rule: the group
// machinery publishes into dead-letter topics through it.
func (n *Node) publish(pub *wire.Pub, reply PubReply, c Corker) { n.publishInto(pub, 0, reply, c) }

// publishInto is publish into one incarnation of the topic when
// incarnation is not 0: a scheduled message whose lane vouched for its
// destination's incarnation must not land in a topic of the same name
// deleted and declared again since (that lane is ORDERING_BROKEN until
// an operator resumes it). The partition it is queued to belongs to the
// incarnation checked; a delete after that fails it there.
func (n *Node) publishInto(pub *wire.Pub, incarnation uint64, reply PubReply, c Corker) {
	r := &pubReq{reply: replyTo{fn: reply}, corker: c}
	if t, part, ok := n.prepare(pub, nil, incarnation, r); ok {
		r.queuedBytes = int64(storage.RecordBytes(&r.rec))
		t.partitions[part].enqueue(r)
	}
}

// PublishBatchCorked publishes each of pubs as PublishCorked would, in
// order, and answers each through reply with its index. The publishes
// for one partition reach its goroutine in one hand-off, and the batch
// costs one allocation for all its requests.
func (n *Node) PublishBatchCorked(pubs []wire.Pub, reply BatchReply, c Corker) {
	reqs := make([]pubReq, len(pubs))
	type chain struct {
		t          *topic
		part       uint32
		head, tail *pubReq
	}
	var chainsArr [1]chain // a batch goes to one partition, mostly
	chains := chainsArr[:0]
	var t *topic
	var valid *string // the last topic name that passed ValidateWritableTopic
	for i := range pubs {
		r := &reqs[i]
		r.reply, r.corker = replyTo{batch: reply, i: i}, c
		if name := &pubs[i].Topic; valid == nil || *name != *valid {
			if err := wire.ValidateWritableTopic(*name); err != nil {
				r.answer(wire.PubOK{}, asWire(err))
				continue
			}
			valid = name
		}
		tt, part, ok := n.prepare(&pubs[i], t, 0, r)
		if !ok {
			continue
		}
		t = tt
		j := 0
		for j < len(chains) && (chains[j].t != tt || chains[j].part != part) {
			j++
		}
		bytes := int64(storage.RecordBytes(&r.rec))
		if j == len(chains) {
			r.queuedBytes = bytes
			chains = append(chains, chain{t: tt, part: part, head: r, tail: r})
			continue
		}
		chains[j].head.queuedBytes += bytes
		chains[j].tail.next, chains[j].tail = r, r
	}
	for _, ch := range chains {
		ch.t.partitions[ch.part].enqueue(ch.head)
	}
}

// prepare validates pub and fills r with its record for the partition it
// picks, or answers r and reports false. t, when not nil, is a topic the
// caller looked up already: it is used when pub names it.
func (n *Node) prepare(pub *wire.Pub, t *topic, incarnation uint64, r *pubReq) (*topic, uint32, bool) {
	if t == nil || t.cfg.Name != pub.Topic {
		var err error
		if t, err = n.topic(pub.Topic); err != nil {
			r.answer(wire.PubOK{}, asWire(err))
			return nil, 0, false
		}
	}
	if incarnation != 0 && t.incarnation != incarnation && !n.cfg.Mutations.PublishIgnoresIncarnation {
		r.answer(wire.PubOK{}, wire.Errorf(wire.CodeNotFound, "topic %q incarnation %d was deleted (it is incarnation %d now)", pub.Topic, incarnation, t.incarnation))
		return nil, 0, false
	}
	if werr := n.validateRecord(pub); werr != nil {
		r.answer(wire.PubOK{}, werr)
		return nil, 0, false
	}
	part, werr := t.partitionFor(pub)
	if werr != nil {
		r.answer(wire.PubOK{}, werr)
		return nil, 0, false
	}
	ts := pub.TimestampMs
	if ts == 0 {
		ts = n.nowMs()
	}
	var headers []storage.Header
	if len(pub.Headers) > 0 {
		headers = make([]storage.Header, len(pub.Headers))
		for i, h := range pub.Headers {
			headers[i] = storage.Header{Key: h.Key, Value: h.Value}
		}
	}
	r.rec = storage.Record{TimestampMs: ts, Key: pub.Key, Value: pub.Value, Headers: headers,
		ProducerID: pub.ProducerID, ProducerSeq: pub.ProducerSeq}
	r.producerID, r.producerSeq = pub.ProducerID, pub.ProducerSeq
	return t, part, true
}

// partitionFor picks pub's partition: the one it names, else by key
// hash, else by producer identity (a replay lands where the original
// did), else round-robin.
func (t *topic) partitionFor(pub *wire.Pub) (uint32, *wire.Error) {
	count := uint32(len(t.partitions))
	switch {
	case pub.Partition >= 0:
		if uint32(pub.Partition) >= count {
			return 0, wire.Errorf(wire.CodeNotFound, "topic %q has no partition %d", pub.Topic, pub.Partition)
		}
		return uint32(pub.Partition), nil
	case pub.Partition != wire.PartitionAuto:
		return 0, wire.Errorf(wire.CodeInvalidArgument, "partition %d", pub.Partition)
	case len(pub.Key) > 0:
		return wire.PartitionForKey(pub.Key, count), nil
	case pub.ProducerID != 0:
		return wire.PartitionForProducer(pub.ProducerID, pub.ProducerSeq, count), nil
	}
	return atomic.AddUint32(&t.rr, 1) % count, nil
}

func (n *Node) validateRecord(pub *wire.Pub) *wire.Error {
	if len(pub.Headers) > wire.HeadersMax {
		return wire.Errorf(wire.CodeInvalidArgument, "%d headers exceed the limit of %d", len(pub.Headers), wire.HeadersMax)
	}
	size := len(pub.Key) + len(pub.Value)
	for _, h := range pub.Headers {
		if len(h.Key) == 0 || len(h.Key) > wire.HeaderKeyBytesMax {
			return wire.Errorf(wire.CodeInvalidArgument, "header key must be 1-%d bytes", wire.HeaderKeyBytesMax)
		}
		if h.Key == replog.ControlHeader {
			return wire.Errorf(wire.CodeInvalidArgument, "header %q is reserved", h.Key)
		}
		size += len(h.Key) + len(h.Value)
	}
	if size > n.cfg.RecordBytesMax {
		return wire.Errorf(wire.CodeInvalidArgument, "record of %d bytes exceeds the limit of %d", size, n.cfg.RecordBytesMax)
	}
	return nil
}

// asWire converts any error to a protocol error, keeping a *wire.Error's code.
func asWire(err error) *wire.Error {
	if we, ok := err.(*wire.Error); ok {
		return we
	}
	return wire.Errorf(wire.CodeStorage, "%v", err)
}
