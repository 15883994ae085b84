package wire

import "encoding/binary"

// Scheduled-delivery frames (DESIGN §2 "Scheduled delivery"): a message
// with a deliver_at is stored in a schedule shard and published to its
// topic when it falls due. Frame types 60–63 and 29–30 are scheduled
// delivery's (72–75: topics.go).
const (
	TypeSchedule     FrameType = 60 // schedule a message (to the shard's leader)
	TypeScheduleOK   FrameType = 61
	TypeSchedAdmin   FrameType = 62 // list, status, cancel, lane commands
	TypeSchedAdminOK FrameType = 63
)

// Paged listing of a shard's live schedules (frames 29–30): SCHED_ADMIN's
// layout cannot grow (the codec refuses trailing bytes), so the listing
// that pages is a frame pair of its own, as KV_LIST_PAGE is beside
// KV_LIST.
const (
	TypeSchedListPage   FrameType = 29 // one page of a shard's live schedules
	TypeSchedListPageOK FrameType = 30
)

// SchedListLimitMax bounds the schedules of one SCHED_LIST_PAGE_OK page
// (and of SCHED_ADMIN's list): a limit of 0 or above it is this. A
// page's frame is then at most about 290 KB (a topic of at most 255
// bytes a schedule), far below the frame maximum.
const SchedListLimitMax = 1000

// SchedTopic is the internal topic whose partitions are the schedule
// shards.
const SchedTopic = "__sched"

func init() {
	typeNames[TypeSchedule], typeNames[TypeScheduleOK] = "SCHEDULE", "SCHEDULE_OK"
	typeNames[TypeSchedAdmin], typeNames[TypeSchedAdminOK] = "SCHED_ADMIN", "SCHED_ADMIN_OK"
	typeNames[TypeSchedListPage], typeNames[TypeSchedListPageOK] = "SCHED_LIST_PAGE", "SCHED_LIST_PAGE_OK"
}

// SchedShard picks a schedule's shard among shards: by its topic and
// key, else by its producer identity (a retry goes where the original
// went), else by its destination partition. Brokers and clients agree on
// it: a client sends a SCHEDULE to its shard's leader.
func SchedShard(topic string, key []byte, producerID, producerSeq uint64, partition, shards uint32) uint32 {
	switch {
	case len(key) > 0:
		return PartitionForKey(append([]byte(topic+"\x00"), key...), shards)
	case producerID != 0:
		return PartitionForProducer(producerID, producerSeq, shards)
	}
	return partition % shards
}

func newSchedFrame(t FrameType) Frame {
	switch t {
	case TypeSchedule:
		return &Schedule{}
	case TypeScheduleOK:
		return &ScheduleOK{}
	case TypeSchedAdmin:
		return &SchedAdmin{}
	case TypeSchedAdminOK:
		return &SchedAdminOK{}
	case TypeSchedListPage:
		return &SchedListPage{}
	case TypeSchedListPageOK:
		return &SchedListPageOK{}
	}
	return nil
}

// Schedule asks for Pub to be published when the broker's clock reaches
// DeliverAtMs (unix ms; one in the past is due at once). Pub's producer
// identity makes a retry idempotent: it is deduplicated in the shard.
type Schedule struct {
	Pub         Pub
	DeliverAtMs int64
}

func (*Schedule) Type() FrameType { return TypeSchedule }
func (f *Schedule) appendBody(b []byte) []byte {
	b = f.Pub.appendBody(b)
	return binary.BigEndian.AppendUint64(b, uint64(f.DeliverAtMs))
}
func (f *Schedule) decodeBody(d *decoder) {
	f.Pub.decodeBody(d)
	f.DeliverAtMs = int64(d.u64())
}

// ScheduleOK answers SCHEDULE once the schedule is durable (on a quorum
// of the shard's replicas): ID names it within its shard. Duplicate is
// true for a retry answered from the shard's dedup table.
type ScheduleOK struct {
	Shard       uint32
	ID          uint64
	DeliverAtMs int64
	Duplicate   bool
}

func (*ScheduleOK) Type() FrameType { return TypeScheduleOK }
func (f *ScheduleOK) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, f.Shard)
	b = binary.BigEndian.AppendUint64(b, f.ID)
	b = binary.BigEndian.AppendUint64(b, uint64(f.DeliverAtMs))
	return appendBool(b, f.Duplicate)
}
func (f *ScheduleOK) decodeBody(d *decoder) {
	f.Shard, f.ID, f.DeliverAtMs, f.Duplicate = d.u32(), d.u64(), int64(d.u64()), d.boolean()
}

// Scheduler administration operations.
const (
	SchedList   uint8 = 1 // live schedules (Topic filters; Limit bounds)
	SchedStatus uint8 = 2 // shards and lanes
	SchedCancel uint8 = 3 // cancel schedule ID of Shard
	SchedLane   uint8 = 4 // LaneOp on Topic's lane
)

// Lane commands of SCHED_ADMIN SchedLane.
const (
	LanePause  uint8 = 1
	LaneResume uint8 = 2
	LaneClose  uint8 = 3
	LaneRetire uint8 = 4
)

// SchedAdmin is a scheduler administration request, answered by
// SCHED_ADMIN_OK.
type SchedAdmin struct {
	Op     uint8
	Topic  string
	Shard  uint32
	ID     uint64
	LaneOp uint8
	Limit  uint32
}

func (*SchedAdmin) Type() FrameType { return TypeSchedAdmin }
func (f *SchedAdmin) appendBody(b []byte) []byte {
	b = append(b, f.Op)
	b = appendStr(b, f.Topic)
	b = binary.BigEndian.AppendUint32(b, f.Shard)
	b = binary.BigEndian.AppendUint64(b, f.ID)
	b = append(b, f.LaneOp)
	return binary.BigEndian.AppendUint32(b, f.Limit)
}
func (f *SchedAdmin) decodeBody(d *decoder) {
	f.Op, f.Topic, f.Shard, f.ID, f.LaneOp, f.Limit = d.u8(), d.str(), d.u32(), d.u64(), d.u8(), d.u32()
}

// ScheduleInfo is one live schedule.
type ScheduleInfo struct {
	Shard       uint32
	ID          uint64
	DeliverAtMs int64
	Topic       string
	Partition   uint32
	State       string // PENDING or FIRING
}

// ShardInfo is a schedule shard as its owner sees it.
type ShardInfo struct {
	Shard      uint32
	Lifecycle  string
	Owner      string
	OwnerEpoch uint64
	Pending    uint32
	NextDueMs  int64 // 0: none
	Fired      uint64
	Unknown    uint64
	Cancelled  uint64
}

// LaneInfo is a destination lane of a shard: both axes.
type LaneInfo struct {
	Shard       uint32
	Topic       string
	Gate        string
	Readiness   string
	Incarnation uint64
	Pending     uint32
}

// SchedAdminOK answers SCHED_ADMIN: schedules for SchedList, shards and
// lanes for SchedStatus, nothing else for the others.
type SchedAdminOK struct {
	Schedules []ScheduleInfo
	Shards    []ShardInfo
	Lanes     []LaneInfo
}

func (*SchedAdminOK) Type() FrameType { return TypeSchedAdminOK }
func (f *SchedAdminOK) appendBody(b []byte) []byte {
	b = appendScheduleInfos(b, f.Schedules)
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Shards)))
	for _, s := range f.Shards {
		b = binary.BigEndian.AppendUint32(b, s.Shard)
		b = appendStr(b, s.Lifecycle)
		b = appendStr(b, s.Owner)
		b = binary.BigEndian.AppendUint64(b, s.OwnerEpoch)
		b = binary.BigEndian.AppendUint32(b, s.Pending)
		b = binary.BigEndian.AppendUint64(b, uint64(s.NextDueMs))
		b = binary.BigEndian.AppendUint64(b, s.Fired)
		b = binary.BigEndian.AppendUint64(b, s.Unknown)
		b = binary.BigEndian.AppendUint64(b, s.Cancelled)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Lanes)))
	for _, l := range f.Lanes {
		b = binary.BigEndian.AppendUint32(b, l.Shard)
		b = appendStr(b, l.Topic)
		b = appendStr(b, l.Gate)
		b = appendStr(b, l.Readiness)
		b = binary.BigEndian.AppendUint64(b, l.Incarnation)
		b = binary.BigEndian.AppendUint32(b, l.Pending)
	}
	return b
}

func (f *SchedAdminOK) decodeBody(d *decoder) {
	f.Schedules = decodeScheduleInfos(d, 0)
	// Minimum encoded sizes: empty strings count 2 bytes each.
	for n := d.listLen(4 + 2 + 2 + 8 + 4 + 8*4); n > 0 && d.err == nil; n-- {
		f.Shards = append(f.Shards, ShardInfo{Shard: d.u32(), Lifecycle: d.str(), Owner: d.str(), OwnerEpoch: d.u64(), Pending: d.u32(),
			NextDueMs: int64(d.u64()), Fired: d.u64(), Unknown: d.u64(), Cancelled: d.u64()})
	}
	for n := d.listLen(4 + 2 + 2 + 2 + 8 + 4); n > 0 && d.err == nil; n-- {
		f.Lanes = append(f.Lanes, LaneInfo{Shard: d.u32(), Topic: d.str(), Gate: d.str(), Readiness: d.str(), Incarnation: d.u64(), Pending: d.u32()})
	}
}

// SchedListPage asks shard Shard's leader for one page of its live schedules
// (PENDING or FIRING) of Topic ("" = every topic), by (deliver_at, id):
// those after the cursor (AfterDeliverAtMs, AfterID) — the last schedule
// of the previous page; AfterID 0 is the start — at most Limit (0 or
// above SchedListLimitMax: SchedListLimitMax).
type SchedListPage struct {
	Shard            uint32
	Topic            string
	AfterDeliverAtMs int64
	AfterID          uint64
	Limit            uint32
}

func (*SchedListPage) Type() FrameType { return TypeSchedListPage }
func (f *SchedListPage) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, f.Shard)
	b = appendStr(b, f.Topic)
	b = binary.BigEndian.AppendUint64(b, uint64(f.AfterDeliverAtMs))
	b = binary.BigEndian.AppendUint64(b, f.AfterID)
	return binary.BigEndian.AppendUint32(b, f.Limit)
}
func (f *SchedListPage) decodeBody(d *decoder) {
	f.Shard, f.Topic, f.AfterDeliverAtMs, f.AfterID, f.Limit = d.u32(), d.str(), int64(d.u64()), d.u64(), d.u32()
}

// SchedListPageOK is one page of a shard's listing: its schedules in order
// (at most SchedListLimitMax; a longer list is BAD_FRAME), and More: the
// next page, after the last of these, holds more.
type SchedListPageOK struct {
	Schedules []ScheduleInfo
	More      bool
}

func (*SchedListPageOK) Type() FrameType { return TypeSchedListPageOK }
func (f *SchedListPageOK) appendBody(b []byte) []byte {
	b = appendScheduleInfos(b, f.Schedules)
	return appendBool(b, f.More)
}
func (f *SchedListPageOK) decodeBody(d *decoder) {
	f.Schedules = decodeScheduleInfos(d, SchedListLimitMax)
	f.More = d.boolean()
}

func appendScheduleInfos(b []byte, ss []ScheduleInfo) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(ss)))
	for _, s := range ss {
		b = binary.BigEndian.AppendUint32(b, s.Shard)
		b = binary.BigEndian.AppendUint64(b, s.ID)
		b = binary.BigEndian.AppendUint64(b, uint64(s.DeliverAtMs))
		b = appendStr(b, s.Topic)
		b = binary.BigEndian.AppendUint32(b, s.Partition)
		b = appendStr(b, s.State)
	}
	return b
}

// decodeScheduleInfos reads a list of schedules of at most max entries
// (0: the codec's list bound).
func decodeScheduleInfos(d *decoder, max int) []ScheduleInfo {
	// Minimum encoded sizes: empty strings count 2 bytes each.
	n := d.listLen(4 + 8 + 8 + 2 + 4 + 2)
	if max > 0 && n > max {
		d.fail("list of %d schedules exceeds %d", n, max)
		return nil
	}
	var out []ScheduleInfo
	for ; n > 0 && d.err == nil; n-- {
		out = append(out, ScheduleInfo{Shard: d.u32(), ID: d.u64(), DeliverAtMs: int64(d.u64()), Topic: d.str(), Partition: d.u32(), State: d.str()})
	}
	return out
}
