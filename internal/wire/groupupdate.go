package wire

import "encoding/binary"

// Group settings. A group's ack wait and max deliveries were fixed by
// the PULL that first created the group on each node; GROUP_UPDATE sets
// them for the whole group (in a cluster through the metadata log), and
// they then hold on every node that delivers one of its partitions.
const (
	TypeGroupUpdate   FrameType = 82 // set a group's ack wait and max deliveries (to the coordinator)
	TypeGroupUpdateOK FrameType = 83 // the group's settings after it
)

func init() {
	typeNames[TypeGroupUpdate], typeNames[TypeGroupUpdateOK] = "GROUP_UPDATE", "GROUP_UPDATE_OK"
}

func newGroupUpdateFrame(t FrameType) Frame {
	switch t {
	case TypeGroupUpdate:
		return &GroupUpdate{}
	case TypeGroupUpdateOK:
		return &GroupUpdateOK{}
	}
	return nil
}

// The settings a GROUP_UPDATE may change, as bits of its Set field.
const (
	SetAckWaitMs  uint8 = 1 << iota // GroupUpdate.AckWaitMs is given
	SetMaxDeliver                   // GroupUpdate.MaxDeliver is given

	setGroupAll = SetAckWaitMs | SetMaxDeliver
)

// GroupUpdate sets the ack wait and max deliveries of group Group's
// current incarnation, or Incarnation when not 0, on every topic it
// consumes. Set says which of the fields are given; the others keep the
// values the group has (the node's defaults for a group never updated).
// In a cluster only the coordinator decides it (NOT_LEADER elsewhere,
// naming it). An incarnation that is not the current one is NOT_FOUND; a
// Set of nothing or of unknown bits, and a zero value given, are
// INVALID_ARGUMENT. Body: GroupRef, set u8, ack_wait_ms u32,
// max_deliver u32.
type GroupUpdate struct {
	GroupRef
	Set        uint8
	AckWaitMs  uint32
	MaxDeliver uint32
}

func (*GroupUpdate) Type() FrameType { return TypeGroupUpdate }
func (f *GroupUpdate) appendBody(b []byte) []byte {
	b = append(f.GroupRef.appendBody(b), f.Set)
	b = binary.BigEndian.AppendUint32(b, f.AckWaitMs)
	return binary.BigEndian.AppendUint32(b, f.MaxDeliver)
}
func (f *GroupUpdate) decodeBody(d *decoder) {
	f.GroupRef.decodeBody(d)
	f.Set, f.AckWaitMs, f.MaxDeliver = d.u8(), d.u32(), d.u32()
}

// Validate refuses what no group can take: a Set of nothing or of
// unknown bits, and a given setting of 0 (no ack wait, no delivery).
func (f *GroupUpdate) Validate() error {
	switch {
	case f.Set == 0:
		return Errorf(CodeInvalidArgument, "group update of %q sets nothing: give the ack wait or the max deliveries", f.Group)
	case f.Set&^setGroupAll != 0:
		return Errorf(CodeInvalidArgument, "group update of %q sets unknown settings (bits %#x)", f.Group, f.Set&^setGroupAll)
	case f.Set&SetAckWaitMs != 0 && f.AckWaitMs == 0:
		return Errorf(CodeInvalidArgument, "group update of %q: the ack wait must be at least 1 ms", f.Group)
	case f.Set&SetMaxDeliver != 0 && f.MaxDeliver == 0:
		return Errorf(CodeInvalidArgument, "group update of %q: the max deliveries must be at least 1", f.Group)
	}
	return nil
}

// GroupUpdateOK answers GROUP_UPDATE once the answering node applied it:
// the group's incarnation and the settings it has now. Body: GroupRef,
// ack_wait_ms u32, max_deliver u32.
type GroupUpdateOK struct {
	GroupRef
	AckWaitMs  uint32
	MaxDeliver uint32
}

func (*GroupUpdateOK) Type() FrameType { return TypeGroupUpdateOK }
func (f *GroupUpdateOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(f.GroupRef.appendBody(b), f.AckWaitMs)
	return binary.BigEndian.AppendUint32(b, f.MaxDeliver)
}
func (f *GroupUpdateOK) decodeBody(d *decoder) {
	f.GroupRef.decodeBody(d)
	f.AckWaitMs, f.MaxDeliver = d.u32(), d.u32()
}
