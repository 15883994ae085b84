package wire

import "encoding/binary"

// Consumer-group membership frames (docs/PROTOCOL.md "Consumer groups").
const (
	TypeJoin       FrameType = 17 // a member joins a group (to its coordinator)
	TypeJoinOK     FrameType = 18
	TypeLeave      FrameType = 19
	TypeHeartbeat  FrameType = 20
	TypeGroupOK    FrameType = 21 // answers LEAVE, HEARTBEAT and CONTROL_ACK
	TypeNotice     FrameType = 22 // coordinator → member, on the JOIN's correlation id
	TypeControlAck FrameType = 23 // member → coordinator: a NOTICE was carried out
)

func init() {
	for t, n := range map[FrameType]string{TypeJoin: "JOIN", TypeJoinOK: "JOIN_OK", TypeLeave: "LEAVE",
		TypeHeartbeat: "HEARTBEAT", TypeGroupOK: "GROUP_OK", TypeNotice: "NOTICE", TypeControlAck: "CONTROL_ACK"} {
		typeNames[t] = n
	}
}

func newGroupFrame(t FrameType) Frame {
	switch t {
	case TypeJoin:
		return &Join{}
	case TypeJoinOK:
		return &JoinOK{}
	case TypeLeave:
		return &Leave{}
	case TypeHeartbeat:
		return &Heartbeat{}
	case TypeGroupOK:
		return &GroupOK{}
	case TypeNotice:
		return &Notice{}
	case TypeControlAck:
		return &ControlAck{}
	}
	return nil
}

// CoordinatorTopic, named in a METADATA request, asks where the groups'
// coordinator is: in a cluster the answer lists it as a one-partition
// topic whose leader is the coordinator; a single node, which coordinates
// its own groups, leaves it out.
const CoordinatorTopic = "__coordinator"

// Group modes of a JOIN.
const (
	GroupExclusive uint8 = 0 // one owner per partition (the default)
	GroupShared    uint8 = 1 // every member competes for every partition
)

// Join makes the connection's member part of Group, subscribed to Topics.
// JoinID tells a retry (same id: answered, not applied again) from a
// restart of the member (a new id: a new incarnation, the old one fenced).
// Timeouts 0 take the defaults. The coordinator pushes the member's
// NOTICEs with this request's correlation id while the connection lasts.
type Join struct {
	Group, Member      string
	Topics             []string
	Mode               uint8
	SessionTimeoutMs   uint32
	RebalanceTimeoutMs uint32
	JoinID             uint64
}

func (*Join) Type() FrameType { return TypeJoin }
func (f *Join) appendBody(b []byte) []byte {
	b = appendStr(appendStr(b, f.Group), f.Member)
	b = appendStrs(b, f.Topics)
	b = append(b, f.Mode)
	b = binary.BigEndian.AppendUint32(b, f.SessionTimeoutMs)
	b = binary.BigEndian.AppendUint32(b, f.RebalanceTimeoutMs)
	return binary.BigEndian.AppendUint64(b, f.JoinID)
}
func (f *Join) decodeBody(d *decoder) {
	f.Group, f.Member = d.str(), d.str()
	f.Topics = decodeStrs(d)
	f.Mode, f.SessionTimeoutMs, f.RebalanceTimeoutMs, f.JoinID = d.u8(), d.u32(), d.u32(), d.u64()
}

// JoinOK confirms a JOIN: the member's incarnation (name it in LEAVE,
// HEARTBEAT and CONTROL_ACK) and how often to send HEARTBEAT.
type JoinOK struct {
	Incarnation     uint64
	MembershipEpoch uint64
	HeartbeatMs     uint32
}

func (*JoinOK) Type() FrameType { return TypeJoinOK }
func (f *JoinOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, f.Incarnation)
	b = binary.BigEndian.AppendUint64(b, f.MembershipEpoch)
	return binary.BigEndian.AppendUint32(b, f.HeartbeatMs)
}
func (f *JoinOK) decodeBody(d *decoder) {
	f.Incarnation, f.MembershipEpoch, f.HeartbeatMs = d.u64(), d.u64(), d.u32()
}

// MemberRef names one incarnation of a member.
type MemberRef struct {
	Group, Member string
	Incarnation   uint64
}

func (r *MemberRef) append(b []byte) []byte {
	return binary.BigEndian.AppendUint64(appendStr(appendStr(b, r.Group), r.Member), r.Incarnation)
}
func (r *MemberRef) decode(d *decoder) { r.Group, r.Member, r.Incarnation = d.str(), d.str(), d.u64() }

// Leave takes the member out of its group at once (its partitions move
// without waiting for its session timeout). Send it after acking what was
// processed.
type Leave struct{ MemberRef }

func (*Leave) Type() FrameType              { return TypeLeave }
func (f *Leave) appendBody(b []byte) []byte { return f.append(b) }
func (f *Leave) decodeBody(d *decoder)      { f.decode(d) }

// Heartbeat keeps the member's session. A fenced incarnation gets
// STALE_ASSIGNMENT and must JOIN again.
type Heartbeat struct{ MemberRef }

func (*Heartbeat) Type() FrameType              { return TypeHeartbeat }
func (f *Heartbeat) appendBody(b []byte) []byte { return f.append(b) }
func (f *Heartbeat) decodeBody(d *decoder)      { f.decode(d) }

// GroupOK answers LEAVE, HEARTBEAT and CONTROL_ACK.
type GroupOK struct{ MembershipEpoch uint64 }

func (*GroupOK) Type() FrameType { return TypeGroupOK }
func (f *GroupOK) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint64(b, f.MembershipEpoch)
}
func (f *GroupOK) decodeBody(d *decoder) { f.MembershipEpoch = d.u64() }

// Notice kinds.
const (
	NoticeAssign uint8 = 1 // start fetching these partitions at these epochs
	NoticeRevoke uint8 = 2 // ack what was processed, stop fetching, then CONTROL_ACK
)

// HeldPartition is a partition and the assignment epoch it is held at.
type HeldPartition struct {
	Topic     string
	Partition uint32
	Epoch     uint64
}

// Notice tells a member to start (ASSIGN) or stop (REVOKE) fetching
// partitions. The member answers every notice of its incarnation with
// CONTROL_ACK; a notice may come twice or late, and applies to a
// partition only if its epoch is newer than any the member heard of.
type Notice struct {
	Group       string
	NoticeID    uint64
	Kind        uint8
	Incarnation uint64
	Partitions  []HeldPartition
}

func (*Notice) Type() FrameType { return TypeNotice }
func (f *Notice) appendBody(b []byte) []byte {
	b = appendStr(b, f.Group)
	b = binary.BigEndian.AppendUint64(b, f.NoticeID)
	b = append(b, f.Kind)
	b = binary.BigEndian.AppendUint64(b, f.Incarnation)
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Partitions)))
	for _, p := range f.Partitions {
		b = appendStr(b, p.Topic)
		b = binary.BigEndian.AppendUint32(b, p.Partition)
		b = binary.BigEndian.AppendUint64(b, p.Epoch)
	}
	return b
}
func (f *Notice) decodeBody(d *decoder) {
	f.Group, f.NoticeID, f.Kind, f.Incarnation = d.str(), d.u64(), d.u8(), d.u64()
	n := d.listLen(2 + 4 + 8)
	if n > 0 {
		f.Partitions = make([]HeldPartition, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		f.Partitions[i] = HeldPartition{Topic: d.str(), Partition: d.u32(), Epoch: d.u64()}
	}
}

// ControlAck tells the coordinator a NOTICE was carried out.
type ControlAck struct {
	MemberRef
	NoticeID uint64
}

func (*ControlAck) Type() FrameType { return TypeControlAck }
func (f *ControlAck) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint64(f.append(b), f.NoticeID)
}
func (f *ControlAck) decodeBody(d *decoder) { f.decode(d); f.NoticeID = d.u64() }

func appendStrs(b []byte, ss []string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(ss)))
	for _, s := range ss {
		b = appendStr(b, s)
	}
	return b
}

func decodeStrs(d *decoder) []string {
	n := d.listLen(2)
	if n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.str())
	}
	return out
}
