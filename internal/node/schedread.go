package node

import (
	"fmt"
	"sort"

	"github.com/nereus-broker/nereus/internal/storage"
)

// schedReadAhead bounds what a shard runner reads at once to publish a
// schedule: the records around it (up to this many, and the frame's
// bytes), kept for the publishes that follow. A burst fires schedules
// admitted together, which lie in the same batches: reading one record
// verified and decoded its whole batch each time.
const schedReadAhead = 256

// schedReads is a shard runner's last read of its log, for publishes.
// Committed records never change, so it is never stale; a runner restart
// drops it.
type schedReads struct {
	entries []storage.Entry // consecutive seqs
}

// record returns the shard's committed record at seq.
func (r *schedRunner) record(seq uint64) (*storage.Record, error) {
	es := r.reads.entries
	if i := sort.Search(len(es), func(i int) bool { return es[i].Seq >= seq }); i < len(es) && es[i].Seq == seq {
		return &es[i].Record, nil
	}
	es, err := r.p.read(seq, schedReadAhead, r.node.cfg.RecordBytesMax+(64<<10))
	if err != nil {
		return nil, err
	}
	if len(es) == 0 || es[0].Seq != seq {
		return nil, fmt.Errorf("seq %d is not in the shard's log", seq)
	}
	r.reads.entries = es
	return &es[0].Record, nil
}
