package wire

import (
	"encoding/binary"
	"fmt"
)

// FrameType identifies a frame. Values are stable across releases.
type FrameType uint8

// Frame types of protocol v1.
const (
	TypeHello      FrameType = 1
	TypeHelloOK    FrameType = 2
	TypeErr        FrameType = 3
	TypeDeclare    FrameType = 4
	TypeDeclareOK  FrameType = 5
	TypeMetadata   FrameType = 6
	TypeMetadataOK FrameType = 7
	TypePub        FrameType = 8
	TypePubOK      FrameType = 9
	TypePull       FrameType = 10
	TypeMsg        FrameType = 11
	TypeAck        FrameType = 12
	TypeAckOK      FrameType = 13
	TypeNack       FrameType = 14
	TypePing       FrameType = 15
	TypePong       FrameType = 16
)

var typeNames = map[FrameType]string{
	TypeHello: "HELLO", TypeHelloOK: "HELLO_OK", TypeErr: "ERR",
	TypeDeclare: "DECLARE", TypeDeclareOK: "DECLARE_OK",
	TypeMetadata: "METADATA", TypeMetadataOK: "METADATA_OK",
	TypePub: "PUB", TypePubOK: "PUB_OK", TypePull: "PULL", TypeMsg: "MSG",
	TypeAck: "ACK", TypeAckOK: "ACK_OK", TypeNack: "NACK",
	TypePing: "PING", TypePong: "PONG",
	TypePubBatch: "PUB_BATCH", TypePubBatchOK: "PUB_BATCH_OK",
}

func (t FrameType) String() string {
	if s, ok := typeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("FRAME_%d", uint8(t))
}

// Frame is one protocol message. Implementations are the structs below.
type Frame interface {
	Type() FrameType
	appendBody(b []byte) []byte
	decodeBody(d *decoder)
}

func newFrame(t FrameType) Frame {
	switch t {
	case TypeHello:
		return &Hello{}
	case TypeHelloOK:
		return &HelloOK{}
	case TypeErr:
		return &Err{}
	case TypeDeclare:
		return &Declare{}
	case TypeDeclareOK:
		return &DeclareOK{}
	case TypeMetadata:
		return &Metadata{}
	case TypeMetadataOK:
		return &MetadataOK{}
	case TypePub:
		return &Pub{}
	case TypePubOK:
		return &PubOK{}
	case TypePull:
		return &Pull{}
	case TypeMsg:
		return &Msg{}
	case TypeAck:
		return &Ack{}
	case TypeAckOK:
		return &AckOK{}
	case TypeNack:
		return &Nack{}
	case TypePing:
		return &Ping{}
	case TypePong:
		return &Pong{}
	case TypePubBatch:
		return &PubBatch{}
	case TypePubBatchOK:
		return &PubBatchOK{}
	case TypePeerHello:
		return &PeerHello{}
	case TypePeerChallenge:
		return &PeerChallenge{}
	case TypePeerAuth:
		return &PeerAuth{}
	case TypeReplicate:
		return &Replicate{}
	case TypePeerDeclare:
		return &PeerDeclare{}
	case TypePeerDeclareOK:
		return &PeerDeclareOK{}
	case TypePeerPublish:
		return &PeerPublish{}
	case TypePeerPublishOK:
		return &PeerPublishOK{}
	}
	return newGroupFrame(t)
}

// Hello is the first frame of every connection: version range and token.
type Hello struct {
	VersionMin, VersionMax uint16
	Token                  string
	ClientName             string
}

func (*Hello) Type() FrameType { return TypeHello }
func (f *Hello) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, f.VersionMin)
	b = binary.BigEndian.AppendUint16(b, f.VersionMax)
	b = appendStr(b, f.Token)
	return appendStr(b, f.ClientName)
}
func (f *Hello) decodeBody(d *decoder) {
	f.VersionMin, f.VersionMax = d.u16(), d.u16()
	f.Token, f.ClientName = d.str(), d.str()
}

// HelloOK accepts a connection: the chosen version and the frame bound.
type HelloOK struct {
	Version       uint16
	NodeID        string
	FrameBytesMax uint32
}

func (*HelloOK) Type() FrameType { return TypeHelloOK }
func (f *HelloOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, f.Version)
	b = appendStr(b, f.NodeID)
	return binary.BigEndian.AppendUint32(b, f.FrameBytesMax)
}
func (f *HelloOK) decodeBody(d *decoder) {
	f.Version, f.NodeID, f.FrameBytesMax = d.u16(), d.str(), d.u32()
}

// Err answers a request that failed. Its correlation id is the request's.
type Err struct {
	Code    Code
	Message string
}

func (*Err) Type() FrameType { return TypeErr }
func (f *Err) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(f.Code))
	return appendStr(b, f.Message)
}
func (f *Err) decodeBody(d *decoder) { f.Code, f.Message = Code(d.u16()), d.str() }

// AsError converts the frame to an *Error.
func (f *Err) AsError() *Error { return &Error{Code: f.Code, Message: f.Message} }

// TopicConfig is what a DECLARE fixes about a topic.
type TopicConfig struct {
	Name           string
	Partitions     uint32
	RetentionMs    int64 // 0 = unlimited
	RetentionBytes int64 // per partition; 0 = unlimited
	// Replicas is the replication factor (1, 3 or 5); 0 asks for the
	// node's default (1 on a single node, 3 in a cluster of 3 or more).
	Replicas uint8
	// Ack is the ack policy of replicated partitions.
	Ack AckPolicy
}

// AckPolicy says when a replicated record is visible and acknowledged.
type AckPolicy uint8

const (
	// AckQuorum: once a majority of the replicas has fsynced it.
	AckQuorum AckPolicy = iota
	// AckAll: once every replica has fsynced it; a lagging replica blocks
	// writes (they fail with QUORUM_LOST), never a silent downgrade.
	AckAll
)

func (a AckPolicy) String() string {
	if a == AckAll {
		return "all"
	}
	return "quorum"
}

// ParseAckPolicy parses "quorum" or "all".
func ParseAckPolicy(s string) (AckPolicy, error) {
	switch s {
	case "quorum", "sync_quorum", "":
		return AckQuorum, nil
	case "all", "sync_all":
		return AckAll, nil
	}
	return 0, fmt.Errorf("ack policy %q: want quorum or all", s)
}

func (c *TopicConfig) append(b []byte) []byte {
	b = appendStr(b, c.Name)
	b = binary.BigEndian.AppendUint32(b, c.Partitions)
	b = binary.BigEndian.AppendUint64(b, uint64(c.RetentionMs))
	b = binary.BigEndian.AppendUint64(b, uint64(c.RetentionBytes))
	return append(b, c.Replicas, uint8(c.Ack))
}
func (c *TopicConfig) decode(d *decoder) {
	c.Name, c.Partitions = d.str(), d.u32()
	c.RetentionMs, c.RetentionBytes = int64(d.u64()), int64(d.u64())
	c.Replicas, c.Ack = d.u8(), AckPolicy(d.u8())
}

const topicConfigBytesMin = 2 + 4 + 8 + 8 + 1 + 1

// Declare creates a topic, or confirms an identical one.
type Declare struct{ Topic TopicConfig }

func (*Declare) Type() FrameType              { return TypeDeclare }
func (f *Declare) appendBody(b []byte) []byte { return f.Topic.append(b) }
func (f *Declare) decodeBody(d *decoder)      { f.Topic.decode(d) }

// DeclareOK confirms a DECLARE. Created is false when the topic existed.
type DeclareOK struct {
	Topic   TopicConfig
	Created bool
}

func (*DeclareOK) Type() FrameType { return TypeDeclareOK }
func (f *DeclareOK) appendBody(b []byte) []byte {
	return appendBool(f.Topic.append(b), f.Created)
}
func (f *DeclareOK) decodeBody(d *decoder) { f.Topic.decode(d); f.Created = d.boolean() }

// Metadata asks for topic configurations; an empty list means all topics.
type Metadata struct{ Topics []string }

func (*Metadata) Type() FrameType { return TypeMetadata }
func (f *Metadata) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Topics)))
	for _, t := range f.Topics {
		b = appendStr(b, t)
	}
	return b
}
func (f *Metadata) decodeBody(d *decoder) {
	n := d.listLen(2)
	f.Topics = make([]string, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		f.Topics = append(f.Topics, d.str())
	}
}

// PartitionInfo describes one partition in a METADATA_OK.
type PartitionInfo struct {
	Partition uint32
	Epoch     uint64
	StartSeq  uint64 // oldest retained seq
	CommitSeq uint64 // last visible seq
	// Leader is the node id of the partition's leader as the answering node
	// knows it ("" = unknown: an election is running), and LeaderAddr its
	// client address ("" = unknown). On a single node both name that node.
	Leader     string
	LeaderAddr string
	// ReadOnly: the leader lost its ack quorum (READ_ONLY_DEGRADED).
	ReadOnly bool
	// Replicas lists the replica group (empty on a single node).
	Replicas []ReplicaInfo
	// State is "" for a healthy partition and "corrupt" when the
	// answering node found damage in its log (it refuses publishes with
	// DATA_CORRUPT until repaired).
	State string
}

// PartitionStateCorrupt is PartitionInfo.State of a damaged partition.
const PartitionStateCorrupt = "corrupt"

// ReplicaInfo is one member of a partition's replica group as the
// answering node sees it. State is InSync, CatchingUp, NeedsRebuild,
// Rebuilding or Unreachable when the answering node leads the partition;
// a follower fills in only its own entry, Rebuilding or Uncertain; else "".
type ReplicaInfo struct {
	Node       string
	State      string
	FlushedSeq uint64
}

// TopicInfo is a topic and the state of its partitions.
type TopicInfo struct {
	Config     TopicConfig
	Partitions []PartitionInfo
	// Incarnation numbers this life of the topic's name (1 for its first
	// declare, one more after each delete). DESCRIBE_OK carries it;
	// METADATA_OK, whose layout is v1's, does not (0 there).
	Incarnation uint64
}

// MetadataOK answers METADATA. Requested topics that do not exist are absent.
type MetadataOK struct{ Topics []TopicInfo }

func (*MetadataOK) Type() FrameType              { return TypeMetadataOK }
func (f *MetadataOK) appendBody(b []byte) []byte { return appendTopicInfos(b, f.Topics, false) }
func (f *MetadataOK) decodeBody(d *decoder)      { f.Topics = decodeTopicInfos(d, false) }

// appendTopicInfos encodes METADATA_OK's list of topics, each followed by
// its incarnation when withIncarnation is set (DESCRIBE_OK).
func appendTopicInfos(b []byte, topics []TopicInfo, withIncarnation bool) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(topics)))
	for i := range topics {
		t := &topics[i]
		b = t.Config.append(b)
		if withIncarnation {
			b = binary.BigEndian.AppendUint64(b, t.Incarnation)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(t.Partitions)))
		for _, p := range t.Partitions {
			b = binary.BigEndian.AppendUint32(b, p.Partition)
			b = binary.BigEndian.AppendUint64(b, p.Epoch)
			b = binary.BigEndian.AppendUint64(b, p.StartSeq)
			b = binary.BigEndian.AppendUint64(b, p.CommitSeq)
			b = appendStr(b, p.Leader)
			b = appendStr(b, p.LeaderAddr)
			b = appendBool(b, p.ReadOnly)
			b = binary.BigEndian.AppendUint32(b, uint32(len(p.Replicas)))
			for _, r := range p.Replicas {
				b = appendStr(b, r.Node)
				b = appendStr(b, r.State)
				b = binary.BigEndian.AppendUint64(b, r.FlushedSeq)
			}
			b = appendStr(b, p.State)
		}
	}
	return b
}

func decodeTopicInfos(d *decoder, withIncarnation bool) []TopicInfo {
	n := d.listLen(topicConfigBytesMin + 4)
	topics := make([]TopicInfo, n)
	for i := 0; i < n && d.err == nil; i++ {
		t := &topics[i]
		t.Config.decode(d)
		if withIncarnation {
			t.Incarnation = d.u64()
		}
		m := d.listLen(4 + 8 + 8 + 8 + 2 + 2 + 1 + 4 + 2)
		t.Partitions = make([]PartitionInfo, m)
		for j := 0; j < m && d.err == nil; j++ {
			p := &t.Partitions[j]
			p.Partition, p.Epoch, p.StartSeq, p.CommitSeq = d.u32(), d.u64(), d.u64(), d.u64()
			p.Leader, p.LeaderAddr, p.ReadOnly = d.str(), d.str(), d.boolean()
			k := d.listLen(2 + 2 + 8)
			if k > 0 {
				p.Replicas = make([]ReplicaInfo, k)
			}
			for r := 0; r < k && d.err == nil; r++ {
				p.Replicas[r] = ReplicaInfo{Node: d.str(), State: d.str(), FlushedSeq: d.u64()}
			}
			p.State = d.str()
		}
	}
	return topics
}

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

func appendHeaders(b []byte, hs []Header) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(hs)))
	for _, h := range hs {
		b = appendStr(b, h.Key)
		b = appendBytes(b, h.Value)
	}
	return b
}

func decodeHeaders(d *decoder) []Header {
	n := d.listLen(2 + 4)
	if n == 0 {
		return nil
	}
	hs := make([]Header, n)
	for i := 0; i < n && d.err == nil; i++ {
		hs[i] = Header{Key: d.str(), Value: d.bytes()}
	}
	return hs
}

// PartitionAuto lets the broker choose the partition of a PUB: by key hash
// when a key is set, else deterministically from the producer identity when
// set (so a replay lands on the same partition), else round-robin.
const PartitionAuto int32 = -1

// Pub publishes one record. ProducerID 0 means a non-idempotent publish.
type Pub struct {
	Topic       string
	Partition   int32
	ProducerID  uint64
	ProducerSeq uint64
	TimestampMs int64 // 0 = broker's clock
	Key, Value  []byte
	Headers     []Header
}

func (*Pub) Type() FrameType { return TypePub }
func (f *Pub) appendBody(b []byte) []byte {
	b = appendStr(b, f.Topic)
	b = binary.BigEndian.AppendUint32(b, uint32(f.Partition))
	b = binary.BigEndian.AppendUint64(b, f.ProducerID)
	b = binary.BigEndian.AppendUint64(b, f.ProducerSeq)
	b = binary.BigEndian.AppendUint64(b, uint64(f.TimestampMs))
	b = appendBytes(b, f.Key)
	b = appendBytes(b, f.Value)
	return appendHeaders(b, f.Headers)
}
func (f *Pub) decodeBody(d *decoder) {
	f.Topic = d.str()
	f.Partition = int32(d.u32())
	f.ProducerID, f.ProducerSeq = d.u64(), d.u64()
	f.TimestampMs = int64(d.u64())
	f.Key, f.Value = d.bytes(), d.bytes()
	f.Headers = decodeHeaders(d)
}

// PubOK acknowledges a durable, visible record. Duplicate is true when the
// PUB was a replay answered from the dedup table.
type PubOK struct {
	Partition uint32
	Seq       uint64
	Epoch     uint64
	Duplicate bool
}

func (*PubOK) Type() FrameType { return TypePubOK }
func (f *PubOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, f.Partition)
	b = binary.BigEndian.AppendUint64(b, f.Seq)
	b = binary.BigEndian.AppendUint64(b, f.Epoch)
	return appendBool(b, f.Duplicate)
}
func (f *PubOK) decodeBody(d *decoder) {
	f.Partition, f.Seq, f.Epoch, f.Duplicate = d.u32(), d.u64(), d.u64(), d.boolean()
}

// Pull grants Credit more messages to the connection's subscription of
// (Topic, Group), creating it on the first PULL. MSG frames of the
// subscription carry the correlation id of that first PULL. AckWaitMs and
// MaxDeliver configure the group when it is first created (0 = default).
// Member and Incarnation, from a JOIN_OK, make the subscription a group
// member's: it is delivered only the partitions the member holds (empty:
// a competing consumer of a group without JOINed members).
type Pull struct {
	Topic, Group string
	Credit       uint32
	AckWaitMs    uint32
	MaxDeliver   uint32
	Member       string
	Incarnation  uint64
}

func (*Pull) Type() FrameType { return TypePull }
func (f *Pull) appendBody(b []byte) []byte {
	b = appendStr(b, f.Topic)
	b = appendStr(b, f.Group)
	b = binary.BigEndian.AppendUint32(b, f.Credit)
	b = binary.BigEndian.AppendUint32(b, f.AckWaitMs)
	b = binary.BigEndian.AppendUint32(b, f.MaxDeliver)
	b = appendStr(b, f.Member)
	return binary.BigEndian.AppendUint64(b, f.Incarnation)
}
func (f *Pull) decodeBody(d *decoder) {
	f.Topic, f.Group = d.str(), d.str()
	f.Credit, f.AckWaitMs, f.MaxDeliver = d.u32(), d.u32(), d.u32()
	f.Member, f.Incarnation = d.str(), d.u64()
}

// Msg delivers one record. DeliveryID fences its ACK: a later redelivery of
// the same seq gets a new id and the old one becomes stale.
type Msg struct {
	Topic         string
	Partition     uint32
	Seq           uint64
	DeliveryID    uint64
	DeliveryCount uint32
	TimestampMs   int64
	Key, Value    []byte
	Headers       []Header
}

func (*Msg) Type() FrameType { return TypeMsg }
func (f *Msg) appendBody(b []byte) []byte {
	b = appendStr(b, f.Topic)
	b = binary.BigEndian.AppendUint32(b, f.Partition)
	b = binary.BigEndian.AppendUint64(b, f.Seq)
	b = binary.BigEndian.AppendUint64(b, f.DeliveryID)
	b = binary.BigEndian.AppendUint32(b, f.DeliveryCount)
	b = binary.BigEndian.AppendUint64(b, uint64(f.TimestampMs))
	b = appendBytes(b, f.Key)
	b = appendBytes(b, f.Value)
	return appendHeaders(b, f.Headers)
}
func (f *Msg) decodeBody(d *decoder) {
	f.Topic = d.str()
	f.Partition, f.Seq, f.DeliveryID = d.u32(), d.u64(), d.u64()
	f.DeliveryCount, f.TimestampMs = d.u32(), int64(d.u64())
	f.Key, f.Value = d.bytes(), d.bytes()
	f.Headers = decodeHeaders(d)
}

// AckEntry names one delivery.
type AckEntry struct {
	Partition  uint32
	Seq        uint64
	DeliveryID uint64
}

const ackEntryBytes = 4 + 8 + 8

func appendAckEntries(b []byte, es []AckEntry) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(es)))
	for _, e := range es {
		b = binary.BigEndian.AppendUint32(b, e.Partition)
		b = binary.BigEndian.AppendUint64(b, e.Seq)
		b = binary.BigEndian.AppendUint64(b, e.DeliveryID)
	}
	return b
}

func decodeAckEntries(d *decoder) []AckEntry {
	n := d.listLen(ackEntryBytes)
	es := make([]AckEntry, n)
	for i := 0; i < n && d.err == nil; i++ {
		es[i] = AckEntry{Partition: d.u32(), Seq: d.u64(), DeliveryID: d.u64()}
	}
	return es
}

// Ack acknowledges deliveries. The broker answers ACK_OK once the acks are
// durable in the group's ledger, with one result code per entry.
type Ack struct {
	Topic, Group string
	Entries      []AckEntry
}

func (*Ack) Type() FrameType { return TypeAck }
func (f *Ack) appendBody(b []byte) []byte {
	b = appendStr(b, f.Topic)
	b = appendStr(b, f.Group)
	return appendAckEntries(b, f.Entries)
}
func (f *Ack) decodeBody(d *decoder) {
	f.Topic, f.Group = d.str(), d.str()
	f.Entries = decodeAckEntries(d)
}

// AckOK answers ACK and NACK: Results[i] is the outcome of entry i
// (CodeOK or CodeStaleDelivery, for example).
type AckOK struct{ Results []Code }

func (*AckOK) Type() FrameType { return TypeAckOK }
func (f *AckOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Results)))
	for _, c := range f.Results {
		b = binary.BigEndian.AppendUint16(b, uint16(c))
	}
	return b
}
func (f *AckOK) decodeBody(d *decoder) {
	n := d.listLen(2)
	f.Results = make([]Code, n)
	for i := 0; i < n && d.err == nil; i++ {
		f.Results[i] = Code(d.u16())
	}
}

// Nack returns deliveries for redelivery after DelayMs (0 = at once).
type Nack struct {
	Topic, Group string
	DelayMs      uint32
	Entries      []AckEntry
}

func (*Nack) Type() FrameType { return TypeNack }
func (f *Nack) appendBody(b []byte) []byte {
	b = appendStr(b, f.Topic)
	b = appendStr(b, f.Group)
	b = binary.BigEndian.AppendUint32(b, f.DelayMs)
	return appendAckEntries(b, f.Entries)
}
func (f *Nack) decodeBody(d *decoder) {
	f.Topic, f.Group, f.DelayMs = d.str(), d.str(), d.u32()
	f.Entries = decodeAckEntries(d)
}

// Ping asks for a Pong; either side may send it to check liveness.
type Ping struct{}

func (*Ping) Type() FrameType            { return TypePing }
func (*Ping) appendBody(b []byte) []byte { return b }
func (*Ping) decodeBody(*decoder)        {}

// Pong answers a Ping with the same correlation id.
type Pong struct{}

func (*Pong) Type() FrameType            { return TypePong }
func (*Pong) appendBody(b []byte) []byte { return b }
func (*Pong) decodeBody(*decoder)        {}
