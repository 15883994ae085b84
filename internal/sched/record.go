package sched

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Kind is the kind of a scheduler record in a shard's log.
type Kind uint8

const (
	// KindSchedule admits one schedule; its id is the record's seq in the
	// shard's log. The message itself (key, value, headers) is the shard
	// record's own and is read back from the log when it fires.
	KindSchedule Kind = iota + 1
	// KindIntent claims due schedules for publication: each gets its
	// destination partition and a fire sequence, the producer_seq of the
	// publish under the (shard, destination partition) producer identity.
	KindIntent
	// KindFired resolves intents whose publish the destination
	// acknowledged (a first append or a deduplicated retry).
	KindFired
	// KindUnknown resolves intents whose outcome the destination can no
	// longer prove (its dedup window moved past the fire sequence), or
	// that a retired lane abandoned: recorded, never guessed.
	KindUnknown
	// KindCancel cancels pending schedules (not those already claimed).
	KindCancel
	// KindLane is a management command on a destination lane's admission
	// gate (pause, resume, close, retire, or the owner's ordering break).
	KindLane
	// KindCarry re-writes a live schedule's message at the log's tail: the
	// shard record's key, value and headers are the message again, and
	// applying it moves the schedule's At (where its message lives) to
	// the carry's seq, so the log's prefix that held it can go. Its id
	// never changes (users cancel by id).
	KindCarry
	// KindCheckpoint is one chunk of the State as of its Base (every
	// schedule's index, no payloads): a replica whose log starts after
	// what it applied loads it instead of the records it lost.
	KindCheckpoint
)

func (k Kind) String() string {
	switch k {
	case KindSchedule:
		return "schedule"
	case KindIntent:
		return "intent"
	case KindFired:
		return "fired"
	case KindUnknown:
		return "unknown"
	case KindCancel:
		return "cancel"
	case KindLane:
		return "lane"
	case KindCarry:
		return "carry"
	case KindCheckpoint:
		return "checkpoint"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Schedule is what a KindSchedule record says beyond the message.
type Schedule struct {
	DeliverAtMs int64  // unix ms; never published before it (by the owner's clock)
	Topic       string // the destination topic: the schedule's lane
	// Incarnation is the destination topic's incarnation at intake. The
	// lane's first schedule pins it; a destination re-created since is
	// another topic, and the lane breaks its ordering instead of firing
	// into it (LaneFiresOnlyIntoItsIncarnation).
	Incarnation uint64
	// Partition is the destination partition chosen at intake with the
	// broker's rule (explicit, key hash, producer identity); a lane
	// resumed into an incarnation with fewer partitions folds it modulo.
	Partition uint32
}

// Intent is one claimed schedule.
type Intent struct {
	ID        uint64 // the schedule's id
	Partition uint32 // destination partition
	FireSeq   uint64 // producer_seq under the (shard, Partition) producer identity of the lane
}

// Fired is one intent the destination acknowledged.
type Fired struct {
	ID      uint64
	DestSeq uint64 // where it landed in the destination partition
}

// LaneOp is a management command on a lane's admission gate.
type LaneOp uint8

const (
	LaneResume LaneOp = iota + 1 // back to OPEN, pinning Incarnation
	LanePause                    // OPEN → ADMIN_PAUSED
	LaneClose                    // no new schedules, nothing fires
	LaneRetire                   // terminal: pending schedules cancelled
	LaneBreak                    // the owner saw another incarnation: ORDERING_BROKEN
)

func (op LaneOp) String() string {
	switch op {
	case LaneResume:
		return "resume"
	case LanePause:
		return "pause"
	case LaneClose:
		return "close"
	case LaneRetire:
		return "retire"
	case LaneBreak:
		return "break"
	}
	return fmt.Sprintf("LaneOp(%d)", uint8(op))
}

// LaneCommand is a KindLane record.
type LaneCommand struct {
	Topic string
	Op    LaneOp
	// Incarnation: for LaneResume the incarnation to pin (0 keeps the
	// pinned one); for LaneBreak the pinned incarnation the owner saw
	// contradicted (a break that names an older pin is stale and ignored).
	Incarnation uint64
}

// Carry is a KindCarry record: the live schedule it moves, named by its
// id and its key (so a spilled one is found without its first record,
// which compaction may have taken), and From, the seq of the record that
// held its message when the carry was proposed.
type Carry struct {
	ID          uint64
	Topic       string
	DeliverAtMs int64
	Partition   uint32
	From        uint64
}

// Checkpoint is one chunk of a KindCheckpoint: the State as of Base, the
// seq of the last entry it describes. Its chunks lie at Base+1 ..
// Base+Chunks, in order, with nothing between them; a chunk anywhere else
// voids the checkpoint (CheckpointAtItsBase). Chunk 0 holds the counts,
// the lanes and the fire logs; every chunk holds live schedules. Entries,
// lanes and fires name their topic by its index in the chunk's Topics.
type Checkpoint struct {
	Base          uint64
	Chunk, Chunks uint32
	Counts        Counts
	Topics        []string
	Lanes         []CheckpointLane
	Fires         []CheckpointFire
	Entries       []CheckpointEntry
	// Refusing: the lanes' spans of seqs refusing schedules (Lane.refusing),
	// in the head chunk; encoded only when there are any, so a checkpoint
	// without them reads as before they were kept.
	Refusing []CheckpointSpan
}

// CheckpointSpan is one of a lane's spans of seqs refusing schedules.
type CheckpointSpan struct {
	Topic    uint16
	From, To uint64
}

// CheckpointLane is a lane's gate and pinned incarnation.
type CheckpointLane struct {
	Topic       uint16
	Gate        Gate
	Incarnation uint64
}

// CheckpointFire is a destination partition's highest fire sequence.
type CheckpointFire struct {
	Topic     uint16
	Partition uint32
	Last      uint64
}

// CheckpointEntry is a live schedule without its message: At is the seq
// of the record that holds it. FireSeq, Epoch and Incarnation are a
// firing schedule's (zero for a pending one).
type CheckpointEntry struct {
	Topic       uint16
	Status      Status
	ID          uint64
	DeliverAtMs int64
	Partition   uint32
	At          uint64
	FireSeq     uint64
	Epoch       uint64
	Incarnation uint64
}

// Record is a scheduler record of a shard's log. Exactly the fields of
// its Kind are set.
type Record struct {
	Kind     Kind
	Schedule Schedule // KindSchedule
	Epoch    uint64   // KindIntent: the owner epoch that claimed
	// Incarnation (KindIntent): the destination incarnation the claim's
	// certificate vouched for. An intent still unresolved when its lane
	// pins another incarnation is resolved UNKNOWN, never published into
	// the new one: the new topic's dedup cannot prove an attempt that may
	// have landed in the deleted one.
	Incarnation uint64
	Intents     []Intent    // KindIntent
	Fired       []Fired     // KindFired
	IDs         []uint64    // KindUnknown, KindCancel
	Lane        LaneCommand // KindLane
	Carry       Carry       // KindCarry
	Checkpoint  Checkpoint  // KindCheckpoint
}

// Size bounds: a record is refused (encoding) or rejected (decoding)
// beyond them.
const (
	TopicBytesMax    = 255 // wire topic names are at most 200 bytes
	RecordEntriesMax = 1 << 16
)

// CheckpointChunksMax bounds a checkpoint's chunks (a shard of
// 2^16 * 2^12 live schedules is far beyond any window).
const CheckpointChunksMax = 1 << 12

const (
	intentBytes = 8 + 4 + 8
	firedBytes  = 8 + 8
	idBytes     = 8
	// checkpoint entries: topic, status, id, deliver_at, partition, at
	// (a firing one adds fire seq, epoch, incarnation)
	ckptLaneBytes        = 2 + 1 + 8
	ckptFireBytes        = 2 + 4 + 8
	ckptSpanBytes        = 2 + 8 + 8
	ckptEntryBytes       = 2 + 1 + 8 + 8 + 4 + 8
	ckptFiringExtraBytes = 8 + 8 + 8
	ckptTopicBytesMin    = 2
	ckptTopicsMax        = 1<<16 - 1
)

// Encode lays r out as a record value: the kind byte, then the kind's
// fields big endian; strings are a u8 length and bytes, lists a u32
// count and fixed-size entries. The layout is canonical: Decode accepts
// exactly what Encode produces.
func (r *Record) Encode() ([]byte, error) {
	b := []byte{byte(r.Kind)}
	switch r.Kind {
	case KindSchedule:
		s := r.Schedule
		if err := checkTopic(s.Topic); err != nil {
			return nil, err
		}
		b = binary.BigEndian.AppendUint64(b, uint64(s.DeliverAtMs))
		b = appendTopic(b, s.Topic)
		b = binary.BigEndian.AppendUint64(b, s.Incarnation)
		b = binary.BigEndian.AppendUint32(b, s.Partition)
	case KindIntent:
		if err := checkEntries(len(r.Intents)); err != nil {
			return nil, err
		}
		b = binary.BigEndian.AppendUint64(b, r.Epoch)
		b = binary.BigEndian.AppendUint64(b, r.Incarnation)
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.Intents)))
		for _, in := range r.Intents {
			b = binary.BigEndian.AppendUint64(b, in.ID)
			b = binary.BigEndian.AppendUint32(b, in.Partition)
			b = binary.BigEndian.AppendUint64(b, in.FireSeq)
		}
	case KindFired:
		if err := checkEntries(len(r.Fired)); err != nil {
			return nil, err
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.Fired)))
		for _, f := range r.Fired {
			b = binary.BigEndian.AppendUint64(b, f.ID)
			b = binary.BigEndian.AppendUint64(b, f.DestSeq)
		}
	case KindUnknown, KindCancel:
		if err := checkEntries(len(r.IDs)); err != nil {
			return nil, err
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.IDs)))
		for _, id := range r.IDs {
			b = binary.BigEndian.AppendUint64(b, id)
		}
	case KindLane:
		l := r.Lane
		if err := checkTopic(l.Topic); err != nil {
			return nil, err
		}
		if l.Op < LaneResume || l.Op > LaneBreak {
			return nil, fmt.Errorf("sched: lane command %v", l.Op)
		}
		b = appendTopic(b, l.Topic)
		b = append(b, byte(l.Op))
		b = binary.BigEndian.AppendUint64(b, l.Incarnation)
	case KindCarry:
		c := r.Carry
		if err := checkTopic(c.Topic); err != nil {
			return nil, err
		}
		b = binary.BigEndian.AppendUint64(b, c.ID)
		b = appendTopic(b, c.Topic)
		b = binary.BigEndian.AppendUint64(b, uint64(c.DeliverAtMs))
		b = binary.BigEndian.AppendUint32(b, c.Partition)
		b = binary.BigEndian.AppendUint64(b, c.From)
	case KindCheckpoint:
		return r.Checkpoint.encode(b)
	default:
		return nil, fmt.Errorf("sched: encode %v", r.Kind)
	}
	return b, nil
}

func checkTopic(t string) error {
	if t == "" || len(t) > TopicBytesMax {
		return fmt.Errorf("sched: destination topic of %d bytes, want 1..%d", len(t), TopicBytesMax)
	}
	return nil
}

func checkEntries(n int) error {
	if n == 0 || n > RecordEntriesMax {
		return fmt.Errorf("sched: record with %d entries, want 1..%d", n, RecordEntriesMax)
	}
	return nil
}

func appendTopic(b []byte, t string) []byte { return append(append(b, byte(len(t))), t...) }

// errShort and friends describe why a value is not a scheduler record.
var errShort = errors.New("sched: record value too short")

// Decode parses a record value laid out by Encode.
func Decode(b []byte) (Record, error) {
	d := decoder{b: b}
	var r Record
	r.Kind = Kind(d.u8())
	switch r.Kind {
	case KindSchedule:
		r.Schedule.DeliverAtMs = int64(d.u64())
		r.Schedule.Topic = d.topic()
		r.Schedule.Incarnation = d.u64()
		r.Schedule.Partition = d.u32()
	case KindIntent:
		r.Epoch = d.u64()
		r.Incarnation = d.u64()
		n := d.count(intentBytes)
		r.Intents = make([]Intent, n)
		for i := range r.Intents {
			r.Intents[i] = Intent{ID: d.u64(), Partition: d.u32(), FireSeq: d.u64()}
		}
	case KindFired:
		n := d.count(firedBytes)
		r.Fired = make([]Fired, n)
		for i := range r.Fired {
			r.Fired[i] = Fired{ID: d.u64(), DestSeq: d.u64()}
		}
	case KindUnknown, KindCancel:
		n := d.count(idBytes)
		r.IDs = make([]uint64, n)
		for i := range r.IDs {
			r.IDs[i] = d.u64()
		}
	case KindLane:
		r.Lane.Topic = d.topic()
		r.Lane.Op = LaneOp(d.u8())
		r.Lane.Incarnation = d.u64()
		if d.err == nil && (r.Lane.Op < LaneResume || r.Lane.Op > LaneBreak) {
			d.err = fmt.Errorf("sched: lane command %v", r.Lane.Op)
		}
	case KindCarry:
		r.Carry.ID = d.u64()
		r.Carry.Topic = d.topic()
		r.Carry.DeliverAtMs = int64(d.u64())
		r.Carry.Partition = d.u32()
		r.Carry.From = d.u64()
	case KindCheckpoint:
		r.Checkpoint = d.checkpoint()
	default:
		if d.err == nil {
			d.err = fmt.Errorf("sched: record of kind %v", r.Kind)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("sched: %v record with %d trailing bytes", r.Kind, len(d.b))
	}
	if d.err != nil {
		return Record{}, d.err
	}
	return r, nil
}

// decoder reads big-endian fields; the first error sticks and every
// later read returns zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = errShort
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) topic() string {
	n := int(d.u8())
	if d.err == nil && n == 0 {
		d.err = errors.New("sched: empty destination topic")
		return ""
	}
	return string(d.take(n))
}

// list reads a list length that may be 0 and checks the value holds
// that many entries of at least size bytes before anything is allocated.
func (d *decoder) list(size int) int { return d.entries(size, 0) }

// count reads a list length of at least one entry, checked as list's.
func (d *decoder) count(size int) int { return d.entries(size, 1) }

func (d *decoder) entries(size, least int) int {
	n := int(d.u32())
	if d.err != nil {
		return 0
	}
	if n < least || n > RecordEntriesMax {
		d.err = fmt.Errorf("sched: record with %d entries, want %d..%d", n, least, RecordEntriesMax)
		return 0
	}
	if len(d.b) < n*size {
		d.err = errShort
		return 0
	}
	return n
}
