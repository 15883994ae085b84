package sched

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Lifecycle is a shard's lifecycle on this node: closed, each state
// visible (sched status).
//
//	UNASSIGNED → ACQUIRING → RESTORING → CATCHING_UP → ACTIVE_FOR_COMMANDS → DRAINING → UNASSIGNED
//	any nonterminal → FENCED → ACQUIRING (both gates again)
//	any nonterminal → FAILED (a proven integrity failure; never back to active)
type Lifecycle uint8

const (
	Unassigned Lifecycle = iota + 1
	Acquiring
	Restoring
	CatchingUp
	Active
	Draining
	Fenced
	Failed
)

func (l Lifecycle) String() string {
	switch l {
	case Unassigned:
		return "UNASSIGNED"
	case Acquiring:
		return "ACQUIRING"
	case Restoring:
		return "RESTORING"
	case CatchingUp:
		return "CATCHING_UP"
	case Active:
		return "ACTIVE_FOR_COMMANDS"
	case Draining:
		return "DRAINING"
	case Fenced:
		return "FENCED"
	case Failed:
		return "FAILED"
	}
	return fmt.Sprintf("Lifecycle(%d)", uint8(l))
}

// inOffice reports whether l holds (or is taking) the shard's authority.
func (l Lifecycle) inOffice() bool {
	return l == Acquiring || l == Restoring || l == CatchingUp || l == Active || l == Draining
}

// Authority is what the shell knows of this node's two gates on the shard.
type Authority struct {
	// Assigned: the shard's Source Assignment in __meta names this node
	// (the shard exists and this node is in its replica group).
	Assigned bool
	// Leader: this node leads the shard's replica group under Epoch, the
	// owner epoch.
	Leader bool
	Epoch  uint64
	// GuardUntilMs is the local lease guard: the shell sets it so that it
	// closes before the lease can expire at any other replica. Nothing is
	// mutated or published at or after it.
	GuardUntilMs int64
	// Barrier is the seq of the entry that installed Epoch: the owner is
	// ACTIVE only once the state applied it, so it has applied everything
	// every earlier owner committed (the activation barrier).
	Barrier uint64
}

// Readiness is a lane's runtime axis, from evidence of its destination.
type Readiness uint8

const (
	RecoveringEvidence Readiness = iota // no current certificate: a probe is due or running
	Ready                               // a valid certificate
	Blocked                             // the destination refused, is gone or unreachable
)

func (r Readiness) String() string {
	switch r {
	case RecoveringEvidence:
		return "RECOVERING_EVIDENCE"
	case Ready:
		return "READY"
	case Blocked:
		return "BLOCKED"
	}
	return fmt.Sprintf("Readiness(%d)", uint8(r))
}

// Evidence is a probe's answer about a lane's destination.
type Evidence struct {
	Topic       string
	Incarnation uint64 // the topic's incarnation now; 0 = it does not exist
	Partitions  uint32
	// Writable: every partition has a leader accepting writes and the
	// scheduler may publish to the topic.
	Writable bool
	// ValidUntilMs bounds how long the evidence may be trusted.
	ValidUntilMs int64
}

// Cert is a READY certificate, bound to the owner epoch, the lane's
// pinned incarnation and an expiry. It is re-validated before every claim
// and every publish (ReadyIsRevalidated).
type Cert struct {
	Epoch       uint64
	Incarnation uint64
	Partitions  uint32
	UntilMs     int64
}

// Publish is a due message to publish: the shell reads schedule ID's
// message from the shard log (the record at At) and publishes it to Topic's Partition with
// the producer identity of (shard, Topic, Partition) and producer_seq
// FireSeq, then reports the outcome with Published.
type Publish struct {
	ID          uint64
	Topic       string
	Partition   uint32
	FireSeq     uint64
	Epoch       uint64 // the owner epoch publishing it
	Incarnation uint64 // the destination incarnation the certificate vouched for
	At          uint64 // the seq of the record holding its message
}

// Proposal is a record the owner proposes to the shard's log. The shell
// reports its end with Proposed(Ref), after applying it if it committed.
// A KindCarry's message is the one the record at Carry.From holds: the
// shell reads it from the log and appends it with the record. Proposals
// are appended in the order they are emitted, none between them (a
// checkpoint's chunks).
type Proposal struct {
	Ref    uint64
	Record Record
}

// Effect is one thing the shell must do, in order. Exactly one field is set.
type Effect struct {
	Propose *Proposal
	Publish *Publish
	Probe   string // gather Evidence of this lane's destination
	Release bool   // the drain finished (or timed out): release the shard
}

// Outcome is how a publish ended at the destination.
type Outcome uint8

const (
	// Landed: appended, or a retry the destination deduplicated against
	// the original append (either way it is in the destination once).
	Landed Outcome = iota + 1
	// Unprovable: the destination's dedup window moved past the fire
	// sequence; whether an earlier attempt landed cannot be proven.
	Unprovable
	// Refused: the destination could not take it now (no leader, quorum
	// lost, gone); the publish is retried once the lane is READY again.
	Refused
)

// Config configures an owner.
type Config struct {
	// ClaimMax bounds the schedules one intent record claims.
	ClaimMax int
	// FireWindow bounds the fire sequences of one destination partition
	// between its lowest unresolved one and its next: at most the
	// destination's producer dedup window, so every retry stays provable
	// (FireWithinDedupWindow).
	FireWindow uint64
	// ProbeEveryMs is how often a lane that is not READY is probed again.
	ProbeEveryMs int64
	// CheckpointEvery: Maintain proposes a checkpoint once at least this
	// many entries (and at least half as many as there are live
	// schedules, so that its cost, which grows with them, is paid by the
	// log it follows) were applied since the last one; 0 never does. A
	// restart replays at most that many entries after the checkpoint.
	CheckpointEvery uint64
	// CheckpointChunkEntries bounds the schedules of one checkpoint chunk.
	CheckpointChunkEntries int
	// CarryMax bounds the carries Maintain proposes at once.
	CarryMax  int
	Mutations Mutations
}

// Mutations are deliberate bugs behind a test-only switch: each disables
// one guard, and a test and a model-checker run must fail with it on.
type Mutations struct {
	// PublishWithoutLease acts on the Source Assignment alone: the lease
	// and its local guard are not checked.
	PublishWithoutLease bool
	// PublishBeforeIntent publishes a due message when it is claimed,
	// before its intent (and fire sequence) committed.
	PublishBeforeIntent bool
	// FencedStillFires keeps claiming and publishing after the owner was
	// fenced.
	FencedStillFires bool
	// ReadyNotRevalidated trusts a READY lane without checking its
	// certificate's epoch, incarnation and expiry.
	ReadyNotRevalidated bool
	// DrainForgetsOutcomes lets a draining owner drop what its publishes
	// in flight did instead of recording it before the release.
	DrainForgetsOutcomes bool
	// ClaimsBeforeDue claims a lane's pending schedules whatever their
	// deliver_at: the NeverEarly guard deleted.
	ClaimsBeforeDue bool
	// PauseIgnored lets a PAUSED lane claim and publish as an OPEN one.
	PauseIgnored bool
	// GateNotRecheckedAtTake hands out a publish decided before a LANE
	// record closed its lane's gate in the same pass.
	GateNotRecheckedAtTake bool
	// FollowsRecreatedDestination takes a destination deleted and
	// declared again for the lane's own: no ordering break, and READY
	// certificates for whichever incarnation a probe found.
	FollowsRecreatedDestination bool
}

// ErrNotActive refuses a command at a node that is not the shard's
// active owner (the shell answers NOT_LEADER or UNAVAILABLE).
var ErrNotActive = errors.New("sched: the shard's owner is not active here")

// laneRuntime is a lane's runtime axis at this owner.
type laneRuntime struct {
	readiness Readiness
	cert      Cert
	// probed at probedAt: a lane not READY is probed at most every
	// ProbeEveryMs, whatever the answers.
	probed   bool
	probedAt int64
	// brokeFor is the pinned incarnation an ordering break was proposed
	// for, so a probe answer proposes it once.
	brokeFor uint64
}

// intentClaim is an intent proposal's claims.
type intentClaim struct {
	topic   string
	intents []Intent
}

// claimed is a destination partition's fire sequences in claims whose
// intent has not been applied yet.
type claimed struct {
	high uint64
	seqs map[uint64]bool
}

// Owner is a shard's scheduler at one node: its lifecycle, the two gates,
// the lanes' readiness, and the intent → publish → fired protocol. It
// reads the shard's applied State, which the shell keeps applying; it
// never changes it. It is pure and not safe for concurrent use.
type Owner struct {
	cfg   Config
	st    *State
	life  Lifecycle
	auth  Authority
	epoch uint64 // the office's owner epoch (Acquiring onward)
	lanes map[string]*laneRuntime
	// claims are schedule ids whose intent is proposed and not completed,
	// by proposal; fire is their fire sequences per destination partition.
	claims     map[uint64]uint64 // schedule id → proposal
	intents    map[uint64]intentClaim
	fire       map[dest]*claimed
	publishing map[uint64]Publish // in flight, by schedule id
	// resolving are schedule ids whose FIRED or UNKNOWN is proposed and
	// not completed, by proposal.
	resolving   map[uint64]bool
	resolutions map[uint64][]uint64
	// landed and unprovable: outcomes reported, their record not yet
	// proposed (the next Step proposes them together).
	landed     []Fired
	unprovable []uint64
	inflight   map[uint64]bool // every proposal not completed
	nextRef    uint64
	// retryAfter holds claims and publishes back after a record of the
	// owner's failed to commit, so a refusing log (a full queue, a
	// leader stepping down) is not asked again at once: an intent claimed
	// again, or a message published again (deduplicated) whose FIRED was
	// refused, would loop at one instant.
	retryAfter int64
	// maintainAfter holds Maintain back after a checkpoint could not be
	// made (a state too large for one, a failing spill): its scan of
	// every live schedule is not repeated at once.
	maintainAfter int64
	// carryQueue holds the lowest carry candidates one scan found for the
	// checkpoint at carryBase, in the epoch carryEpoch, handed out
	// CarryMax at a time: a scan of every live schedule for each CarryMax
	// carries made a round quadratic in the live count (at 4.5 million
	// live schedules a shard's runner did nothing else for minutes). No
	// new candidate can appear during a round (new and carried messages
	// lie after its base), so the queue stays the lowest ones left.
	carryQueue []Carry
	carryBase  uint64
	carryEpoch uint64
	drainUntil int64
	effects    []Effect
}

// carryScanFactor: a scan for carries keeps this many times CarryMax
// candidates.
const carryScanFactor = 64

// NewOwner returns the owner side of a shard whose applied state is st.
func NewOwner(cfg Config, st *State) *Owner {
	if cfg.ClaimMax <= 0 || cfg.FireWindow == 0 || cfg.ProbeEveryMs <= 0 {
		panic(fmt.Sprintf("sched: owner config %+v", cfg))
	}
	o := &Owner{cfg: cfg, st: st, life: Unassigned}
	o.reset()
	return o
}

// reset forgets the office's runtime: claims, publishes, certificates.
// Results of publishes still in flight are ignored; their intents stay
// firing in the state and the next owner publishes them again, which the
// destination deduplicates.
func (o *Owner) reset() {
	o.lanes = map[string]*laneRuntime{}
	o.claims = map[uint64]uint64{}
	o.intents = map[uint64]intentClaim{}
	o.fire = map[dest]*claimed{}
	o.publishing = map[uint64]Publish{}
	o.resolving = map[uint64]bool{}
	o.resolutions = map[uint64][]uint64{}
	o.landed, o.unprovable = nil, nil
	o.inflight = map[uint64]bool{}
}

// Lifecycle is the shard's lifecycle state here.
func (o *Owner) Lifecycle() Lifecycle { return o.life }

// Epoch is the owner epoch of the current office (0 before the first).
func (o *Owner) Epoch() uint64 { return o.epoch }

// LaneReadiness is a lane's runtime axis here.
func (o *Owner) LaneReadiness(topic string) Readiness {
	if rt := o.lanes[topic]; rt != nil {
		return rt.readiness
	}
	return RecoveringEvidence
}

// TakeEffects returns the effects since the last call.
//
// A publish whose lane's gate a LANE record closed since it was decided
// — its intent and a pause, close or retire applied in one pass of the
// shell, the pause's answer given before the effects are taken — is not
// handed out (GateClosesAtItsAnswer): its schedule stays FIRING and goes
// out once the lane is OPEN again, and nothing is sent after the
// command's answer.
func (o *Owner) TakeEffects() []Effect {
	e := o.effects
	o.effects = nil
	if o.cfg.Mutations.GateNotRecheckedAtTake {
		return e
	}
	kept := e[:0]
	for _, x := range e {
		if p := x.Publish; p != nil {
			if l, ok := o.st.Lane(p.Topic); ok && !o.gateOpen(l) {
				delete(o.publishing, p.ID)
				continue
			}
		}
		kept = append(kept, x)
	}
	return kept
}

// SetAuthority reports the gates as the shell sees them now.
func (o *Owner) SetAuthority(now int64, a Authority) {
	o.auth = a
	o.Step(now)
}

// gates reports whether both authorities hold at now.
func (o *Owner) gates(now int64) bool {
	if o.cfg.Mutations.PublishWithoutLease {
		return o.auth.Assigned
	}
	return o.auth.Assigned && o.auth.Leader && now < o.auth.GuardUntilMs
}

// firing reports whether the owner may claim and publish: only while
// active (NoPublishWithoutBothGates: Step fences it the moment a gate is
// missing).
func (o *Owner) firing() bool {
	return o.life == Active || (o.cfg.Mutations.FencedStillFires && o.life == Fenced)
}

// Step re-evaluates the lifecycle and the lanes at now and emits what is
// due. The shell calls it on every event and at NextWakeMs; the events
// below call it themselves.
func (o *Owner) Step(now int64) {
	if o.life == Failed {
		return
	}
	if err := o.st.Failed(); err != nil {
		o.life = Failed
		o.reset()
		return
	}
	gates := o.gates(now)
	if o.life.inOffice() && (!gates || o.auth.Epoch != o.epoch) {
		o.fence()
	}
	if (o.life == Unassigned || o.life == Fenced) && gates {
		o.life, o.epoch = Acquiring, o.auth.Epoch
	}
	if o.life == Acquiring {
		o.life = Restoring
	}
	if o.life == Restoring && o.st.Loaded() {
		o.life = CatchingUp
	}
	if o.life == CatchingUp && o.st.Applied() >= o.auth.Barrier {
		o.life = Active
	}
	if o.life == Draining {
		if !o.cfg.Mutations.DrainForgetsOutcomes {
			o.proposeResolutions() // persisted before the release (DrainPersistsOutcomes)
		}
		if now >= o.drainUntil {
			o.fence()
			o.effects = append(o.effects, Effect{Release: true})
		} else if len(o.publishing) == 0 && len(o.inflight) == 0 {
			o.life = Unassigned
			o.reset()
			o.effects = append(o.effects, Effect{Release: true})
		}
	}
	if o.firing() {
		o.proposeResolutions()
		for _, topic := range o.st.Lanes() {
			o.stepLane(now, topic)
		}
	}
}

// fence drops the office: zero authority until both gates hold again.
// Effects not taken yet were emitted under the gates now gone (an event
// stepped the owner before the shell reported the gates again): they are
// dropped, so no publish, proposal or probe of the old office is carried
// out after the fence (NoPublishWithoutBothGates).
func (o *Owner) fence() {
	o.life = Fenced
	if !o.cfg.Mutations.FencedStillFires {
		o.reset()
		o.effects = slices.DeleteFunc(o.effects, func(e Effect) bool { return !e.Release })
	}
}

// ready reports whether a lane may claim and publish at now: OPEN, and a
// READY certificate still valid for this office, this incarnation and
// this instant.
func (o *Owner) ready(l Lane, rt *laneRuntime, now int64) bool {
	if !o.gateOpen(l) || rt.readiness != Ready {
		return false
	}
	if o.cfg.Mutations.ReadyNotRevalidated {
		return true
	}
	c := rt.cert
	if c.Epoch == o.epoch && (c.Incarnation == l.Incarnation || o.cfg.Mutations.FollowsRecreatedDestination) && now < c.UntilMs {
		return true
	}
	rt.readiness = RecoveringEvidence
	return false
}

// gateOpen reports whether l's admission gate lets it claim and publish.
func (o *Owner) gateOpen(l Lane) bool {
	return l.Gate == GateOpen || l.Gate == GatePaused && o.cfg.Mutations.PauseIgnored
}

func (o *Owner) lane(topic string) *laneRuntime {
	rt := o.lanes[topic]
	if rt == nil {
		rt = &laneRuntime{}
		o.lanes[topic] = rt
	}
	return rt
}

func (o *Owner) stepLane(now int64, topic string) {
	l, _ := o.st.Lane(topic)
	rt := o.lane(topic)
	if !o.ready(l, rt, now) {
		if l.Gate == GateOpen && l.Pending > 0 && (!rt.probed || now >= rt.probedAt+o.cfg.ProbeEveryMs) {
			rt.probed, rt.probedAt = true, now
			o.effects = append(o.effects, Effect{Probe: topic})
		}
		return
	}
	if now < o.retryAfter {
		return
	}
	o.publishFiring(l, rt)
	o.claimDue(now, l, rt)
}

// publishFiring publishes the lane's committed intents not in flight,
// by partition and fire sequence: a later owner's too, which the
// destination deduplicates if an earlier attempt landed. An intent
// claimed for another incarnation than the lane's (the destination was
// re-created and the lane resumed into the new one) is resolved UNKNOWN:
// it may have landed in the deleted topic, and the new one cannot tell
// (UnprovableNeverResent).
func (o *Owner) publishFiring(l Lane, rt *laneRuntime) {
	var unknown []uint64
	for _, e := range o.st.firing(l.Topic) {
		if _, busy := o.publishing[e.ID]; busy || o.resolving[e.ID] {
			continue
		}
		if e.Incarnation != l.Incarnation {
			unknown = append(unknown, e.ID)
			continue
		}
		o.publish(Publish{ID: e.ID, Topic: e.Topic, Partition: e.Partition, FireSeq: e.FireSeq, Epoch: o.epoch, Incarnation: rt.cert.Incarnation, At: e.At})
	}
	if len(unknown) > 0 {
		ref := o.propose(Record{Kind: KindUnknown, IDs: unknown})
		for _, id := range unknown {
			o.resolving[id] = true
		}
		o.resolutions[ref] = unknown
	}
}

func (o *Owner) publish(p Publish) {
	o.publishing[p.ID] = p
	o.effects = append(o.effects, Effect{Publish: &p})
}

// claimDue claims the lane's due schedules, earliest first, up to
// ClaimMax, in one intent record. A schedule is due only when the
// owner's clock has reached its deliver_at (NeverEarly): the clock is
// read as given, never as the highest seen, so a clock that jumps back
// fires later, not earlier.
func (o *Owner) claimDue(now int64, l Lane, rt *laneRuntime) {
	var intents []Intent
	// Each destination partition's lowest unresolved fire sequence, found
	// once per pass: what this pass allocates is above it.
	lows := map[dest]uint64{}
	// full: the destination partitions whose fire window is full. Once
	// every one is, nothing further can be claimed this pass: the walk
	// stops (a burst's claims used to walk thousands of entries at every
	// publish's answer).
	full := map[uint32]bool{}
	visits := o.cfg.ClaimMax*8 + len(o.claims)
	o.st.dueInOrder(l.Topic, func(e *Entry) bool {
		if e.DeliverAtMs > now && !o.cfg.Mutations.ClaimsBeforeDue || len(intents) >= o.cfg.ClaimMax || visits == 0 {
			return false
		}
		visits--
		if _, ok := o.claims[e.ID]; ok {
			return true
		}
		p := e.Partition % rt.cert.Partitions
		d := dest{l.Topic, p}
		low, known := lows[d]
		if !known {
			low = o.lowestUnresolved(d)
			lows[d] = low
		}
		seq, ok := o.nextFireSeq(d, low)
		if ok && low == 0 {
			lows[d] = seq
		}
		if !ok {
			full[p] = true
			return len(full) < int(rt.cert.Partitions) // this partition's window is full; another's may not be
		}
		intents = append(intents, Intent{ID: e.ID, Partition: p, FireSeq: seq})
		return true
	})
	if len(intents) == 0 {
		return
	}
	ref := o.propose(Record{Kind: KindIntent, Epoch: o.epoch, Incarnation: rt.cert.Incarnation, Intents: intents})
	o.intents[ref] = intentClaim{l.Topic, intents}
	for _, in := range intents {
		o.claims[in.ID] = ref
		if o.cfg.Mutations.PublishBeforeIntent {
			e, _ := o.st.Entry(in.ID)
			o.publish(Publish{ID: in.ID, Topic: l.Topic, Partition: in.Partition, FireSeq: in.FireSeq, Epoch: o.epoch, Incarnation: rt.cert.Incarnation, At: e.At})
		}
	}
}

// lowestUnresolved is a destination partition's lowest fire sequence
// still unresolved, applied or claimed; 0 when none.
func (o *Owner) lowestUnresolved(d dest) uint64 {
	low := o.st.lowestFiring(d)
	if c := o.fire[d]; c != nil {
		for seq := range c.seqs {
			if low == 0 || seq < low {
				low = seq
			}
		}
	}
	return low
}

// nextFireSeq allocates a destination partition's next fire sequence, if
// it stays within FireWindow of low, the lowest one unresolved (applied
// or claimed; 0: none): the destination then still remembers every lower
// one that may be retried (FireWithinDedupWindow).
func (o *Owner) nextFireSeq(d dest, low uint64) (uint64, bool) {
	c := o.fire[d]
	if c == nil {
		c = &claimed{seqs: map[uint64]bool{}}
		o.fire[d] = c
	}
	next := max(o.st.LastFire(d.topic, d.partition), c.high) + 1
	if low != 0 && next >= low+o.cfg.FireWindow {
		return 0, false
	}
	c.high = next
	c.seqs[next] = true
	return next, true
}

func (o *Owner) propose(r Record) uint64 {
	o.nextRef++
	o.inflight[o.nextRef] = true
	o.effects = append(o.effects, Effect{Propose: &Proposal{Ref: o.nextRef, Record: r}})
	return o.nextRef
}

// Proposed reports how proposal ref ended: err nil once it committed and
// the state applied it. The shell must apply a committed record before
// completing it, so a claim is never forgotten before its intent is seen
// (an intent that did not commit frees its schedules to be claimed again).
func (o *Owner) Proposed(now int64, ref uint64, err error) {
	delete(o.inflight, ref)
	if err != nil {
		o.retryAfter = now + o.cfg.ProbeEveryMs
		o.carryQueue = nil // a carry that failed (its message unreadable) is not offered again unscanned
	}
	if c, ok := o.intents[ref]; ok {
		for _, in := range c.intents {
			delete(o.claims, in.ID)
			if f := o.fire[dest{c.topic, in.Partition}]; f != nil {
				delete(f.seqs, in.FireSeq)
			}
		}
		delete(o.intents, ref)
	}
	for _, id := range o.resolutions[ref] {
		delete(o.resolving, id)
	}
	delete(o.resolutions, ref)
	o.Step(now)
}

// Published reports a publish's outcome; destSeq is where it landed.
// Landed and Unprovable are recorded in the shard (FIRED, UNKNOWN) by the
// next Step, one record for every outcome since the last one: the shell
// reports a batch of outcomes, then steps. Refused blocks the lane until
// a probe finds it ready again, and the intent is published again then.
func (o *Owner) Published(now int64, p Publish, out Outcome, destSeq uint64) {
	if q, ok := o.publishing[p.ID]; !ok || q != p {
		return // an earlier office's publish: its intent is published again by this one
	}
	delete(o.publishing, p.ID)
	e, ok := o.st.Entry(p.ID)
	// A draining owner still records what its publishes in flight did:
	// the drain waits for them in order to persist them, so the next
	// owner has nothing to publish again (DrainPersistsOutcomes).
	recording := o.firing() || o.life == Draining && !o.cfg.Mutations.DrainForgetsOutcomes
	if !recording || !ok || e.Status != StatusFiring || e.FireSeq != p.FireSeq {
		return
	}
	switch out {
	case Landed:
		o.landed = append(o.landed, Fired{ID: p.ID, DestSeq: destSeq})
		o.resolving[p.ID] = true
	case Unprovable:
		o.unprovable = append(o.unprovable, p.ID)
		o.resolving[p.ID] = true
	default:
		o.lane(p.Topic).readiness = Blocked
	}
}

// proposeResolutions proposes the outcomes reported since the last Step:
// one FIRED record, one UNKNOWN record.
func (o *Owner) proposeResolutions() {
	for len(o.landed) > 0 {
		n := min(len(o.landed), RecordEntriesMax)
		ids := make([]uint64, n)
		for i, f := range o.landed[:n] {
			ids[i] = f.ID
		}
		o.resolutions[o.propose(Record{Kind: KindFired, Fired: slices.Clone(o.landed[:n])})] = ids
		o.landed = o.landed[n:]
	}
	for len(o.unprovable) > 0 {
		n := min(len(o.unprovable), RecordEntriesMax)
		ids := slices.Clone(o.unprovable[:n])
		o.resolutions[o.propose(Record{Kind: KindUnknown, IDs: ids})] = ids
		o.unprovable = o.unprovable[n:]
	}
}

// Evidence reports a probe's answer. A destination with another
// incarnation than the lane pinned breaks the lane's ordering (a
// management record, so every later owner sees it); one that is gone or
// refuses writes blocks the lane; otherwise the lane is READY with a
// certificate for this office.
func (o *Owner) Evidence(now int64, ev Evidence) {
	l, ok := o.st.Lane(ev.Topic)
	if !ok || !o.life.inOffice() {
		return
	}
	rt := o.lane(ev.Topic)
	switch {
	case ev.Incarnation != 0 && ev.Incarnation != l.Incarnation && !o.cfg.Mutations.FollowsRecreatedDestination:
		rt.readiness = Blocked
		if (l.Gate == GateOpen || l.Gate == GatePaused) && rt.brokeFor != l.Incarnation && o.life == Active {
			rt.brokeFor = l.Incarnation
			o.propose(Record{Kind: KindLane, Lane: LaneCommand{Topic: ev.Topic, Op: LaneBreak, Incarnation: l.Incarnation}})
		}
	case ev.Incarnation == 0 || !ev.Writable || ev.Partitions == 0 || now >= ev.ValidUntilMs:
		rt.readiness = Blocked
	default:
		rt.readiness = Ready
		rt.cert = Cert{Epoch: o.epoch, Incarnation: ev.Incarnation, Partitions: ev.Partitions, UntilMs: ev.ValidUntilMs}
	}
	o.Step(now)
}

// active checks that this node may take a command for the shard now.
func (o *Owner) active(now int64) error {
	o.Step(now)
	if o.life != Active {
		return fmt.Errorf("%w (%v)", ErrNotActive, o.life)
	}
	return nil
}

// Serving checks that this node may answer a read of the shard's state
// now (a listing): the owner is in office — active, or draining — with
// both gates holding at now, so no other replica commits to the shard
// while it answers.
func (o *Owner) Serving(now int64) error {
	o.Step(now)
	if o.life != Active && o.life != Draining {
		return fmt.Errorf("%w (%v)", ErrNotActive, o.life)
	}
	return nil
}

// Admit checks a new schedule before the shell appends it: only the
// active owner takes one, and not into a CLOSED or RETIRED lane. Neither
// a paused, broken or blocked lane nor any other lane's state delays it
// (IntakeNeverBlocked). The applied record has the last word (a lane
// closed by a command still in flight refuses it there).
func (o *Owner) Admit(now int64, sc Schedule) error {
	if err := o.active(now); err != nil {
		return err
	}
	if err := checkTopic(sc.Topic); err != nil {
		return err
	}
	if l, ok := o.st.Lane(sc.Topic); ok && (l.Gate == GateClosed || l.Gate == GateRetired) {
		return fmt.Errorf("lane %q is %v: %w", sc.Topic, l.Gate, ErrLaneAdmitsNone)
	}
	return nil
}

// ErrLaneAdmitsNone refuses a schedule to a CLOSED or RETIRED lane (Admit).
var ErrLaneAdmitsNone = errors.New("it admits no schedules")

// Manage proposes an operator's lane command; its applied Result answers it.
func (o *Owner) Manage(now int64, c LaneCommand) (uint64, error) {
	if c.Op == LaneBreak {
		return 0, errors.New("sched: an ordering break is the owner's, from evidence")
	}
	if err := o.active(now); err != nil {
		return 0, err
	}
	r := Record{Kind: KindLane, Lane: c}
	if _, err := r.Encode(); err != nil {
		return 0, err
	}
	return o.propose(r), nil
}

// Cancel proposes cancelling pending schedules; its applied Result says
// which were too late (firing, fired or unknown ids).
func (o *Owner) Cancel(now int64, ids []uint64) (uint64, error) {
	if err := o.active(now); err != nil {
		return 0, err
	}
	if err := checkEntries(len(ids)); err != nil {
		return 0, err
	}
	return o.propose(Record{Kind: KindCancel, IDs: slices.Clone(ids)}), nil
}

// maintainRetryMs is how long Maintain waits after a checkpoint could not
// be made.
const maintainRetryMs = 10_000

// Maintain proposes the shard's upkeep, which lets its log be compacted:
// the shell calls it when nothing of its own is on the way to the
// shard's log and everything committed is applied. Once CheckpointEvery
// entries (and half of Live) were applied since the last checkpoint, it
// carries the live schedules whose message lies at or below that
// checkpoint's base (lowest first, CarryMax at a time); when none is
// left, it proposes a checkpoint of the state as of now — its chunks
// land right after what the state applied unless something else got in
// first, which voids it (CheckpointAtItsBase) and it is proposed again.
// Only the active owner maintains, with no proposal in flight.
func (o *Owner) Maintain(now int64) {
	o.Step(now)
	if o.life != Active || len(o.inflight) > 0 || now < o.retryAfter || now < o.maintainAfter || o.cfg.CheckpointEvery == 0 ||
		o.st.SinceCheckpoint() < max(o.cfg.CheckpointEvery, uint64(o.st.Live())/2) {
		return
	}
	carries, err := o.nextCarries()
	if err != nil {
		o.maintainAfter = now + maintainRetryMs
		o.Step(now) // a spill failure failed the state: so does the office
		return
	}
	for _, c := range carries {
		o.propose(Record{Kind: KindCarry, Carry: c})
	}
	if len(carries) > 0 {
		return
	}
	recs, err := o.st.Checkpoint(o.cfg.CheckpointChunkEntries)
	if err != nil {
		o.maintainAfter = now + maintainRetryMs
		o.Step(now)
		return
	}
	for _, r := range recs {
		o.propose(r)
	}
}

// nextCarries returns the next CarryMax carries of the round for the
// latest checkpoint, lowest At first, scanning the live schedules again
// only when the queue of the last scan ran out (or the checkpoint or the
// office changed). Each candidate is handed out once; one resolved or
// cancelled since the scan comes back Skipped from its apply, or fails
// (its message gone) and the queue is scanned again.
func (o *Owner) nextCarries() ([]Carry, error) {
	n := max(1, o.cfg.CarryMax)
	base := o.st.LastCheckpoint()
	if base != o.carryBase || o.epoch != o.carryEpoch {
		o.carryQueue = nil
	}
	if len(o.carryQueue) == 0 {
		q, err := o.st.CarryCandidates(base, n*carryScanFactor)
		if err != nil {
			return nil, err
		}
		o.carryQueue, o.carryBase, o.carryEpoch = q, base, o.epoch
	}
	out := o.carryQueue[:min(n, len(o.carryQueue))]
	o.carryQueue = o.carryQueue[len(out):]
	return out, nil
}

// Drain begins a planned release (leadership transfer, shutdown): no
// claims, admissions or publishes from now on; the publishes and
// proposals in flight are waited for until untilMs, the outcomes of those
// publishes are recorded (FIRED, UNKNOWN) and committed
// (DrainPersistsOutcomes), then the shard is released (Effect.Release). A timeout leaves it FENCED, which is safe:
// a later owner publishes the unresolved intents again.
func (o *Owner) Drain(now, untilMs int64) {
	if o.life == Active {
		o.life, o.drainUntil = Draining, untilMs
	}
	o.Step(now)
}

// NextWakeMs is when Step has something to do without another event:
// the lease guard closing, a pending schedule falling due in a READY lane,
// a certificate expiring, a probe to repeat, the drain's deadline. 0 when
// nothing is due.
func (o *Owner) NextWakeMs(now int64) int64 {
	var at int64
	wake := func(t int64) {
		if t > now && (at == 0 || t < at) {
			at = t
		}
	}
	if !o.life.inOffice() && !o.firing() {
		return 0
	}
	wake(o.auth.GuardUntilMs)
	if o.life == Draining {
		wake(o.drainUntil)
	}
	wake(o.retryAfter)
	for topic, rt := range o.lanes {
		switch {
		case rt.readiness == Ready:
			wake(rt.cert.UntilMs)
			if due, ok := o.st.NextDue(topic); ok {
				wake(due)
			}
		case rt.probed:
			wake(rt.probedAt + o.cfg.ProbeEveryMs)
		}
	}
	return at
}

// Clone returns a deep copy of o reading st (a copy of o's state): the
// model checker branches owners.
func (o *Owner) Clone(st *State) *Owner {
	c := *o
	c.st = st
	c.lanes = make(map[string]*laneRuntime, len(o.lanes))
	for t, rt := range o.lanes {
		r := *rt
		c.lanes[t] = &r
	}
	c.claims = maps.Clone(o.claims)
	c.intents = make(map[uint64]intentClaim, len(o.intents))
	for ref, ic := range o.intents {
		c.intents[ref] = intentClaim{ic.topic, slices.Clone(ic.intents)}
	}
	c.fire = make(map[dest]*claimed, len(o.fire))
	for d, f := range o.fire {
		c.fire[d] = &claimed{high: f.high, seqs: maps.Clone(f.seqs)}
	}
	c.publishing = maps.Clone(o.publishing)
	c.resolving = maps.Clone(o.resolving)
	c.resolutions = make(map[uint64][]uint64, len(o.resolutions))
	for ref, ids := range o.resolutions {
		c.resolutions[ref] = slices.Clone(ids)
	}
	c.inflight = maps.Clone(o.inflight)
	c.landed, c.unprovable = slices.Clone(o.landed), slices.Clone(o.unprovable)
	c.effects = slices.Clone(o.effects)
	return &c
}

// AppendDigest appends a canonical encoding of o's runtime (not its
// State's) to b: equal owners encode equally (the model checker hashes
// states with it).
func (o *Owner) AppendDigest(b []byte) []byte {
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	// Every string and list is length-prefixed: the encoding must be
	// self-delimiting, or two owners could encode alike.
	str := func(v string) {
		u(uint64(len(v)))
		b = append(b, v...)
	}
	u(uint64(o.life))
	u(o.epoch)
	u(uint64(o.drainUntil))
	u(uint64(o.retryAfter))
	u(uint64(o.maintainAfter))
	u(o.nextRef)
	u(uint64(len(o.lanes)))
	for _, t := range slices.Sorted(maps.Keys(o.lanes)) {
		rt := o.lanes[t]
		str(t)
		u(uint64(rt.readiness))
		u(rt.cert.Epoch)
		u(rt.cert.Incarnation)
		u(uint64(rt.cert.Partitions))
		u(uint64(rt.cert.UntilMs))
		if rt.probed {
			u(uint64(rt.probedAt) + 1)
		} else {
			u(0)
		}
		u(rt.brokeFor)
	}
	u(uint64(len(o.claims)))
	for _, id := range slices.Sorted(maps.Keys(o.claims)) {
		u(id)
		u(o.claims[id])
	}
	u(uint64(len(o.intents)))
	for _, ref := range slices.Sorted(maps.Keys(o.intents)) {
		u(ref)
		u(uint64(len(o.intents[ref].intents)))
		for _, in := range o.intents[ref].intents {
			u(in.ID)
			u(uint64(in.Partition))
			u(in.FireSeq)
		}
	}
	u(uint64(len(o.fire)))
	for _, d := range slices.SortedFunc(maps.Keys(o.fire), compareDest) {
		f := o.fire[d]
		str(d.topic)
		u(uint64(d.partition))
		u(f.high)
		u(uint64(len(f.seqs)))
		for _, s := range slices.Sorted(maps.Keys(f.seqs)) {
			u(s)
		}
	}
	u(uint64(len(o.publishing)))
	for _, id := range slices.Sorted(maps.Keys(o.publishing)) {
		p := o.publishing[id]
		u(id)
		u(p.FireSeq)
		u(p.Epoch)
		u(p.Incarnation)
	}
	u(uint64(len(o.resolutions)))
	for _, ref := range slices.Sorted(maps.Keys(o.resolutions)) {
		u(ref)
		u(uint64(len(o.resolutions[ref])))
		for _, id := range o.resolutions[ref] {
			u(id)
		}
	}
	u(uint64(len(o.inflight)))
	for _, ref := range slices.Sorted(maps.Keys(o.inflight)) {
		u(ref)
	}
	u(uint64(len(o.landed)))
	for _, f := range o.landed {
		u(f.ID)
		u(f.DestSeq)
	}
	u(uint64(len(o.unprovable)))
	for _, id := range o.unprovable {
		u(id)
	}
	return b
}
