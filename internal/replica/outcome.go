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
	// there, or a snapshot replaced the log below it: it may or may not
	// be in the committed prefix, so its proposer must retry idempotently.
	Lost
)

// Outcome reports what became of the entry this replica proposed at (seq,
// epoch) — the answer its proposer gets.
func (r *Replica) Outcome(seq, epoch uint64) Outcome {
	switch {
	case seq > r.commit:
		return Pending
	case r.epochAt(seq) == epoch:
		return Committed
	default:
		return Lost
	}
}
