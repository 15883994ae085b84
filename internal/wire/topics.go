package wire

import "encoding/binary"

// Topic deletion and incarnations. METADATA_OK keeps protocol v1's
// layout (the codec refuses trailing bytes, so a field added to it would
// break v1 decoders): a topic's incarnation comes in DESCRIBE_OK, a
// METADATA_OK whose topics carry it.
const (
	TypeTopicDelete   FrameType = 72 // delete a topic (to the metadata leader)
	TypeTopicDeleteOK FrameType = 73 // the incarnation deleted
	TypeDescribe      FrameType = 74 // METADATA, answered with incarnations
	TypeDescribeOK    FrameType = 75
)

func init() {
	typeNames[TypeTopicDelete], typeNames[TypeTopicDeleteOK] = "TOPIC_DELETE", "TOPIC_DELETE_OK"
	typeNames[TypeDescribe], typeNames[TypeDescribeOK] = "DESCRIBE", "DESCRIBE_OK"
}

func newTopicFrame(t FrameType) Frame {
	switch t {
	case TypeTopicDelete:
		return &TopicDelete{}
	case TypeTopicDeleteOK:
		return &TopicDeleteOK{}
	case TypeDescribe:
		return &Describe{}
	case TypeDescribeOK:
		return &DescribeOK{}
	}
	return nil
}

// TopicDelete deletes a topic: its current incarnation, or Incarnation
// when not 0 (a client deleting what it described). In a cluster only
// the metadata leader decides it (NOT_LEADER elsewhere, naming it).
// A topic that does not exist — never declared, already deleted, or not
// at that incarnation — is NOT_FOUND; an internal topic (`__…`) is
// INVALID_ARGUMENT.
type TopicDelete struct{ TopicRef }

func (*TopicDelete) Type() FrameType { return TypeTopicDelete }

// TopicDeleteOK answers TOPIC_DELETE once the answering node applied the
// delete: Incarnation is the one deleted.
type TopicDeleteOK struct{ TopicRef }

func (*TopicDeleteOK) Type() FrameType { return TypeTopicDeleteOK }

// TopicRef names an incarnation of a topic (0: whichever is current):
// topic str, incarnation u64.
type TopicRef struct {
	Topic       string
	Incarnation uint64
}

func (f *TopicRef) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint64(appendStr(b, f.Topic), f.Incarnation)
}
func (f *TopicRef) decodeBody(d *decoder) { f.Topic, f.Incarnation = d.str(), d.u64() }

// Describe is METADATA answered with DESCRIBE_OK: the named topics (all
// when Topics is empty), each with its incarnation.
type Describe struct{ Metadata }

func (*Describe) Type() FrameType { return TypeDescribe }

// DescribeOK answers DESCRIBE: METADATA_OK's topics, each followed by its
// incarnation (u64) after its configuration.
type DescribeOK struct{ Topics []TopicInfo }

func (*DescribeOK) Type() FrameType              { return TypeDescribeOK }
func (f *DescribeOK) appendBody(b []byte) []byte { return appendTopicInfos(b, f.Topics, true) }
func (f *DescribeOK) decodeBody(d *decoder)      { f.Topics = decodeTopicInfos(d, true) }
