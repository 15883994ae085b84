package node

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// ScrubBytesPerSecondDefault is the scrubber's default read rate.
const ScrubBytesPerSecondDefault = 8 << 20

// scrubber re-verifies the sealed segments of every partition log this
// node holds, at a bounded average rate (Config.ScrubBytesPerSecond): each
// second adds that many bytes of credit, a step reads while credit
// remains, and a segment read past the credit is paid back by idle
// seconds. Damage it finds takes the same path as damage found at open: a
// single-node partition goes corrupt, a replica drops the damaged range
// and rebuilds it from a healthy replica without a restart.
type scrubber struct {
	n *Node
	// creditBytes may go negative: a whole segment is read at once.
	creditBytes int64
	// next is the position of the next partition to visit, and from each
	// partition's next seq to verify.
	next int
	from map[*partitionRunner]uint64
}

// startScrubber starts the scrubber's goroutine unless it is off.
func (n *Node) startScrubber() {
	if n.cfg.Manual || n.cfg.ScrubBytesPerSecond < 0 {
		return
	}
	n.scrubStop, n.scrubDone = make(chan struct{}), make(chan struct{})
	go n.runScrubber(n.scrubStop)
}

func (n *Node) runScrubber(stop <-chan struct{}) {
	defer close(n.scrubDone)
	s := &scrubber{n: n, from: map[*partitionRunner]uint64{}}
	t := n.cfg.Env.Clock.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C():
			s.step(n.cfg.ScrubBytesPerSecond)
		}
	}
}

// step adds one second of credit and verifies partitions round-robin
// while credit lasts.
func (s *scrubber) step(rateBytes int64) {
	s.creditBytes = min(s.creditBytes+rateBytes, rateBytes)
	parts := s.n.partitionsHeld()
	for visited := 0; visited < len(parts) && s.creditBytes > 0; visited++ {
		p := parts[s.next%len(parts)]
		lg := p.readLog.Load()
		if lg == nil {
			s.next++
			continue
		}
		next, readBytes, found, err := lg.Verify(s.from[p], s.creditBytes)
		s.creditBytes -= readBytes
		s.n.metrics.scrubBytes.Add(float64(readBytes))
		if err != nil {
			s.n.log.Warn("scrub failed", "topic", p.topic.cfg.Name, "partition", p.id, "err", err)
		}
		if len(found) > 0 {
			s.n.metrics.scrubDamage.Add(float64(len(found)))
			p.store.foundDamage(found, 0)
		}
		s.from[p] = next
		if next == 0 { // this log is done for this round
			s.next++
		}
	}
	if len(s.from) > 2*len(parts) {
		clear(s.from) // partitions that went away
	}
}

// partitionsHeld lists the partitions whose log this node holds.
func (n *Node) partitionsHeld() []*partitionRunner { return n.partitionsWhere((*partitionRunner).held) }

// partitionsWhere returns the partitions of every topic for which keep
// holds, by topic name and partition.
func (n *Node) partitionsWhere(keep func(*partitionRunner) bool) []*partitionRunner {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []*partitionRunner
	for _, name := range slices.Sorted(maps.Keys(n.topics)) {
		for _, p := range n.topics[name].partitions {
			if keep(p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// Damaged describes every partition this node found damaged, one line
// each: "topic/partition: seqs A-B in FILE at offset N: cause".
func (n *Node) Damaged() []string {
	var out []string
	for _, p := range n.partitionsWhere(func(p *partitionRunner) bool { return p.damage.Load() != nil }) {
		switch d := p.damage.Load(); {
		case d.Segment == "": // not located (openDamaged)
			out = append(out, fmt.Sprintf("%s/%d: not opened: %s", p.topic.cfg.Name, p.id, d.Cause))
		default:
			out = append(out, fmt.Sprintf("%s/%d: seqs %d-%d in %s at offset %d: %s",
				p.topic.cfg.Name, p.id, d.FirstSeq, d.LastSeq, d.Segment, d.Offset, d.Cause))
		}
	}
	if n.cluster != nil {
		damaged := n.cluster.Damaged()
		for _, name := range slices.Sorted(maps.Keys(damaged)) {
			out = append(out, fmt.Sprintf("%s: not started on this node: %v", name, damaged[name]))
		}
	}
	return out
}

// PartitionState names a partition's state for people and scripts:
// "corrupt", "read_only" (its leader lost the ack quorum) or "ok".
func PartitionState(p wire.PartitionInfo) string {
	switch {
	case p.State == wire.PartitionStateCorrupt:
		return "corrupt"
	case p.ReadOnly:
		return "read_only"
	}
	return "ok"
}
