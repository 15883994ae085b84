package wire

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// KV bucket frames (KVNODE_NOTES.md, to move into docs/PROTOCOL.md). A
// bucket is a one-partition replicated log; a revision is the seq of the
// write. Frame types 40-59 are the KV range.
const (
	TypeKVBucketCreate FrameType = 40 // create a bucket, or confirm an identical one
	TypeKVBucketOK     FrameType = 41 // answers KV_BUCKET_CREATE and KV_BUCKET_DELETE
	TypeKVBucketDelete FrameType = 42 // delete a bucket (its keys are gone)
	TypeKVBucketList   FrameType = 43 // describe one bucket, or all
	TypeKVBucketListOK FrameType = 44
	TypeKVWrite        FrameType = 45 // put or delete, optionally conditional (CAS)
	TypeKVWriteOK      FrameType = 46 // the write's revision
	TypeKVGet          FrameType = 47 // a key's value, latest or at a revision
	TypeKVGetOK        FrameType = 48
	TypeKVKeys         FrameType = 49 // live keys with a prefix, a page at a time
	TypeKVKeysOK       FrameType = 50
	TypeKVHistory      FrameType = 51 // a key's kept revisions
	TypeKVHistoryOK    FrameType = 52
	TypeKVWatch        FrameType = 53 // start a watch; events come on its corr
	TypeKVEvent        FrameType = 54 // server → client, on the KV_WATCH's corr
	TypeKVWatchCredit  FrameType = 55 // more credit for a watch (no answer)
	TypeKVWatchCancel  FrameType = 56 // end a watch (no answer)
	TypeKVList         FrameType = 57 // every live entry with a prefix, at one revision
	TypeKVListOK       FrameType = 58
	// A listing of any size, a page at a time, every page at the
	// revision of the first (the leader keeps the listing open).
	TypeKVListPage   FrameType = 27
	TypeKVListPageOK FrameType = 28
)

// KV error codes (30-39 are the KV range).
const (
	// CodeRevisionMismatch: a CAS whose expected revision is not the
	// key's latest. The message starts with "current=N;" (N = the key's
	// latest revision, 0 when absent or deleted): RevisionMismatch builds
	// it, MismatchCurrent reads it.
	CodeRevisionMismatch Code = 30
	// CodeCursorExpired: a watch's cursor is below the bucket's floor (a
	// revision it has not seen was evicted). It ends the watch, in band on
	// its corr after its last event. The message starts with "floor=N;":
	// CursorExpired builds it, ExpiredFloor reads it.
	CodeCursorExpired Code = 31
	// A KV_LIST_PAGE naming a listing the leader no longer holds (idle
	// too long, another leader, the bucket deleted) is CURSOR_EXPIRED too
	// (with no floor): the client starts the listing again.
	//
	// CodeOutcomeUnknown: a KV write was handed to the bucket's log but
	// the leader lost its office (or its quorum) before it committed: it
	// may still commit under the next leader, or not. Not retryable
	// blindly — read the key and decide. A retried SCHEDULE gets it too
	// when its lane has closed too many times since to remember whether
	// it admitted the original: list the lane's schedules and decide.
	CodeOutcomeUnknown Code = 32
)

// Sentinels for errors.Is.
var (
	ErrRevisionMismatch = &Error{Code: CodeRevisionMismatch}
	ErrCursorExpired    = &Error{Code: CodeCursorExpired}
	ErrOutcomeUnknown   = &Error{Code: CodeOutcomeUnknown}
)

// KV bounds the decoder does not enforce (the frame bound does) but the
// node checks, answering INVALID_ARGUMENT.
const (
	KVKeyBytesMax   = 1024    // a key: 1..1024 bytes
	KVValueBytesMax = 1 << 20 // a value: 0..1 MiB
	KVHistoryMax    = 64      // revisions kept per key
	// KVKeysPageMax bounds the keys of one KV_KEYS_OK.
	KVKeysPageMax = 10_000
	// KVListBytesMax bounds the keys and values of one KV_LIST_OK (a
	// listing is one frame, at one revision): a larger listing is
	// INVALID_ARGUMENT.
	KVListBytesMax   = 6 << 20
	KVListEntriesMax = listLenMax
	// KVTopicPrefix starts the internal topic of a bucket: bucket B is
	// the one-partition topic "__kv.B" (reserved: clients cannot declare,
	// publish to or consume it directly).
	KVTopicPrefix = ReservedPrefix + "kv."
	// KVBucketBytesMax leaves room for the prefix within NameBytesMax.
	KVBucketBytesMax = NameBytesMax - len(KVTopicPrefix)
)

func init() {
	for t, n := range map[FrameType]string{
		TypeKVBucketCreate: "KV_BUCKET_CREATE", TypeKVBucketOK: "KV_BUCKET_OK", TypeKVBucketDelete: "KV_BUCKET_DELETE",
		TypeKVBucketList: "KV_BUCKET_LIST", TypeKVBucketListOK: "KV_BUCKET_LIST_OK",
		TypeKVWrite: "KV_WRITE", TypeKVWriteOK: "KV_WRITE_OK", TypeKVGet: "KV_GET", TypeKVGetOK: "KV_GET_OK",
		TypeKVKeys: "KV_KEYS", TypeKVKeysOK: "KV_KEYS_OK", TypeKVHistory: "KV_HISTORY", TypeKVHistoryOK: "KV_HISTORY_OK",
		TypeKVWatch: "KV_WATCH", TypeKVEvent: "KV_EVENT", TypeKVWatchCredit: "KV_WATCH_CREDIT", TypeKVWatchCancel: "KV_WATCH_CANCEL",
		TypeKVList: "KV_LIST", TypeKVListOK: "KV_LIST_OK", TypeKVListPage: "KV_LIST_PAGE", TypeKVListPageOK: "KV_LIST_PAGE_OK",
	} {
		typeNames[t] = n
	}
	codeNames[CodeRevisionMismatch] = "REVISION_MISMATCH"
	codeNames[CodeCursorExpired] = "CURSOR_EXPIRED"
	codeNames[CodeOutcomeUnknown] = "OUTCOME_UNKNOWN"
}

func newKVFrame(t FrameType) Frame {
	switch t {
	case TypeKVBucketCreate:
		return &KVBucketCreate{}
	case TypeKVBucketOK:
		return &KVBucketOK{}
	case TypeKVBucketDelete:
		return &KVBucketDelete{}
	case TypeKVBucketList:
		return &KVBucketList{}
	case TypeKVBucketListOK:
		return &KVBucketListOK{}
	case TypeKVWrite:
		return &KVWrite{}
	case TypeKVWriteOK:
		return &KVWriteOK{}
	case TypeKVGet:
		return &KVGet{}
	case TypeKVGetOK:
		return &KVGetOK{}
	case TypeKVKeys:
		return &KVKeys{}
	case TypeKVKeysOK:
		return &KVKeysOK{}
	case TypeKVHistory:
		return &KVHistory{}
	case TypeKVHistoryOK:
		return &KVHistoryOK{}
	case TypeKVWatch:
		return &KVWatch{}
	case TypeKVEvent:
		return &KVEvent{}
	case TypeKVWatchCredit:
		return &KVWatchCredit{}
	case TypeKVWatchCancel:
		return &KVWatchCancel{}
	case TypeKVList:
		return &KVList{}
	case TypeKVListOK:
		return &KVListOK{}
	case TypeKVListPage:
		return &KVListPage{}
	case TypeKVListPageOK:
		return &KVListPageOK{}
	}
	return nil
}

// KVTopic is the internal topic that holds bucket's log.
func KVTopic(bucket string) string { return KVTopicPrefix + bucket }

// ValidateBucketName checks a bucket name: a valid topic name (1-195
// bytes of A-Z a-z 0-9 . _ -, not starting with "__") short enough that
// its topic name "__kv.<bucket>" fits.
func ValidateBucketName(bucket string) error {
	if err := ValidateName("bucket", bucket); err != nil {
		return err
	}
	if len(bucket) > KVBucketBytesMax {
		return Errorf(CodeInvalidArgument, "bucket name must be 1-%d bytes, got %d", KVBucketBytesMax, len(bucket))
	}
	return nil
}

// IsKVTopic reports whether a topic name is a bucket's internal topic.
func IsKVTopic(name string) bool { return strings.HasPrefix(name, KVTopicPrefix) }

// validateKVTopic checks the internal topic of a bucket (the broker's
// own paths accept it through ValidateTopicOrInternal; clients' requests
// keep using ValidateName, which refuses every reserved name).
func validateKVTopic(name string) error {
	if err := ValidateBucketName(name[len(KVTopicPrefix):]); err != nil {
		return Errorf(CodeInvalidArgument, "topic %q: %v", name, err)
	}
	return nil
}

// RevisionMismatch is the REVISION_MISMATCH error of a refused CAS:
// current is the key's latest revision (0: absent or deleted).
func RevisionMismatch(current uint64, format string, args ...any) *Error {
	return &Error{Code: CodeRevisionMismatch, Message: fmt.Sprintf("current=%d; ", current) + fmt.Sprintf(format, args...)}
}

// MismatchCurrent reads the current revision out of a REVISION_MISMATCH.
func MismatchCurrent(e *Error) (uint64, bool) {
	if e == nil || e.Code != CodeRevisionMismatch {
		return 0, false
	}
	return leadingU64(e.Message, "current=")
}

// CursorExpired is the CURSOR_EXPIRED error that ends a watch whose
// cursor is below floor.
func CursorExpired(floor uint64, format string, args ...any) *Error {
	return &Error{Code: CodeCursorExpired, Message: fmt.Sprintf("floor=%d; ", floor) + fmt.Sprintf(format, args...)}
}

// ExpiredFloor reads the floor out of a CURSOR_EXPIRED.
func ExpiredFloor(e *Error) (uint64, bool) {
	if e == nil || e.Code != CodeCursorExpired {
		return 0, false
	}
	return leadingU64(e.Message, "floor=")
}

func leadingU64(msg, field string) (uint64, bool) {
	rest, ok := strings.CutPrefix(msg, field)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, ";")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(digits, 10, 64)
	return v, err == nil
}

// KVBucketConfig is what a bucket is created with. Zero fields take the
// broker's defaults: History 0 = 1, TombstoneTTLMs 0 = 24 h, Replicas 0 =
// the broker's default (1 on a single node, 3 in a cluster of 3 or more).
type KVBucketConfig struct {
	Bucket         string
	History        uint32 // revisions kept per key, 1..KVHistoryMax
	TombstoneTTLMs int64  // how long a delete is kept before compaction may purge it
	Replicas       uint8  // 1, 3 or 5
}

func (c *KVBucketConfig) append(b []byte) []byte {
	b = appendStr(b, c.Bucket)
	b = binary.BigEndian.AppendUint32(b, c.History)
	b = binary.BigEndian.AppendUint64(b, uint64(c.TombstoneTTLMs))
	return append(b, c.Replicas)
}

func (c *KVBucketConfig) decode(d *decoder) {
	c.Bucket, c.History, c.TombstoneTTLMs, c.Replicas = d.str(), d.u32(), int64(d.u64()), d.u8()
}

// KVBucketCreate creates a bucket, or confirms one created with the same
// configuration (a different one is TOPIC_CONFLICT).
type KVBucketCreate struct{ Config KVBucketConfig }

func (*KVBucketCreate) Type() FrameType              { return TypeKVBucketCreate }
func (f *KVBucketCreate) appendBody(b []byte) []byte { return f.Config.append(b) }
func (f *KVBucketCreate) decodeBody(d *decoder)      { f.Config.decode(d) }

// KVBucketOK answers KV_BUCKET_CREATE (the bucket's configuration, with
// the defaults filled in; Created false when it existed) and
// KV_BUCKET_DELETE (Created false).
type KVBucketOK struct {
	Config  KVBucketConfig
	Created bool
}

func (*KVBucketOK) Type() FrameType { return TypeKVBucketOK }
func (f *KVBucketOK) appendBody(b []byte) []byte {
	return appendBool(f.Config.append(b), f.Created)
}
func (f *KVBucketOK) decodeBody(d *decoder) { f.Config.decode(d); f.Created = d.boolean() }

// KVBucketDelete deletes a bucket: its keys are gone and its name may be
// created again (an empty bucket whose revisions continue its log).
type KVBucketDelete struct{ Bucket string }

func (*KVBucketDelete) Type() FrameType              { return TypeKVBucketDelete }
func (f *KVBucketDelete) appendBody(b []byte) []byte { return appendStr(b, f.Bucket) }
func (f *KVBucketDelete) decodeBody(d *decoder)      { f.Bucket = d.str() }

// KVBucketList asks for one bucket ("" = every bucket).
type KVBucketList struct{ Bucket string }

func (*KVBucketList) Type() FrameType              { return TypeKVBucketList }
func (f *KVBucketList) appendBody(b []byte) []byte { return appendStr(b, f.Bucket) }
func (f *KVBucketList) decodeBody(d *decoder)      { f.Bucket = d.str() }

// KVBucketInfo describes a bucket as the answering node knows it.
// Revision (the last seq applied) and Floor are the answering node's
// view; Leader and LeaderAddr name the node that takes its writes, reads
// and watches ("" during an election).
type KVBucketInfo struct {
	Config             KVBucketConfig
	Revision, Floor    uint64
	Keys               uint32 // live keys, when the answering node holds the bucket
	Leader, LeaderAddr string
}

// KVBucketListOK answers KV_BUCKET_LIST. A requested bucket that does not
// exist is NOT_FOUND instead.
type KVBucketListOK struct{ Buckets []KVBucketInfo }

func (*KVBucketListOK) Type() FrameType { return TypeKVBucketListOK }
func (f *KVBucketListOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Buckets)))
	for i := range f.Buckets {
		in := &f.Buckets[i]
		b = in.Config.append(b)
		b = binary.BigEndian.AppendUint64(b, in.Revision)
		b = binary.BigEndian.AppendUint64(b, in.Floor)
		b = binary.BigEndian.AppendUint32(b, in.Keys)
		b = appendStr(appendStr(b, in.Leader), in.LeaderAddr)
	}
	return b
}
func (f *KVBucketListOK) decodeBody(d *decoder) {
	n := d.listLen(2 + 4 + 8 + 1 + 8 + 8 + 4 + 2 + 2)
	if n == 0 {
		return
	}
	f.Buckets = make([]KVBucketInfo, n)
	for i := 0; i < n && d.err == nil; i++ {
		in := &f.Buckets[i]
		in.Config.decode(d)
		in.Revision, in.Floor, in.Keys = d.u64(), d.u64(), d.u32()
		in.Leader, in.LeaderAddr = d.str(), d.str()
	}
}

// KV write operations.
const (
	KVOpPut    uint8 = 1
	KVOpDelete uint8 = 2
)

// KVWrite puts or deletes a key. Conditional makes it a compare-and-set:
// it applies only if the key's latest revision is Expected (0: the key is
// absent or deleted), else REVISION_MISMATCH. Answered with KV_WRITE_OK
// once the write is committed and applied.
type KVWrite struct {
	Bucket      string
	Op          uint8
	Key, Value  []byte
	Conditional bool
	Expected    uint64
}

func (*KVWrite) Type() FrameType { return TypeKVWrite }
func (f *KVWrite) appendBody(b []byte) []byte {
	b = append(appendStr(b, f.Bucket), f.Op)
	b = appendBytes(appendBytes(b, f.Key), f.Value)
	b = appendBool(b, f.Conditional)
	return binary.BigEndian.AppendUint64(b, f.Expected)
}
func (f *KVWrite) decodeBody(d *decoder) {
	f.Bucket, f.Op, f.Key, f.Value = d.str(), d.u8(), d.bytes(), d.bytes()
	f.Conditional, f.Expected = d.boolean(), d.u64()
	if d.err == nil && f.Op != KVOpPut && f.Op != KVOpDelete {
		d.fail("KV_WRITE op %d is not put (1) or delete (2)", f.Op)
	}
}

// KVWriteOK confirms a write: Revision is its seq in the bucket's log.
type KVWriteOK struct{ Revision uint64 }

func (*KVWriteOK) Type() FrameType { return TypeKVWriteOK }
func (f *KVWriteOK) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint64(b, f.Revision)
}
func (f *KVWriteOK) decodeBody(d *decoder) { f.Revision = d.u64() }

// KVGet reads a key's latest value (Revision 0), or its revision at
// Revision (a value or a tombstone; NOT_FOUND when not kept).
type KVGet struct {
	Bucket   string
	Key      []byte
	Revision uint64
}

func (*KVGet) Type() FrameType { return TypeKVGet }
func (f *KVGet) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint64(appendBytes(appendStr(b, f.Bucket), f.Key), f.Revision)
}
func (f *KVGet) decodeBody(d *decoder) { f.Bucket, f.Key, f.Revision = d.str(), d.bytes(), d.u64() }

// KVEntry is one revision of a key: a value (Op put) or a tombstone (Op
// delete, no value).
type KVEntry struct {
	Key         []byte
	Revision    uint64
	Op          uint8
	TimestampMs int64
	Value       []byte
}

func (e *KVEntry) append(b []byte) []byte {
	b = appendBytes(b, e.Key)
	b = binary.BigEndian.AppendUint64(b, e.Revision)
	b = append(b, e.Op)
	b = binary.BigEndian.AppendUint64(b, uint64(e.TimestampMs))
	return appendBytes(b, e.Value)
}

const kvEntryBytesMin = 4 + 8 + 1 + 8 + 4

func (e *KVEntry) decode(d *decoder) {
	e.Key, e.Revision, e.Op, e.TimestampMs, e.Value = d.bytes(), d.u64(), d.u8(), int64(d.u64()), d.bytes()
}

// KVGetOK answers KV_GET. Found false: the key is absent or deleted (a
// latest read). BucketRevision is the bucket's last applied seq when the
// read was answered.
type KVGetOK struct {
	Found          bool
	Entry          KVEntry
	BucketRevision uint64
}

func (*KVGetOK) Type() FrameType { return TypeKVGetOK }
func (f *KVGetOK) appendBody(b []byte) []byte {
	b = f.Entry.append(appendBool(b, f.Found))
	return binary.BigEndian.AppendUint64(b, f.BucketRevision)
}
func (f *KVGetOK) decodeBody(d *decoder) {
	f.Found = d.boolean()
	f.Entry.decode(d)
	f.BucketRevision = d.u64()
}

// KVKeys lists the live keys that start with Prefix, sorted, after After
// (exclusive; empty = from the first), at most Limit (0 or more than
// KVKeysPageMax = KVKeysPageMax).
type KVKeys struct {
	Bucket        string
	Prefix, After []byte
	Limit         uint32
}

func (*KVKeys) Type() FrameType { return TypeKVKeys }
func (f *KVKeys) appendBody(b []byte) []byte {
	b = appendBytes(appendBytes(appendStr(b, f.Bucket), f.Prefix), f.After)
	return binary.BigEndian.AppendUint32(b, f.Limit)
}
func (f *KVKeys) decodeBody(d *decoder) {
	f.Bucket, f.Prefix, f.After, f.Limit = d.str(), d.bytes(), d.bytes(), d.u32()
}

// KVKeysOK answers KV_KEYS: More says a later page exists (ask again
// with After = the last key).
type KVKeysOK struct {
	Keys           [][]byte
	More           bool
	BucketRevision uint64
}

func (*KVKeysOK) Type() FrameType { return TypeKVKeysOK }
func (f *KVKeysOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Keys)))
	for _, k := range f.Keys {
		b = appendBytes(b, k)
	}
	b = appendBool(b, f.More)
	return binary.BigEndian.AppendUint64(b, f.BucketRevision)
}
func (f *KVKeysOK) decodeBody(d *decoder) {
	if n := d.listLen(4); n > 0 {
		f.Keys = make([][]byte, n)
		for i := 0; i < n && d.err == nil; i++ {
			f.Keys[i] = d.bytes()
		}
	}
	f.More, f.BucketRevision = d.boolean(), d.u64()
}

// KVHistory asks for a key's kept revisions, oldest first.
type KVHistory struct {
	Bucket string
	Key    []byte
}

func (*KVHistory) Type() FrameType              { return TypeKVHistory }
func (f *KVHistory) appendBody(b []byte) []byte { return appendBytes(appendStr(b, f.Bucket), f.Key) }
func (f *KVHistory) decodeBody(d *decoder)      { f.Bucket, f.Key = d.str(), d.bytes() }

// KVHistoryOK answers KV_HISTORY (empty when the key has no revision).
type KVHistoryOK struct{ Entries []KVEntry }

func (*KVHistoryOK) Type() FrameType { return TypeKVHistoryOK }
func (f *KVHistoryOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Entries)))
	for i := range f.Entries {
		b = f.Entries[i].append(b)
	}
	return b
}
func (f *KVHistoryOK) decodeBody(d *decoder) {
	if n := d.listLen(kvEntryBytesMin); n > 0 {
		f.Entries = make([]KVEntry, n)
		for i := 0; i < n && d.err == nil; i++ {
			f.Entries[i].decode(d)
		}
	}
}

// KVWatch starts a watch of the keys that start with Prefix from
// revision FromRevision (0 = 1, the start), with Credit events. The
// watch is named by this frame's corr: its KV_EVENTs carry it, and
// KV_WATCH_CREDIT / KV_WATCH_CANCEL name it. The server sends events in
// revision order while credit lasts (SKIPPED takes none); an ERR on the
// corr ends the watch (CURSOR_EXPIRED, NOT_LEADER, NOT_FOUND...).
type KVWatch struct {
	Bucket       string
	Prefix       []byte
	FromRevision uint64
	Credit       uint32
}

func (*KVWatch) Type() FrameType { return TypeKVWatch }
func (f *KVWatch) appendBody(b []byte) []byte {
	b = appendBytes(appendStr(b, f.Bucket), f.Prefix)
	b = binary.BigEndian.AppendUint64(b, f.FromRevision)
	return binary.BigEndian.AppendUint32(b, f.Credit)
}
func (f *KVWatch) decodeBody(d *decoder) {
	f.Bucket, f.Prefix, f.FromRevision, f.Credit = d.str(), d.bytes(), d.u64(), d.u32()
}

// KV_EVENT kinds.
const (
	KVEventPut     uint8 = 1 // a value at Entry.Revision
	KVEventDelete  uint8 = 2 // a tombstone at Entry.Revision
	KVEventSkipped uint8 = 3 // revisions From..To hold nothing for this watch (Reasons)
)

// KVEvent is one event of a watch. Put/delete carry Entry; skipped
// carries From, To and Reasons (1 overwritten or no revision, 2 outside
// the prefix; ORed). Floor is the bucket's floor when the event was sent.
type KVEvent struct {
	Kind     uint8
	Entry    KVEntry
	From, To uint64
	Reasons  uint8
	Floor    uint64
}

func (*KVEvent) Type() FrameType { return TypeKVEvent }
func (f *KVEvent) appendBody(b []byte) []byte {
	b = f.Entry.append(append(b, f.Kind))
	b = binary.BigEndian.AppendUint64(b, f.From)
	b = binary.BigEndian.AppendUint64(b, f.To)
	b = append(b, f.Reasons)
	return binary.BigEndian.AppendUint64(b, f.Floor)
}
func (f *KVEvent) decodeBody(d *decoder) {
	f.Kind = d.u8()
	f.Entry.decode(d)
	f.From, f.To, f.Reasons, f.Floor = d.u64(), d.u64(), d.u8(), d.u64()
	if d.err == nil && (f.Kind < KVEventPut || f.Kind > KVEventSkipped) {
		d.fail("KV_EVENT kind %d is not put (1), delete (2) or skipped (3)", f.Kind)
	}
}

// KVWatchCredit grants a watch (the corr of its KV_WATCH) more events.
type KVWatchCredit struct {
	Watch  uint64
	Credit uint32
}

func (*KVWatchCredit) Type() FrameType { return TypeKVWatchCredit }
func (f *KVWatchCredit) appendBody(b []byte) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(b, f.Watch), f.Credit)
}
func (f *KVWatchCredit) decodeBody(d *decoder) { f.Watch, f.Credit = d.u64(), d.u32() }

// KVWatchCancel ends a watch (the corr of its KV_WATCH).
type KVWatchCancel struct{ Watch uint64 }

func (*KVWatchCancel) Type() FrameType              { return TypeKVWatchCancel }
func (f *KVWatchCancel) appendBody(b []byte) []byte { return binary.BigEndian.AppendUint64(b, f.Watch) }
func (f *KVWatchCancel) decodeBody(d *decoder)      { f.Watch = d.u64() }

// KVList lists every live entry whose key starts with Prefix, at one
// revision (the SDK's applied loop resyncs from it). A listing larger than
// KVListBytesMax (keys and values) or listLenMax entries is refused with
// INVALID_ARGUMENT.
type KVList struct {
	Bucket string
	Prefix []byte
}

func (*KVList) Type() FrameType              { return TypeKVList }
func (f *KVList) appendBody(b []byte) []byte { return appendBytes(appendStr(b, f.Bucket), f.Prefix) }
func (f *KVList) decodeBody(d *decoder)      { f.Bucket, f.Prefix = d.str(), d.bytes() }

// KVListOK answers KV_LIST: the live entries at BucketRevision, sorted by
// key.
type KVListOK struct {
	BucketRevision uint64
	Entries        []KVEntry
}

func (*KVListOK) Type() FrameType { return TypeKVListOK }
func (f *KVListOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, f.BucketRevision)
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Entries)))
	for i := range f.Entries {
		b = f.Entries[i].append(b)
	}
	return b
}
func (f *KVListOK) decodeBody(d *decoder) {
	f.BucketRevision = d.u64()
	if n := d.listLen(kvEntryBytesMin); n > 0 {
		f.Entries = make([]KVEntry, n)
		for i := 0; i < n && d.err == nil; i++ {
			f.Entries[i].decode(d)
		}
	}
}

// KVListPage asks for one page of a listing of every live entry with
// Prefix. Listing 0 opens a new listing at the bucket's current revision
// (the answer names it); later pages name it and the Offset of their
// first entry (the count of entries already received), so a page asked
// again after a lost answer is the same page. Limit bounds the entries
// of the page (0: as many as fit in KVListBytesMax).
type KVListPage struct {
	Bucket  string
	Prefix  []byte
	Listing uint64
	Offset  uint64
	Limit   uint32
}

func (*KVListPage) Type() FrameType { return TypeKVListPage }
func (f *KVListPage) appendBody(b []byte) []byte {
	b = appendBytes(appendStr(b, f.Bucket), f.Prefix)
	b = binary.BigEndian.AppendUint64(b, f.Listing)
	b = binary.BigEndian.AppendUint64(b, f.Offset)
	return binary.BigEndian.AppendUint32(b, f.Limit)
}
func (f *KVListPage) decodeBody(d *decoder) {
	f.Bucket, f.Prefix = d.str(), d.bytes()
	f.Listing, f.Offset, f.Limit = d.u64(), d.u64(), d.u32()
}

// KVListPageOK is one page of a listing: its entries from Offset on,
// sorted by key, as of BucketRevision (the same for every page of the
// listing); More is true while entries follow.
type KVListPageOK struct {
	Listing        uint64
	BucketRevision uint64
	Entries        []KVEntry
	More           bool
}

func (*KVListPageOK) Type() FrameType { return TypeKVListPageOK }
func (f *KVListPageOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, f.Listing)
	b = (&KVListOK{BucketRevision: f.BucketRevision, Entries: f.Entries}).appendBody(b)
	return appendBool(b, f.More)
}
func (f *KVListPageOK) decodeBody(d *decoder) {
	f.Listing = d.u64()
	var l KVListOK
	l.decodeBody(d)
	f.BucketRevision, f.Entries, f.More = l.BucketRevision, l.Entries, d.boolean()
}
