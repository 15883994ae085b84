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
	TypeTopicUpdate   FrameType = 80 // change a topic's retention (to the metadata leader)
	TypeTopicUpdateOK FrameType = 81 // the topic's configuration after it
)

func init() {
	typeNames[TypeTopicDelete], typeNames[TypeTopicDeleteOK] = "TOPIC_DELETE", "TOPIC_DELETE_OK"
	typeNames[TypeDescribe], typeNames[TypeDescribeOK] = "DESCRIBE", "DESCRIBE_OK"
	typeNames[TypeTopicUpdate], typeNames[TypeTopicUpdateOK] = "TOPIC_UPDATE", "TOPIC_UPDATE_OK"
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
	case TypeTopicUpdate:
		return &TopicUpdate{}
	case TypeTopicUpdateOK:
		return &TopicUpdateOK{}
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

// The settings a TOPIC_UPDATE may change, as bits of its Set field.
const (
	SetRetentionMs    uint8 = 1 << iota // TopicUpdate.RetentionMs is given
	SetRetentionBytes                   // TopicUpdate.RetentionBytes is given

	setTopicAll = SetRetentionMs | SetRetentionBytes
)

// TopicUpdate changes the settings of a topic that may change after its
// declare — its retention — for its current incarnation, or Incarnation
// when not 0. Set says which of the fields are given (SetRetentionMs,
// SetRetentionBytes); the others keep their values. In a cluster only the
// metadata leader decides it (NOT_LEADER elsewhere, naming it). A topic
// that does not exist is NOT_FOUND; an internal topic (`__…`), a Set of
// nothing or of unknown bits, and a negative value are INVALID_ARGUMENT.
// Body: topic str, incarnation u64, set u8, retention_ms u64,
// retention_bytes u64.
type TopicUpdate struct {
	TopicRef
	Set            uint8
	RetentionMs    int64 // 0 = unlimited
	RetentionBytes int64 // per partition; 0 = unlimited
}

func (*TopicUpdate) Type() FrameType { return TypeTopicUpdate }
func (f *TopicUpdate) appendBody(b []byte) []byte {
	b = append(f.TopicRef.appendBody(b), f.Set)
	b = binary.BigEndian.AppendUint64(b, uint64(f.RetentionMs))
	return binary.BigEndian.AppendUint64(b, uint64(f.RetentionBytes))
}
func (f *TopicUpdate) decodeBody(d *decoder) {
	f.TopicRef.decodeBody(d)
	f.Set, f.RetentionMs, f.RetentionBytes = d.u8(), int64(d.u64()), int64(d.u64())
}

// Validate refuses what no topic can take: a Set of nothing or of unknown
// bits, and negative values.
func (f *TopicUpdate) Validate() error {
	switch {
	case f.Set == 0:
		return Errorf(CodeInvalidArgument, "topic update of %q sets nothing: give retention_ms or retention_bytes", f.Topic)
	case f.Set&^setTopicAll != 0:
		return Errorf(CodeInvalidArgument, "topic update of %q sets unknown settings (bits %#x)", f.Topic, f.Set&^setTopicAll)
	case f.RetentionMs < 0 || f.RetentionBytes < 0:
		return Errorf(CodeInvalidArgument, "topic update of %q: retention must not be negative (retention_ms=%d retention_bytes=%d)",
			f.Topic, f.RetentionMs, f.RetentionBytes)
	}
	return nil
}

// Apply returns c with the settings f gives.
func (f *TopicUpdate) Apply(c TopicConfig) TopicConfig {
	if f.Set&SetRetentionMs != 0 {
		c.RetentionMs = f.RetentionMs
	}
	if f.Set&SetRetentionBytes != 0 {
		c.RetentionBytes = f.RetentionBytes
	}
	return c
}

// TopicUpdateOK answers TOPIC_UPDATE once the answering node applied the
// update: the topic's configuration now, and its incarnation.
// Body: the configuration as in DECLARE, incarnation u64.
type TopicUpdateOK struct {
	Topic       TopicConfig
	Incarnation uint64
}

func (*TopicUpdateOK) Type() FrameType { return TypeTopicUpdateOK }
func (f *TopicUpdateOK) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint64(f.Topic.append(b), f.Incarnation)
}
func (f *TopicUpdateOK) decodeBody(d *decoder) { f.Topic.decode(d); f.Incarnation = d.u64() }
