package model

// The produce model: one idempotent producer publishing to a replicated
// partition, with the real kernel of the publish side on every replica —
// partition.Member: the dedup table rebuilt by applying committed
// entries, the install gate, the dedup seal after the log's start moved,
// proposals in flight by producer identity, the answers on completion or
// when the leader degrades, the compaction limit and the dedup carries —
// driven as the node's shell (internal/node/replicated.go, dedupcarry.go)
// drives it. The partition's log is one linear committed sequence here
// (its replication is the replica model's business): the leader's
// proposals commit in log order while it holds its quorum; at a change of
// leader any prefix of them commits and the rest are lost, and the new
// leader's install entry is appended at its epoch. Each replica applies
// the committed log at its own pace. Retention compacts a replica's log
// no further than its kernel's CompactLimit; a replica lagging behind the
// leader's start is rebuilt from the leader's snapshot point, and a
// replica restarts from its own kept log (both: Member.LogStart or a new
// Member on a log that starts late, so its table is sealed). The producer
// sends seqs 1..Messages to the leader, retries any it holds no final
// answer for, and may lose replies.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/invariant"
	"github.com/nereus-broker/nereus/internal/partition"
)

// ProduceConfig bounds a produce exploration. Budgets limit how often an
// action kind may occur along one path.
type ProduceConfig struct {
	Replicas int // 2 or 3
	Messages int // producer seqs 1..Messages, producer id 1
	// InflightMax is how many of its seqs the producer has outstanding
	// (sent, no final answer) at once.
	InflightMax int
	Retries     int // a publish sent again with the same identity
	LostReplies int // a reply lost on its way to the producer
	Elections   int // a new leader takes office in the next epoch
	Degrades    int // the leader loses its quorum (and may get it back)
	// Compactions: retention compacts a replica's log as far as its
	// kernel lets it (CompactLimit).
	Compactions int
	// Restarts: a follower restarts from its own kept log, or one lagging
	// behind the leader's start is rebuilt from its snapshot point.
	Restarts int
	Carries  int // the leader proposes a dedup carry (retention wants its whole applied log)
	// ApplyErrors: a shell pass whose reading of committed entries fails
	// answers its completions without applying (NotApplied).
	ApplyErrors int
	DepthMax    int
	StatesMax   int
	Mutations   partition.Mutations
}

// ProduceResult is the outcome of a produce exploration.
type ProduceResult struct {
	Outcome
	// What the exploration reached (distinct states entered that way).
	Duplicates int // a retry answered PUB_OK as a duplicate
	// RebuiltDuplicates: a retry answered as a duplicate by a leader
	// whose kernel started over from a later log start.
	RebuiltDuplicates int
	Waits             int // a retry waited on its identity in flight
	TakingOffice      int // a publish refused by the install gate
	TooOld            int // a retry answered PRODUCER_SEQ_TOO_OLD (a sealed table)
	QuorumLost        int // replies answered QuorumLost by Degraded
	Failed            int // a proposal completed with an error (lost at a change of leader)
	NotApplied        int // a completion answered NotApplied
	RefusedUnapplied  int // a retry refused: its original committed, not applied yet
	Rebuilds          int // a replica's kernel started over from a later log start
	Carries           int // a dedup carry committed
	Elections         int // a new leader took office
	Settled           int // every seq answered PUB_OK
}

const (
	pbRetries = iota
	pbLostReplies
	pbElections
	pbDegrades
	pbCompactions
	pbRestarts
	pbCarries
	pbApplyErrors
	pbudgets
)

func (c *ProduceConfig) budget(i int) int {
	return [pbudgets]int{c.Retries, c.LostReplies, c.Elections, c.Degrades, c.Compactions, c.Restarts, c.Carries, c.ApplyErrors}[i]
}

// producerID is the one producer's id.
const producerID = 1

// errLost is a proposal superseded by a new leader (replog.ErrLost).
var errLost = errors.New("lost")

type pkind uint8

const (
	pkInstall pkind = iota
	pkPub
	pkCarry
)

// pentry is a log entry: proposed or committed.
type pentry struct {
	epoch uint64
	kind  pkind
	pseq  uint64 // pkPub
	carry []byte // pkCarry; never changed once made
}

// pdone is a proposal's completion, waiting for its replica's shell pass.
type pdone struct {
	pseq, seq, epoch uint64
	lost             bool
}

type preplica struct {
	m     *partition.Member[uint64] // a reply is the producer seq it answers
	start uint64                    // the first seq its log keeps
	// whole: its kernel applied the log from seq 1 (never started over).
	whole bool
	done  []pdone
}

// Producer seq status.
const (
	psUnsent uint8 = iota
	psOutstanding
	psOK
	psTooOld
)

// preply is an answer on its way to the producer (retriable errors are
// not kept: the producer may retry at any time anyway).
type preply struct {
	pseq   uint64
	tooOld bool
}

type pstate struct {
	log        []pentry // committed: seq i+1
	pending    []pentry // proposed by the leader, in log order
	reps       []preplica
	leader     int
	epoch      uint64
	installSeq uint64 // seq of the leader's epoch's install entry
	degraded   bool
	carrying   bool // a dedup carry in flight
	// refused: a retry was refused as committed but not applied (a ghost
	// in the key, so that the state it leads to is told from the same
	// state reached by a retry that waited instead).
	refused bool
	status  []uint8
	replies []preply
	used    [pbudgets]int
	events  pevent
}

type pevent uint16

const (
	peDuplicate pevent = 1 << iota
	peWait
	peTakingOffice
	peTooOld
	peQuorumLost
	peFailed
	peNotApplied
	peRebuild
	peCarry
	peElection
	peRebuiltDuplicate
	peRefusedUnapplied
)

func (s *pstate) clone() *pstate {
	c := *s
	c.log, c.pending, c.status, c.replies = slices.Clone(s.log), slices.Clone(s.pending), slices.Clone(s.status), slices.Clone(s.replies)
	c.reps = make([]preplica, len(s.reps))
	for i, r := range s.reps {
		c.reps[i] = preplica{m: r.m.Clone(), start: r.start, whole: r.whole, done: slices.Clone(r.done)}
	}
	c.events = 0
	return &c
}

func (cfg *ProduceConfig) newMember(start uint64) *partition.Member[uint64] {
	// The window holds every seq: eviction is the unit tests' business.
	return partition.NewMember[uint64](partition.Config{DedupWindowMax: cfg.Messages + 1, ProducersMax: 4}, start, cfg.Mutations)
}

// view is replica r's replication state as the kernel sees it
// (replicaStore.leaderView).
func (s *pstate) view(r int) partition.View {
	if r != s.leader {
		return partition.View{Epoch: s.epoch}
	}
	return partition.View{Leader: true, ReadOnly: s.degraded, Epoch: s.epoch, InstallSeq: s.installSeq}
}

func (s *pstate) kernelEntry(seq uint64) partition.Entry {
	e := s.log[seq-1]
	ke := partition.Entry{Seq: seq, Epoch: e.epoch}
	switch e.kind {
	case pkPub:
		ke.ProducerID, ke.ProducerSeq = producerID, e.pseq
	case pkCarry:
		ke.Carry = e.carry
	}
	return ke
}

// apply applies replica r's next committed entry.
func (s *pstate) apply(r int) string {
	m := s.reps[r].m
	if err := m.Apply(s.kernelEntry(m.Applied() + 1)); err != nil {
		return "KernelAssertion: " + err.Error()
	}
	return ""
}

// okAnswer checks a PUB_OK naming (seq, epoch) for pseq and sends it.
func (s *pstate) okAnswer(pseq, seq, epoch uint64, how string) string {
	if seq == 0 || seq > uint64(len(s.log)) || s.log[seq-1].kind != pkPub || s.log[seq-1].pseq != pseq || s.log[seq-1].epoch != epoch {
		return invariant.Violated("PubOKTruthful", "producer seq %d answered PUB_OK (%s) at seq %d epoch %d, which the committed log does not hold (%d entries)",
			pseq, how, seq, epoch, len(s.log)).Error()
	}
	s.replies = append(s.replies, preply{pseq: pseq})
	return ""
}

// publish is the producer's PUB of pseq reaching the leader
// (replicaStore.proposeReplicated).
func (s *pstate) publish(pseq uint64) string {
	l := s.leader
	d := s.reps[l].m.Publish(s.view(l), producerID, pseq, pseq)
	switch d.Action {
	case partition.Refuse:
		switch d.Refusal {
		case partition.RefusedTakingOffice:
			s.events |= peTakingOffice
		case partition.RefusedNotApplied:
			s.events |= peRefusedUnapplied
			s.refused = true
		}
	case partition.AnswerDuplicate:
		s.events |= peDuplicate
		if !s.reps[l].whole {
			s.events |= peRebuiltDuplicate
		}
		return s.okAnswer(pseq, d.Seq, d.Epoch, "a duplicate")
	case partition.AnswerTooOld:
		s.events |= peTooOld
		s.replies = append(s.replies, preply{pseq: pseq, tooOld: true})
	case partition.Wait:
		s.events |= peWait
	case partition.Propose:
		if d.Key != (partition.ProposalKey{ProducerID: producerID, ProducerSeq: pseq}) {
			return fmt.Sprintf("KernelAssertion: producer seq %d proposed under key %+v", pseq, d.Key)
		}
		if slices.ContainsFunc(s.pending, func(e pentry) bool { return e.kind == pkPub && e.pseq == pseq }) {
			return invariant.Violated("OneProposalInFlight", "producer seq %d proposed again while its proposal is in flight", pseq).Error()
		}
		s.pending = append(s.pending, pentry{epoch: s.epoch, kind: pkPub, pseq: pseq})
	}
	return ""
}

// commit appends the oldest pending entry to the committed log; the
// leader's member completes it.
func (s *pstate) commit() string {
	e := s.pending[0]
	s.pending = s.pending[1:]
	s.log = append(s.log, e)
	seq := uint64(len(s.log))
	switch e.kind {
	case pkPub:
		for i, o := range s.log[:seq-1] {
			if o.kind == pkPub && o.pseq == e.pseq {
				return invariant.Violated("NoDuplicateFromReplay", "producer seq %d committed at seq %d (epoch %d) and again at seq %d (epoch %d)",
					e.pseq, i+1, o.epoch, seq, e.epoch).Error()
			}
		}
		s.reps[s.leader].done = append(s.reps[s.leader].done, pdone{pseq: e.pseq, seq: seq, epoch: e.epoch})
	case pkCarry:
		s.carrying = false
		s.events |= peCarry
	}
	return ""
}

// pass is replica r's shell pass (replicaStore.applyReplicated): apply
// what committed (unless reading it fails), answer the replies in flight
// QuorumLost when it leads degraded, then its completions.
func (s *pstate) pass(r int, applyFails bool) string {
	p := &s.reps[r]
	if !applyFails {
		for p.m.Applied() < uint64(len(s.log)) {
			if err := s.apply(r); err != "" {
				return err
			}
		}
	}
	if r == s.leader && s.degraded {
		if len(p.m.Degraded()) > 0 {
			s.events |= peQuorumLost
		}
	}
	done := p.done
	p.done = nil
	for _, c := range done {
		var err error
		if c.lost {
			err = errLost
		}
		a, ok := p.m.Completed(partition.ProposalKey{ProducerID: producerID, ProducerSeq: c.pseq}, c.seq, c.epoch, err)
		if !ok {
			continue
		}
		switch a.Outcome {
		case partition.Committed:
			for _, pseq := range a.Replies {
				if pseq != c.pseq {
					return fmt.Sprintf("KernelAssertion: the completion of producer seq %d answers a reply of %d", c.pseq, pseq)
				}
				if err := s.okAnswer(pseq, a.Seq, a.Epoch, "committed"); err != "" {
					return err
				}
			}
		case partition.Failed:
			s.events |= peFailed
		case partition.NotApplied:
			s.events |= peNotApplied
		}
	}
	return ""
}

// elect makes replica j the leader of the next epoch: the first kept of
// the old leader's pending entries commit, the rest are lost (its member
// completes them with an error), and j's install entry is appended.
func (s *pstate) elect(j, kept int) string {
	for range kept {
		if err := s.commit(); err != "" {
			return err
		}
	}
	old := &s.reps[s.leader]
	for _, e := range s.pending {
		if e.kind == pkPub {
			old.done = append(old.done, pdone{pseq: e.pseq, lost: true})
		}
	}
	s.pending, s.degraded, s.carrying = nil, false, false
	s.epoch++
	s.leader = j
	s.installSeq = uint64(len(s.log)) + 1
	s.pending = append(s.pending, pentry{epoch: s.epoch, kind: pkInstall})
	s.events |= peElection
	return ""
}

// check holds in every state: every replica's dedup table names only
// where the log holds a producer seq, and one that applied the log from
// its beginning knows every producer seq it applied.
func (cfg *ProduceConfig) check(s *pstate) string {
	for r, p := range s.reps {
		for pseq := uint64(1); pseq <= uint64(cfg.Messages); pseq++ {
			v, seq, epoch := p.m.Lookup(producerID, pseq)
			at := slices.IndexFunc(s.log, func(e pentry) bool { return e.kind == pkPub && e.pseq == pseq })
			switch {
			case v == partition.VerdictDuplicate && (seq == 0 || seq > uint64(len(s.log)) || s.log[seq-1].kind != pkPub || s.log[seq-1].pseq != pseq || s.log[seq-1].epoch != epoch):
				return invariant.Violated("DedupTableTruthful", "replica %d's table holds producer seq %d at seq %d epoch %d, which the committed log does not",
					r, pseq, seq, epoch).Error()
			case p.whole && at >= 0 && uint64(at) < p.m.Applied() && (v != partition.VerdictDuplicate || seq != uint64(at+1)):
				return invariant.Violated("DedupTableComplete", "replica %d applied the log from its start through seq %d, yet its table answers %v (seq %d) for producer seq %d committed at seq %d",
					r, p.m.Applied(), v, seq, pseq, at+1).Error()
			}
		}
	}
	return ""
}

func (cfg *ProduceConfig) successors(s *pstate) []step[*pstate] {
	var out []step[*pstate]
	try := func(action string, f func(*pstate) string) {
		t := s.clone()
		err := f(t)
		if err == "" {
			err = cfg.check(t)
		}
		if err != "" {
			out = append(out, step[*pstate]{action: action, err: err})
			return
		}
		out = append(out, step[*pstate]{action: action, next: t})
	}
	can := func(b int) bool { return s.used[b] < cfg.budget(b) }
	l := s.leader

	// The producer.
	outstanding := 0
	for _, st := range s.status[1:] {
		if st == psOutstanding {
			outstanding++
		}
	}
	if next := slices.Index(s.status[1:], psUnsent) + 1; next > 0 && outstanding < cfg.InflightMax {
		try(fmt.Sprintf("the producer publishes seq %d to replica %d", next, l), func(x *pstate) string {
			x.status[next] = psOutstanding
			return x.publish(uint64(next))
		})
	}
	if can(pbRetries) {
		for pseq, st := range s.status {
			if st == psOutstanding {
				try(fmt.Sprintf("the producer retries seq %d at replica %d", pseq, l), func(x *pstate) string {
					x.used[pbRetries]++
					return x.publish(uint64(pseq))
				})
			}
		}
	}
	for k, rp := range s.replies {
		if k > 0 && rp == s.replies[k-1] {
			continue
		}
		what := "PUB_OK"
		if rp.tooOld {
			what = "PRODUCER_SEQ_TOO_OLD"
		}
		try(fmt.Sprintf("the producer receives %s for seq %d", what, rp.pseq), func(x *pstate) string {
			x.replies = slices.Delete(x.replies, k, k+1)
			if x.status[rp.pseq] == psOutstanding {
				x.status[rp.pseq] = psOK
				if rp.tooOld {
					x.status[rp.pseq] = psTooOld
				}
			}
			return ""
		})
		if can(pbLostReplies) {
			try(fmt.Sprintf("the %s for seq %d is lost", what, rp.pseq), func(x *pstate) string {
				x.used[pbLostReplies]++
				x.replies = slices.Delete(x.replies, k, k+1)
				return ""
			})
		}
	}

	// Replication.
	if len(s.pending) > 0 && !s.degraded {
		try(fmt.Sprintf("seq %d commits", len(s.log)+1), func(x *pstate) string { return x.commit() })
	}
	if !s.degraded && can(pbDegrades) {
		try("the leader loses its quorum", func(x *pstate) string { x.used[pbDegrades]++; x.degraded = true; return "" })
	}
	if s.degraded {
		try("the leader's quorum is back", func(x *pstate) string { x.degraded = false; return "" })
	}
	if can(pbElections) {
		for j := range s.reps {
			for kept := 0; kept <= len(s.pending); kept++ {
				try(fmt.Sprintf("replica %d takes office in epoch %d with %d of %d pending entries", j, s.epoch+1, kept, len(s.pending)), func(x *pstate) string {
					x.used[pbElections]++
					return x.elect(j, kept)
				})
			}
		}
	}

	// The replicas' shells.
	for r, p := range s.reps {
		if p.m.Applied() < uint64(len(s.log)) {
			try(fmt.Sprintf("replica %d applies seq %d", r, p.m.Applied()+1), func(x *pstate) string { return x.apply(r) })
		}
		if len(p.done) > 0 || r == l && s.degraded && p.m.Inflight() > 0 {
			try(fmt.Sprintf("replica %d's shell passes", r), func(x *pstate) string { return x.pass(r, false) })
			if can(pbApplyErrors) && len(p.done) > 0 && p.m.Applied() < uint64(len(s.log)) {
				try(fmt.Sprintf("replica %d's shell passes, reading committed entries fails", r), func(x *pstate) string {
					x.used[pbApplyErrors]++
					return x.pass(r, true)
				})
			}
		}
		if can(pbCompactions) {
			if limit := min(p.m.CompactLimit(), p.m.Applied()); limit+1 > p.start {
				try(fmt.Sprintf("retention compacts replica %d's log through seq %d", r, limit), func(x *pstate) string {
					x.used[pbCompactions]++
					x.reps[r].start = limit + 1
					if x.reps[r].m.LogStart(limit + 1) { // followStart
						return fmt.Sprintf("KernelAssertion: replica %d started over at its own compaction through %d", r, limit)
					}
					return ""
				})
			}
		}
		if r != l && can(pbRestarts) {
			try(fmt.Sprintf("replica %d restarts from its log at seq %d", r, p.start), func(x *pstate) string {
				x.used[pbRestarts]++
				q := &x.reps[r]
				q.m.Close() // its replies are answered UNAVAILABLE
				q.m, q.done, q.whole = cfg.newMember(q.start), nil, q.start == 1
				if q.start > 1 {
					x.events |= peRebuild
				}
				return ""
			})
			if start := s.reps[l].start; p.m.Applied()+1 < start {
				try(fmt.Sprintf("replica %d is rebuilt from the leader's snapshot point, seq %d", r, start), func(x *pstate) string {
					x.used[pbRestarts]++
					q := &x.reps[r]
					q.start = start
					if !q.m.LogStart(start) {
						return fmt.Sprintf("KernelAssertion: replica %d at %d did not start over at %d", r, q.m.Applied(), start)
					}
					q.whole = false
					x.events |= peRebuild
					return ""
				})
			}
		}
	}
	// The leader in office proposes a dedup carry when retention would
	// compact its whole applied log (proposeCarry).
	if m := s.reps[l].m; can(pbCarries) && !s.carrying && s.installSeq != 0 && m.Applied() >= s.installSeq {
		if value, ok := m.AppendCarry(nil, m.Applied()); ok {
			try(fmt.Sprintf("replica %d proposes a dedup carry", l), func(x *pstate) string {
				x.used[pbCarries]++
				x.carrying = true
				x.pending = append(x.pending, pentry{epoch: x.epoch, kind: pkCarry, carry: value})
				return ""
			})
		}
	}
	return out
}

func (s *pstate) key() [16]byte {
	var b []byte
	u := func(v uint64) { b = binary.BigEndian.AppendUint64(b, v) }
	entries := func(es []pentry) {
		u(uint64(len(es)))
		for _, e := range es {
			u(e.epoch)
			u(uint64(e.kind))
			u(e.pseq)
			u(uint64(len(e.carry)))
			b = append(b, e.carry...)
		}
	}
	entries(s.log)
	entries(s.pending)
	u(uint64(len(s.reps)))
	for _, p := range s.reps {
		b = p.m.AppendDigest(b, binary.BigEndian.AppendUint64)
		u(p.start)
		u(uint64(boolByte(p.whole)))
		u(uint64(len(p.done)))
		for _, d := range p.done {
			u(d.pseq)
			u(d.seq)
			u(d.epoch)
			u(uint64(boolByte(d.lost)))
		}
	}
	u(uint64(s.leader))
	u(s.epoch)
	u(s.installSeq)
	u(uint64(boolByte(s.degraded)))
	u(uint64(boolByte(s.carrying)))
	u(uint64(boolByte(s.refused)))
	b = append(b, s.status...)
	replies := slices.Clone(s.replies)
	slices.SortFunc(replies, comparePreply)
	u(uint64(len(replies)))
	for _, r := range replies {
		u(r.pseq)
		u(uint64(boolByte(r.tooOld)))
	}
	for _, v := range s.used {
		u(uint64(v))
	}
	return stateKey(b)
}

func comparePreply(a, b preply) int {
	if a.pseq != b.pseq {
		if a.pseq < b.pseq {
			return -1
		}
		return 1
	}
	return int(boolByte(a.tooOld)) - int(boolByte(b.tooOld))
}

// CheckProduce explores every interleaving of the configuration.
func CheckProduce(cfg ProduceConfig) ProduceResult {
	if cfg.Replicas < 1 || cfg.Messages <= 0 || cfg.Messages > 8 || cfg.InflightMax <= 0 {
		panic(fmt.Sprintf("model: produce config %+v", cfg))
	}
	if cfg.DepthMax == 0 {
		cfg.DepthMax = 80
	}
	if cfg.StatesMax == 0 {
		cfg.StatesMax = 2_000_000
	}
	init := &pstate{status: make([]uint8, cfg.Messages+1), reps: make([]preplica, cfg.Replicas)}
	for r := range init.reps {
		init.reps[r] = preplica{m: cfg.newMember(1), start: 1, whole: true}
	}
	init.status[0] = psOK // no seq 0
	init.elect(0, 0)
	init.events = 0
	var res ProduceResult
	res.Outcome = search[*pstate]{
		successors: cfg.successors,
		key:        (*pstate).key,
		visit: func(s *pstate) {
			res.count(s.events)
			if !slices.ContainsFunc(s.status, func(st uint8) bool { return st != psOK }) {
				res.Settled++
			}
		},
		bounded:   func(*pstate) bool { return false },
		depthMax:  cfg.DepthMax,
		statesMax: cfg.StatesMax,
	}.run(init)
	return res
}

func (res *ProduceResult) count(ev pevent) {
	for _, c := range []struct {
		ev pevent
		n  *int
	}{{peDuplicate, &res.Duplicates}, {peWait, &res.Waits}, {peTakingOffice, &res.TakingOffice}, {peTooOld, &res.TooOld},
		{peQuorumLost, &res.QuorumLost}, {peFailed, &res.Failed}, {peNotApplied, &res.NotApplied}, {peRebuild, &res.Rebuilds},
		{peCarry, &res.Carries}, {peElection, &res.Elections}, {peRebuiltDuplicate, &res.RebuiltDuplicates},
		{peRefusedUnapplied, &res.RefusedUnapplied}} {
		if ev&c.ev != 0 {
			*c.n++
		}
	}
}
