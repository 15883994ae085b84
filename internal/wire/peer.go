package wire

import "encoding/binary"

// Peer protocol frames (node to node). They share the client frame
// envelope and codec; a peer connection never carries client frames.
const (
	TypePeerHello     FrameType = 64 // dialer: who it is and a nonce
	TypePeerChallenge FrameType = 65 // acceptor: its nonce and its proof
	TypePeerAuth      FrameType = 66 // dialer: its proof
	TypeReplicate     FrameType = 67 // one replication message for a partition
	TypePeerDeclare   FrameType = 68 // a DECLARE forwarded to the metadata leader
	TypePeerDeclareOK FrameType = 69 // its outcome, back to the forwarding node
	TypePeerPublish   FrameType = 70 // a broker-made PUB forwarded to a partition leader
	TypePeerPublishOK FrameType = 71 // its outcome, back to the forwarding node
)

func init() {
	typeNames[TypePeerHello] = "PEER_HELLO"
	typeNames[TypePeerChallenge] = "PEER_CHALLENGE"
	typeNames[TypePeerAuth] = "PEER_AUTH"
	typeNames[TypeReplicate] = "REPLICATE"
	typeNames[TypePeerDeclare] = "PEER_DECLARE"
	typeNames[TypePeerDeclareOK] = "PEER_DECLARE_OK"
	typeNames[TypePeerPublish] = "PEER_PUBLISH"
	typeNames[TypePeerPublishOK] = "PEER_PUBLISH_OK"
}

// Nonce and proof sizes of the peer handshake.
const (
	PeerNonceBytes = 32
	PeerProofBytes = 32 // HMAC-SHA256
)

// PeerHello opens a peer connection. ClientAddr is the dialer's client
// address, so that every node can tell clients where a leader is.
type PeerHello struct {
	Version    uint16
	From       uint32
	To         uint32
	Nonce      []byte
	ClientAddr string
}

func (*PeerHello) Type() FrameType { return TypePeerHello }
func (f *PeerHello) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, f.Version)
	b = binary.BigEndian.AppendUint32(b, f.From)
	b = binary.BigEndian.AppendUint32(b, f.To)
	b = appendBytes(b, f.Nonce)
	return appendStr(b, f.ClientAddr)
}
func (f *PeerHello) decodeBody(d *decoder) {
	f.Version, f.From, f.To, f.Nonce = d.u16(), d.u32(), d.u32(), d.bytes()
	f.ClientAddr = d.str()
}

// PeerChallenge answers PeerHello: the acceptor's nonce and its proof that
// it knows the cluster secret.
type PeerChallenge struct {
	Nonce []byte
	Proof []byte
}

func (*PeerChallenge) Type() FrameType { return TypePeerChallenge }
func (f *PeerChallenge) appendBody(b []byte) []byte {
	return appendBytes(appendBytes(b, f.Nonce), f.Proof)
}
func (f *PeerChallenge) decodeBody(d *decoder) { f.Nonce, f.Proof = d.bytes(), d.bytes() }

// PeerAuth completes the handshake with the dialer's proof.
type PeerAuth struct{ Proof []byte }

func (*PeerAuth) Type() FrameType              { return TypePeerAuth }
func (f *PeerAuth) appendBody(b []byte) []byte { return appendBytes(b, f.Proof) }
func (f *PeerAuth) decodeBody(d *decoder)      { f.Proof = d.bytes() }

// ReplicaEntry is one log entry in a Replicate frame.
type ReplicaEntry struct {
	Seq, Epoch uint64
	Data       []byte
}

// Replicate carries one replication-kernel message (internal/replica) for
// one partition replica group. Field meanings are the kernel's.
type Replicate struct {
	Topic      string
	Partition  uint32
	Kind       uint8
	From, To   uint32
	Epoch      uint64
	LastEpoch  uint64
	LastSeq    uint64
	Granted    bool
	Uncertain  bool
	Damaged    bool
	Forced     bool
	PrevSeq    uint64
	PrevEpoch  uint64
	CommitSeq  uint64
	FlushedSeq uint64
	Reject     uint8
	HintSeq    uint64
	Tick       uint64
	Entries    []ReplicaEntry
}

func (*Replicate) Type() FrameType { return TypeReplicate }

// replicateFixedBytes is a Replicate body without its topic's bytes and
// entries; replicaEntryFixedBytes an entry without its data.
const (
	replicateFixedBytes    = 2 + 4 + 1 + 4 + 4 + 3*8 + 4 + 4*8 + 1 + 8 + 8 + 4
	replicaEntryFixedBytes = 8 + 8 + 4
)

func (f *Replicate) bodyBytes() int {
	n := replicateFixedBytes + min(len(f.Topic), 0xFFFF) + len(f.Entries)*replicaEntryFixedBytes
	for i := range f.Entries {
		n += len(f.Entries[i].Data)
	}
	return n
}
func (f *Replicate) appendBody(b []byte) []byte {
	b = f.appendHead(b)
	for i := range f.Entries {
		b = f.Entries[i].appendHead(b)
		b = append(b, f.Entries[i].Data...)
	}
	return b
}

// appendHead appends the body up to its entries: every field and the
// entry count.
func (f *Replicate) appendHead(b []byte) []byte {
	b = appendStr(b, f.Topic)
	b = binary.BigEndian.AppendUint32(b, f.Partition)
	b = append(b, f.Kind)
	b = binary.BigEndian.AppendUint32(b, f.From)
	b = binary.BigEndian.AppendUint32(b, f.To)
	for _, v := range []uint64{f.Epoch, f.LastEpoch, f.LastSeq} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	b = appendBool(appendBool(appendBool(appendBool(b, f.Granted), f.Uncertain), f.Damaged), f.Forced)
	for _, v := range []uint64{f.PrevSeq, f.PrevEpoch, f.CommitSeq, f.FlushedSeq} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	b = append(b, f.Reject)
	b = binary.BigEndian.AppendUint64(b, f.HintSeq)
	b = binary.BigEndian.AppendUint64(b, f.Tick)
	return binary.BigEndian.AppendUint32(b, uint32(len(f.Entries)))
}

// appendHead appends an entry's encoding but its data: seq, epoch and
// the data's length.
func (e *ReplicaEntry) appendHead(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, e.Seq)
	b = binary.BigEndian.AppendUint64(b, e.Epoch)
	return binary.BigEndian.AppendUint32(b, uint32(len(e.Data)))
}
func (f *Replicate) decodeBody(d *decoder) {
	f.Topic, f.Partition, f.Kind = d.str(), d.u32(), d.u8()
	f.From, f.To = d.u32(), d.u32()
	f.Epoch, f.LastEpoch, f.LastSeq = d.u64(), d.u64(), d.u64()
	f.Granted, f.Uncertain, f.Damaged, f.Forced = d.boolean(), d.boolean(), d.boolean(), d.boolean()
	f.PrevSeq, f.PrevEpoch, f.CommitSeq, f.FlushedSeq = d.u64(), d.u64(), d.u64(), d.u64()
	f.Reject, f.HintSeq, f.Tick = d.u8(), d.u64(), d.u64()
	n := d.listLen(8 + 8 + 4)
	if n > 0 {
		f.Entries = make([]ReplicaEntry, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		f.Entries[i] = ReplicaEntry{Seq: d.u64(), Epoch: d.u64(), Data: d.bytes()}
	}
}

// PeerDeclare forwards a client's DECLARE to the metadata leader; ReqID
// pairs it with its PeerDeclareOK.
type PeerDeclare struct {
	ReqID uint64
	Topic TopicConfig
}

func (*PeerDeclare) Type() FrameType { return TypePeerDeclare }
func (f *PeerDeclare) appendBody(b []byte) []byte {
	return f.Topic.append(binary.BigEndian.AppendUint64(b, f.ReqID))
}
func (f *PeerDeclare) decodeBody(d *decoder) { f.ReqID = d.u64(); f.Topic.decode(d) }

// PeerDeclareOK is the metadata leader's answer to a PeerDeclare: Code OK
// with Created, or an error code and message for the client.
type PeerDeclareOK struct {
	ReqID   uint64
	Created bool
	Code    Code
	Message string
}

func (*PeerDeclareOK) Type() FrameType { return TypePeerDeclareOK }
func (f *PeerDeclareOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, f.ReqID)
	b = appendBool(b, f.Created)
	b = binary.BigEndian.AppendUint16(b, uint16(f.Code))
	return appendStr(b, f.Message)
}
func (f *PeerDeclareOK) decodeBody(d *decoder) {
	f.ReqID, f.Created, f.Code, f.Message = d.u64(), d.boolean(), Code(d.u16()), d.str()
}

// PeerPublish forwards a PUB that a node makes itself (a dead letter, a
// scheduled message falling due) to the leader of its partition; ReqID
// pairs it with its PeerPublishOK. The PUB's producer identity makes a
// retry idempotent. Incarnation, when not 0, is the only incarnation of
// the topic the PUB may land in (a scheduler lane's destination): one
// deleted meanwhile answers NOT_FOUND, even if the name lives again.
type PeerPublish struct {
	ReqID       uint64
	Incarnation uint64
	Pub         Pub
}

func (*PeerPublish) Type() FrameType { return TypePeerPublish }
func (f *PeerPublish) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, f.ReqID)
	return f.Pub.appendBody(binary.BigEndian.AppendUint64(b, f.Incarnation))
}
func (f *PeerPublish) decodeBody(d *decoder) {
	f.ReqID, f.Incarnation = d.u64(), d.u64()
	f.Pub.decodeBody(d)
}

// PeerPublishOK is the partition leader's answer to a PeerPublish: Code OK
// with the PUB_OK, or an error code and message.
type PeerPublishOK struct {
	ReqID   uint64
	OK      PubOK
	Code    Code
	Message string
}

func (*PeerPublishOK) Type() FrameType { return TypePeerPublishOK }
func (f *PeerPublishOK) appendBody(b []byte) []byte {
	b = f.OK.appendBody(binary.BigEndian.AppendUint64(b, f.ReqID))
	b = binary.BigEndian.AppendUint16(b, uint16(f.Code))
	return appendStr(b, f.Message)
}
func (f *PeerPublishOK) decodeBody(d *decoder) {
	f.ReqID = d.u64()
	f.OK.decodeBody(d)
	f.Code, f.Message = Code(d.u16()), d.str()
}
