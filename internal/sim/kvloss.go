package sim

import (
	"fmt"
	"slices"

	"github.com/anishathalye/porcupine"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Losses of a bucket with one replica (--replicas 1 --kv N, bit flips:
// flipLoneBucket). No healthy copy is left, so a repair may drop writes
// that were acknowledged, and a cut of the log's tail take them back:
// expected, in the damaged range only, and never silent.
//   - The history is checked era by era, an era ending at each loss (the
//     node is down for it: nothing is in flight across it). An era starts
//     from the states its keys may have after the loss (kvLossInit).
//   - The watcher, if it went past a lost revision (it may hold that write
//     in what it derived), must hear CURSOR_EXPIRED before its next event
//     (LossExpiresEveryCursor).

// LossExpiresEveryCursor: a watcher that went past a revision the bucket
// then lost is told in band (CURSOR_EXPIRED) before anything else.
const LossExpiresEveryCursor = "LossExpiresEveryCursor"

// kvLoss is what the bucket's only replica lost at atMs: seq ranges a
// repair dropped, and its tail from cutFrom on (0: none) — a torn tail
// cut as it opened or by the repair.
type kvLoss struct {
	atMs    int64
	dropped []storage.SeqRange
	cutFrom uint64
	// recreated: the bucket could not be rebuilt after it; the operator
	// deleted it and created it again (kvRecreator).
	recreated bool
}

// lost reports whether revision rev was lost.
func (l kvLoss) lost(rev uint64) bool {
	if l.cutFrom != 0 && rev >= l.cutFrom {
		return true
	}
	for _, r := range l.dropped {
		if rev >= r.First && rev <= r.Last {
			return true
		}
	}
	return false
}

// cut adds a torn tail t cut off the bucket's log: the seqs the node
// kept (storage.Options.KeepTornSeqs) are dropped, never written again;
// otherwise every seq from its first on may be.
func (l *kvLoss) cut(t storage.TornTail) {
	if t.Kept {
		l.dropped = append(l.dropped, storage.SeqRange{First: t.FirstSeq, Last: t.LastSeq})
		return
	}
	l.cutFrom = t.FirstSeq
}

// subtractRanges is the seqs of rs that none of minus holds.
func subtractRanges(rs, minus []storage.SeqRange) []storage.SeqRange {
	for _, m := range minus {
		var out []storage.SeqRange
		for _, r := range rs {
			if m.Last < r.First || m.First > r.Last {
				out = append(out, r)
				continue
			}
			if r.First < m.First {
				out = append(out, storage.SeqRange{First: r.First, Last: m.First - 1})
			}
			if r.Last > m.Last {
				out = append(out, storage.SeqRange{First: m.Last + 1, Last: r.Last})
			}
		}
		rs = out
	}
	return rs
}

// first is the lowest seq lost.
func (l kvLoss) first() uint64 {
	first := l.cutFrom
	for _, r := range l.dropped {
		if first == 0 || r.First < first {
			first = r.First
		}
	}
	return first
}

func (l kvLoss) String() string {
	s := fmt.Sprintf("dropped %v", l.dropped)
	if l.cutFrom != 0 {
		s += fmt.Sprintf(", cut from %d", l.cutFrom)
	}
	return s
}

// lose takes in a loss of the bucket at the current time. Seqs an
// earlier loss dropped hold lost records (or a gap) since, and are never
// written again: a repair that drops one again (a flip into a repair's
// fill) loses nothing.
func (kw *kvWorkload) lose(l kvLoss) {
	for _, prev := range kw.losses {
		l.dropped = subtractRanges(l.dropped, prev.dropped)
	}
	if len(l.dropped) == 0 && l.cutFrom == 0 {
		return
	}
	l.atMs = kw.s.w.nowMs
	kw.s.w.tracef("checker: the bucket lost seqs (%s): writes there may be gone", l)
	kw.s.repaired["bucket losses"]++
	if n := len(kw.losses); n > 0 && kw.losses[n-1].atMs == l.atMs {
		prev := &kw.losses[n-1]
		prev.dropped = append(prev.dropped, l.dropped...)
		if l.cutFrom != 0 && (prev.cutFrom == 0 || l.cutFrom < prev.cutFrom) {
			prev.cutFrom = l.cutFrom
		}
	} else {
		kw.losses = append(kw.losses, l)
	}
	kw.watcher.lose(l)
}

// lose forgets what the watcher knows of the lost revisions (a cut's may
// be written again); if it went past one it is owed CURSOR_EXPIRED.
func (wt *kvWatcher) lose(l kvLoss) {
	for rev := range wt.acked {
		if l.lost(rev) {
			delete(wt.acked, rev)
		}
	}
	for rev := range wt.seen {
		if l.lost(rev) {
			delete(wt.seen, rev)
		}
	}
	// Seqs before the bucket was created again (kvRecreator) held none
	// of what the watcher holds now.
	l.dropped = slices.DeleteFunc(slices.Clone(l.dropped), func(r storage.SeqRange) bool { return r.Last < wt.bucketStart })
	if len(l.dropped) == 0 && l.cutFrom == 0 || wt.next <= l.first() {
		return
	}
	if wt.owed == "" {
		wt.owed = fmt.Sprintf("the bucket lost seqs (%s) at t=%d, its cursor then at %d", l, l.atMs-epochMs, wt.next)
	}
	wt.owedLoss.cutFrom = max(wt.owedLoss.cutFrom, l.cutFrom)
	for _, r := range l.dropped {
		if r.First < wt.next {
			wt.owedLoss.dropped = append(wt.owedLoss.dropped, r)
		}
	}
}

// covered takes in a bucket rebuilt from a checkpoint as of seq base
// (node.KVRebuiltMessage): what dropped seqs up to base held is in it, so
// a watcher that saw them lost nothing there; once nothing it passed is
// lost, it is owed nothing.
func (wt *kvWatcher) covered(base uint64) {
	if wt.owed == "" {
		return
	}
	wt.owedLoss.dropped = slices.DeleteFunc(wt.owedLoss.dropped, func(r storage.SeqRange) bool { return r.Last <= base })
	if len(wt.owedLoss.dropped) == 0 && wt.owedLoss.cutFrom == 0 {
		wt.kw.s.w.tracef("checker: the bucket was rebuilt from its checkpoint as of %d: the watcher lost nothing", base)
		wt.kw.s.repaired["bucket losses a checkpoint held"]++
		wt.owed = ""
	}
}

// kvEra is the part of the history between two losses (kvLoss), with the
// states each key may start it in.
type kvEra struct {
	ops  []porcupine.Operation
	init map[string][]any
}

// eras splits the history at the losses: an operation belongs to the era
// it was invoked in (a loss's node is down, so none is answered across
// it); a write whose outcome is unknown ends with its era.
func (kw *kvWorkload) eras() []kvEra {
	eras := make([]kvEra, len(kw.losses)+1)
	for _, op := range kw.history {
		e := 0
		for e < len(kw.losses) && kw.losses[e].atMs < op.Call {
			e++
		}
		if e < len(kw.losses) && op.Return > kw.losses[e].atMs {
			op.Return = kw.losses[e].atMs
		}
		eras[e].ops = append(eras[e].ops, op)
	}
	eras[0].init = map[string][]any{}
	for _, op := range kw.history {
		eras[0].init[op.Input.(kvInput).Key] = []any{kvKeyState{RevKnown: true}}
	}
	past := map[string][]any{}
	for i, l := range kw.losses {
		eras[i+1].init = kvLossInit(eras[i], l, past)
		if l.recreated {
			clear(past)
			for key := range eras[i+1].init {
				eras[i+1].init[key] = []any{kvKeyState{RevKnown: true}}
			}
		}
	}
	return eras
}

// kvLossInit is the states each key may be in after loss l, which ended
// era e; past holds every state each key has been in, or may have been,
// before e (taken in and pruned here). If the key's latest acknowledged
// write of e (the highest revision) was not lost and is not a
// compare-and-set, the key holds it, or a write of e whose outcome is
// unknown, taking effect after it (the latest one left). Otherwise the
// loss may have taken the key back to any earlier state, or to none: a
// compare-and-set whose record is whole is refused when the log is
// applied again if the write it expected was lost; a checkpoint after a
// dropped range brings back what it held; a state written at a seq cut
// off the tail is gone for good.
func kvLossInit(e kvEra, l kvLoss, past map[string][]any) map[string][]any {
	latest := map[string]kvKeyState{}
	cas := map[string]bool{} // the latest write is a compare-and-set
	var unknown []kvInput
	for key, starts := range e.init {
		past[key] = append(past[key], starts...)
	}
	for _, op := range e.ops {
		in, out := op.Input.(kvInput), op.Output.(kvOutput)
		if in.Op == kvGet || out.Mismatch {
			continue
		}
		st := kvKeyState{Live: in.Op != kvDel, Value: in.Value}
		if out.Unknown {
			unknown = append(unknown, in)
		} else {
			st.Rev, st.RevKnown = out.Rev, true
			if st.Rev > latest[in.Key].Rev {
				latest[in.Key], cas[in.Key] = st, in.Op == kvCAS
			}
		}
		past[in.Key] = append(past[in.Key], st)
	}
	init := map[string][]any{}
	for key, states := range past {
		seen := map[kvKeyState]bool{}
		states = slices.DeleteFunc(states, func(s any) bool {
			st := s.(kvKeyState)
			dup := seen[st]
			seen[st] = true
			return dup || st.RevKnown && l.cutFrom != 0 && st.Rev >= l.cutFrom
		})
		past[key] = states
		if L, ok := latest[key]; ok && !l.lost(L.Rev) && !cas[key] {
			init[key] = []any{L}
			for _, in := range unknown {
				if in.Key == key {
					init[key] = append(init[key], kvKeyState{Live: in.Op != kvDel, Value: in.Value, Rev: L.Rev})
				}
			}
			continue
		}
		init[key] = append([]any{kvKeyState{RevKnown: true}}, states...)
	}
	return init
}

// kvModelFrom is the sequential specification of one key starting in any
// of states.
func kvModelFrom(states []any) porcupine.Model {
	return (&porcupine.NondeterministicModel{
		Init: func() []any { return slices.Clone(states) },
		Step: kvStep,
		DescribeOperation: func(input, output any) string {
			return fmt.Sprintf("%s -> %+v", input.(kvInput), output.(kvOutput))
		},
	}).ToModel()
}

// kvRecreateAdvice is what a bucket that cannot be rebuilt says to do.
const kvRecreateAdvice = "delete the bucket and create it again"

// kvRecreator is the operator of a bucket that says it cannot be rebuilt
// (DATA_CORRUPT "delete the bucket and create it again": every checkpoint
// it could be rebuilt from lost, or its creation with none after it): it
// deletes the bucket and creates it again, as OPERATIONS says. Everything
// the bucket held is lost then: the era after its loss starts with every
// key absent, and the watcher, if it saw anything, is owed CURSOR_EXPIRED.
type kvRecreator struct {
	kw *kvWorkload
	kvConns
	at       int
	creating bool   // the delete was answered; the create is next
	corr     uint64 // the request in flight (0: idle)
	busy     bool
	// doneMs: when the last re-creation was answered; advice asked
	// before it (an answer late on its way) is old news.
	doneMs int64
}

func (o *kvRecreator) name() string { return "kvoperator" }

func (o *kvRecreator) onClose(c *conn) {
	if o.closed(o.kw.s, o, c) && o.corr != 0 && o.conns[o.at] == c {
		o.again()
	}
}

// start asks for the re-creation at node at (the one that said it, to
// a request sent at askedMs).
func (o *kvRecreator) start(at int, askedMs int64) {
	if o.busy || askedMs < o.doneMs {
		return
	}
	o.busy, o.creating, o.at = true, false, at
	s := o.kw.s
	s.w.tracef("operator: the bucket cannot be rebuilt; deleting it and creating it again at n%d", at+1)
	if o.conns[at] == nil {
		// Dialed only now: a run that needs no operator draws the same
		// randomness as before it existed.
		for n := range o.conns {
			o.connect(s, o, n)
		}
	}
	s.w.after(10, o.send)
}

func (o *kvRecreator) send() {
	w := o.kw.s.w
	c := o.conns[o.at]
	if c == nil || !c.open {
		o.again()
		return
	}
	o.corr++
	corr := o.corr
	if o.creating {
		c.send(corr, &wire.KVBucketCreate{Config: wire.KVBucketConfig{Bucket: kvBucket, History: kvBucketHist,
			TombstoneTTLMs: kvTombstoneTTLMs, Replicas: o.kw.s.replicas}})
	} else {
		c.send(corr, &wire.KVBucketDelete{Bucket: kvBucket})
	}
	w.after(kvOpTimeoutMs, func() {
		if o.corr == corr {
			o.again()
		}
	})
}

// again sends the step in flight once more, later, at the next node.
func (o *kvRecreator) again() {
	w := o.kw.s.w
	o.corr++ // what was in flight is answered to no one
	o.at = (o.at + 1) % len(o.conns)
	w.after(w.between(50, 300), o.send)
}

func (o *kvRecreator) onFrame(c *conn, corr uint64, f wire.Frame) {
	if corr != o.corr || c != o.conns[o.at] {
		return
	}
	w := o.kw.s.w
	switch f := f.(type) {
	case *wire.KVBucketOK:
		if !o.creating { // the delete's answer
			o.deleted()
			return
		}
		o.busy, o.corr, o.doneMs = false, 0, w.nowMs
		w.tracef("operator: the bucket was created again (created %v)", f.Created)
	case *wire.Err:
		switch {
		case !o.creating && f.Code == wire.CodeNotFound:
			o.deleted()
		default:
			w.tracef("operator: %s of the bucket: %v", map[bool]string{false: "delete", true: "create"}[o.creating], f.AsError())
			o.again()
		}
	}
}

// deleted takes in the bucket's delete, answered (or found done): what
// comes next is a new bucket, whoever creates it — a client's create may
// come before the operator's (which then finds it created, and the
// watcher may be on it already).
func (o *kvRecreator) deleted() {
	o.kw.s.w.tracef("operator: the bucket was deleted")
	o.kw.recreated()
	o.creating = true
	o.send()
}

// recreated takes in the bucket deleted, to be created again: nothing of
// it is left.
func (kw *kvWorkload) recreated() {
	if len(kw.losses) == 0 {
		kw.s.chk.violate(KVLinearizable, "the bucket said it cannot be rebuilt, and it lost nothing")
		return
	}
	kw.losses[len(kw.losses)-1].recreated = true
	kw.s.repaired["buckets created again"]++
	wt := kw.watcher
	wt.recreating = true
	clear(wt.acked)
	clear(wt.seen)
	if wt.next > 1 {
		if wt.owed == "" {
			wt.owed = fmt.Sprintf("the bucket was deleted and created again at t=%d (it could not be rebuilt), the watcher's cursor then at %d", kw.s.w.nowMs-epochMs, wt.next)
		}
		wt.owedLoss.cutFrom = 1 // nothing of it is left
	}
}
