package model

// The KV bucket model: the real KV kernel (internal/kv) on every replica
// of a bucket's partition — kv.Bucket, the applied state, on each, and
// kv.Leader, the bucket leader's write decisions, on the replica whose
// shell leads — driven as the node's shell (internal/node/kv.go,
// kvRunner) drives them. The partition's log is one linear committed
// sequence here (its replication is the replica model's business): the
// leader's records commit in log order, any of them may be refused before
// its append (the shell reports it Failed), a degraded leader's may be
// answered failed while they stay in flight (QUORUM_LOST), and at a
// change of leader any prefix of them commits, the rest are lost, and the
// new leader's install entry lands at its reignStartSeq. Leases are
// assumed safe (one leader holds one at a time: a new leader takes office
// only once the old one's lapsed); the kernel's flag follows the shell's
// reading of it. Each replica's shell applies the committed log at its
// own pace, follows the partition's leadership at its own pace (a deposed
// leader keeps its kernel and takes writes until it notices: its
// proposals are refused, its refusals need the lease it lost), and
// answers the completions of its proposals as they arrive (a committed
// one once it applied its seq).
//
// A client submits a fixed list of writes (PUT, DEL, CAS with an expected
// revision of 0 or of the latest revision it heard of the key) to a
// replica whose shell leads, several in flight, retries the ones answered
// UNAVAILABLE (nothing written), and may lose any final answer. GETs of
// every key at every replica that would serve one are checked in every
// state. Optionally: compaction records purging tombstones, a watcher
// resuming from its cursor at whichever replica serves it, checkpoints
// proposed by the leader, a replica's log truncated through its latest
// checkpoint, a follower restarted from its log or reset to the leader's
// log start and rebuilt from the first checkpoint in it (kv.Seeker).
//
// Linearizability is checked answer by answer against points in the
// committed log: a write answered revision r sits at r; a refusal
// (REVISION_MISMATCH) and a GET are reads of the committed prefix p they
// were decided against (the deciding replica's applied seq; seq-1 for a
// CAS refused as it applies), placed just after seq p. Ordered by p, the
// answers form a linearization if each one's state is the log folded to
// its p and real time is respected: an operation answered before another
// was submitted has a p no later than the other's. The model keeps the
// highest p any answer has shown (observed) and checks p >= observed as
// of the operation's submit (a GET, served at once: as of now), and p <=
// what is committed. A write answered OUTCOME_UNKNOWN, or not answered,
// sits at its seq if it commits. With one leasing leader at a time this
// is what the leases and the reign's-start gate must give: a deposed
// leader's state may lack a revision the new one acknowledged, a new
// leader's one the old one acknowledged.
//
// Not modelled: the shell's holding back of writes while a checkpoint
// drains (here a checkpoint is proposed only when nothing is in flight,
// which the drain waits for), the bucket's config and delete records (the
// bucket exists from seq 1), ErrBusy bounds, the shell's QUORUM_LOST
// refusal before Submit while read-only (nothing reaches the kernel), a
// restart of the leader's replica, watches with a prefix or a credit
// above one, several watchers.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/kv"
)

// The KV bucket model's invariants (DESIGN §4: linearizable KV writes and
// reads, cursor authority, watchers never silently miss a revision).
const (
	// KVReplyTruthful: a write answered with revision r is the committed
	// record at seq r, and the log (folded by the model's own reading of
	// PUT/DEL/CAS/compaction) applies it as a revision.
	KVReplyTruthful = "KVReplyTruthful"
	// KVRefusalLinearizable: a CAS answered REVISION_MISMATCH was decided
	// against a committed prefix p of the log — p at least every prefix an
	// answer given before the CAS was submitted had shown (the real-time
	// order), p at most what is committed at the answer — in which the
	// key's latest revision fails the condition, and the answer's current
	// revision is that latest one.
	KVRefusalLinearizable = "KVRefusalLinearizable"
	// KVRefusedNotWritten: a write answered with a definite refusal
	// (REVISION_MISMATCH, or UNAVAILABLE: lease lapsed, leader not ready)
	// is never a revision: no record of it is proposed for an
	// UNAVAILABLE, and a mismatch's record, if any, never applies.
	KVRefusedNotWritten = "KVRefusedNotWritten"
	// KVLeaderHoldsAcked: a leader holding its lease that takes a write
	// past its gates has applied every write acknowledged so far, by
	// itself or an earlier leader (the reignStartSeq gate).
	KVLeaderHoldsAcked = "KVLeaderHoldsAcked"
	// KVGetLinearizable: a GET that a replica would serve (it leads, took
	// office, holds its lease) returns the key's value in a committed
	// prefix at least every prefix already shown by an answer.
	KVGetLinearizable = "KVGetLinearizable"
	// KVStateMatchesLog: every replica's bucket holds, for every key, the
	// latest revision of the committed log folded to its applied seq.
	KVStateMatchesLog = "KVStateMatchesLog"
	// KVReplicasAgree: two replicas that applied the same seq hold the
	// same bucket (its digest: every kept revision, the floor, the
	// checkpoint bookkeeping) — a rebuilt one included.
	KVReplicasAgree = "KVReplicasAgree"
	// KVAppliesEveryRecord: no replica's bucket refuses a committed record
	// (Apply or a checkpoint's load fails: the node would stop it).
	KVAppliesEveryRecord = "KVAppliesEveryRecord"
	// KVCASProposedOnlyIfItMayHold: the leader proposes a CAS only if its
	// condition holds against its committed state plus its writes in
	// flight, the last one on the key taken as its latest revision (the
	// overlay: two CASes of one expected revision are never both
	// proposed).
	KVCASProposedOnlyIfItMayHold = "KVCASProposedOnlyIfItMayHold"
	// KVWatchNoSilentGap: a watch batch accounts for every seq from the
	// watcher's cursor on, in order: a delivered revision is the committed
	// record at its seq, a skipped seq holds no revision or one its key
	// overwrote HistoryMax times since; otherwise CURSOR_EXPIRED.
	KVWatchNoSilentGap = "KVWatchNoSilentGap"
)

// KVCAS is how a client's write is conditioned.
type KVCAS uint8

const (
	// KVPlain: not a CAS.
	KVPlain KVCAS = iota
	// KVCreate: a CAS expecting revision 0 (the key absent or deleted).
	KVCreate
	// KVKnown: a CAS expecting the latest revision of the key the client
	// heard of (in an answer: a write's revision, a mismatch's current),
	// 0 when none.
	KVKnown
)

// KVWrite is one of the client's writes: Key 0 or 1 ("a", "b").
type KVWrite struct {
	Key int
	Op  kv.Op // OpPut or OpDelete
	CAS KVCAS
}

func (w KVWrite) String() string {
	s := fmt.Sprintf("%v %s", w.Op, kbKeys[w.Key])
	switch w.CAS {
	case KVCreate:
		s += " if absent"
	case KVKnown:
		s += " if at the known revision"
	}
	return s
}

var kbKeys = [...]string{"a", "b"}

// KVShellMutations break the model's shell on purpose (the node's
// guards around the kernel).
type KVShellMutations struct {
	// SkipReadyGate: the shell passes writes to the leader kernel before
	// its bucket applied its reign's install entry (kvRunner.ready's
	// reignStart check). With kv.Mutations.SubmitBeforeReignStart the
	// kernel takes them too.
	SkipReadyGate bool
	// ReadWithoutLease: a leader serves GETs and watches without its
	// lease (node.Mutations.KVReadWithoutLease).
	ReadWithoutLease bool
	// FailedAsUnavailable: the shell answers a write the kernel failed
	// (ErrNotCommitted, ErrLeadershipLost) UNAVAILABLE — nothing written,
	// retry — instead of OUTCOME_UNKNOWN (kvWireError): its record may
	// still commit (a degraded leader's, one the next leader kept).
	FailedAsUnavailable bool
	// CheckpointWithoutDrain: the leader proposes a checkpoint while
	// writes are in flight, so one may land between the checkpoint's base
	// and its first chunk (the chunks are then void, unless
	// kv.Mutations.CheckpointAnyBase).
	CheckpointWithoutDrain bool
}

// KVBucketConfig bounds a KV bucket exploration. Budgets limit how often
// an action kind may occur along one path.
type KVBucketConfig struct {
	Replicas int       // 2 or 3
	Writes   []KVWrite // the client's writes, submitted in this order
	// InflightMax is how many writes the client has outstanding at once.
	InflightMax int
	HistoryMax  int // kv.Config.HistoryMax (0: 1)
	LostReplies int // a final answer lost on its way to the client
	Elections   int // a new leader takes office in the next epoch
	Lapses      int // the leader's lease lapses (it may get it back)
	Refusals    int // a proposal refused before its append (Failed)
	// Degrades: the leader loses its quorum; the partition answers its
	// proposals in flight QUORUM_LOST (the shell reports them Failed) and
	// they stay in flight, to commit when the quorum returns or be kept
	// or lost by the next leader.
	Degrades    int
	Compactions int  // the leader proposes a compaction record
	Watch       bool // a watcher from revision 1, served wherever a replica leads
	Checkpoints int  // the leader proposes a checkpoint
	// CheckpointChunkBytes bounds a chunk's value (0: 40, two chunks for a
	// revision or two).
	CheckpointChunkBytes int
	Truncations          int // a replica's log is truncated through its latest checkpoint
	Restarts             int // a follower restarts from its log, or is reset to the leader's log start
	DepthMax             int
	StatesMax            int
	Mutations            kv.Mutations
	Shell                KVShellMutations
}

// KVBucketResult is the outcome of a KV bucket exploration.
type KVBucketResult struct {
	Outcome
	// What the exploration reached (distinct states entered that way).
	Written        int // a write answered with its revision
	Mismatches     int // a CAS refused REVISION_MISMATCH against committed state (at submit, or decided again)
	ApplyRefusals  int // a CAS refused as it applied (its condition failed then)
	Parked         int // a CAS parked behind a write in flight
	LeaseLapsed    int // a CAS refused ErrLeaseLapsed
	NotReady       int // a write the kernel refused ErrLeaderNotReady (past the shell's gate, when it is off)
	Unknown        int // a write answered OUTCOME_UNKNOWN
	Elections      int // a new leader took office
	ZombieSubmits  int // a write taken by a deposed leader's kernel
	Compactions    int // a compaction record applied by the leader
	WatchEvents    int // a watcher got a revision
	CursorExpired  int // a watcher got CURSOR_EXPIRED
	Checkpoints    int // a replica completed a checkpoint
	Rebuilds       int // a replica loaded its bucket from a checkpoint
	Reads          int // states where some replica serves GETs
	Settled        int // states where the client heard every write answered with a revision or a mismatch
	ClientAnswered int // states where the client has a final answer for every write (a lost one: unknown)
}

const (
	bkLostReplies = iota
	bkElections
	bkLapses
	bkRefusals
	bkDegrades
	bkCompactions
	bkCheckpoints
	bkTruncations
	bkRestarts
	bkbudgets
)

func (c *KVBucketConfig) budget(i int) int {
	return [bkbudgets]int{c.LostReplies, c.Elections, c.Lapses, c.Refusals, c.Degrades, c.Compactions, c.Checkpoints, c.Truncations, c.Restarts}[i]
}

// The model's clock: writes are stamped 0, compaction records
// kbCompactMs, with a tombstone TTL of kbCompactMs: a compaction purges
// every tombstone written before it.
const kbCompactMs = 1

func (c *KVBucketConfig) kvConfig() kv.Config {
	return kv.Config{HistoryMax: c.HistoryMax, TombstoneTTLms: kbCompactMs, KeyBytesMax: 8, ValueBytesMax: 8,
		WatchScanRevisionsMax: 64, InflightWritesMax: 64, ParkedWritesMax: 64, Mutations: c.Mutations}
}

type kbKind uint8

const (
	kbInstall kbKind = iota
	kbWrite
	kbCompact
	kbChunk
)

// kbEntry is a log entry, proposed or committed.
type kbEntry struct {
	kind  kbKind
	epoch uint64
	rep   int    // proposer (write, compaction, chunk)
	gen   uint64 // the proposer's leader kernel (write)
	w     int    // the client's write (write)
	exp   uint64 // the CAS's expected revision (write)
	rec   kv.Record
	// answered: its proposer heard it failed while it stays in flight
	// (a degraded leader's QUORUM_LOST): its commit answers nothing.
	answered bool
}

// kbDone is a proposal's end reaching its proposer's shell: committed at
// seq, or failed.
type kbDone struct {
	kind   kbKind
	id     uint64
	gen    uint64
	seq    uint64
	failed bool
}

type kbResult struct {
	seq uint64
	res kv.ApplyResult
}

type kbReplica struct {
	b       *kv.Bucket // nil while it seeks a checkpoint
	seeker  *kv.Seeker
	applied uint64 // the runner's applied seq (bucket or seeking)
	start   uint64 // the first seq of its log
	ckpt    uint64 // the base of the latest complete checkpoint applied
	// The shell's view of the partition's leadership (followLeadership).
	leading          bool
	epoch, reignFrom uint64
	lease            bool
	l                *kv.Leader
	gen              uint64   // kernels created so far: a completion names its own
	props            []uint64 // the kernel's proposals not answered yet, in order
	done             []kbDone // posted, in arrival order
	waits            []kbDone // committed, waiting for the seq to be applied
	results          []kbResult
	proposing        int
	compacting       bool
	checkpointing    int // chunks not completed yet
}

// Client write status.
const (
	kwUnsent uint8 = iota
	kwOutstanding
	kwAnswered // a final answer on its way
	kwOK
	kwMismatch
	kwUnknown // OUTCOME_UNKNOWN, or its answer lost
)

type kbReply struct {
	w        int
	status   uint8 // kwOK, kwMismatch, kwUnknown
	revision uint64
}

type kbstate struct {
	log        []kbEntry // committed: seq i+1
	pending    []kbEntry // the leader's, uncommitted, in log order
	reps       []kbReplica
	leader     int
	epoch      uint64
	installSeq uint64
	lease      bool // the leader holds its lease
	status     []uint8
	expected   []uint64 // the CAS's expected revision, per outstanding write
	observedAt []uint64 // observed when the write was submitted
	at         []int    // the replica the outstanding write went to
	known      [len(kbKeys)]uint64
	replies    []kbReply
	// observed: the highest committed prefix an answer showed (a write's
	// revision, a refusal's or a read's prefix); acked: the highest
	// revision answered.
	observed, acked uint64
	watchNext       uint64 // the watcher's cursor (0: no watcher)
	used            [bkbudgets]int
	events          kbevent
	owned           uint8 // replicas whose kernels this state owns (own)
}

type kbevent uint32

const (
	keWritten kbevent = 1 << iota
	keMismatch
	keApplyRefusal
	keParked
	keLeaseLapsed
	keNotReady
	keUnknown
	keElection
	keZombieSubmit
	keCompaction
	keWatchEvent
	keCursorExpired
	keCheckpoint
	keRebuild
)

func (s *kbstate) clone() *kbstate {
	c := *s
	c.log, c.pending = slices.Clone(s.log), slices.Clone(s.pending)
	c.status, c.expected, c.observedAt, c.at = slices.Clone(s.status), slices.Clone(s.expected), slices.Clone(s.observedAt), slices.Clone(s.at)
	c.replies = slices.Clone(s.replies)
	c.reps = make([]kbReplica, len(s.reps))
	for i, r := range s.reps {
		d := r // the kernels are shared until own copies them
		d.props, d.done, d.waits, d.results = slices.Clone(r.props), slices.Clone(r.done), slices.Clone(r.waits), slices.Clone(r.results)
		c.reps[i] = d
	}
	c.events, c.owned = 0, 0
	return &c
}

// own gives replica r's kernels (bucket, seeker, leader) to this state
// alone: call it before anything that may change them. A clone shares
// them with its parent until then (most actions touch one replica).
func (s *kbstate) own(r int) {
	if s.owned&(1<<r) != 0 {
		return
	}
	s.owned |= 1 << r
	p := &s.reps[r]
	if p.b != nil {
		p.b = p.b.Clone()
	}
	if p.seeker != nil {
		p.seeker = p.seeker.Clone()
	}
	if p.l != nil {
		p.l = p.l.Clone()
	}
}

// kvBucketOff turns invariants off (tests: each must be load-bearing,
// TestKVBucketInvariantsAreLoadBearing).
var kvBucketOff map[string]bool

// kbViolated is a violation of inv, unless it is turned off.
func kbViolated(inv, format string, args ...any) string {
	if kvBucketOff[inv] {
		return ""
	}
	return invariant.Violated(inv, format, args...).Error()
}

// ---- the reference: the model's own reading of the committed log

type kbRev struct {
	seq uint64 // 0: absent
	op  kv.Op
	w   int
	ts  int64
}

type kbFold struct {
	latest  [len(kbKeys)]kbRev
	written []bool // written[seq-1]: the record at seq is a revision
}

func kbHolds(latest kbRev, expected uint64) bool {
	if expected == 0 {
		return latest.seq == 0 || latest.op == kv.OpDelete
	}
	return latest.seq == expected
}

// fold reads the first p committed entries.
func (cfg *KVBucketConfig) fold(log []kbEntry, p uint64) kbFold {
	var f kbFold
	f.written = make([]bool, p)
	for i, e := range log[:p] {
		seq := uint64(i + 1)
		switch e.kind {
		case kbWrite:
			w := cfg.Writes[e.w]
			if w.CAS != KVPlain && !kbHolds(f.latest[w.Key], e.exp) {
				continue
			}
			f.latest[w.Key] = kbRev{seq: seq, op: w.Op, w: e.w, ts: e.rec.TimestampMs}
			f.written[i] = true
		case kbCompact:
			for k, rev := range f.latest {
				if rev.seq != 0 && rev.op == kv.OpDelete && e.rec.TimestampMs-rev.ts >= kbCompactMs {
					f.latest[k] = kbRev{}
				}
			}
		}
	}
	return f
}

func kbValue(w int) []byte { return []byte{'v', byte('0' + w)} }

// ---- the shell

var kbInstallRecord = kv.Record{Headers: []kv.Header{{Key: "nereus-control", Value: []byte("install")}}}

func (s *kbstate) nextSeq() uint64 { return uint64(len(s.log) + len(s.pending) + 1) }

// propose appends what replica r proposes: to the log's tail when it is
// the partition's leader, else it is refused (not the leader).
func (s *kbstate) propose(r int, e kbEntry) {
	p := &s.reps[r]
	p.proposing++
	e.rep = r
	if r == s.leader {
		e.epoch = s.epoch
		s.pending = append(s.pending, e)
		return
	}
	p.done = append(p.done, kbDone{kind: e.kind, id: uint64(e.w + 1), gen: e.gen, failed: true})
}

// carry proposes what replica r's leader kernel decided, in order, then
// answers (kvRunner.carry). decidedAt tells where an answer's refusal was
// decided: the applied write's own refusal at seq-1, any other against
// the bucket as it is.
func (cfg *KVBucketConfig) carry(s *kbstate, r int, eff kv.LeaderEffects, appliedID, appliedSeq uint64) string {
	s.own(r)
	p := &s.reps[r]
	for _, rep := range eff.Replies {
		p.props = slices.DeleteFunc(p.props, func(id uint64) bool { return id == rep.ID })
	}
	for _, prop := range eff.Propose {
		w := int(prop.ID) - 1
		if w < 0 || w >= len(cfg.Writes) || s.status[w] != kwOutstanding || s.at[w] != r {
			return fmt.Sprintf("KernelAssertion: replica %d proposed request %d, not outstanding there", r, prop.ID)
		}
		cw := cfg.Writes[w]
		dec, err := kv.DecodeRecord(prop.Record)
		if err != nil || dec.Op != cw.Op || string(dec.Key) != kbKeys[cw.Key] || dec.Conditional != (cw.CAS != KVPlain) ||
			dec.Expected != s.expected[w] || (cw.Op == kv.OpPut && !bytes.Equal(dec.Value, kbValue(w))) {
			return fmt.Sprintf("KernelAssertion: write %d (%v) proposed as %+v (%v)", w, cw, dec, err)
		}
		if cw.CAS != KVPlain {
			if err := cfg.mayHold(s, r, w); err != "" {
				return err
			}
		}
		p.props = append(p.props, prop.ID)
		s.propose(r, kbEntry{kind: kbWrite, gen: p.gen, w: w, exp: s.expected[w], rec: prop.Record})
	}
	for _, rep := range eff.Replies {
		if err := cfg.answer(s, r, rep, appliedID, appliedSeq); err != "" {
			return err
		}
	}
	return ""
}

// mayHold checks KVCASProposedOnlyIfItMayHold for write w, proposed by
// replica r's kernel: its committed state overlaid with the kernel's
// proposals not answered yet, in proposal order, each taken as its key's
// latest revision (applied here or not: the kernel learns its outcome
// when it is answered). A proposal answered failed is not in it, though
// it may have committed (lost at a change of leader, then kept by the
// next one): Apply refuses a CAS proposed against it.
func (cfg *KVBucketConfig) mayHold(s *kbstate, r int, w int) string {
	p := &s.reps[r]
	f := cfg.fold(s.log, p.applied)
	for _, id := range p.props {
		o := int(id) - 1
		seq := uint64(1<<32) + id // not committed yet: no revision a client could name
		if at := slices.IndexFunc(s.log, func(e kbEntry) bool { return e.kind == kbWrite && e.w == o }); at >= 0 {
			seq = uint64(at + 1)
		}
		ow := cfg.Writes[o]
		f.latest[ow.Key] = kbRev{seq: seq, op: ow.Op, w: o}
	}
	cw := cfg.Writes[w]
	if !kbHolds(f.latest[cw.Key], s.expected[w]) {
		return kbViolated(KVCASProposedOnlyIfItMayHold, "replica %d proposed write %d (%v expecting %d) though its state at %d with its writes in flight (%v) has %q at %+v",
			r, w, cw, s.expected[w], p.applied, p.props, kbKeys[cw.Key], f.latest[cw.Key])
	}
	return ""
}

// answer checks the kernel's reply to write rep.ID-1 and sends it.
func (cfg *KVBucketConfig) answer(s *kbstate, r int, rep kv.Reply, appliedID, appliedSeq uint64) string {
	w := int(rep.ID) - 1
	if w < 0 || w >= len(cfg.Writes) || s.status[w] != kwOutstanding || s.at[w] != r {
		return fmt.Sprintf("KernelAssertion: replica %d answered request %d, not outstanding there: %+v", r, rep.ID, rep)
	}
	cw := cfg.Writes[w]
	var me *kv.MismatchError
	switch {
	case rep.Err == nil:
		seq := rep.Revision
		if seq == 0 || seq > uint64(len(s.log)) || s.log[seq-1].kind != kbWrite || s.log[seq-1].w != w || !cfg.fold(s.log, seq).written[seq-1] {
			if err := kbViolated(KVReplyTruthful, "write %d (%v) answered revision %d, which the committed log (%d entries) does not hold as its revision",
				w, cw, seq, len(s.log)); err != "" {
				return err
			}
		}
		s.events |= keWritten
		s.observed, s.acked = max(s.observed, seq), max(s.acked, seq)
		s.status[w] = kwAnswered
		s.replies = append(s.replies, kbReply{w: w, status: kwOK, revision: seq})
	case errors.As(rep.Err, &me):
		p := s.reps[r].applied
		if rep.ID == appliedID {
			p = appliedSeq - 1
			s.events |= keApplyRefusal
		} else {
			s.events |= keMismatch
		}
		f := cfg.fold(s.log, min(p, uint64(len(s.log))))
		latest := f.latest[cw.Key]
		if cw.CAS == KVPlain || me.Expected != s.expected[w] || p < s.observedAt[w] || p > uint64(len(s.log)) ||
			kbHolds(latest, s.expected[w]) || me.Current != latest.seq {
			if err := kbViolated(KVRefusalLinearizable, "write %d (%v expecting %d) refused with current %d against the state at %d (committed %d, observed at its submit %d), where %q is at %d (%v)",
				w, cw, s.expected[w], me.Current, p, len(s.log), s.observedAt[w], kbKeys[cw.Key], latest.seq, latest.op); err != "" {
				return err
			}
		}
		s.observed = max(s.observed, p)
		s.status[w] = kwAnswered
		s.replies = append(s.replies, kbReply{w: w, status: kwMismatch, revision: me.Current})
	case errors.Is(rep.Err, kv.ErrLeaseLapsed), errors.Is(rep.Err, kv.ErrLeaderNotReady),
		cfg.Shell.FailedAsUnavailable && (errors.Is(rep.Err, kv.ErrNotCommitted) || errors.Is(rep.Err, kv.ErrLeadershipLost)):
		// UNAVAILABLE: nothing written; the client retries.
		if errors.Is(rep.Err, kv.ErrLeaseLapsed) {
			s.events |= keLeaseLapsed
		} else {
			s.events |= keNotReady
		}
		if slices.ContainsFunc(s.log, func(e kbEntry) bool { return e.kind == kbWrite && e.w == w }) ||
			slices.ContainsFunc(s.pending, func(e kbEntry) bool { return e.kind == kbWrite && e.w == w }) {
			if err := kbViolated(KVRefusedNotWritten, "write %d (%v) answered UNAVAILABLE (%v), yet its record is in the log", w, cw, rep.Err); err != "" {
				return err
			}
		}
		s.unsend(w)
	case errors.Is(rep.Err, kv.ErrNotCommitted), errors.Is(rep.Err, kv.ErrLeadershipLost):
		s.events |= keUnknown
		s.status[w] = kwAnswered
		s.replies = append(s.replies, kbReply{w: w, status: kwUnknown})
	default:
		return fmt.Sprintf("KernelAssertion: write %d answered %v", w, rep.Err)
	}
	return ""
}

// unsend puts write w back to be sent again (an answer that says nothing
// was written: the client retries).
func (s *kbstate) unsend(w int) {
	s.status[w], s.expected[w], s.observedAt[w], s.at[w] = kwUnsent, 0, 0, 0
}

// submit is the client's write w reaching replica r (kvRunner.write).
func (cfg *KVBucketConfig) submit(s *kbstate, r, w int) string {
	s.own(r)
	p := &s.reps[r]
	cw := cfg.Writes[w]
	s.status[w], s.at[w], s.observedAt[w] = kwOutstanding, r, s.observed
	switch cw.CAS {
	case KVPlain, KVCreate:
		s.expected[w] = 0
	case KVKnown:
		s.expected[w] = s.known[cw.Key]
	}
	if p.b == nil || p.l == nil || (p.applied < p.reignFrom && !cfg.Shell.SkipReadyGate) {
		s.unsend(w) // UNAVAILABLE (ready)
		return ""
	}
	if r != s.leader {
		s.events |= keZombieSubmit
	}
	parked := p.l.Parked()
	eff := p.l.Submit(p.b, kv.Request{ID: uint64(w + 1), Write: kv.Write{Op: cw.Op, Key: []byte(kbKeys[cw.Key]), Value: cfg.value(w),
		Conditional: cw.CAS != KVPlain, Expected: s.expected[w]}}, 0)
	notReady := len(eff.Replies) == 1 && errors.Is(eff.Replies[0].Err, kv.ErrLeaderNotReady)
	if p.lease && !notReady && p.b.Applied() < s.acked {
		if err := kbViolated(KVLeaderHoldsAcked, "replica %d, holding its lease, takes write %d having applied %d, below revision %d already acknowledged",
			r, w, p.b.Applied(), s.acked); err != "" {
			return err
		}
	}
	if p.l.Parked() > parked {
		s.events |= keParked
	}
	return cfg.carry(s, r, eff, 0, 0)
}

func (cfg *KVBucketConfig) value(w int) []byte {
	if cfg.Writes[w].Op == kv.OpDelete {
		return nil
	}
	return kbValue(w)
}

// apply is replica r's runner taking its next committed entry (apply, or
// seek while it rebuilds).
func (cfg *KVBucketConfig) apply(s *kbstate, r int) string {
	s.own(r)
	p := &s.reps[r]
	seq := p.applied + 1
	e := s.log[seq-1]
	rec := e.rec
	if e.kind == kbInstall {
		rec = kbInstallRecord
	}
	if p.seeker != nil {
		c, err := p.seeker.Add(seq, rec)
		if err != nil {
			return kbViolated(KVAppliesEveryRecord, "replica %d seeking a checkpoint fails at seq %d: %v", r, seq, err)
		}
		p.applied = seq
		if c != nil {
			b, err := kv.LoadCheckpoint(cfg.kvConfig(), *c, seq)
			if err != nil {
				return kbViolated(KVAppliesEveryRecord, "replica %d cannot load the checkpoint ending at seq %d: %v", r, seq, err)
			}
			p.b, p.seeker = b, nil
			s.events |= keRebuild
		}
		return cfg.catchUpDone(s, r)
	}
	res, err := p.b.Apply(seq, rec)
	if err != nil {
		return kbViolated(KVAppliesEveryRecord, "replica %d cannot apply seq %d: %v", r, seq, err)
	}
	p.applied = seq
	if res.CheckpointComplete {
		s.events |= keCheckpoint
	}
	if e.kind == kbCompact && r == s.leader {
		s.events |= keCompaction
	}
	if p.l != nil && p.l.Inflight() > 0 {
		p.results = append(p.results, kbResult{seq: seq, res: res})
	}
	return cfg.catchUpDone(s, r)
}

// catchUpDone is the end of catchUp: the latest checkpoint.
func (cfg *KVBucketConfig) catchUpDone(s *kbstate, r int) string {
	p := &s.reps[r]
	if p.b != nil {
		p.ckpt = max(p.ckpt, p.b.LastCheckpoint())
	}
	return ""
}

// runWaits answers the committed proposals whose seq is applied
// (afterApplied's waits).
func (cfg *KVBucketConfig) runWaits(s *kbstate, r int) string {
	s.own(r)
	p := &s.reps[r]
	var ready []kbDone
	p.waits = slices.DeleteFunc(p.waits, func(d kbDone) bool {
		if d.seq <= p.applied {
			ready = append(ready, d)
			return true
		}
		return false
	})
	for _, d := range ready {
		if p.l == nil || d.gen != p.gen {
			continue
		}
		i := slices.IndexFunc(p.results, func(x kbResult) bool { return x.seq == d.seq })
		if i < 0 {
			if err := cfg.carry(s, r, p.l.Failed(p.b, d.id, errors.New("its apply result was not kept")), 0, 0); err != "" {
				return err
			}
			continue
		}
		res := p.results[i].res
		p.results = slices.Delete(p.results, i, i+1)
		if err := cfg.carry(s, r, p.l.Applied(p.b, d.id, d.seq, res), d.id, d.seq); err != "" {
			return err
		}
	}
	return ""
}

// completed is replica r's shell taking its next posted completion
// (kvRunner.completed, and the compaction's and checkpoint's callbacks).
func (cfg *KVBucketConfig) completed(s *kbstate, r int) string {
	s.own(r)
	p := &s.reps[r]
	d := p.done[0]
	p.done = p.done[1:]
	p.proposing--
	switch d.kind {
	case kbCompact:
		p.compacting = false
		return ""
	case kbChunk:
		p.checkpointing--
		return ""
	}
	if p.l == nil || d.gen != p.gen {
		return "" // its overlay is gone; LeadershipLost answered it
	}
	if d.failed {
		return cfg.carry(s, r, p.l.Failed(p.b, d.id, errors.New("refused")), 0, 0)
	}
	p.waits = append(p.waits, d)
	return cfg.runWaits(s, r)
}

// followLeadership is replica r's shell reading the partition's
// leadership and lease.
func (cfg *KVBucketConfig) followLeadership(s *kbstate, r int) string {
	s.own(r)
	p := &s.reps[r]
	leading := r == s.leader
	epoch, start := p.epoch, p.reignFrom
	if leading {
		epoch, start = s.epoch, s.installSeq
	}
	changed := leading != p.leading || epoch != p.epoch
	p.leading, p.epoch, p.reignFrom, p.lease = leading, epoch, start, leading && s.lease
	if p.l != nil && (changed || !leading) {
		if err := cfg.carry(s, r, p.l.LeadershipLost(), 0, 0); err != "" {
			return err
		}
		p.l, p.props, p.results = nil, nil, nil
	}
	if leading && p.b != nil && p.l == nil {
		l, err := kv.NewLeader(cfg.kvConfig(), start)
		if err != nil {
			return "KernelAssertion: " + err.Error()
		}
		p.l = l
		p.gen++
	}
	if p.l != nil {
		p.l.SetLease(p.lease)
	}
	return ""
}

func (s *kbstate) viewStale(r int) bool {
	p := &s.reps[r]
	leading := r == s.leader
	if leading != p.leading || (leading && (p.epoch != s.epoch || p.lease != s.lease)) || (!leading && p.lease) {
		return true
	}
	return leading && p.b != nil && p.l == nil
}

// ready is kvRunner.ready: it leads, took office and has a bucket.
func (cfg *KVBucketConfig) ready(p *kbReplica) bool {
	return p.b != nil && p.leading && (p.applied >= p.reignFrom || cfg.Shell.SkipReadyGate)
}

// readable is kvRunner.readableBucket.
func (cfg *KVBucketConfig) readable(p *kbReplica) bool {
	return cfg.ready(p) && p.applied >= p.reignFrom && (p.lease || cfg.Shell.ReadWithoutLease)
}

// commit appends the oldest pending entry to the committed log; its
// proposer's shell hears it.
func (s *kbstate) commit() {
	e := s.pending[0]
	s.pending = s.pending[1:]
	s.log = append(s.log, e)
	s.hear(e, uint64(len(s.log)), false)
}

// hear posts entry e's end to its proposer's shell, unless it heard one.
func (s *kbstate) hear(e kbEntry, seq uint64, failed bool) {
	if e.kind != kbInstall && !e.answered {
		s.reps[e.rep].done = append(s.reps[e.rep].done, kbDone{kind: e.kind, id: uint64(e.w + 1), gen: e.gen, seq: seq, failed: failed})
	}
}

// elect makes replica j the leader of the next epoch: the first kept of
// the pending entries commit, the rest are lost (replog.ErrLost); the old
// leader's shell hears the kept ones committed at their seqs (replog
// finishes a proposal whose entry the next leader committed), or, with
// keptFailed, failed (the partition's kernel answers one it has not
// applied yet NotApplied: UNAVAILABLE); j's install entry is appended.
func (s *kbstate) elect(j, kept int, keptFailed bool) {
	for i, e := range s.pending {
		if i < kept {
			s.log = append(s.log, e)
			s.hear(e, uint64(len(s.log)), keptFailed)
		} else {
			s.hear(e, 0, true)
		}
	}
	s.pending = nil
	s.epoch++
	s.leader = j
	s.installSeq = uint64(len(s.log)) + 1
	s.pending = append(s.pending, kbEntry{kind: kbInstall, epoch: s.epoch})
	s.events |= keElection
}

// startSeeking drops replica r's bucket: its log starts at start, after
// what it applied.
func (cfg *KVBucketConfig) startSeeking(s *kbstate, r int, start uint64) string {
	s.own(r)
	p := &s.reps[r]
	if p.l != nil {
		if err := cfg.carry(s, r, p.l.LeadershipLost(), 0, 0); err != "" {
			return err
		}
		p.l, p.props, p.results = nil, nil, nil
	}
	p.b, p.applied, p.seeker = nil, start-1, kv.NewSeeker(cfg.Mutations)
	return ""
}

// serveWatch is the leader's shell serving the watcher one event
// (serveWatch with a credit of one), checked against the log.
func (cfg *KVBucketConfig) serveWatch(s *kbstate, r int) string {
	b := s.reps[r].b
	cursor := s.watchNext
	batch := b.Watch(kv.Cursor{Next: cursor}, 1)
	fail := func(format string, args ...any) string {
		return kbViolated(KVWatchNoSilentGap, "replica %d serving the watch from %d (applied %d, floor %d): %s",
			r, cursor, b.Applied(), b.Floor(), fmt.Sprintf(format, args...))
	}
	if batch.Expired {
		if len(batch.Events) != 1 || cursor >= b.Floor() {
			return fail("CURSOR_EXPIRED at or above the floor: %+v", batch)
		}
		s.events |= keCursorExpired
		s.watchNext = b.Applied() + 1 // the watcher lists the bucket and resumes
		return ""
	}
	f := cfg.fold(s.log, b.Applied())
	pos := cursor
	for _, ev := range batch.Events {
		switch ev.Kind {
		case kv.EventPut, kv.EventDelete:
			seq := ev.Revision.Seq
			if seq != pos || seq > b.Applied() || !f.written[seq-1] {
				return fail("delivered revision %d at position %d, not a revision of the log", seq, pos)
			}
			e := s.log[seq-1]
			cw := cfg.Writes[e.w]
			if ev.Revision.Key != kbKeys[cw.Key] || ev.Revision.Op != cw.Op || !bytes.Equal(ev.Revision.Value, cfg.value(e.w)) {
				return fail("delivered %+v for write %d (%v) at %d", ev.Revision, e.w, cw, seq)
			}
			s.events |= keWatchEvent
			pos = seq + 1
		case kv.EventSkipped:
			if ev.From != pos || ev.To < ev.From || ev.To > b.Applied() {
				return fail("skipped %d-%d at position %d", ev.From, ev.To, pos)
			}
			for seq := ev.From; seq <= ev.To; seq++ {
				if !f.written[seq-1] {
					continue
				}
				key, later := cfg.Writes[s.log[seq-1].w].Key, 0
				for t := seq + 1; t <= b.Applied(); t++ {
					if f.written[t-1] && cfg.Writes[s.log[t-1].w].Key == key {
						later++
					}
				}
				if later < max(cfg.HistoryMax, 1) {
					return fail("skipped revision %d of %q, overwritten only %d times since", seq, kbKeys[key], later)
				}
			}
			pos = ev.To + 1
		default:
			return fail("event %v", ev.Kind)
		}
	}
	if pos != batch.Next {
		return fail("the events account for %d-%d, the batch moves the cursor to %d", cursor, pos-1, batch.Next)
	}
	s.watchNext = batch.Next
	return ""
}

// reads checks the GETs replica r would serve.
func (cfg *KVBucketConfig) reads(s *kbstate, r int) string {
	p := &s.reps[r]
	f := cfg.fold(s.log, min(p.applied, uint64(len(s.log))))
	for k, key := range kbKeys {
		rev, found := p.b.Get(key)
		latest := f.latest[k]
		want := latest.seq != 0 && latest.op == kv.OpPut
		if p.applied < s.observed || found != want || (found && (rev.Seq != latest.seq || !bytes.Equal(rev.Value, kbValue(latest.w)))) {
			if err := kbViolated(KVGetLinearizable, "replica %d serves GET %q as %v (found %v) at its applied %d; answers showed up to %d, the log folded there has it at %d (%v)",
				r, key, rev.Seq, found, p.applied, s.observed, latest.seq, latest.op); err != "" {
				return err
			}
		}
	}
	return ""
}

// check holds in every state.
func (cfg *KVBucketConfig) check(s *kbstate) string {
	whole := cfg.fold(s.log, uint64(len(s.log)))
	for w, st := range s.status {
		if st != kwMismatch && !slices.ContainsFunc(s.replies, func(rp kbReply) bool { return rp.w == w && rp.status == kwMismatch }) {
			continue
		}
		for i, e := range s.log {
			if e.kind == kbWrite && e.w == w && whole.written[i] {
				if err := kbViolated(KVRefusedNotWritten, "write %d (%v) answered REVISION_MISMATCH, yet it applies at seq %d", w, cfg.Writes[w], i+1); err != "" {
					return err
				}
			}
		}
	}
	for r := range s.reps {
		p := &s.reps[r]
		if p.b == nil {
			continue
		}
		f := cfg.fold(s.log, p.applied)
		for k, key := range kbKeys {
			h := p.b.History(key)
			latest := f.latest[k]
			var got kbRev
			if len(h) > 0 {
				got = kbRev{seq: h[len(h)-1].Seq, op: h[len(h)-1].Op}
			}
			if got.seq != latest.seq || (got.seq != 0 && got.op != latest.op) {
				if err := kbViolated(KVStateMatchesLog, "replica %d at %d holds %q at %d (%v); the log folded there has it at %d (%v)",
					r, p.applied, key, got.seq, got.op, latest.seq, latest.op); err != "" {
					return err
				}
			}
		}
		for q := r + 1; q < len(s.reps); q++ {
			o := &s.reps[q]
			if o.b != nil && o.applied == p.applied && !bytes.Equal(o.b.AppendDigest(nil), p.b.AppendDigest(nil)) {
				if err := kbViolated(KVReplicasAgree, "replicas %d and %d applied seq %d and hold different buckets: %+v and %+v",
					r, q, p.applied, p.b.Snapshot(), o.b.Snapshot()); err != "" {
					return err
				}
			}
		}
	}
	return ""
}

func (cfg *KVBucketConfig) successors(s *kbstate) []step[*kbstate] {
	var out []step[*kbstate]
	try := func(action string, f func(*kbstate) string) {
		t := s.clone()
		err := f(t)
		if err == "" {
			for r := range t.reps {
				if p := &t.reps[r]; p.l == nil || p.l.Inflight() == 0 {
					p.results = nil // the end of a round
				}
			}
		}
		if err != "" {
			out = append(out, step[*kbstate]{action: action, err: err})
			return
		}
		out = append(out, step[*kbstate]{action: action, next: t})
	}
	can := func(b int) bool { return s.used[b] < cfg.budget(b) }

	// GETs, at every replica that would serve them (a read changes no
	// state: checked here, it leads nowhere).
	for r := range s.reps {
		if p := &s.reps[r]; cfg.readable(p) {
			if err := cfg.reads(s, r); err != "" {
				out = append(out, step[*kbstate]{action: fmt.Sprintf("the client GETs every key at replica %d", r), err: err})
				return out
			}
		}
	}

	// The client.
	outstanding := 0
	for _, st := range s.status {
		if st == kwOutstanding || st == kwAnswered {
			outstanding++
		}
	}
	if w := slices.Index(s.status, kwUnsent); w >= 0 && outstanding < cfg.InflightMax {
		for r := range s.reps {
			if s.reps[r].leading {
				try(fmt.Sprintf("the client sends write %d (%v) to replica %d", w, cfg.Writes[w], r), func(x *kbstate) string { return cfg.submit(x, r, w) })
			}
		}
	}
	for k, rp := range s.replies {
		what := map[uint8]string{kwOK: fmt.Sprintf("revision %d", rp.revision), kwMismatch: fmt.Sprintf("REVISION_MISMATCH (current %d)", rp.revision), kwUnknown: "OUTCOME_UNKNOWN"}[rp.status]
		try(fmt.Sprintf("the client hears write %d answered %s", rp.w, what), func(x *kbstate) string {
			x.replies = slices.Delete(x.replies, k, k+1)
			x.status[rp.w] = rp.status
			if rp.status != kwUnknown {
				x.known[cfg.Writes[rp.w].Key] = rp.revision
			}
			return ""
		})
		if can(bkLostReplies) {
			try(fmt.Sprintf("the answer to write %d is lost", rp.w), func(x *kbstate) string {
				x.used[bkLostReplies]++
				x.replies = slices.Delete(x.replies, k, k+1)
				x.status[rp.w] = kwUnknown
				return ""
			})
		}
	}

	// Replication.
	if len(s.pending) > 0 {
		try(fmt.Sprintf("seq %d commits", len(s.log)+1), func(x *kbstate) string { x.commit(); return "" })
	}
	if can(bkDegrades) && slices.ContainsFunc(s.pending, func(e kbEntry) bool { return e.kind != kbInstall && !e.answered }) {
		try("the leader degrades: its proposals in flight are answered QUORUM_LOST (they stay in flight)", func(x *kbstate) string {
			x.used[bkDegrades]++
			for i := range x.pending {
				x.hear(x.pending[i], 0, true)
				x.pending[i].answered = true
			}
			return ""
		})
	}
	if can(bkRefusals) {
		for i, e := range s.pending {
			if e.kind != kbInstall {
				try(fmt.Sprintf("the partition refuses pending entry %d (before its append)", i), func(x *kbstate) string {
					x.used[bkRefusals]++
					x.pending = slices.Delete(x.pending, i, i+1)
					x.hear(e, 0, true)
					return ""
				})
			}
		}
	}
	if s.lease && can(bkLapses) {
		try(fmt.Sprintf("replica %d's lease lapses", s.leader), func(x *kbstate) string {
			x.used[bkLapses]++
			x.lease = false
			// The shell reads its lease on the clock: a lapsed lease is
			// read as lapsed at once (lease safety is the replica
			// model's business).
			for r := range x.reps {
				if p := &x.reps[r]; p.lease {
					p.lease = false
					x.own(r)
					if p.l != nil {
						p.l.SetLease(false)
					}
				}
			}
			return ""
		})
	}
	if !s.lease {
		try(fmt.Sprintf("replica %d holds its lease", s.leader), func(x *kbstate) string { x.lease = true; return "" })
		if can(bkElections) {
			for j := range s.reps {
				for kept := 0; kept <= len(s.pending); kept++ {
					try(fmt.Sprintf("replica %d takes office in epoch %d keeping %d of %d pending entries", j, s.epoch+1, kept, len(s.pending)), func(x *kbstate) string {
						x.used[bkElections]++
						x.elect(j, kept, false)
						return ""
					})
					if kept > 0 {
						try(fmt.Sprintf("replica %d takes office in epoch %d keeping %d of %d pending entries (their proposer hears them failed)", j, s.epoch+1, kept, len(s.pending)), func(x *kbstate) string {
							x.used[bkElections]++
							x.elect(j, kept, true)
							return ""
						})
					}
				}
			}
		}
	}

	// The replicas' shells.
	for r := range s.reps {
		p := &s.reps[r]
		if p.applied < uint64(len(s.log)) && p.applied+1 >= p.start {
			try(fmt.Sprintf("replica %d applies seq %d", r, p.applied+1), func(x *kbstate) string { return cfg.apply(x, r) })
		}
		if s.viewStale(r) {
			try(fmt.Sprintf("replica %d follows the leadership", r), func(x *kbstate) string { return cfg.followLeadership(x, r) })
		}
		if len(p.done) > 0 {
			try(fmt.Sprintf("replica %d takes a completion", r), func(x *kbstate) string { return cfg.completed(x, r) })
		}
		if slices.ContainsFunc(p.waits, func(d kbDone) bool { return d.seq <= p.applied }) {
			try(fmt.Sprintf("replica %d answers what it applied", r), func(x *kbstate) string { return cfg.runWaits(x, r) })
		}
		ready := cfg.ready(p) && p.l != nil && p.applied >= p.reignFrom
		if ready && can(bkCompactions) && !p.compacting && p.b.PurgeDue(kbCompactMs) {
			try(fmt.Sprintf("replica %d proposes a compaction", r), func(x *kbstate) string {
				x.used[bkCompactions]++
				x.reps[r].compacting = true
				x.propose(r, kbEntry{kind: kbCompact, rec: kv.CompactRecord(kbCompactMs)})
				return ""
			})
		}
		drained := p.proposing == 0 && (r != s.leader || p.applied+1 == s.nextSeq())
		if ready && can(bkCheckpoints) && p.checkpointing == 0 && (drained || cfg.Shell.CheckpointWithoutDrain) {
			try(fmt.Sprintf("replica %d proposes a checkpoint as of %d", r, p.applied), func(x *kbstate) string {
				x.used[bkCheckpoints]++
				q := &x.reps[r]
				recs, err := q.b.CheckpointRecords(cfg.chunkBytes(), 0)
				if err != nil {
					return "KernelAssertion: " + err.Error()
				}
				q.checkpointing = len(recs)
				for _, rec := range recs {
					x.propose(r, kbEntry{kind: kbChunk, rec: rec})
				}
				return ""
			})
		}
		if cfg.Watch && s.watchNext <= p.applied && cfg.readable(p) {
			try(fmt.Sprintf("replica %d serves the watch from %d", r, s.watchNext), func(x *kbstate) string { return cfg.serveWatch(x, r) })
		}
		if can(bkTruncations) && p.ckpt+1 > p.start {
			try(fmt.Sprintf("replica %d's log is truncated through its checkpoint's base %d", r, p.ckpt), func(x *kbstate) string {
				x.used[bkTruncations]++
				x.reps[r].start = p.ckpt + 1
				return ""
			})
		}
		if r != s.leader && can(bkRestarts) {
			try(fmt.Sprintf("replica %d restarts from its log at seq %d", r, p.start), func(x *kbstate) string {
				x.used[bkRestarts]++
				x.own(r)
				q := &x.reps[r]
				if q.l != nil { // shutdown: what it holds is answered
					if err := cfg.carry(x, r, q.l.LeadershipLost(), 0, 0); err != "" {
						return err
					}
				}
				*q = kbReplica{start: q.start, gen: q.gen}
				if q.start == 1 {
					b, err := kv.NewBucket(cfg.kvConfig())
					if err != nil {
						return "KernelAssertion: " + err.Error()
					}
					q.b = b
					return ""
				}
				return cfg.startSeeking(x, r, q.start)
			})
			if start := s.reps[s.leader].start; p.applied+1 < start {
				try(fmt.Sprintf("replica %d is reset to the leader's log start %d", r, start), func(x *kbstate) string {
					x.used[bkRestarts]++
					x.reps[r].start = start
					return cfg.startSeeking(x, r, start)
				})
			}
		}
	}
	return out
}

func (cfg *KVBucketConfig) chunkBytes() int {
	if cfg.CheckpointChunkBytes > 0 {
		return cfg.CheckpointChunkBytes
	}
	return 40
}

func (s *kbstate) key() [16]byte {
	b := make([]byte, 0, 2048)
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	record := func(r kv.Record) {
		u(uint64(r.TimestampMs))
		b = appendKBBytes(b, r.Key)
		b = appendKBBytes(b, r.Value)
		u(uint64(len(r.Headers)))
		for _, h := range r.Headers {
			b = appendKBBytes(b, []byte(h.Key))
			b = appendKBBytes(b, h.Value)
		}
	}
	entries := func(es []kbEntry) {
		u(uint64(len(es)))
		for _, e := range es {
			u(uint64(e.kind))
			u(e.epoch)
			u(uint64(e.rep))
			u(e.gen)
			u(uint64(e.w))
			u(e.exp)
			record(e.rec)
		}
	}
	dones := func(ds []kbDone) {
		u(uint64(len(ds)))
		for _, d := range ds {
			u(uint64(d.kind))
			u(d.id)
			u(d.gen)
			u(d.seq)
			u(uint64(boolByte(d.failed)))
		}
	}
	entries(s.log)
	entries(s.pending)
	for _, p := range s.reps {
		if p.b != nil {
			u(1)
			b = p.b.AppendDigest(b)
		} else {
			u(0)
		}
		if p.seeker != nil {
			u(1) // a seeker's state is the log it read since its start: applied says it
		} else {
			u(0)
		}
		if p.l != nil {
			u(1)
			b = p.l.AppendDigest(b)
		} else {
			u(0)
		}
		u(p.applied)
		u(p.start)
		u(p.ckpt)
		u(uint64(boolByte(p.leading)))
		u(p.epoch)
		u(p.reignFrom)
		u(uint64(boolByte(p.lease)))
		u(p.gen)
		u(uint64(len(p.props)))
		for _, id := range p.props {
			u(id)
		}
		dones(p.done)
		dones(p.waits)
		u(uint64(len(p.results)))
		for _, x := range p.results {
			u(x.seq)
			u(uint64(x.res.Outcome))
			u(x.res.Current)
		}
		u(uint64(p.proposing))
		u(uint64(boolByte(p.compacting)))
		u(uint64(p.checkpointing))
	}
	u(uint64(s.leader))
	u(s.epoch)
	u(s.installSeq)
	u(uint64(boolByte(s.lease)))
	b = append(b, s.status...)
	for w := range s.status {
		u(s.expected[w])
		u(s.observedAt[w])
		u(uint64(s.at[w]))
	}
	for _, k := range s.known {
		u(k)
	}
	replies := slices.Clone(s.replies)
	slices.SortFunc(replies, func(a, b kbReply) int { return a.w - b.w })
	u(uint64(len(replies)))
	for _, rp := range replies {
		u(uint64(rp.w))
		u(uint64(rp.status))
		u(rp.revision)
	}
	u(s.observed)
	u(s.acked)
	u(s.watchNext)
	for _, v := range s.used {
		u(uint64(v))
	}
	return stateKey(b)
}

func appendKBBytes(dst, b []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(len(b)))
	return append(dst, b...)
}

// CheckKVBucket explores every interleaving of the configuration.
func CheckKVBucket(cfg KVBucketConfig) KVBucketResult {
	if cfg.Replicas < 1 || len(cfg.Writes) == 0 || len(cfg.Writes) > 8 || cfg.InflightMax <= 0 {
		panic(fmt.Sprintf("model: kv bucket config %+v", cfg))
	}
	for _, w := range cfg.Writes {
		if w.Key < 0 || w.Key >= len(kbKeys) || (w.Op != kv.OpPut && w.Op != kv.OpDelete) {
			panic(fmt.Sprintf("model: kv bucket write %+v", w))
		}
	}
	if cfg.HistoryMax == 0 {
		cfg.HistoryMax = 1
	}
	if cfg.DepthMax == 0 {
		cfg.DepthMax = 100
	}
	if cfg.StatesMax == 0 {
		cfg.StatesMax = 2_000_000
	}
	n := len(cfg.Writes)
	init := &kbstate{status: make([]uint8, n), expected: make([]uint64, n), observedAt: make([]uint64, n), at: make([]int, n),
		reps: make([]kbReplica, cfg.Replicas), lease: true}
	for r := range init.reps {
		b, err := kv.NewBucket(cfg.kvConfig())
		if err != nil {
			panic(err)
		}
		init.reps[r] = kbReplica{b: b, start: 1}
	}
	if cfg.Watch {
		init.watchNext = 1
	}
	init.elect(0, 0, false)
	init.commit() // replica 0's install entry, seq 1
	if err := cfg.followLeadership(init, 0); err != "" {
		panic(err)
	}
	init.events = 0
	var res KVBucketResult
	res.Outcome = search[*kbstate]{
		successors: cfg.successors,
		key:        (*kbstate).key,
		visit: func(s *kbstate) {
			res.count(s.events)
			heard := !slices.ContainsFunc(s.status, func(st uint8) bool { return st < kwOK })
			if heard {
				res.ClientAnswered++
				if !slices.Contains(s.status, kwUnknown) {
					res.Settled++
				}
			}
			if slices.ContainsFunc(s.reps, func(p kbReplica) bool { return cfg.readable(&p) }) {
				res.Reads++
			}
		},
		bounded:   func(*kbstate) bool { return false },
		check:     cfg.check,
		depthMax:  cfg.DepthMax,
		statesMax: cfg.StatesMax,
	}.run(init)
	return res
}

func (res *KVBucketResult) count(ev kbevent) {
	for _, c := range []struct {
		ev kbevent
		n  *int
	}{{keWritten, &res.Written}, {keMismatch, &res.Mismatches}, {keApplyRefusal, &res.ApplyRefusals}, {keParked, &res.Parked},
		{keLeaseLapsed, &res.LeaseLapsed}, {keNotReady, &res.NotReady}, {keUnknown, &res.Unknown}, {keElection, &res.Elections},
		{keZombieSubmit, &res.ZombieSubmits}, {keCompaction, &res.Compactions}, {keWatchEvent, &res.WatchEvents},
		{keCursorExpired, &res.CursorExpired}, {keCheckpoint, &res.Checkpoints}, {keRebuild, &res.Rebuilds}} {
		if ev&c.ev != 0 {
			*c.n++
		}
	}
}

// KVWritesString names a write list for logs and the CLI.
func KVWritesString(ws []KVWrite) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = w.String()
	}
	return strings.Join(parts, ", ")
}
