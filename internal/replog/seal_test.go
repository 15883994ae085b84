package replog

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
)

// IdleLogExpires across replicas: a leader that sealed its active segment
// because every record in it expired proposes a seal record, and each
// follower seals its own active segment before appending it — so that what
// follows (a dedup carry, a group's checkpoint, which compaction must keep)
// starts a segment on every replica, and the expired records before it can
// go everywhere. Here only n1, the preferred leader, compacts (the
// followers' own SealExpired would hide a missing seal): every replica
// ends with n1's segments, each seal record the first entry of one.
func TestLeadersSealStartsASegmentOnEveryReplica(t *testing.T) {
	g := newGroupWith(t, 3, func(c *Config) {
		c.Storage = storage.Options{RetentionAgeMs: 60_000}
		c.CompactEvery = time.Hour
		if c.ID == 1 {
			c.CompactEvery = 5 * time.Millisecond
		}
		c.PreferredLeader = 1
	})
	deadline := time.Now().Add(20 * time.Second)
	for g.leader().Status().ID != 1 {
		if time.Now().After(deadline) {
			t.Fatal("n1 never led")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var last uint64
	for i := range 20 {
		// Dated long ago: expired as soon as written.
		p := g.member(1).Propose(storage.Record{TimestampMs: 1, Value: fmt.Appendf(nil, "old-%d", i)})
		<-p.Done
		if p.Err != nil {
			t.Fatalf("record %d: %v", i, p.Err)
		}
		last = p.Seq
		time.Sleep(3 * time.Millisecond)
	}
	// n1 deletes what expired; the followers, which never compact, keep
	// every entry, seal records included.
	for g.member(1).ReadLog().StartSeq() <= last {
		if time.Now().After(deadline) {
			t.Fatalf("n1 never deleted its expired records: log start %d, last record %d", g.member(1).ReadLog().StartSeq(), last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	commit := g.member(1).CommitSeq()
	for _, id := range g.members {
		g.waitCommit(id, commit)
	}
	for _, id := range g.members[1:] {
		es, err := g.member(id).ReadLog().Read(1, 1000, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var seals []uint64
		for _, e := range es {
			if e.Seq <= commit && isSeal(&e.Record) {
				seals = append(seals, e.Seq)
			}
		}
		bases := segmentBases(t, g, id)
		if len(seals) == 0 || len(bases) <= len(seals) {
			t.Fatalf("n%d: seal records at %v, segments start at %v: want seals, each starting a segment", id, seals, bases)
		}
		for _, s := range seals {
			if !slices.Contains(bases, s) {
				t.Fatalf("n%d: seal record %d does not start a segment: segments start at %v, seals at %v", id, s, bases, seals)
			}
		}
	}
}

// segmentBases lists the base seqs of member id's segments, in order.
func segmentBases(t *testing.T, g *group, id replica.NodeID) []uint64 {
	t.Helper()
	names, err := g.fs.List(fmt.Sprintf("/n%d", id))
	if err != nil {
		t.Fatal(err)
	}
	var bases []uint64
	for _, n := range names {
		if base, ok := strings.CutSuffix(n, ".log"); ok {
			b, err := strconv.ParseUint(base, 10, 64)
			if err != nil {
				t.Fatalf("segment name %q: %v", n, err)
			}
			bases = append(bases, b)
		}
	}
	slices.Sort(bases)
	return bases
}
