package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/wire"
)

// TestSchedOwnerDrainsBeforeAHandOff (issue 14, "Drain and takeover"):
// shard 0's preferred leader P is killed -9 and kept down until another
// node owns the shard, then restarted; once it has kept up, leadership
// goes back to it by a planned hand-off while schedules keep falling
// due. The owner being handed off drains first — no new claims, its
// publishes and FIRED records in flight finished — so no later owner
// publishes again a fire sequence first published after P's restart (an
// owner retrying its own publish, in its own epoch, is not counted). (The kill itself strands intents: those the next owner
// publishes again are not counted.) TransferWithoutRelease, which starts
// the hand-off without the drain, fences the owner mid-flight and makes
// its successor publish again (seed 2).
func TestSchedOwnerDrainsBeforeAHandOff(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		st, err := schedHandOff(seed, node.Mutations{})
		if err != "" {
			t.Fatalf("seed %d: %s", seed, err)
		}
		if st.republished != 0 {
			t.Fatalf("seed %d: %d fire sequences first published after the restart were published again (%s)", seed, st.republished, st)
		}
		if len(st.handOffs) == 0 || slices.ContainsFunc(st.handOffs, func(l sched.Lifecycle) bool { return l != sched.Unassigned }) {
			t.Fatalf("seed %d: a hand-off started while the owner had not released the shard (%s)", seed, st)
		}
		t.Logf("seed %d: %s", seed, st)
	}
	st, err := schedHandOff(2, node.Mutations{Replica: replica.Mutations{TransferWithoutRelease: true}})
	if err != "" {
		t.Fatalf("mutated: %s", err)
	}
	if !slices.ContainsFunc(st.handOffs, func(l sched.Lifecycle) bool { return l != sched.Unassigned }) {
		t.Fatalf("mutated (TransferWithoutRelease): every hand-off found the shard released; the test no longer proves the drain (%s)", st)
	}
	t.Logf("mutated: %s", st)
}

// schedHandOffRun is what one run of the script saw (virtual ms).
type schedHandOffRun struct {
	preferred                  string
	killedAtMs, restartedAtMs  int64
	returnedAtMs               int64
	publishedAfterRestart      int
	republished                int
	publishedAroundTheHandOffs int // in the 200 ms before the hand-back
	// handOffs: the owner's lifecycle on the handing node when its
	// shard-0 replica started each hand-off (TransferTo set).
	handOffs []sched.Lifecycle
}

func (r schedHandOffRun) String() string {
	return fmt.Sprintf("%s killed at %d ms, restarted at %d ms, owns shard 0 again at %d ms; owner at each hand-off %v; %d publishes after the restart (%d in the 200 ms before the hand-back), %d published again",
		r.preferred, r.killedAtMs, r.restartedAtMs, r.returnedAtMs, r.handOffs, r.publishedAfterRestart, r.publishedAroundTheHandOffs, r.republished)
}

// schedHandOff runs the script on one seed; it returns what it saw and
// the run's violation ("" when none).
func schedHandOff(seed uint64, mut node.Mutations) (schedHandOffRun, string) {
	const shard = uint32(0)
	s := newClusterSim(ClusterOptions{Seed: seed, Producers: 1, MessagesPerProducer: 50, Consumers: 1, Schedules: 150, Mutations: mut})
	st := schedHandOffRun{killedAtMs: -1, restartedAtMs: -1, returnedAtMs: -1}
	type fireKey struct {
		shard     uint32
		topic     string
		partition uint32
		fireSeq   uint64
	}
	t0 := s.w.nowMs
	now := func() int64 { return s.w.nowMs - t0 }
	type first struct {
		atMs  int64
		epoch uint64
	}
	firstAt := map[fireKey]first{}
	var pubTimes []int64
	s.schedPublished = func(b *broker, sh uint32, p sched.Publish) {
		k := fireKey{sh, p.Topic, p.Partition, p.FireSeq}
		f, seen := firstAt[k]
		if !seen {
			firstAt[k] = first{now(), p.Epoch}
		}
		if st.restartedAtMs < 0 || sh != shard || st.returnedAtMs >= 0 && now() > st.returnedAtMs+2000 {
			return // before the restart, another shard, or past the hand-back (the final power loss strands intents too)
		}
		if seen && f.atMs >= st.restartedAtMs && p.Epoch != f.epoch {
			st.republished++
			s.w.tracef("scenario: %s publishes %v again", b.id, k)
		}
		if !seen {
			st.publishedAfterRestart++
			pubTimes = append(pubTimes, now())
		}
	}
	var pref *broker
	owner := func() *broker {
		for _, b := range s.nodes {
			if !b.up {
				continue
			}
			if v, ok := b.node.Replica(wire.SchedTopic, shard); ok && v.Status.Role == replica.Leader && v.Status.CommitSeq >= installOf(v.Status) {
				return b
			}
		}
		return nil
	}
	handing := map[string]bool{}
	var watch func()
	watch = func() {
		if st.returnedAtMs >= 0 || now() > 20_000 {
			return
		}
		s.w.after(1, watch)
		for _, b := range s.nodes {
			if !b.up {
				continue
			}
			v, ok := b.node.Replica(wire.SchedTopic, shard)
			if !ok || v.Status.Role != replica.Leader || v.Status.TransferTo == 0 {
				handing[b.id] = false
				continue
			}
			if !handing[b.id] {
				handing[b.id] = true
				for _, sv := range b.node.SchedViews() {
					if sv.Shard == shard {
						st.handOffs = append(st.handOffs, sv.Lifecycle)
					}
				}
			}
		}
		if o := owner(); st.restartedAtMs >= 0 && o == pref {
			st.returnedAtMs = now()
			for _, at := range pubTimes {
				if at >= st.returnedAtMs-200 {
					st.publishedAroundTheHandOffs++
				}
			}
			s.w.tracef("scenario: %s owns shard %d again", pref.id, shard)
		}
	}
	s.w.after(800, func() {
		for _, b := range s.nodes {
			for _, tp := range b.node.Metadata([]string{wire.SchedTopic}) {
				if pref == nil && len(tp.Partitions) > int(shard) && len(tp.Partitions[shard].Replicas) > 0 {
					id := tp.Partitions[shard].Replicas[0].Node
					pref = s.nodes[slices.IndexFunc(s.nodes, func(n *broker) bool { return n.id == id })]
				}
			}
		}
		if pref == nil || owner() != pref {
			return // reported below
		}
		st.preferred = pref.id
		st.killedAtMs = now()
		s.w.tracef("scenario: kill -9 %s, shard %d's preferred leader, until another node owns the shard", pref.id, shard)
		pref.stopRestarts = true
		pref.crash()
		var restart func()
		restart = func() {
			if o := owner(); o == nil || o == pref {
				s.w.after(10, restart)
				return
			}
			s.w.after(500, func() {
				pref.stopRestarts = false
				pref.start()
				st.restartedAtMs = now()
				s.w.tracef("scenario: %s restarted", pref.id)
				watch()
			})
		}
		restart()
	})
	r := s.runPhases()
	switch {
	case r.Violation != nil:
		return st, fmt.Sprintf("%v\ntrace tail:\n%v", r.Violation, r.Tail)
	case st.killedAtMs < 0:
		return st, fmt.Sprintf("shard %d's preferred leader did not own it at 800 ms", shard)
	case st.returnedAtMs < 0:
		return st, fmt.Sprintf("shard %d never went back to its preferred leader (%s)", shard, st)
	case st.publishedAfterRestart == 0:
		return st, fmt.Sprintf("nothing was published after the restart: the hand-back had nothing to drain (%s)", st)
	}
	return st, ""
}
