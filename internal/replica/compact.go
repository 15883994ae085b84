package replica

// Compaction and reservations: how far a replica may compact its log
// (RetainFloor), and the tail-chase watch that gives up on a follower that
// cannot converge.

import (
	"slices"
	"sort"
)

// CompactTo records that the shell replaced every entry up to seq with a
// snapshot. seq must be committed, durable and not below RetainFloor's
// answer when it was asked (the kernel clamps to what is safe and returns
// the point it accepted).
func (r *Replica) CompactTo(seq uint64) uint64 {
	seq = min(seq, r.commit, r.durable)
	if seq <= r.snapSeq {
		return r.snapSeq
	}
	i := sort.Search(len(r.epochs), func(i int) bool { return r.epochs[i].StartSeq > seq }) - 1
	r.epochs = slices.Clone(r.epochs[i:])
	r.epochs[0].StartSeq = seq
	r.snapSeq = seq
	return seq
}

// watchChase detects tail chasing: over each window of ChaseTicks a
// lagging follower must shrink its lag, or its reservation is revoked (it
// will rebuild from a snapshot instead of chasing the tail forever). A
// follower that catches up (lag within one Append) gets it back. The first
// window after a follower falls behind only measures its lag: whatever lag
// it had while in sync is no baseline (ChaseFromABaseline).
func (r *Replica) watchChase(i int) {
	lag := r.last - min(r.match[i], r.last)
	if lag <= uint64(r.cfg.AppendEntriesMax) {
		r.revoked[i], r.chaseAge[i], r.chaseLag[i] = false, 0, 0
		return
	}
	r.chaseAge[i]++
	if r.chaseAge[i] < r.cfg.ChaseTicks {
		return
	}
	if lag >= r.chaseLag[i] && r.chaseLag[i] > 0 {
		r.revoked[i] = true
	}
	r.chaseAge[i], r.chaseLag[i] = 0, lag
}

// RetainFloor is the highest seq the shell may compact up to: committed,
// and, on a leader, not past what a follower heard from within its
// reservation still needs.
func (r *Replica) RetainFloor() uint64 {
	floor := min(r.commit, r.durable)
	if r.role != Leader {
		return floor
	}
	for i := range r.peers {
		if i != r.self && r.heard[i] <= r.cfg.ReservationTicks && !r.revoked[i] &&
			r.last-min(r.match[i], r.last) <= r.cfg.ReservationEntriesMax {
			floor = min(floor, r.match[i])
		}
	}
	return max(floor, r.snapSeq)
}
