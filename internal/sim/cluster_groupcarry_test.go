package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
)

// TestGroupKeptAcrossRetentionAtNodeLevel (GroupsKeptAcrossRetention): a
// group that stops acking for good does not pin its partition's log. The
// workload's topic keeps 4 KiB; once the group has acked, its consumers go
// away (cut off from every node) and the producers write on. Every node
// is then killed -9 and restarted — no group runner survives a restart,
// and none starts again without a consumer — so no runner writes the
// group's records any more: partition 0's leader must carry the group's
// checkpoint to the tail for the log to compact past everything the group
// had written, on every node. The consumers then come back and consume
// the rest (AckFloorNeverRedelivered and the other invariants after every
// event). With no-group-carry the log never passes the group's records.
func TestGroupKeptAcrossRetentionAtNodeLevel(t *testing.T) {
	runSeeds(t, groupKeptAcrossRetention)
	for _, seed := range portedSeeds {
		_, err := groupKeptAcrossRetention(seed, ClusterMutations["no-group-carry"])
		if err == nil {
			t.Errorf("no-group-carry, seed %d: the scenario passed", seed)
			continue
		}
		t.Logf("no-group-carry, seed %d: %s", seed, strings.SplitN(err.Error(), "\n", 2)[0])
	}
}

func groupKeptAcrossRetention(seed uint64, m node.Mutations) (Result, error) {
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 800, Retention: retentionOptions, Mutations: m})
	passed := false
	sc.when("the group acked", 10_000, func() bool { return sc.acksConfirmed >= 20 }, func() {
		for _, c := range sc.consumers {
			sc.partitioned[c.name()] = true
			for _, l := range c.lanes {
				if l.c != nil && l.c.open {
					l.c.breakConn("scenario: the group's consumers go away")
				}
			}
		}
		// A second and a half: the group's quiet checkpoints (1 s after
		// its last ack) are in the logs.
		sc.at(1500, func() {
			var written uint64 // partition 0's commit: the group wrote nothing past it
			for _, b := range sc.nodes {
				if p, ok := partitionOn(b, 0); ok {
					written = max(written, p.CommitSeq)
				}
			}
			last := sc.lastGroupRecord(0)
			if last == 0 {
				sc.fail("the group has no record in partition 0's log")
				return
			}
			sc.w.tracef("scenario: the group wrote nothing past %d of partition 0 (its last record at %d); kill -9 every node", written, last)
			for _, b := range sc.nodes {
				if b.up {
					b.crash()
				}
			}
			sc.when("partition 0 compacted past the group's records on every node", 30_000, func() bool {
				for _, b := range sc.nodes {
					if p, ok := partitionOn(b, 0); !ok || p.StartSeq <= written {
						return false
					}
				}
				return true
			}, func() {
				if sc.healed {
					// The run's healing brought the consumers back, whose
					// runners wrote the group's records again.
					sc.fail("partition 0 compacted past the group's records only once the run healed")
					return
				}
				passed = true
				for _, c := range sc.consumers {
					delete(sc.partitioned, c.name())
				}
			})
		})
	})
	r, err := sc.run()
	if err == nil && !passed {
		err = errors.New("partition 0 never compacted past the group's records")
	}
	return r, err
}

// lastGroupRecord is the seq of the latest record of a consumer group in
// partition p's log on its leader (0: none, or no leader).
func (sc *script) lastGroupRecord(p uint32) uint64 {
	b := sc.leaderOf(p)
	info, ok := partitionOn(b, p)
	if b == nil || !ok {
		return 0
	}
	var last uint64
	for from := max(info.StartSeq, 1); from <= info.CommitSeq; {
		es, err := b.node.Read(simTopic, p, from, 1000)
		if err != nil || len(es) == 0 {
			break
		}
		for _, e := range es {
			if len(e.Record.Headers) == 2 && e.Record.Headers[1].Key == "nereus-group" {
				last = e.Seq
			}
		}
		from = es[len(es)-1].Seq + 1
	}
	return last
}
