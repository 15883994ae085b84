package sim

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// The check of the KV workload's history (kv.go): linearizability
// against kvModel, a map whose keys carry their revisions, with porcupine,
// key by key.

// KVLinearizable: every KV history is linearizable (a KV map with
// revisions; kvModel).
const KVLinearizable = "KVLinearizable"

// kvCheckTimeout bounds porcupine's search (wall time): a history it
// cannot decide in time fails the run as unchecked, never passes.
const kvCheckTimeout = 20 * time.Second

// check checks the history for linearizability, key by key and, after
// losses of a bucket with one replica, era by era (kvloss.go); a history
// porcupine cannot decide within kvCheckTimeout fails the run too.
func (kw *kvWorkload) check() {
	w := kw.s.w
	eras := kw.eras()
	w.tracef("kv: %d operations (%d writes with unknown outcomes) in %d eras; the watcher reached %d in %d watches, %d ended CURSOR_EXPIRED",
		len(kw.history), kw.unknown, len(eras), kw.watcher.next, kw.watcher.resumes, kw.watcher.expired)
	if owed := kw.watcher.owed; owed != "" {
		kw.s.chk.violate(LossExpiresEveryCursor, "the watcher was never told: %s", owed)
		return
	}
	for i, era := range eras {
		for _, part := range kvPartition(era.ops) {
			key := part[0].Input.(kvInput).Key
			model := kvModelFrom(era.init[key])
			switch porcupine.CheckOperationsTimeout(model, part, kvCheckTimeout) {
			case porcupine.Ok:
				continue
			case porcupine.Unknown:
				kw.s.chk.violate(KVLinearizable, "porcupine could not decide the history of key %s (%d operations) within %s: not checked", key, len(part), kvCheckTimeout)
				return
			}
			// Name the first operation the key's history cannot be
			// linearized at; trace what led to it.
			culprit, before := kvFirstIllegal(model, part)
			for _, op := range before[max(0, len(before)-kvTracedOpsMax):] {
				w.tracef("kv history %s: %s", key, kvDescribe(op))
			}
			where := ""
			if len(eras) > 1 {
				where = fmt.Sprintf(" (era %d of %d, after %d losses of the bucket; it may start it in %v)", i+1, len(eras), i, era.init[key])
			}
			kw.s.chk.violate(KVLinearizable, "key %s%s: %s cannot be linearized after the %d operations of the key that precede it (the last %d traced above)",
				key, where, kvDescribe(culprit), len(before), min(len(before), kvTracedOpsMax))
			return
		}
	}
}

// kvTracedOpsMax bounds the operations a failed check traces.
const kvTracedOpsMax = 30

// kvFirstIllegal finds, in a key's illegal history, the first answer that
// cannot be linearized: the earliest return time T at which the history
// as known at T (answered by then; writes in flight then as unknown) is
// already illegal (a binary search: knowing more never makes a history
// legal again). It returns that operation and the ones known at T before
// it, in call order.
func kvFirstIllegal(model porcupine.Model, part []porcupine.Operation) (porcupine.Operation, []porcupine.Operation) {
	var returns []int64
	for _, op := range part {
		if op.Return != math.MaxInt64 {
			returns = append(returns, op.Return)
		}
	}
	slices.Sort(returns)
	returns = slices.Compact(returns)
	known := func(t int64) []porcupine.Operation {
		var out []porcupine.Operation
		for _, op := range part {
			switch {
			case op.Return <= t:
				out = append(out, op)
			case op.Call <= t && op.Input.(kvInput).Op != kvGet:
				op.Output, op.Return = kvOutput{Unknown: true}, math.MaxInt64
				out = append(out, op)
			}
		}
		slices.SortStableFunc(out, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		return out
	}
	i, _ := slices.BinarySearchFunc(returns, true, func(t int64, _ bool) int {
		if porcupine.CheckOperationsTimeout(model, known(t), kvCheckTimeout) == porcupine.Illegal {
			return 0
		}
		return -1
	})
	if i == len(returns) {
		return part[len(part)-1], part[:len(part)-1]
	}
	t := returns[i]
	var culprit porcupine.Operation
	var before []porcupine.Operation
	for _, op := range known(t) {
		if op.Return == t && culprit.Input == nil {
			culprit = op
			continue
		}
		before = append(before, op)
	}
	return culprit, before
}

// kvDescribe is one operation for a trace line: client, [call, return]
// in virtual ms since the start, input and outcome.
func kvDescribe(op porcupine.Operation) string {
	ret := "never"
	if op.Return != math.MaxInt64 {
		ret = fmt.Sprint(op.Return - epochMs)
	}
	return fmt.Sprintf("client %d [%d, %s] %s -> %+v", op.ClientId+1, op.Call-epochMs, ret, op.Input, op.Output)
}

// kvKeyState is one key in kvModel: Live with Value, and its latest
// revision Rev (a tombstone's while not Live; 0: never written; see
// Purged). While
// !RevKnown the revision is only known to be above Rev: a write whose
// outcome is unknown took effect, at a revision nobody saw.
type kvKeyState struct {
	Live     bool
	Value    string
	Rev      uint64
	RevKnown bool
	// Purged: a tombstone compaction removed; the key's current revision
	// is 0 again, while Rev still bounds the next one.
	Purged bool
}

// revIs reports whether the key's latest revision may be rev, and the
// state with it known.
func (s kvKeyState) revIs(rev uint64) (kvKeyState, bool) {
	if s.Purged {
		return s, rev == 0
	}
	if s.RevKnown {
		return s, s.Rev == rev
	}
	above := s.Rev
	s.Rev, s.RevKnown = rev, true
	return s, rev > above
}

// before reports whether a write at rev may follow the latest revision.
func (s kvKeyState) before(rev uint64) bool {
	if s.RevKnown {
		return rev > s.Rev
	}
	return rev > s.Rev+1
}

// written is the state after a write whose revision is unknown.
func (s kvKeyState) written(live bool, value string) kvKeyState {
	bound := s.Rev
	if !s.RevKnown {
		bound++
	}
	return kvKeyState{Live: live, Value: value, Rev: bound}
}

// holds reports whether a CAS expecting expected may succeed, with the
// state it learns (the kernel's conditionHolds: 0 means absent or a
// tombstone; otherwise the latest revision, tombstone or not).
func (s kvKeyState) holds(expected uint64) (kvKeyState, bool) {
	if expected == 0 {
		return s, !s.Live
	}
	return s.revIs(expected)
}

// kvStep is the sequential specification of one key: the states op may
// leave (none: it cannot have happened so).
func kvStep(state, input, output any) []any {
	s := state.(kvKeyState)
	next := kvStepFrom(s, input.(kvInput), output.(kvOutput))
	if !s.Live && !s.Purged && (s.Rev != 0 || !s.RevKnown) {
		// A tombstone may have been purged by a compaction (an entry of
		// the log no client sees): the key is then as never written,
		// though later revisions still come after the delete's.
		s.Purged = true
		next = append(next, kvStepFrom(s, input.(kvInput), output.(kvOutput))...)
	}
	return next
}

func kvStepFrom(s kvKeyState, in kvInput, out kvOutput) []any {
	var next []any
	add := func(ok bool, st kvKeyState) {
		if ok {
			next = append(next, st)
		}
	}
	switch in.Op {
	case kvGet:
		if !out.Found {
			add(!s.Live, s)
			break
		}
		st, ok := s.revIs(out.Rev)
		add(ok && s.Live && s.Value == out.Value, st)
	case kvPut, kvDel:
		live := in.Op == kvPut
		if out.Unknown {
			add(true, s.written(live, in.Value))
			break
		}
		add(s.before(out.Rev), kvKeyState{Live: live, Value: in.Value, Rev: out.Rev, RevKnown: true})
	case kvCAS:
		switch {
		case out.Unknown:
			if st, ok := s.holds(in.Expected); ok {
				add(true, st.written(true, in.Value))
			}
			add(true, s) // refused when applied: nothing changed
		case out.Mismatch:
			st, ok := s.revIs(out.Rev)
			held := !s.Live
			if in.Expected != 0 {
				held = !st.Purged && st.Rev == in.Expected
			}
			add(ok && !held, st)
		default:
			st, ok := s.holds(in.Expected)
			add(ok && st.before(out.Rev), kvKeyState{Live: true, Value: in.Value, Rev: out.Rev, RevKnown: true})
		}
	}
	return next
}

// kvPartition splits a history by key, in key order.
func kvPartition(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(kvInput).Key
		byKey[k] = append(byKey[k], op)
	}
	var out [][]porcupine.Operation
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		out = append(out, byKey[k])
	}
	return out
}

// kvModel is a map of keys with revisions, none written yet, checked key
// by key.
var kvModel = func() porcupine.Model {
	m := kvModelFrom([]any{kvKeyState{RevKnown: true}})
	m.Partition = kvPartition
	return m
}()
