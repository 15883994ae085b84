package replica

// Outcome is what became of an entry a replica proposed.
type Outcome uint8

const (
	// Pending: not committed yet, and not known replaced.
	Pending Outcome = iota
	// Committed: the commit point passed it, and the entry at its seq is
	// still of its epoch (same seq and epoch: the same entry).
	Committed
	// Lost: the commit point passed its seq with another epoch's entry
	// there, or a snapshot replaced the log below it, or the committed
	// prefix ends in a later epoch than its own (LostBehindALaterEpoch):
	// it may or may not be in the committed prefix, so its proposer must
	// retry idempotently.
	Lost
)

// Outcome reports what became of the entry this replica proposed at (seq,
// epoch) — the answer its proposer gets.
//
// LostBehindALaterEpoch: an entry beyond the commit point is lost once
// the committed prefix ends in a later epoch — a log's epochs never
// decrease, so no leader can commit it after that entry. Waiting for the
// commit point to pass its seq instead left a deposed leader's proposals
// beyond the new leader's log unanswered for as long as nothing more was
// written to the partition (a publisher waiting on them writes nothing).
func (r *Replica) Outcome(seq, epoch uint64) Outcome {
	switch {
	case seq > r.commit:
		// (A later epoch was promised if the prefix ends in one: checked
		// first, it spares a leader's own proposals the search.)
		if epoch < r.hard.Promised && (r.epochAt(r.commit) > epoch || r.cfg.Mutations.OutcomeLostOnceDeposed) && !r.cfg.Mutations.OutcomeWaitsForTheCommitPoint {
			return Lost
		}
		return Pending
	case r.epochAt(seq) == epoch:
		return Committed
	default:
		return Lost
	}
}
