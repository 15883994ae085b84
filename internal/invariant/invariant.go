// Package invariant holds the named invariants of DESIGN §4 as pure checks
// over ghost state — what the checkers remember of a run — shared by the
// simulator, the model checker and the scenario tests, so that each
// invariant is stated once. Callers gather the facts (who durably
// promised, who durably holds an entry) from their own world; the checks
// here decide.
package invariant

import (
	"encoding/binary"
	"fmt"
)

// The named invariants.
const (
	// OneLeaderPerEpoch: no two replicas lead the same epoch.
	OneLeaderPerEpoch = "OneLeaderPerEpoch"
	// InstallNeedsQuorumPromise: no replica installs epoch e without
	// durable promises for e from a majority.
	InstallNeedsQuorumPromise = "InstallNeedsQuorumPromise"
	// CommittedPrefixAgreement: replicas never disagree on a committed
	// entry, and a committed entry never changes.
	CommittedPrefixAgreement = "CommittedPrefixAgreement"
	// VisibleImpliesQuorumFlushed: every visible entry is durable on a
	// quorum of the replica group (every replica under sync_all).
	VisibleImpliesQuorumFlushed = "VisibleImpliesQuorumFlushed"
	// AckedNeverLost: every acknowledged record stays readable at its
	// position.
	AckedNeverLost = "AckedNeverLost"
)

// Violation is a broken invariant and what broke it.
type Violation struct {
	Invariant string
	Detail    string
}

func (v *Violation) Error() string { return v.Invariant + ": " + v.Detail }

func violation(inv, format string, args ...any) *Violation {
	return &Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...)}
}

// Entry is a replicated entry as the checks compare it: the epoch it was
// written in and its content (an install entry's is "").
type Entry struct {
	Epoch uint64
	Value string
}

// Group is the ghost state of one replica group: the leader of each epoch
// and the committed prefix.
type Group struct {
	replicas int
	syncAll  bool
	leaders  []uint32 // leaders[e]: the replica that led epoch e (0: none seen)
	// committed[i] is the entry visible at seq i+1; known[i] whether any
	// replica made it visible yet.
	committed []Entry
	known     []bool
}

// NewGroup is the ghost state of a group of replicas under sync_quorum,
// or sync_all when syncAll.
func NewGroup(replicas int, syncAll bool) *Group {
	return &Group{replicas: replicas, syncAll: syncAll}
}

// Quorum is how many replicas make a majority.
func (g *Group) Quorum() int { return g.replicas/2 + 1 }

// durableNeed is how many replicas must hold a visible entry.
func (g *Group) durableNeed() int {
	if g.syncAll {
		return g.replicas
	}
	return g.Quorum()
}

// Leader is the replica seen leading epoch (0: none).
func (g *Group) Leader(epoch uint64) uint32 {
	if epoch >= uint64(len(g.leaders)) {
		return 0
	}
	return g.leaders[epoch]
}

// LastLedEpoch is the highest epoch a leader was seen in (0: none).
func (g *Group) LastLedEpoch() uint64 {
	for e := len(g.leaders) - 1; e > 0; e-- {
		if g.leaders[e] != 0 {
			return uint64(e)
		}
	}
	return 0
}

// Elections is how many epochs had a leader.
func (g *Group) Elections() int {
	n := 0
	for _, l := range g.leaders {
		if l != 0 {
			n++
		}
	}
	return n
}

// Committed is the entry visible at seq, if any replica made one visible.
func (g *Group) Committed(seq uint64) (Entry, bool) {
	if seq == 0 || seq > uint64(len(g.committed)) || !g.known[seq-1] {
		return Entry{}, false
	}
	return g.committed[seq-1], true
}

// CommittedLen is the highest seq made visible so far.
func (g *Group) CommittedLen() uint64 { return uint64(len(g.committed)) }

// TookOffice checks OneLeaderPerEpoch and InstallNeedsQuorumPromise as
// replica node starts leading epoch, with promised replicas (itself
// included) durably promised at least epoch. It records the leader.
func (g *Group) TookOffice(node uint32, epoch uint64, promised int) *Violation {
	for uint64(len(g.leaders)) <= epoch {
		g.leaders = append(g.leaders, 0)
	}
	if l := g.leaders[epoch]; l != 0 && l != node {
		return violation(OneLeaderPerEpoch, "epoch %d led by n%d and n%d", epoch, l, node)
	}
	g.leaders[epoch] = node
	if promised < g.Quorum() {
		return violation(InstallNeedsQuorumPromise, "n%d installed epoch %d with %d durable promises of %d needed", node, epoch, promised, g.Quorum())
	}
	return nil
}

// Visible checks CommittedPrefixAgreement and VisibleImpliesQuorumFlushed
// as replica node makes entry e visible at seq, with holders replicas
// (itself included) durably holding it. It records the entry.
func (g *Group) Visible(node uint32, seq uint64, e Entry, holders int) *Violation {
	if v := g.Agree(node, seq, e); v != nil {
		return v
	}
	if holders < g.durableNeed() {
		return violation(VisibleImpliesQuorumFlushed, "seq %d (e%d) visible on n%d but durable on %d replicas, need %d", seq, e.Epoch, node, holders, g.durableNeed())
	}
	return nil
}

// Agree checks CommittedPrefixAgreement alone as replica node reports the
// entry e committed at seq (where the caller cannot see durability), and
// records it.
func (g *Group) Agree(node uint32, seq uint64, e Entry) *Violation {
	if seq == 0 {
		return violation(CommittedPrefixAgreement, "n%d reports seq 0 committed", node)
	}
	if prev, ok := g.Committed(seq); ok && prev != e {
		return violation(CommittedPrefixAgreement, "seq %d visible as (e%d %q) on n%d, earlier as (e%d %q)", seq, e.Epoch, e.Value, node, prev.Epoch, prev.Value)
	}
	for uint64(len(g.committed)) < seq {
		g.committed = append(g.committed, Entry{})
		g.known = append(g.known, false)
	}
	g.committed[seq-1], g.known[seq-1] = e, true
	return nil
}

// Forget drops the entries committed at seqs from through through: a
// group's only replica lost them to damage (a repair dropped them, or a
// cut took them as a torn tail), and other entries may be committed there
// next. Only a checker that saw the loss said calls it.
func (g *Group) Forget(from, through uint64) {
	for seq := max(from, 1); seq <= through && seq <= uint64(len(g.committed)); seq++ {
		g.committed[seq-1], g.known[seq-1] = Entry{}, false
	}
}

// Clone is an independent copy (the model checker forks states).
func (g *Group) Clone() *Group {
	c := *g
	c.leaders = append([]uint32(nil), g.leaders...)
	c.committed = append([]Entry(nil), g.committed...)
	c.known = append([]bool(nil), g.known...)
	return &c
}

// AppendKey appends an encoding of the ghost state (the model checker
// hashes states).
func (g *Group) AppendKey(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(g.leaders)))
	for _, l := range g.leaders {
		b = binary.AppendUvarint(b, uint64(l))
	}
	b = binary.AppendUvarint(b, uint64(len(g.committed)))
	for i, e := range g.committed {
		if !g.known[i] {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.AppendUvarint(b, e.Epoch)
		b = binary.AppendUvarint(b, uint64(len(e.Value)))
		b = append(b, e.Value...)
	}
	return b
}
