package model

// The scheduled-delivery model: the real scheduler kernel
// (internal/sched) — a shard's applied state at each node and its owner —
// on two nodes that take the shard's leadership from each other, with a
// destination partition that deduplicates with the real producer table
// (internal/partition). Time is a global tick; each node's clock is that
// tick minus its skew (clocks jump back, never ahead). The shard's log
// is one linear committed sequence: a proposal commits only while its
// proposer leads in the proposal's epoch (replication fences the rest).
// Nodes apply it at their own pace; owners crash and lose their runtime;
// the destination refuses writes for a while, or is deleted and
// re-created (a publish names the incarnation it is for, and the
// destination refuses another); publish replies are lost (the shell's
// timeout: Refused); an operator pauses, closes or retires the lane and
// resumes it; a client cancels a schedule; a schedule's append may commit
// after a lane command the owner proposed once it was admitted, as the
// shell's intake appends apart from the owner's proposals. A node may end
// all its proposals in one pass, as the shell applies every committed
// entry (answering the operator's command among them) before it takes the
// owner's effects.

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/sched"
)

// SchedConfig bounds a scheduler exploration. Budgets limit how often an
// action kind may occur along one path.
type SchedConfig struct {
	// Due lists the schedules' deliver_at ticks, in admission order (the
	// owner admits them one by one, whenever it is active).
	Due     []int64
	TimeMax int64 // ticks run 0..TimeMax
	// Moves: the leader's lease guard closes and the other node takes
	// the shard in the next epoch; the old leader learns it later.
	Moves       int
	Crashes     int // an owner restarts and loses its runtime
	ClockJumps  int // a node's clock jumps one tick back
	Recreates   int // the destination is deleted and re-created
	Resumes     int // an operator resumes the lane (after a break or a pause)
	Pauses      int // an operator pauses the lane
	Closes      int // an operator closes the lane (new schedules refused; held as by a pause)
	Retires     int // an operator retires the lane (2: the operator asks again)
	Cancels     int // a client cancels an admitted schedule
	Outages     int // the destination refuses writes until it recovers
	LostReplies int // a publish lands but its reply is lost (the shell times out: Refused)
	// IntakeRaces: an admitted schedule's record commits at any later
	// point, not at once: after a lane command proposed meanwhile, which
	// the applied record obeys.
	IntakeRaces bool
	// LeaseTicks is how long a lease renewal keeps the leader's guard
	// open (by its own clock).
	LeaseTicks int64
	// Window is the destination's producer dedup window and the owner's
	// FireWindow.
	Window uint64
	// EvidenceTicks is how long a probe's answer is valid.
	EvidenceTicks int64
	NetworkMax    int
	DepthMax      int
	StatesMax     int
	Mutations     sched.Mutations
	// StateMutations break the applied state, at every node.
	StateMutations sched.StateMutations
}

// SchedResult is the outcome of a scheduler exploration.
type SchedResult struct {
	Outcome
	Landed      int // a schedule landed at the destination
	Retries     int // a retry was deduplicated against its first landing
	Unknown     int // an outcome was recorded UNKNOWN
	Breaks      int // a lane's ordering was broken by a re-created destination
	Takeovers   int // a second owner published
	AllResolved int // every schedule admitted, fired or unknown
	PausedHeld  int // a schedule fell due, not landed, while the lane was paused
	Cancelled   int // a cancel was answered OK
	TooLate     int // a cancel was answered too late (firing or fired)
	Refused     int // a schedule's record was refused as it applied (its lane closed or retired meanwhile)
	Retired     int // the lane's RETIRE was answered
}

const schedTopic = "a"

const (
	sbMoves = iota
	sbCrashes
	sbJumps
	sbRecreates
	sbResumes
	sbOutages
	sbLostReplies
	sbPauses
	sbCloses
	sbRetires
	sbCancels
	sbCount
)

func (c *SchedConfig) budget(i int) int {
	return [...]int{c.Moves, c.Crashes, c.ClockJumps, c.Recreates, c.Resumes, c.Outages, c.LostReplies, c.Pauses, c.Closes, c.Retires, c.Cancels}[i]
}

type sproposal struct {
	ref   uint64
	epoch uint64
	rec   sched.Record
}

type snode struct {
	st      *sched.State
	o       *sched.Owner
	auth    sched.Authority
	skew    int64
	inc     int // restarts: replies to an earlier incarnation's publishes are dropped
	queue   []sproposal
	probing bool
}

type spub struct {
	node, inc int
	p         sched.Publish
}

type slanding struct {
	id, fireSeq, incarnation uint64
}

type sstate struct {
	t        int64
	log      []*sched.Record // nil: a replica group install entry
	admitted int
	intake   []sched.Schedule // IntakeRaces: admitted, not yet committed
	nodes    [2]*snode
	holder   int
	epoch    uint64
	net      []spub
	// The destination: its incarnation, whether it takes writes, when it
	// was last re-created, and every landing of every incarnation.
	destInc     uint64
	writable    bool
	recreatedAt int64
	landings    []slanding
	// asks: the operator's lane commands and the client's cancels not yet
	// answered. held: a PAUSE or CLOSE was answered and no resume asked
	// since (PauseHolds: nothing is published meanwhile); retired: a
	// RETIRE was answered (nothing is published again); cancelled: the
	// schedules whose cancel was answered OK (never to land).
	asks      []sask
	held      bool
	retired   bool
	cancelled []uint64
	used      [sbCount]int
	events    sevent
}

// sask is a command asked of node's owner, answered when its proposal
// ref ends: a lane command (op) or a cancel of schedule id.
type sask struct {
	node int
	ref  uint64
	op   sched.LaneOp // 0: a cancel
	id   uint64
}

type sevent uint16

const (
	seLanded sevent = 1 << iota
	seRetry
	seUnknown
	seBreak
	seTakeover
	seResolved
	sePausedHeld // a schedule fell due, not landed, while the lane was paused
	seCancelled
	seTooLate
	seRefused
	seRetired
)

func (cfg *SchedConfig) ownerConfig() sched.Config {
	return sched.Config{ClaimMax: 4, FireWindow: cfg.Window, ProbeEveryMs: 1, Mutations: cfg.Mutations}
}

// newState is an empty shard's state, with the configured mutations.
func (cfg *SchedConfig) newState() *sched.State {
	st := sched.NewState()
	st.Mutations = cfg.StateMutations
	return st
}

// replay builds a node's state from the log's first n entries.
func (cfg *SchedConfig) replay(log []*sched.Record, n int) *sched.State {
	st := cfg.newState()
	for i, r := range log[:n] {
		if _, err := st.Apply(uint64(i+1), r); err != nil {
			panic(err)
		}
	}
	st.MarkLoaded()
	return st
}

func (s *sstate) clone(cfg *SchedConfig) *sstate {
	c := *s
	c.log = slices.Clone(s.log)
	c.net = slices.Clone(s.net)
	c.landings = slices.Clone(s.landings)
	c.intake = slices.Clone(s.intake)
	c.asks = slices.Clone(s.asks)
	c.cancelled = slices.Clone(s.cancelled)
	for i, n := range s.nodes {
		m := *n
		m.st = n.st.Clone()
		m.o = n.o.Clone(m.st)
		m.queue = slices.Clone(n.queue)
		c.nodes[i] = &m
	}
	c.events = 0
	return &c
}

func (s *sstate) clock(i int) int64 { return s.t + s.nodes[i].skew }

func (cfg *SchedConfig) initial() *sstate {
	s := &sstate{holder: 0, epoch: 1, log: []*sched.Record{nil}, destInc: 1, writable: true}
	for i := range s.nodes {
		st := cfg.newState()
		st.MarkLoaded()
		s.nodes[i] = &snode{st: st, o: sched.NewOwner(cfg.ownerConfig(), st), auth: sched.Authority{Assigned: true}}
	}
	s.nodes[0].auth = sched.Authority{Assigned: true, Leader: true, Epoch: 1, GuardUntilMs: cfg.LeaseTicks, Barrier: 1}
	return s
}

// collect carries out node i's effects, checking each publish as it is
// sent.
func (cfg *SchedConfig) collect(s *sstate, i int) string {
	n := s.nodes[i]
	for _, e := range n.o.TakeEffects() {
		switch {
		case e.Propose != nil:
			n.queue = append(n.queue, sproposal{ref: e.Propose.Ref, epoch: n.o.Epoch(), rec: e.Propose.Record})
		case e.Probe != "":
			n.probing = true
		case e.Publish != nil:
			if v := cfg.checkPublish(s, i, *e.Publish); v != "" {
				return v
			}
			s.net = append(s.net, spub{node: i, inc: n.inc, p: *e.Publish})
		}
	}
	return ""
}

// checkPublish checks a publish when it is sent.
func (cfg *SchedConfig) checkPublish(s *sstate, i int, p sched.Publish) string {
	n := s.nodes[i]
	if s.holder != i || !n.auth.Leader || n.auth.Epoch != s.epoch || s.clock(i) >= n.auth.GuardUntilMs {
		return fmt.Sprintf("NoPublishWithoutBothGates: n%d published schedule %d in epoch %d while n%d leads epoch %d (its guard open: %v)",
			i+1, p.ID, p.Epoch, s.holder+1, s.epoch, s.clock(i) < n.auth.GuardUntilMs)
	}
	intent := false
	for _, r := range s.log {
		if r != nil && r.Kind == sched.KindIntent {
			for _, in := range r.Intents {
				intent = intent || in.ID == p.ID && in.FireSeq == p.FireSeq
			}
		}
	}
	if !intent {
		return fmt.Sprintf("NoPublishBeforeIntent: n%d published schedule %d under fire sequence %d, which no committed intent gave it", i+1, p.ID, p.FireSeq)
	}
	if e, ok := n.st.Entry(p.ID); ok && e.Epoch != p.Epoch {
		s.events |= seTakeover
	}
	if s.held {
		return fmt.Sprintf("PauseHolds: n%d published schedule %d after the lane's pause or close was answered, before a resume was asked", i+1, p.ID)
	}
	if s.retired {
		return fmt.Sprintf("RetireHolds: n%d published schedule %d after the lane's RETIRE was answered", i+1, p.ID)
	}
	if slices.Contains(s.cancelled, p.ID) {
		return fmt.Sprintf("CancelledNeverPublished: n%d published schedule %d after its cancel was answered OK", i+1, p.ID)
	}
	if due := cfg.Due[cfg.admissionOf(s, p.ID)]; s.t < due {
		return fmt.Sprintf("NeverEarly: schedule %d due at %d published at %d", p.ID, due, s.t)
	}
	// A destination re-created longer ago than any evidence stays valid
	// (plus the clocks' lag) must have been noticed by now.
	if pinned := cfg.pinned(s); s.destInc != pinned && s.t >= s.recreatedAt+cfg.EvidenceTicks+int64(cfg.ClockJumps) {
		return fmt.Sprintf("NoPublishOnStaleEvidence: n%d published schedule %d into incarnation %d at %d; the lane pins %d and the destination was re-created at %d",
			i+1, p.ID, s.destInc, s.t, pinned, s.recreatedAt)
	}
	return ""
}

// admissionOf finds a schedule id's index in Due.
func (cfg *SchedConfig) admissionOf(s *sstate, id uint64) int {
	k := 0
	for seq, r := range s.log {
		if r != nil && r.Kind == sched.KindSchedule {
			if uint64(seq+1) == id {
				return k
			}
			k++
		}
	}
	panic(fmt.Sprintf("model: schedule %d not in the log", id))
}

// pinned is the lane's incarnation in the committed log.
func (cfg *SchedConfig) pinned(s *sstate) uint64 {
	st := cfg.replay(s.log, len(s.log))
	l, _ := st.Lane(schedTopic)
	return l.Incarnation
}

// apply makes node i apply its next committed entry and steps its owner.
func (cfg *SchedConfig) apply(s *sstate, i int) string {
	n := s.nodes[i]
	seq := n.st.Applied() + 1
	if _, err := n.st.Apply(seq, s.log[seq-1]); err != nil {
		panic(err)
	}
	n.o.Step(s.clock(i))
	return cfg.collect(s, i)
}

// commit appends node i's first proposal to the log if it still leads
// in the proposal's epoch (else replication refuses it), applies the log
// at i up to it, and completes it.
func (cfg *SchedConfig) commit(s *sstate, i int) string {
	n := s.nodes[i]
	p := n.queue[0]
	n.queue = n.queue[1:]
	v, committed := cfg.end(s, i, p, true)
	if v != "" {
		return v
	}
	if v := cfg.collect(s, i); v != "" || !committed {
		return v
	}
	return cfg.checkResolved(s)
}

// commitPass ends every proposal node i has queued in one pass, as the
// shell does: each committed one (while i leads in its epoch) is applied
// and completed — the operator's command answered — and only then are the
// owner's effects taken.
func (cfg *SchedConfig) commitPass(s *sstate, i int) string {
	n := s.nodes[i]
	q := n.queue
	n.queue = nil
	for _, p := range q {
		cfg.end(s, i, p, false) // (no effects taken: nothing to check)
	}
	if v := cfg.collect(s, i); v != "" {
		return v
	}
	return cfg.checkResolved(s)
}

// end ends node i's proposal p: refused when i no longer leads in p's
// epoch (replication fences it), else appended to the log, applied at i
// up to it and completed. With eachStep the owner steps and its effects
// are taken after every entry applied (apply), as when one proposal ends
// at a time; without, they wait for the caller (commitPass).
func (cfg *SchedConfig) end(s *sstate, i int, p sproposal, eachStep bool) (violation string, committed bool) {
	n := s.nodes[i]
	if s.holder != i || p.epoch != s.epoch {
		n.o.Proposed(s.clock(i), p.ref, fmt.Errorf("fenced"))
		return "", false
	}
	r := p.rec
	s.log = append(s.log, &r)
	if v := cfg.claimedForItsIncarnation(s, &r); v != "" {
		return v, true
	}
	switch {
	case r.Kind == sched.KindLane && r.Lane.Op == sched.LaneBreak:
		s.events |= seBreak
	case r.Kind == sched.KindUnknown:
		s.events |= seUnknown
	}
	for n.st.Applied() < uint64(len(s.log)) {
		if eachStep {
			if v := cfg.apply(s, i); v != "" {
				return v, true
			}
			continue
		}
		seq := n.st.Applied() + 1
		if _, err := n.st.Apply(seq, s.log[seq-1]); err != nil {
			panic(err)
		}
	}
	n.o.Proposed(s.clock(i), p.ref, nil)
	return cfg.answered(s, i, p.ref, uint64(len(s.log))), true
}

// claimedForItsIncarnation is NoClaimForAnEarlierIncarnation at an
// intent's commit: no schedule is claimed for an earlier incarnation of
// its destination than the one it was admitted under (the intent would
// be resolved UNKNOWN when the lane resumes into the new topic, the
// schedule never published).
func (cfg *SchedConfig) claimedForItsIncarnation(s *sstate, r *sched.Record) string {
	if r.Kind != sched.KindIntent {
		return ""
	}
	res := cfg.resultAt(s.log, uint64(len(s.log)))
	for _, in := range r.Intents {
		adm := s.log[in.ID-1]
		if slices.Contains(res.Skipped, in.ID) || adm == nil || adm.Kind != sched.KindSchedule {
			continue
		}
		if adm.Schedule.Incarnation > r.Incarnation {
			return fmt.Sprintf("NoClaimForAnEarlierIncarnation: schedule %d, admitted for incarnation %d, claimed for incarnation %d", in.ID, adm.Schedule.Incarnation, r.Incarnation)
		}
	}
	return ""
}

// answered answers the command asked of node i whose proposal ref
// committed at seq, from what its record decided as it applied.
func (cfg *SchedConfig) answered(s *sstate, i int, ref, seq uint64) string {
	k := slices.IndexFunc(s.asks, func(a sask) bool { return a.node == i && a.ref == ref })
	if k < 0 {
		return ""
	}
	a := s.asks[k]
	s.asks = slices.Delete(s.asks, k, k+1)
	res := cfg.resultAt(s.log, seq)
	switch a.op {
	case 0:
		if slices.Contains(res.Skipped, a.id) {
			s.events |= seTooLate
			return ""
		}
		if s.landed(a.id) > 0 {
			return fmt.Sprintf("CancelledNeverPublished: schedule %d's cancel was answered OK after it landed", a.id)
		}
		s.cancelled = append(s.cancelled, a.id)
		s.events |= seCancelled
	case sched.LanePause, sched.LaneClose:
		if res.Err == nil {
			s.held = true
		}
	case sched.LaneRetire:
		if res.Err != nil {
			return fmt.Sprintf("RetireAnsweredOK: n%d's RETIRE committed at %d and was refused (%v): an operator asking again after a lost answer never hears it done", i+1, seq, res.Err)
		}
		s.retired = true
		s.events |= seRetired
	}
	return ""
}

// resultAt is what the log's record at seq decided as it applied.
func (cfg *SchedConfig) resultAt(log []*sched.Record, seq uint64) sched.Result {
	res, err := cfg.replay(log, int(seq-1)).Apply(seq, log[seq-1])
	if err != nil {
		panic(err)
	}
	return res
}

// closedInLog reports whether the log, read as the operator's commands
// alone, leaves the lane refusing schedules: a CLOSE or a RETIRE with no
// RESUME after it (none undoes a RETIRE).
func closedInLog(log []*sched.Record) bool {
	closed, retired := false, false
	for _, r := range log {
		if r == nil || r.Kind != sched.KindLane {
			continue
		}
		switch r.Lane.Op {
		case sched.LaneClose:
			closed = true
		case sched.LaneRetire:
			retired = true
		case sched.LaneResume:
			closed = false
		}
	}
	return closed || retired
}

// appendSchedule commits an admitted schedule's record: a lane closed or
// retired in the log before it must refuse it (ClosedAdmitsNone: the
// client hears the refusal; it is never published).
func (cfg *SchedConfig) appendSchedule(s *sstate, sc sched.Schedule) string {
	closed := closedInLog(s.log)
	s.log = append(s.log, &sched.Record{Kind: sched.KindSchedule, Schedule: sc})
	if !closed {
		return ""
	}
	if res := cfg.resultAt(s.log, uint64(len(s.log))); res.Err == nil {
		return fmt.Sprintf("ClosedAdmitsNone: schedule %d committed after its lane's CLOSE or RETIRE and was admitted", len(s.log))
	}
	s.events |= seRefused
	return ""
}

// heldByPause notes a schedule due and not landed while the lane is
// paused (what the exploration is for).
func (cfg *SchedConfig) heldByPause(s *sstate) {
	if !s.held {
		return
	}
	for seq, r := range s.log {
		if r != nil && r.Kind == sched.KindSchedule && r.Schedule.DeliverAtMs <= s.t && s.landed(uint64(seq+1)) == 0 {
			s.events |= sePausedHeld
			return
		}
	}
}

// checkResolved: once every schedule is admitted, a log in which none is
// live any more records each as fired (and it landed exactly once) or
// unknown.
func (cfg *SchedConfig) checkResolved(s *sstate) string {
	st := cfg.replay(s.log, len(s.log))
	if s.admitted < len(cfg.Due) || len(s.intake) > 0 || st.Live() > 0 {
		return ""
	}
	fired := map[uint64]bool{}
	for _, r := range s.log {
		if r != nil && r.Kind == sched.KindFired {
			for _, f := range r.Fired {
				fired[f.ID] = true
			}
		}
	}
	for id := range fired {
		if n := s.landed(id); n != 1 {
			return fmt.Sprintf("ExactlyOnce: schedule %d recorded FIRED but landed %d times", id, n)
		}
	}
	s.events |= seResolved
	return ""
}

func (s *sstate) landed(id uint64) int {
	n := 0
	for _, l := range s.landings {
		if l.id == id {
			n++
		}
	}
	return n
}

// deliver carries a publish to the destination, which decides with the
// real producer table of its current incarnation.
func (cfg *SchedConfig) deliver(s *sstate, k int, lostReply bool) string {
	m := s.net[k]
	s.net = slices.Delete(s.net, k, k+1)
	out, destSeq := sched.Refused, uint64(0)
	// A scheduled publish names the incarnation its certificate vouched
	// for; the destination refuses another (a publish still in flight
	// when the topic was re-created must not land in the new one).
	if s.writable && m.p.Incarnation == s.destInc {
		table := partition.NewProducers(int(cfg.Window), 4)
		var seq uint64
		for _, l := range s.landings {
			if l.incarnation == s.destInc {
				seq++
				table.Record(1, l.fireSeq, seq, 1)
			}
		}
		switch v, at, _ := table.Check(1, m.p.FireSeq); v {
		case partition.VerdictDuplicate:
			first := s.landingAt(at)
			if first.id != m.p.ID {
				return fmt.Sprintf("ExactlyOnce: schedule %d's publish under fire sequence %d was taken for a retry of schedule %d's", m.p.ID, m.p.FireSeq, first.id)
			}
			out, destSeq = sched.Landed, at
			s.events |= seRetry
		case partition.VerdictTooOld:
			out = sched.Unprovable
		default:
			s.landings = append(s.landings, slanding{id: m.p.ID, fireSeq: m.p.FireSeq, incarnation: s.destInc})
			if n := s.landed(m.p.ID); n > 1 {
				return fmt.Sprintf("ExactlyOnce: schedule %d landed %d times", m.p.ID, n)
			}
			if slices.Contains(s.cancelled, m.p.ID) {
				return fmt.Sprintf("CancelledNeverPublished: schedule %d landed after its cancel was answered OK", m.p.ID)
			}
			out, destSeq = sched.Landed, seq+1
			s.events |= seLanded
		}
	}
	if lostReply {
		out = sched.Refused
	}
	n := s.nodes[m.node]
	if n.inc != m.inc {
		return ""
	}
	n.o.Published(s.clock(m.node), m.p, out, destSeq)
	n.o.Step(s.clock(m.node))
	return cfg.collect(s, m.node)
}

// landingAt is the current incarnation's landing at destination seq.
func (s *sstate) landingAt(seq uint64) slanding {
	var k uint64
	for _, l := range s.landings {
		if l.incarnation == s.destInc {
			if k++; k == seq {
				return l
			}
		}
	}
	panic("model: no landing at a deduplicated seq")
}

type sstep = step[*sstate]

func (cfg *SchedConfig) successors(s *sstate) []sstep {
	var out []sstep
	try := func(action string, f func(*sstate) string) {
		next := s.clone(cfg)
		v := f(next)
		out = append(out, sstep{action: action, next: next, err: v})
	}
	can := func(b int) bool { return s.used[b] < cfg.budget(b) }
	if s.t < cfg.TimeMax {
		try(fmt.Sprintf("tick to %d", s.t+1), func(x *sstate) string { x.t++; cfg.heldByPause(x); return "" })
	}
	for i, n := range s.nodes {
		if n.st.Applied() < uint64(len(s.log)) {
			try(fmt.Sprintf("n%d applies entry %d", i+1, n.st.Applied()+1), func(x *sstate) string { return cfg.apply(x, i) })
		}
		try(fmt.Sprintf("n%d steps at clock %d", i+1, s.clock(i)), func(x *sstate) string {
			x.nodes[i].o.Step(x.clock(i))
			return cfg.collect(x, i)
		})
		if len(n.queue) > 0 {
			try(fmt.Sprintf("n%d's proposal %d (%v) ends", i+1, n.queue[0].ref, n.queue[0].rec.Kind), func(x *sstate) string { return cfg.commit(x, i) })
		}
		if len(n.queue) > 1 {
			try(fmt.Sprintf("n%d's %d proposals end in one pass", i+1, len(n.queue)), func(x *sstate) string { return cfg.commitPass(x, i) })
		}
		if n.probing {
			try(fmt.Sprintf("n%d's probe answered", i+1), func(x *sstate) string {
				m := x.nodes[i]
				m.probing = false
				m.o.Evidence(x.clock(i), sched.Evidence{Topic: schedTopic, Incarnation: x.destInc, Partitions: 1, Writable: x.writable, ValidUntilMs: x.clock(i) + cfg.EvidenceTicks})
				return cfg.collect(x, i)
			})
		}
		if can(sbJumps) && n.skew > -int64(cfg.ClockJumps) {
			try(fmt.Sprintf("n%d's clock jumps back", i+1), func(x *sstate) string {
				x.used[sbJumps]++
				m := x.nodes[i]
				m.skew--
				// The guard runs on the monotonic clock: the shell
				// re-expresses it in the wall clock's frame.
				m.auth.GuardUntilMs--
				m.o.SetAuthority(x.clock(i), m.auth)
				return cfg.collect(x, i)
			})
		}
		if i == s.holder && n.auth.GuardUntilMs < s.clock(i)+cfg.LeaseTicks {
			try(fmt.Sprintf("n%d renews its lease", i+1), func(x *sstate) string {
				m := x.nodes[i]
				m.auth.GuardUntilMs = x.clock(i) + cfg.LeaseTicks
				m.o.SetAuthority(x.clock(i), m.auth)
				return cfg.collect(x, i)
			})
		}
		if can(sbCrashes) {
			try(fmt.Sprintf("n%d's owner restarts", i+1), func(x *sstate) string {
				x.used[sbCrashes]++
				m := x.nodes[i]
				m.o = sched.NewOwner(cfg.ownerConfig(), m.st)
				m.inc++
				m.queue, m.probing = nil, false
				// Its proposals are gone unanswered; the new owner's refs
				// start again.
				x.asks = slices.DeleteFunc(x.asks, func(a sask) bool { return a.node == i })
				m.o.SetAuthority(x.clock(i), m.auth)
				return cfg.collect(x, i)
			})
		}
		if i != s.holder && n.auth.Leader {
			try(fmt.Sprintf("n%d learns it no longer leads", i+1), func(x *sstate) string {
				m := x.nodes[i]
				m.auth.Leader = false
				m.o.SetAuthority(x.clock(i), m.auth)
				return cfg.collect(x, i)
			})
		}
		// The lease: another replica takes office only once every guard
		// has closed.
		closed := true
		for j, m := range s.nodes {
			closed = closed && s.clock(j) >= m.auth.GuardUntilMs
		}
		if i != s.holder && can(sbMoves) && closed {
			try(fmt.Sprintf("n%d takes the shard in epoch %d", i+1, s.epoch+1), func(x *sstate) string {
				x.used[sbMoves]++
				x.epoch++
				x.log = append(x.log, nil)
				x.holder = i
				m := x.nodes[i]
				m.auth = sched.Authority{Assigned: true, Leader: true, Epoch: x.epoch, GuardUntilMs: x.clock(i) + cfg.LeaseTicks, Barrier: uint64(len(x.log))}
				m.o.SetAuthority(x.clock(i), m.auth)
				return cfg.collect(x, i)
			})
		}
	}
	if h := s.nodes[s.holder]; s.admitted < len(cfg.Due) && h.o.Lifecycle() == sched.Active {
		try(fmt.Sprintf("n%d admits schedule %d (due %d)", s.holder+1, s.admitted+1, cfg.Due[s.admitted]), func(x *sstate) string {
			sc := sched.Schedule{DeliverAtMs: cfg.Due[x.admitted], Topic: schedTopic, Incarnation: x.destInc}
			if err := x.nodes[x.holder].o.Admit(x.clock(x.holder), sc); err != nil {
				return ""
			}
			x.admitted++
			if cfg.IntakeRaces {
				x.intake = append(x.intake, sc)
				return ""
			}
			return cfg.appendSchedule(x, sc)
		})
	}
	if len(s.intake) > 0 {
		try(fmt.Sprintf("schedule %d's append commits", len(s.log)+1), func(x *sstate) string {
			sc := x.intake[0]
			x.intake = x.intake[1:]
			return cfg.appendSchedule(x, sc)
		})
	}
	if h := s.nodes[s.holder]; can(sbResumes) && h.o.Lifecycle() == sched.Active {
		try("an operator resumes the lane", func(x *sstate) string {
			x.used[sbResumes]++
			// Asked: publishing may start again, and a pause or close
			// still on its way ends before it.
			x.held = false
			x.asks = slices.DeleteFunc(x.asks, func(a sask) bool { return a.op == sched.LanePause || a.op == sched.LaneClose })
			if _, err := x.nodes[x.holder].o.Manage(x.clock(x.holder), sched.LaneCommand{Topic: schedTopic, Op: sched.LaneResume, Incarnation: x.destInc}); err != nil {
				return ""
			}
			return cfg.collect(x, x.holder)
		})
	}
	for _, c := range []struct {
		op     sched.LaneOp
		budget int
		what   string
	}{{sched.LanePause, sbPauses, "pauses"}, {sched.LaneClose, sbCloses, "closes"}, {sched.LaneRetire, sbRetires, "retires"}} {
		if h := s.nodes[s.holder]; can(c.budget) && h.o.Lifecycle() == sched.Active {
			try("an operator "+c.what+" the lane", func(x *sstate) string {
				x.used[c.budget]++
				ref, err := x.nodes[x.holder].o.Manage(x.clock(x.holder), sched.LaneCommand{Topic: schedTopic, Op: c.op})
				if err != nil {
					return ""
				}
				x.asks = append(x.asks, sask{node: x.holder, ref: ref, op: c.op})
				return cfg.collect(x, x.holder)
			})
		}
	}
	if h := s.nodes[s.holder]; can(sbCancels) && h.o.Lifecycle() == sched.Active {
		for seq, r := range s.log {
			if r == nil || r.Kind != sched.KindSchedule {
				continue
			}
			id := uint64(seq + 1)
			try(fmt.Sprintf("a client cancels schedule %d", id), func(x *sstate) string {
				x.used[sbCancels]++
				ref, err := x.nodes[x.holder].o.Cancel(x.clock(x.holder), []uint64{id})
				if err != nil {
					return ""
				}
				x.asks = append(x.asks, sask{node: x.holder, ref: ref, id: id})
				return cfg.collect(x, x.holder)
			})
		}
	}
	for k := range s.net {
		try(fmt.Sprintf("publish of schedule %d (fire sequence %d) reaches the destination", s.net[k].p.ID, s.net[k].p.FireSeq), func(x *sstate) string { return cfg.deliver(x, k, false) })
		if can(sbLostReplies) {
			try(fmt.Sprintf("publish of schedule %d reaches the destination; its reply is lost", s.net[k].p.ID), func(x *sstate) string {
				x.used[sbLostReplies]++
				return cfg.deliver(x, k, true)
			})
		}
	}
	if can(sbRecreates) {
		try("the destination is deleted and re-created", func(x *sstate) string {
			x.used[sbRecreates]++
			x.destInc++
			x.recreatedAt = x.t
			return ""
		})
	}
	if s.writable && can(sbOutages) {
		try("the destination refuses writes", func(x *sstate) string { x.used[sbOutages]++; x.writable = false; return "" })
	}
	if !s.writable {
		try("the destination recovers", func(x *sstate) string { x.writable = true; return "" })
	}
	return out
}

func (s *sstate) key() [16]byte {
	var b []byte
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	u(uint64(s.t))
	u(uint64(s.admitted))
	u(uint64(s.holder))
	u(s.epoch)
	for _, r := range s.log {
		if r == nil {
			b = append(b, 0)
			continue
		}
		enc, err := r.Encode()
		if err != nil {
			panic(err)
		}
		u(uint64(len(enc)))
		b = append(b, enc...)
	}
	for _, n := range s.nodes {
		u(n.st.Applied())
		u(uint64(n.skew))
		u(uint64(n.inc))
		u(uint64(boolByte(n.probing)))
		u(uint64(boolByte(n.auth.Assigned)))
		u(uint64(boolByte(n.auth.Leader)))
		u(n.auth.Epoch)
		u(uint64(n.auth.GuardUntilMs))
		u(n.auth.Barrier)
		u(uint64(len(n.queue)))
		for _, p := range n.queue {
			u(p.ref)
			u(p.epoch)
			enc, _ := p.rec.Encode()
			b = append(b, enc...)
		}
		b = n.o.AppendDigest(append(b, 0xff))
	}
	u(uint64(len(s.net)))
	for _, m := range s.net {
		u(uint64(m.node))
		u(uint64(m.inc))
		u(m.p.ID)
		u(m.p.FireSeq)
		u(m.p.Epoch)
		u(m.p.Incarnation)
	}
	u(s.destInc)
	u(uint64(boolByte(s.writable)))
	u(uint64(s.recreatedAt))
	u(uint64(len(s.asks)))
	for _, a := range s.asks {
		u(uint64(a.node))
		u(a.ref)
		u(uint64(a.op))
		u(a.id)
	}
	u(uint64(boolByte(s.held)))
	u(uint64(boolByte(s.retired)))
	u(uint64(len(s.cancelled)))
	for _, id := range s.cancelled {
		u(id)
	}
	u(uint64(len(s.intake)))
	for _, sc := range s.intake {
		u(uint64(sc.DeliverAtMs))
		u(sc.Incarnation)
	}
	u(uint64(len(s.landings)))
	for _, l := range s.landings {
		u(l.id)
		u(l.fireSeq)
		u(l.incarnation)
	}
	for _, v := range s.used {
		u(uint64(v))
	}
	return stateKey(b)
}

// CheckSched explores every interleaving of the configuration.
func CheckSched(cfg SchedConfig) SchedResult {
	if len(cfg.Due) == 0 || cfg.Window == 0 || cfg.EvidenceTicks <= 0 || cfg.LeaseTicks <= 0 {
		panic(fmt.Sprintf("model: sched config %+v", cfg))
	}
	var res SchedResult
	x := search[*sstate]{
		successors: cfg.successors,
		key:        (*sstate).key,
		visit: func(s *sstate) {
			for ev, n := range map[sevent]*int{seLanded: &res.Landed, seRetry: &res.Retries, seUnknown: &res.Unknown, seBreak: &res.Breaks, seTakeover: &res.Takeovers, seResolved: &res.AllResolved, sePausedHeld: &res.PausedHeld,
				seCancelled: &res.Cancelled, seTooLate: &res.TooLate, seRefused: &res.Refused, seRetired: &res.Retired} {
				if s.events&ev != 0 {
					*n++
				}
			}
		},
		bounded: func(s *sstate) bool {
			q := 0
			for _, n := range s.nodes {
				q += len(n.queue)
			}
			return len(s.net)+q > cfg.NetworkMax
		},
		depthMax:  cfg.DepthMax,
		statesMax: cfg.StatesMax,
	}
	res.Outcome = x.run(cfg.initial())
	return res
}
