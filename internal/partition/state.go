package partition

import "fmt"

// Config bounds the kernel.
type Config struct {
	// DedupWindowMax is how many producer_seqs are remembered per producer.
	DedupWindowMax int
	// ProducersMax is how many producers are remembered per partition.
	ProducersMax int
}

// DefaultConfig is used by the node unless overridden.
var DefaultConfig = Config{DedupWindowMax: 1024, ProducersMax: 100_000}

// State is the publish-side kernel of one partition on a single node: it
// assigns sequence numbers, deduplicates idempotent producers and tracks the
// visible prefix. The shell appends what Publish decides, makes it durable,
// then calls Committed.
//
// Invariants: CommitSeq ≤ NextSeq-1; a seq is reported visible only after the
// shell said it is durable (Committed); a (producer_id, producer_seq) is
// assigned at most one seq.
type State struct {
	epoch     uint64
	nextSeq   uint64
	commitSeq uint64
	producers *Producers
}

// NewState returns the state of a partition whose log holds seqs
// [startSeq, nextSeq) all durable, written under epochs up to epoch.
// The shell then replays the retained log through Replay.
func NewState(cfg Config, epoch, nextSeq uint64) *State {
	if nextSeq == 0 {
		panic("partition: seqs are 1-based; nextSeq must be ≥ 1")
	}
	return &State{epoch: epoch, nextSeq: nextSeq, commitSeq: nextSeq - 1,
		producers: NewProducers(cfg.DedupWindowMax, cfg.ProducersMax)}
}

// Replay feeds one durable log entry to the dedup table during recovery.
func (s *State) Replay(seq, epoch, producerID, producerSeq uint64) {
	if producerID != 0 {
		s.producers.Record(producerID, producerSeq, seq, epoch)
	}
}

// ReplayDone ends recovery. historyTruncated is true when retention deleted
// the oldest part of the log, so older producer_seqs are no longer provable.
func (s *State) ReplayDone(historyTruncated bool) {
	if historyTruncated {
		s.producers.SealHistory()
	}
}

// Decision is what the kernel decided for one publish.
type Decision struct {
	Verdict Verdict
	// Seq and Epoch: for VerdictNew the seq to append at; for
	// VerdictDuplicate where the original landed (maybe not yet visible:
	// compare with CommitSeq before answering).
	Seq, Epoch uint64
}

// Publish decides one PUB. For VerdictNew it reserves the next seq: the shell
// must append the records of one batch in the order Publish returned them.
func (s *State) Publish(producerID, producerSeq uint64) Decision {
	if d := s.Lookup(producerID, producerSeq); d.Verdict != VerdictNew {
		return d
	}
	seq := s.nextSeq
	s.nextSeq++
	if producerID != 0 {
		s.producers.Record(producerID, producerSeq, seq, s.epoch)
	}
	return Decision{Verdict: VerdictNew, Seq: seq, Epoch: s.epoch}
}

// Lookup decides a publish its caller takes only as a retry
// (RetryIsItsOriginal), changing nothing: Duplicate or TooOld as Publish
// would decide them; VerdictNew for one the table does not know, with no
// seq assigned (not to be appended).
func (s *State) Lookup(producerID, producerSeq uint64) Decision {
	if producerID == 0 {
		return Decision{Verdict: VerdictNew}
	}
	v, seq, epoch := s.producers.Check(producerID, producerSeq)
	return Decision{Verdict: v, Seq: seq, Epoch: epoch}
}

// Committed reports that every seq ≤ seq is durable; they become visible.
func (s *State) Committed(seq uint64) {
	if seq >= s.nextSeq {
		panic(fmt.Sprintf("partition: commit %d beyond assigned %d", seq, s.nextSeq-1))
	}
	if seq > s.commitSeq {
		s.commitSeq = seq
	}
}

// Epoch is the leader epoch new records are written under.
func (s *State) Epoch() uint64 { return s.epoch }

// NextSeq is the seq the next new record gets.
func (s *State) NextSeq() uint64 { return s.nextSeq }

// CommitSeq is the last visible seq (0 when none).
func (s *State) CommitSeq() uint64 { return s.commitSeq }

// Producers is the number of producers in the dedup table.
func (s *State) Producers() int { return s.producers.Len() }
