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
	case TypeGroupList:
		return &GroupList{}
	case TypeGroupListOK:
		return &GroupListOK{}
	case TypeGroupDelete:
		return &GroupDelete{}
	case TypeGroupDeleteForce:
		return &GroupDeleteForce{}
	case TypeGroupIncarnation:
		return &GroupIncarnation{}
	case TypeGroupIncarnationOK:
		return &GroupIncarnationOK{}
	case TypeGroupDeleteIncarnation:
		return &GroupDeleteIncarnation{}
	}
	if f := newSchedFrame(t); f != nil {
		return f
	}
	if f := newTopicFrame(t); f != nil {
		return f
	}
	if f := newGroupUpdateFrame(t); f != nil {
		return f
	}
	return newKVFrame(t)
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

// Group administration frames.
const (
	TypeGroupList   FrameType = 24 // describe one group, or all
	TypeGroupListOK FrameType = 25
	TypeGroupDelete FrameType = 26 // a group without members; answered GROUP_OK (on the coordinator)
	// GROUP_DELETE_FORCE is GROUP_DELETE that also deletes a group the
	// coordinator does not know: one consumed only without membership
	// (GROUP_DELETE's layout cannot grow: the codec refuses trailing bytes).
	TypeGroupDeleteForce FrameType = 76
	// GROUP_DELETE_INCARNATION is GROUP_DELETE (or, with force,
	// GROUP_DELETE_FORCE) naming the incarnation it deletes, which
	// GROUP_INCARNATION told: safe to send again after a lost answer
	// (neither older frame can grow a field for it).
	TypeGroupIncarnation       FrameType = 77 // the current incarnation of a group (at the coordinator)
	TypeGroupIncarnationOK     FrameType = 78
	TypeGroupDeleteIncarnation FrameType = 79 // answered GROUP_OK (on the coordinator)
)

func init() {
	typeNames[TypeGroupList], typeNames[TypeGroupListOK], typeNames[TypeGroupDelete] = "GROUP_LIST", "GROUP_LIST_OK", "GROUP_DELETE"
	typeNames[TypeGroupDeleteForce] = "GROUP_DELETE_FORCE"
	typeNames[TypeGroupIncarnation], typeNames[TypeGroupIncarnationOK] = "GROUP_INCARNATION", "GROUP_INCARNATION_OK"
	typeNames[TypeGroupDeleteIncarnation] = "GROUP_DELETE_INCARNATION"
}

// GroupList asks for the group named Group ("" = every group).
type GroupList struct{ Group string }

func (*GroupList) Type() FrameType              { return TypeGroupList }
func (f *GroupList) appendBody(b []byte) []byte { return appendStr(b, f.Group) }
func (f *GroupList) decodeBody(d *decoder)      { f.Group = d.str() }

// GroupDelete removes a group that has no members.
type GroupDelete struct{ Group string }

func (*GroupDelete) Type() FrameType              { return TypeGroupDelete }
func (f *GroupDelete) appendBody(b []byte) []byte { return appendStr(b, f.Group) }
func (f *GroupDelete) decodeBody(d *decoder)      { f.Group = d.str() }

// GroupDeleteForce removes a group that has no members, known to the
// coordinator or not.
type GroupDeleteForce struct{ Group string }

func (*GroupDeleteForce) Type() FrameType              { return TypeGroupDeleteForce }
func (f *GroupDeleteForce) appendBody(b []byte) []byte { return appendStr(b, f.Group) }
func (f *GroupDeleteForce) decodeBody(d *decoder)      { f.Group = d.str() }

// GroupIncarnation asks the coordinator for the current incarnation of
// group Group: the one a delete would remove now (1 until the name is
// first deleted; a name the metadata does not know has one too).
type GroupIncarnation struct{ Group string }

func (*GroupIncarnation) Type() FrameType              { return TypeGroupIncarnation }
func (f *GroupIncarnation) appendBody(b []byte) []byte { return appendStr(b, f.Group) }
func (f *GroupIncarnation) decodeBody(d *decoder)      { f.Group = d.str() }

// GroupRef names one incarnation of a group: group str, incarnation u64.
type GroupRef struct {
	Group       string
	Incarnation uint64
}

func (f *GroupRef) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint64(appendStr(b, f.Group), f.Incarnation)
}
func (f *GroupRef) decodeBody(d *decoder) { f.Group, f.Incarnation = d.str(), d.u64() }

// GroupIncarnationOK answers GROUP_INCARNATION.
type GroupIncarnationOK struct{ GroupRef }

func (*GroupIncarnationOK) Type() FrameType { return TypeGroupIncarnationOK }

// GroupDeleteIncarnation deletes incarnation Incarnation of group Group,
// refused as GROUP_DELETE (Force: GROUP_DELETE_FORCE) is — except that an
// incarnation already deleted is answered GROUP_OK and deletes nothing
// more (a retry of a delete that was applied never deletes the next
// incarnation), and one above the current is NOT_FOUND. Incarnation 0
// deletes whichever is current, as the older frames do. Body: GroupRef,
// force u8 (0 or 1).
type GroupDeleteIncarnation struct {
	GroupRef
	Force bool
}

func (*GroupDeleteIncarnation) Type() FrameType { return TypeGroupDeleteIncarnation }
func (f *GroupDeleteIncarnation) appendBody(b []byte) []byte {
	return appendBool(f.GroupRef.appendBody(b), f.Force)
}
func (f *GroupDeleteIncarnation) decodeBody(d *decoder) {
	f.GroupRef.decodeBody(d)
	f.Force = d.boolean()
}

// GroupMemberInfo is one member and what it holds.
type GroupMemberInfo struct {
	Member      string
	Incarnation uint64
	Topics      []string
	Partitions  []HeldPartition
}

// PendingNotice is a notice its member has not acknowledged.
type PendingNotice struct {
	NoticeID   uint64
	Kind       uint8
	Member     string
	Partitions []HeldPartition
}

// GroupPartitionInfo is a partition's delivery state in a group, as the
// answering node knows it (it runs the group's delivery of the topic).
type GroupPartitionInfo struct {
	Topic     string
	Partition uint32
	AckFloor  uint64 // the lowest seq not yet done (acked or dead-lettered)
	CommitSeq uint64 // the partition's last visible seq
}

// GroupInfo describes one group.
type GroupInfo struct {
	Group           string
	Mode            uint8
	MembershipEpoch uint64
	AssignmentEpoch uint64
	Members         []GroupMemberInfo
	Pending         []PendingNotice
	Partitions      []GroupPartitionInfo
}

// GroupListOK answers GROUP_LIST.
type GroupListOK struct{ Groups []GroupInfo }

func (*GroupListOK) Type() FrameType { return TypeGroupListOK }

func appendHeld(b []byte, hs []HeldPartition) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(hs)))
	for _, p := range hs {
		b = appendStr(b, p.Topic)
		b = binary.BigEndian.AppendUint32(b, p.Partition)
		b = binary.BigEndian.AppendUint64(b, p.Epoch)
	}
	return b
}

func decodeHeld(d *decoder) []HeldPartition {
	n := d.listLen(2 + 4 + 8)
	if n == 0 {
		return nil
	}
	out := make([]HeldPartition, n)
	for i := 0; i < n && d.err == nil; i++ {
		out[i] = HeldPartition{Topic: d.str(), Partition: d.u32(), Epoch: d.u64()}
	}
	return out
}

func (f *GroupListOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Groups)))
	for _, g := range f.Groups {
		b = appendStr(b, g.Group)
		b = append(b, g.Mode)
		b = binary.BigEndian.AppendUint64(b, g.MembershipEpoch)
		b = binary.BigEndian.AppendUint64(b, g.AssignmentEpoch)
		b = binary.BigEndian.AppendUint32(b, uint32(len(g.Members)))
		for _, m := range g.Members {
			b = appendStr(b, m.Member)
			b = binary.BigEndian.AppendUint64(b, m.Incarnation)
			b = appendStrs(b, m.Topics)
			b = appendHeld(b, m.Partitions)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(g.Pending)))
		for _, n := range g.Pending {
			b = binary.BigEndian.AppendUint64(b, n.NoticeID)
			b = append(b, n.Kind)
			b = appendStr(b, n.Member)
			b = appendHeld(b, n.Partitions)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(g.Partitions)))
		for _, p := range g.Partitions {
			b = appendStr(b, p.Topic)
			b = binary.BigEndian.AppendUint32(b, p.Partition)
			b = binary.BigEndian.AppendUint64(b, p.AckFloor)
			b = binary.BigEndian.AppendUint64(b, p.CommitSeq)
		}
	}
	return b
}

func (f *GroupListOK) decodeBody(d *decoder) {
	n := d.listLen(2 + 1 + 8 + 8 + 4 + 4 + 4)
	if n == 0 {
		return
	}
	f.Groups = make([]GroupInfo, n)
	for i := 0; i < n && d.err == nil; i++ {
		g := &f.Groups[i]
		g.Group, g.Mode, g.MembershipEpoch, g.AssignmentEpoch = d.str(), d.u8(), d.u64(), d.u64()
		if k := d.listLen(2 + 8 + 4 + 4); k > 0 {
			g.Members = make([]GroupMemberInfo, k)
			for j := 0; j < k && d.err == nil; j++ {
				g.Members[j] = GroupMemberInfo{Member: d.str(), Incarnation: d.u64(), Topics: decodeStrs(d), Partitions: decodeHeld(d)}
			}
		}
		if k := d.listLen(8 + 1 + 2 + 4); k > 0 {
			g.Pending = make([]PendingNotice, k)
			for j := 0; j < k && d.err == nil; j++ {
				g.Pending[j] = PendingNotice{NoticeID: d.u64(), Kind: d.u8(), Member: d.str(), Partitions: decodeHeld(d)}
			}
		}
		if k := d.listLen(2 + 4 + 8 + 8); k > 0 {
			g.Partitions = make([]GroupPartitionInfo, k)
			for j := 0; j < k && d.err == nil; j++ {
				g.Partitions[j] = GroupPartitionInfo{Topic: d.str(), Partition: d.u32(), AckFloor: d.u64(), CommitSeq: d.u64()}
			}
		}
	}
}
