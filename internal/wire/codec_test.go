package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sampleFrames holds one populated value of every frame type; it is the
// round-trip table and the fuzz seed corpus.
func sampleFrames() []Frame {
	return []Frame{
		&Hello{VersionMin: 1, VersionMax: 3, Token: "s3cret", ClientName: "cli"},
		&HelloOK{Version: 1, NodeID: "n1", FrameBytesMax: DefaultFrameBytesMax},
		&Err{Code: CodeTopicConflict, Message: "partitions differ"},
		&Declare{Topic: TopicConfig{Name: "orders", Partitions: 4, RetentionMs: 3600000, RetentionBytes: 1 << 30, Replicas: 3, Ack: AckAll}},
		&DeclareOK{Topic: TopicConfig{Name: "orders", Partitions: 4}, Created: true},
		&Metadata{Topics: []string{"a", "b"}},
		&MetadataOK{Topics: []TopicInfo{{Config: TopicConfig{Name: "a", Partitions: 2}, Partitions: []PartitionInfo{
			{Partition: 0, Epoch: 1, StartSeq: 1, CommitSeq: 9, Leader: "n2", LeaderAddr: "127.0.0.1:4851", ReadOnly: true,
				Replicas: []ReplicaInfo{{Node: "n1", State: "CatchingUp", FlushedSeq: 7}, {Node: "n2", State: "InSync", FlushedSeq: 9}}},
			{Partition: 1, Epoch: 1, StartSeq: 3, CommitSeq: 4, State: PartitionStateCorrupt}}}}},
		&Pub{Topic: "orders", Partition: PartitionAuto, ProducerID: 7, ProducerSeq: 9, TimestampMs: 1234, Key: []byte("k"), Value: []byte("value"), Headers: []Header{{Key: "h", Value: []byte("v")}}},
		&PubOK{Partition: 3, Seq: 42, Epoch: 1, Duplicate: true},
		&Pull{Topic: "orders", Group: "g", Credit: 500, AckWaitMs: 30000, MaxDeliver: 5, Member: "pod-1", Incarnation: 12},
		&Msg{Topic: "orders", Partition: 1, Seq: 5, DeliveryID: 99, DeliveryCount: 2, TimestampMs: 77, Key: []byte("k"), Value: []byte("v")},
		&Ack{Topic: "orders", Group: "g", Entries: []AckEntry{{1, 5, 99}, {2, 6, 100}}},
		&AckOK{Results: []Code{CodeOK, CodeStaleDelivery}},
		&Nack{Topic: "orders", Group: "g", DelayMs: 10, Entries: []AckEntry{{1, 5, 99}}},
		&Ping{},
		&Pong{},
		&PubBatch{Topic: "orders", Partition: PartitionAuto, ProducerID: 7, Records: []PubRecord{
			{Corr: 3, ProducerSeq: 11, Value: []byte("a")},
			{Corr: 4, ProducerSeq: 12, TimestampMs: 1700000000000, Key: []byte("k"), Value: []byte("b"), Headers: []Header{{Key: "h", Value: []byte("v")}}},
		}},
		&PubBatchOK{Results: []PubResult{{Corr: 3, Partition: 1, Seq: 9, Epoch: 2}, {Corr: 4, Partition: 1, Seq: 9, Epoch: 2, Duplicate: true}, {Corr: 5, Code: CodeNotLeader, Message: "not here"}}},
		&PeerHello{Version: 1, From: 1, To: 2, Nonce: []byte("0123456789abcdef0123456789abcdef"), ClientAddr: "127.0.0.1:4850"},
		&PeerDeclare{ReqID: 7, Topic: TopicConfig{Name: "orders", Partitions: 2, Replicas: 3}},
		&PeerDeclareOK{ReqID: 7, Created: true, Code: CodeTopicConflict, Message: "differs"},
		&PeerPublish{ReqID: 8, Incarnation: 3, Pub: Pub{Topic: "dlq.g.t", ProducerID: 9, ProducerSeq: 1<<48 | 3, TimestampMs: 5,
			Key: []byte("k"), Value: []byte("v"), Headers: []Header{{Key: "nereus-dlq-seq", Value: []byte("3")}}}},
		&PeerPublishOK{ReqID: 8, OK: PubOK{Partition: 0, Seq: 4, Epoch: 2, Duplicate: true}},
		&PeerPublishOK{ReqID: 9, Code: CodeNotLeader, Message: "moved"},
		&PeerChallenge{Nonce: []byte("n"), Proof: []byte("p")},
		&PeerAuth{Proof: []byte("proof")},
		&Replicate{Topic: "t", Partition: 2, Kind: 3, From: 1, To: 2, Epoch: 7, LastEpoch: 6, LastSeq: 9, Granted: true, Uncertain: true, Damaged: true,
			PrevSeq: 8, PrevEpoch: 6, CommitSeq: 8, FlushedSeq: 9, Reject: 2, HintSeq: 4,
			Entries: []ReplicaEntry{{Seq: 9, Epoch: 7, Data: []byte("d")}}},
		&Join{Group: "billing", Member: "pod-1", Topics: []string{"orders", "refunds"}, Mode: GroupShared, SessionTimeoutMs: 10000, RebalanceTimeoutMs: 30000, JoinID: 77},
		&JoinOK{Incarnation: 12, MembershipEpoch: 3, HeartbeatMs: 2500},
		&Leave{MemberRef{Group: "billing", Member: "pod-1", Incarnation: 12}},
		&Heartbeat{MemberRef{Group: "billing", Member: "pod-1", Incarnation: 12}},
		&GroupOK{MembershipEpoch: 4},
		&Notice{Group: "billing", NoticeID: 9, Kind: NoticeRevoke, Incarnation: 12, Partitions: []HeldPartition{{Topic: "orders", Partition: 3, Epoch: 2}, {Topic: "refunds", Partition: 0, Epoch: 5}}},
		&ControlAck{MemberRef: MemberRef{Group: "billing", Member: "pod-1", Incarnation: 12}, NoticeID: 9},
		&GroupList{Group: "billing"},
		&TopicDelete{TopicRef: TopicRef{Topic: "orders", Incarnation: 2}},
		&TopicDeleteOK{TopicRef: TopicRef{Topic: "orders", Incarnation: 2}},
		&Describe{Metadata{Topics: []string{"orders"}}},
		&TopicUpdate{TopicRef: TopicRef{Topic: "orders", Incarnation: 2}, Set: SetRetentionMs | SetRetentionBytes, RetentionMs: 60_000, RetentionBytes: 1 << 30},
		&TopicUpdateOK{Topic: TopicConfig{Name: "orders", Partitions: 3, RetentionMs: 60_000, Replicas: 3, Ack: AckAll}, Incarnation: 2},
		&DescribeOK{Topics: []TopicInfo{{Config: TopicConfig{Name: "a", Partitions: 1}, Incarnation: 3, Partitions: []PartitionInfo{
			{Partition: 0, Epoch: 1, StartSeq: 1, CommitSeq: 2, Leader: "n1", Replicas: []ReplicaInfo{{Node: "n1", State: "InSync", FlushedSeq: 2}}}}},
			{Config: TopicConfig{Name: "b", Partitions: 0}, Partitions: []PartitionInfo{}, Incarnation: 1}}},
		&GroupDelete{Group: "billing"},
		&GroupDeleteForce{Group: "billing"},
		&GroupIncarnation{Group: "billing"},
		&GroupIncarnationOK{GroupRef: GroupRef{Group: "billing", Incarnation: 3}},
		&GroupDeleteIncarnation{GroupRef: GroupRef{Group: "billing", Incarnation: 3}, Force: true},
		&GroupUpdate{GroupRef: GroupRef{Group: "billing", Incarnation: 3}, Set: SetAckWaitMs | SetMaxDeliver, AckWaitMs: 45_000, MaxDeliver: 7},
		&GroupUpdateOK{GroupRef: GroupRef{Group: "billing", Incarnation: 3}, AckWaitMs: 45_000, MaxDeliver: 7},
		&Schedule{Pub: Pub{Topic: "orders", Partition: -1, ProducerID: 7, ProducerSeq: 3, Key: []byte("k"), Value: []byte("v"), Headers: []Header{{Key: "h", Value: []byte("x")}}}, DeliverAtMs: 1767225600000},
		&ScheduleOK{Shard: 2, ID: 41, DeliverAtMs: 1767225600000, Duplicate: true},
		&SchedAdmin{Op: SchedLane, Topic: "orders", Shard: 1, ID: 9, LaneOp: LanePause, Limit: 100},
		&SchedAdminOK{Schedules: []ScheduleInfo{{Shard: 1, ID: 9, DeliverAtMs: 5, Topic: "orders", Partition: 2, State: "PENDING"}},
			Shards: []ShardInfo{{Shard: 1, Lifecycle: "ACTIVE_FOR_COMMANDS", Owner: "n1", OwnerEpoch: 3, Pending: 1, NextDueMs: 5, Fired: 2, Unknown: 1, Cancelled: 4}},
			Lanes:  []LaneInfo{{Shard: 1, Topic: "orders", Gate: "OPEN", Readiness: "READY", Incarnation: 12, Pending: 1}}},
		&SchedListPage{Shard: 1, Topic: "orders", AfterDeliverAtMs: -5, AfterID: 9, Limit: 1000},
		&SchedListPageOK{Schedules: []ScheduleInfo{{Shard: 1, ID: 9, DeliverAtMs: 5, Topic: "orders", Partition: 2, State: "FIRING"},
			{Shard: 1, ID: 12, DeliverAtMs: 5, Topic: "b", State: "PENDING"}}, More: true},
		&GroupListOK{Groups: []GroupInfo{{Group: "billing", Mode: GroupExclusive, MembershipEpoch: 3, AssignmentEpoch: 2,
			Members:    []GroupMemberInfo{{Member: "pod-1", Incarnation: 12, Topics: []string{"orders"}, Partitions: []HeldPartition{{Topic: "orders", Partition: 1, Epoch: 2}}}},
			Pending:    []PendingNotice{{NoticeID: 9, Kind: NoticeRevoke, Member: "pod-1", Partitions: []HeldPartition{{Topic: "orders", Partition: 1, Epoch: 2}}}},
			Partitions: []GroupPartitionInfo{{Topic: "orders", Partition: 1, AckFloor: 40, CommitSeq: 44}}}, {Group: "empty"}}},
	}
}

func TestRoundTripEveryFrame(t *testing.T) {
	for _, f := range sampleFrames() {
		t.Run(f.Type().String(), func(t *testing.T) {
			b := AppendFrame(nil, 0xABCDEF, f)
			corr, got, err := ReadFrame(bytes.NewReader(b), DefaultFrameBytesMax)
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if corr != 0xABCDEF {
				t.Fatalf("corr = %x", corr)
			}
			if !reflect.DeepEqual(got, f) {
				t.Fatalf("round trip mismatch:\n got %#v\nwant %#v", got, f)
			}
		})
	}
}

func TestStreamOfFrames(t *testing.T) {
	var b []byte
	frames := sampleFrames()
	for i, f := range frames {
		b = AppendFrame(b, uint64(i), f)
	}
	r := bufio.NewReader(bytes.NewReader(b))
	for i, want := range frames {
		corr, got, err := ReadFrame(r, DefaultFrameBytesMax)
		if err != nil || corr != uint64(i) || got.Type() != want.Type() {
			t.Fatalf("frame %d: corr=%d type=%v err=%v", i, corr, got, err)
		}
	}
	if _, _, err := ReadFrame(r, DefaultFrameBytesMax); err != io.EOF {
		t.Fatalf("after last frame: err = %v, want EOF", err)
	}
}

func TestFrameTooLargeRejectedBeforeAllocation(t *testing.T) {
	b := AppendFrame(nil, 1, &Pub{Topic: "t", Value: make([]byte, 1000)})
	_, _, err := ReadFrame(bytes.NewReader(b), 500)
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want FRAME_TOO_LARGE", err)
	}
	// A length prefix claiming 4 GiB must fail without reading a body.
	_, _, err = ReadFrame(bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff}), DefaultFrameBytesMax)
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("err = %v, want FRAME_TOO_LARGE", err)
	}
}

// The refusal of an oversized frame names its request's corr when the
// frame's head is already buffered, and never waits for it.
func TestFrameTooLargeNamesItsCorr(t *testing.T) {
	b := AppendFrame(nil, 77, &Pub{Topic: "t", Value: make([]byte, 1000)})
	corr, _, err := ReadFrame(bufio.NewReader(bytes.NewReader(b)), 500)
	if !errors.Is(err, ErrFrameTooLarge) || corr != 77 {
		t.Fatalf("corr %d, err %v; want 77, FRAME_TOO_LARGE", corr, err)
	}
	// Only the length prefix has arrived: answered at once, corr 0.
	pr, pw := io.Pipe()
	go pw.Write(b[:4])
	done := make(chan uint64, 1)
	go func() {
		corr, _, _ := ReadFrame(bufio.NewReader(pr), 500)
		done <- corr
	}()
	select {
	case corr := <-done:
		if corr != 0 {
			t.Fatalf("corr %d without the frame's head, want 0", corr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the refusal waited for the frame's head")
	}
	pw.Close()
}

func TestMalformedFramesAreBadFrame(t *testing.T) {
	good := AppendFrame(nil, 1, &Pub{Topic: "t", Value: []byte("hello")})
	cases := map[string][]byte{
		"flipped body bit": func() []byte { b := bytes.Clone(good); b[20] ^= 1; return b }(),
		"unknown type":     AppendFrame(nil, 1, rawFrame{t: 200}),
		"trailing bytes":   AppendFrame(nil, 1, rawFrame{t: TypePing, body: []byte{1}}),
		"short body":       AppendFrame(nil, 1, rawFrame{t: TypePubOK, body: []byte{0, 0}}),
		"huge list":        AppendFrame(nil, 1, rawFrame{t: TypeAckOK, body: []byte{0, 1, 0, 0}}),
		"bad bool":         AppendFrame(nil, 1, rawFrame{t: TypePubOK, body: append(make([]byte, 20), 7)}),
		"bad utf8":         AppendFrame(nil, 1, rawFrame{t: TypeMetadata, body: []byte{0, 0, 0, 1, 0, 1, 0xff}}),
		"header only":      {0, 0, 0, 2, 1, 2},
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, f, err := ReadFrame(bytes.NewReader(b), DefaultFrameBytesMax)
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("got frame %#v err %v, want BAD_FRAME", f, err)
			}
		})
	}
}

func TestOverlongStringIsCutNotCorrupting(t *testing.T) {
	msg := strings.Repeat("é", 40000) // 80000 bytes
	b := AppendFrame(nil, 1, &Err{Code: CodeStorage, Message: msg})
	_, f, err := ReadFrame(bytes.NewReader(b), DefaultFrameBytesMax)
	if err != nil {
		t.Fatalf("ReadFrame: %v", err)
	}
	got := f.(*Err).Message
	if len(got) > 0xFFFF || !strings.HasPrefix(msg, got) || len(got) < 0xFFFF-1 {
		t.Fatalf("message cut to %d bytes", len(got))
	}
}

func TestErrorIsMatchesByCode(t *testing.T) {
	err := error(Errorf(CodeStaleDelivery, "seq %d", 4))
	if !errors.Is(err, ErrStaleDelivery) || errors.Is(err, ErrNotFound) {
		t.Fatalf("errors.Is by code broken for %v", err)
	}
	if CodeStorage.String() != "STORAGE_ERROR" || Code(999).String() != "CODE_999" {
		t.Fatal("code names")
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "orders.v2", "A-b_c", "...", ".a", "a..", "_meta", "a__b", "dlq.g.t", "ledger", "topics.json", "epoch", "0"} {
		if err := ValidateName("topic", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "x/y", strings.Repeat("a", NameBytesMax+1), ".", "..", "__meta", "__", "__x"} {
		if err := ValidateName("topic", bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}

func TestValidateWritableTopicRefusesDeadLetterTopics(t *testing.T) {
	for _, ok := range []string{"orders", "dlq", "dlqx.a", "x.dlq.a"} {
		if err := ValidateWritableTopic(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"dlq.g.orders", "dlq.", "..", "__meta"} {
		err := ValidateWritableTopic(bad)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
	if err := ValidateWritableTopic("dlq.g.orders"); !strings.Contains(err.Error(), "dead-letter") {
		t.Errorf("the refusal does not give the reason: %v", err)
	}
}

func TestPartitionersAreStableAndInRange(t *testing.T) {
	key := []byte("user-1")
	first := PartitionForKey(key, 8)
	for i := 0; i < 3; i++ {
		if PartitionForKey(bytes.Clone(key), 8) != first {
			t.Fatal("key hash not stable")
		}
	}
	// FNV-1a of "a" is 0xe40c292c; pinning it keeps clients and brokers agreeing.
	if got := PartitionForKey([]byte("a"), 1000); got != 0xe40c292c%1000 {
		t.Fatalf("PartitionForKey(a) = %d", got)
	}
	seen := map[uint32]bool{}
	for s := uint64(0); s < 200; s++ {
		p := PartitionForProducer(42, s, 4)
		if p >= 4 {
			t.Fatalf("partition %d out of range", p)
		}
		seen[p] = true
	}
	if len(seen) != 4 {
		t.Fatalf("producer partitioner uses only %d of 4 partitions", len(seen))
	}
	// Consecutive seqs of one producer must not pile onto one partition.
	counts := make([]int, 4)
	for s := uint64(1); s <= 400; s++ {
		counts[PartitionForProducer(0xdeadbeefcafe, s, 4)]++
	}
	for p, c := range counts {
		if c < 60 {
			t.Fatalf("partition %d got %d of 400 consecutive seqs: %v", p, c, counts)
		}
	}
}

// rawFrame encodes an arbitrary type and body, to build malformed input.
type rawFrame struct {
	t    FrameType
	body []byte
}

func (r rawFrame) Type() FrameType            { return r.t }
func (r rawFrame) appendBody(b []byte) []byte { return append(b, r.body...) }
func (r rawFrame) decodeBody(*decoder)        {}

// TestReplicateBodyBytesIsExact: the size AppendFrame reserves for a
// REPLICATE is exactly what it writes (at most 3 bytes more for a topic
// cut at its u16 bound, at a rune boundary), so one allocation suffices.
func TestReplicateBodyBytesIsExact(t *testing.T) {
	for _, f := range []*Replicate{
		{},
		{Topic: "t", Entries: []ReplicaEntry{{Seq: 1, Epoch: 1}}},
		replicateBatch(3, 100),
		{Topic: strings.Repeat("é", 0x8000), Entries: []ReplicaEntry{{Data: []byte("x")}}}, // cut at the u16 bound
	} {
		got := len(AppendFrame(nil, 0, f))
		want := FrameBytes(f)
		if cut := len(f.Topic) > 0xFFFF; (!cut && got != want) || got > want || got < want-3 {
			t.Errorf("topic of %d bytes, %d entries: encoded %d bytes, bodyBytes says %d", len(f.Topic), len(f.Entries), got, want)
		}
		if allocs := testing.AllocsPerRun(10, func() { AppendFrame(nil, 0, f) }); allocs > 1 && !raceEnabled {
			t.Errorf("%d entries: %v allocations per frame, want 1", len(f.Entries), allocs)
		}
	}
}

// TestFramePiecesAreWhatAppendFrameEncodes: the vectored encoding the
// peer transport writes is byte for byte the frame AppendFrame builds,
// for REPLICATEs with and without entries (large ones by reference, small
// ones copied, mixed; a topic cut at its bound too), for every other
// frame, and with the scratch buffer and pieces of earlier frames kept
// while it grows (as a batch of frames is written at once).
func TestFramePiecesAreWhatAppendFrameEncodes(t *testing.T) {
	frames := append(sampleFrames(),
		&Replicate{},
		&Replicate{Topic: "t", Entries: []ReplicaEntry{{Seq: 1, Epoch: 1}}},
		replicateBatch(3, 100),
		replicateBatch(64, 1024),
		replicateBatch(5, DirectEntryBytesMin),   // each by reference
		replicateBatch(3, DirectEntryBytesMin-1), // copied
		&Replicate{Topic: "mixed", Entries: []ReplicaEntry{ // both, in turn
			{Seq: 1, Data: make([]byte, 10)}, {Seq: 2, Data: make([]byte, 70<<10)}, {Seq: 3}, {Seq: 4, Data: make([]byte, 20<<10)}, {Seq: 5, Data: make([]byte, 30<<10)}}},
		&Replicate{Topic: strings.Repeat("é", 0x8000), Entries: []ReplicaEntry{{Data: []byte("x")}}})
	for _, f := range frames {
		if r, ok := f.(*Replicate); ok {
			for i := range r.Entries {
				for j := range r.Entries[i].Data {
					r.Entries[i].Data[j] = byte(i*7 + j)
				}
			}
		}
	}
	var pieces [][]byte
	var scratch []byte
	var want []byte
	for i, f := range frames {
		pieces, scratch = AppendFramePieces(pieces, scratch, uint64(i), f)
		want = AppendFrame(want, uint64(i), f)
	}
	got := bytes.Join(pieces, nil)
	if !bytes.Equal(got, want) {
		t.Fatalf("pieces of %d bytes differ from AppendFrame's %d", len(got), len(want))
	}
	r := bytes.NewReader(got)
	for _, f := range frames {
		if _, read, err := ReadFrame(r, DefaultFrameBytesMax); err != nil || read.Type() != f.Type() {
			t.Fatalf("%s: read back %v, %v", f.Type(), read, err)
		}
	}
	// The large entries travel as their own slices; the small ones do not.
	byReference := 0
	for _, p := range pieces {
		for _, f := range frames {
			if r, ok := f.(*Replicate); ok {
				for _, e := range r.Entries {
					if len(e.Data) > 0 && len(p) == len(e.Data) && &p[0] == &e.Data[0] {
						byReference++
					}
				}
			}
		}
	}
	if byReference != 5+3 {
		t.Errorf("%d entries written from their own slices, want the 8 of at least %d bytes", byReference, DirectEntryBytesMin)
	}
}

// TestSchedListPageIsBounded: a SCHED_LIST_PAGE_OK of more schedules than
// a page may hold is BAD_FRAME (before its entries are allocated), one
// of exactly that many decodes, and the whole page fits far below the
// frame maximum even with the longest topics.
func TestSchedListPageIsBounded(t *testing.T) {
	long := strings.Repeat("t", 255)
	page := func(n int) *SchedListPageOK {
		f := &SchedListPageOK{More: true}
		for i := range n {
			f.Schedules = append(f.Schedules, ScheduleInfo{Shard: 1, ID: uint64(i + 1), DeliverAtMs: int64(i), Topic: long, State: "PENDING"})
		}
		return f
	}
	b := AppendFrame(nil, 1, page(SchedListLimitMax))
	if len(b) > DefaultFrameBytesMax/16 {
		t.Fatalf("a full page is %d bytes", len(b))
	}
	if _, f, err := ReadFrame(bytes.NewReader(b), DefaultFrameBytesMax); err != nil || len(f.(*SchedListPageOK).Schedules) != SchedListLimitMax {
		t.Fatalf("a full page: %v", err)
	}
	_, _, err := ReadFrame(bytes.NewReader(AppendFrame(nil, 1, page(SchedListLimitMax+1))), DefaultFrameBytesMax)
	if !errors.Is(err, ErrBadFrame) {
		t.Fatalf("a page of %d: %v, want BAD_FRAME", SchedListLimitMax+1, err)
	}
}
