package model

import "crypto/sha256"

// stateKey is the visited-set key of a state's canonical encoding: the
// first 16 bytes of its SHA-256.
func stateKey(b []byte) [16]byte {
	sum := sha256.Sum256(b)
	var k [16]byte
	copy(k[:], sum[:16])
	return k
}

// step is one action out of a state: the state it leads to, or the
// invariant it broke.
type step[S any] struct {
	action string
	next   S
	err    string
}

// search is a depth-first exploration of a state space, shared by the
// models: every state is hashed and visited once.
type search[S any] struct {
	successors func(S) []step[S]
	key        func(S) [16]byte
	// visit is called once per new state; bounded reports whether the
	// state is past a bound (it is counted, not expanded).
	visit   func(S)
	bounded func(S) bool
	// check, when set, is the invariants' check of a new state ("": it
	// holds): a state seen before is not checked again.
	check     func(S) string
	depthMax  int
	statesMax int
}

// Outcome is what an exploration found; every model's result has it.
type Outcome struct {
	States    int      // distinct states visited
	Pruned    int      // states not expanded (network or depth bound)
	Complete  bool     // false when StatesMax stopped the search
	Violation string   // "" when every visited state satisfied the invariants
	Trace     []string // actions from the initial state to the violation
}

func (x search[S]) run(init S) Outcome {
	out := Outcome{Complete: true}
	visited := map[[16]byte]struct{}{x.key(init): {}}
	type frame struct {
		steps []step[S]
		next  int
		via   string
	}
	stack := []*frame{{steps: x.successors(init)}}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		if f.next >= len(f.steps) {
			stack = stack[:len(stack)-1]
			continue
		}
		st := f.steps[f.next]
		f.next++
		if st.err != "" {
			out.Violation = st.err
			for _, fr := range stack[1:] {
				out.Trace = append(out.Trace, fr.via)
			}
			out.Trace = append(out.Trace, st.action)
			break
		}
		k := x.key(st.next)
		if _, seen := visited[k]; seen {
			continue
		}
		visited[k] = struct{}{}
		if x.check != nil {
			if err := x.check(st.next); err != "" {
				out.Violation = err
				for _, fr := range stack[1:] {
					out.Trace = append(out.Trace, fr.via)
				}
				out.Trace = append(out.Trace, st.action)
				break
			}
		}
		x.visit(st.next)
		if len(visited) >= x.statesMax {
			out.Complete = false
			break
		}
		if x.bounded(st.next) || len(stack) >= x.depthMax {
			out.Pruned++
			continue
		}
		stack = append(stack, &frame{steps: x.successors(st.next), via: st.action})
	}
	out.States = len(visited)
	return out
}

// rstep is a step of the replication model.
type rstep = step[*state]
