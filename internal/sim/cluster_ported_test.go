package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The scenarios of this file were real-time tests of internal/node
// (cluster_test.go) that tested protocol behaviour over real TCP and the
// wall clock. Here they run scripted on virtual time, over the cluster
// simulator's workload, with every invariant checked after every event
// and the run's liveness and final read-back phases after the script.

// portedSeeds are the seeds each ported scenario runs.
var portedSeeds = []uint64{1, 2, 3}

// script is a scripted scenario over a cluster run: steps scheduled on
// virtual time, and the failures of its own assertions (the invariants'
// are the run's violation).
type script struct {
	*sim
	failures []string
}

func newScript(o ClusterOptions) *script { return &script{sim: newClusterSim(o)} }

func (sc *script) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	sc.failures = append(sc.failures, fmt.Sprintf("t=%dms: %s", sc.w.nowMs-epochMs, msg))
	sc.w.tracef("scenario FAIL: %s", msg)
}

// at runs step ms from now; the run does not end before it ran.
func (sc *script) at(ms int64, step func()) {
	sc.scriptSteps++
	sc.w.after(ms, func() {
		sc.scriptSteps--
		step()
	})
}

// when runs then at the first event boundary (checked every tick) at
// which cond holds, or fails with what if that takes over withinMs.
func (sc *script) when(what string, withinMs int64, cond func() bool, then func()) {
	deadline := sc.w.nowMs + withinMs
	var check func()
	check = func() {
		switch {
		case cond():
			sc.w.tracef("scenario: %s", what)
			then()
		case sc.w.nowMs > deadline:
			sc.fail("not within %dms: %s", withinMs, what)
		default:
			sc.at(tickMs, check)
		}
	}
	sc.at(0, check)
}

// run runs the phases and returns what went wrong: the invariant broken,
// or the script's failed assertions.
func (sc *script) run() (Result, error) {
	r := sc.runPhases()
	problems := sc.failures // a failed step first: a broken invariant may follow from it
	if r.Violation != nil {
		problems = append(problems, r.Violation.String())
	}
	if len(problems) > 0 {
		return r, fmt.Errorf("%s\ntrace tail:\n%s", strings.Join(problems, "\n"), strings.Join(r.Tail, "\n"))
	}
	return r, nil
}

// holdDown kills b -9 and keeps it down until bringBack.
func (sc *script) holdDown(b *broker) {
	b.stopRestarts = true
	b.crash()
}

func (sc *script) bringBack(b *broker) {
	b.stopRestarts = false
	b.start()
}

// others are the nodes but b.
func (sc *script) others(b *broker) []*broker {
	return slices.DeleteFunc(slices.Clone(sc.nodes), func(o *broker) bool { return o == b })
}

// partitionOn is partition p of the topic as up node b reports it.
func partitionOn(b *broker, p uint32) (wire.PartitionInfo, bool) {
	if !b.up {
		return wire.PartitionInfo{}, false
	}
	for _, t := range b.node.Metadata([]string{simTopic}) {
		if int(p) < len(t.Partitions) {
			return t.Partitions[p], true
		}
	}
	return wire.PartitionInfo{}, false
}

// metric is b's metric name for partition p of the topic, as scraped.
func (sc *script) metric(b *broker, name string, p uint32) float64 {
	v, err := b.node.Metrics().PartitionValue(name, simTopic, p)
	if err != nil {
		sc.fail("scrape %s: %v", b.id, err)
	}
	return v
}

// readsBackAcked checks that b serves every acknowledged record of
// partition p at or below its commit, with its content.
func (sc *script) readsBackAcked(b *broker, p uint32) {
	info, _ := partitionOn(b, p)
	got := map[uint64]string{}
	for from := max(info.StartSeq, 1); from <= info.CommitSeq; {
		entries, err := b.node.Read(simTopic, p, from, 256)
		if err != nil || len(entries) == 0 {
			sc.fail("%s: partition %d unreadable at %d (commit %d): %v", b.id, p, from, info.CommitSeq, err)
			return
		}
		for _, e := range entries {
			got[e.Seq] = string(e.Record.Value)
		}
		from = entries[len(entries)-1].Seq + 1
	}
	for pos, k := range sc.chk.ackedAt {
		if pos.partition == p && pos.seq >= info.StartSeq && pos.seq <= info.CommitSeq && got[pos.seq] != sc.chk.acked[k].value {
			sc.fail("%s serves %q at %s, acknowledged as %q", b.id, got[pos.seq], pos, sc.chk.acked[k].value)
		}
	}
}

// ackedAbove counts acknowledged records of partition p above seq.
func (sc *script) ackedAbove(p uint32, seq uint64) int {
	n := 0
	for pos := range sc.chk.ackedAt {
		if pos.partition == p && pos.seq > seq {
			n++
		}
	}
	return n
}

// runSeeds runs scenario on every ported seed.
func runSeeds(t *testing.T, scenario func(seed uint64, m node.Mutations) (Result, error)) {
	t.Helper()
	for _, seed := range portedSeeds {
		r, err := scenario(seed, node.Mutations{})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		t.Logf("seed %d: %d events, %d virtual ms, %d acked, %d deliveries", seed, r.Events, r.VirtualMs, r.Acked, r.Deliveries)
	}
}

// TestQuorumLossIsReadOnlyAtNodeLevel (was TestClusterQuorumLossIsReadOnly):
// with two of three nodes down, partition 0's leader turns ReadOnly (in
// METADATA and in nereus_partition_read_only) while it still leads; it
// refuses its producers' writes with QUORUM_LOST and acknowledges none,
// and still serves every acknowledged record of the visible prefix. Once
// the nodes return the run heals and every acknowledged record is read
// back.
func TestQuorumLossIsReadOnlyAtNodeLevel(t *testing.T) { runSeeds(t, quorumLossIsReadOnly) }

func quorumLossIsReadOnly(seed uint64, m node.Mutations) (Result, error) {
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 200, Mutations: m})
	sc.at(800, func() {
		leader := sc.leaderOf(0)
		if leader == nil {
			sc.fail("no leader of partition 0 at 800 ms")
			return
		}
		sc.w.tracef("scenario: %s leads partition 0; the others go down", leader.id)
		others := sc.others(leader)
		for _, o := range others {
			sc.holdDown(o)
		}
		sc.when("the leader turns ReadOnly", 5_000, func() bool {
			p, ok := partitionOn(leader, 0)
			return ok && p.ReadOnly
		}, func() {
			p, _ := partitionOn(leader, 0)
			if p.Leader != leader.id {
				sc.fail("the degraded leader names %q as leader", p.Leader)
			}
			if v := sc.metric(leader, "nereus_partition_read_only", 0); v != 1 {
				sc.fail("nereus_partition_read_only = %v on the degraded leader", v)
			}
			if v := sc.metric(leader, "nereus_partition_leader", 0); v != 1 {
				sc.fail("nereus_partition_leader = %v on the degraded leader", v)
			}
			sc.readsBackAcked(leader, 0)
			commit, refused := p.CommitSeq, sc.pubErrors[wire.CodeQuorumLost]
			sc.at(1_000, func() {
				p, _ := partitionOn(leader, 0)
				switch {
				case !p.ReadOnly:
					sc.fail("the leader left ReadOnly with two of three nodes down")
				case p.CommitSeq != commit:
					sc.fail("commit moved from %d to %d with two of three nodes down", commit, p.CommitSeq)
				case sc.ackedAbove(0, commit) > 0:
					sc.fail("%d publishes above %d acknowledged with two of three nodes down", sc.ackedAbove(0, commit), commit)
				case sc.pubErrors[wire.CodeQuorumLost] == refused:
					sc.fail("no publish was refused with QUORUM_LOST in a second of ReadOnly")
				}
				sc.readsBackAcked(leader, 0)
				for _, o := range others {
					sc.bringBack(o)
				}
			})
		})
	})
	return sc.run()
}

// TestAcksSurviveCoordinatorFailoverAtNodeLevel (was
// TestClusterAcksSurviveCoordinatorFailover): each partition's leader
// delivers it to the group (a subscription at any node holding the topic
// is accepted, and gets the partitions that node leads); the group's acks
// of partition 0 are committed in partition 0's log, so when its leader is
// killed -9 the next leader delivers what was not acked — every record
// delivered but unacked at the crash is acked after it — and never
// redelivers what was (AckFloorNeverRedelivered, checked on every MSG the
// nodes send).
func TestAcksSurviveCoordinatorFailoverAtNodeLevel(t *testing.T) {
	runSeeds(t, acksSurviveCoordinatorFailover)
}

func acksSurviveCoordinatorFailover(seed uint64, m node.Mutations) (Result, error) {
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 200, Mutations: m})
	var unackedAtCrash []position
	sc.at(1_000, func() {
		coordinator := sc.leaderOf(0)
		if coordinator == nil {
			sc.fail("no leader of partition 0 at 1 s")
			return
		}
		for _, o := range sc.others(coordinator) {
			sub, err := o.node.Subscribe(simTopic, simGroup, node.GroupOptions{}, nopSink{})
			if err != nil {
				sc.fail("subscribe on %s, which does not lead partition 0: %v, want a subscription", o.id, err)
				continue
			}
			sub.Close()
		}
		if sc.acksConfirmed == 0 {
			sc.fail("no ack confirmed before the coordinator's crash")
		}
		for pos := range sc.chk.seen {
			if !sc.chk.groupDone[pos] {
				unackedAtCrash = append(unackedAtCrash, pos)
			}
		}
		confirmed := sc.acksConfirmed
		sc.w.tracef("scenario: kill -9 %s, the coordinator (%d acks confirmed, %d delivered unacked)", coordinator.id, confirmed, len(unackedAtCrash))
		sc.holdDown(coordinator)
		sc.when("another node leads partition 0 and acks are confirmed", 10_000, func() bool {
			l := sc.leaderOf(0)
			return l != nil && l != coordinator && sc.acksConfirmed > confirmed
		}, func() { sc.bringBack(coordinator) })
	})
	r, err := sc.run()
	if err == nil && len(unackedAtCrash) == 0 {
		err = errors.New("nothing was delivered and unacked at the crash: no redelivery tested")
	}
	for _, pos := range unackedAtCrash {
		if err == nil && !sc.chk.groupDone[pos] && !sc.chk.compacted(pos) {
			err = fmt.Errorf("%s, delivered but unacked at the crash, was never acked after it", pos)
		}
	}
	return r, err
}

// TestAcksDuringQuorumLossAreRetriedDurablyAtNodeLevel (was
// TestClusterAcksDuringQuorumLossAreRetriedDurably): with both followers
// of partition 0 down the coordinator refuses acks with QUORUM_LOST and
// confirms none (they cannot commit in partition 0's log); once one
// follower returns the consumers' repeated acks are committed and
// confirmed; with the second back and caught up, the coordinator is killed
// -9 and its successor never redelivers a confirmed ack.
func TestAcksDuringQuorumLossAreRetriedDurablyAtNodeLevel(t *testing.T) {
	runSeeds(t, acksDuringQuorumLossAreRetriedDurably)
}

func acksDuringQuorumLossAreRetriedDurably(seed uint64, m node.Mutations) (Result, error) {
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 200, Mutations: m})
	sc.at(800, func() {
		coordinator := sc.leaderOf(0)
		if coordinator == nil {
			sc.fail("no leader of partition 0 at 800 ms")
			return
		}
		others := sc.others(coordinator)
		sc.w.tracef("scenario: %s coordinates; %s and %s go down", coordinator.id, others[0].id, others[1].id)
		for _, o := range others {
			sc.holdDown(o)
		}
		sc.when("the coordinator turns ReadOnly", 5_000, func() bool {
			p, ok := partitionOn(coordinator, 0)
			return ok && p.ReadOnly
		}, func() {
			confirmed, refused := sc.acksConfirmed, sc.ackErrors[wire.CodeQuorumLost]
			sc.at(1_000, func() {
				if sc.acksConfirmed != confirmed {
					sc.fail("%d acks confirmed while partition 0 had no quorum", sc.acksConfirmed-confirmed)
				}
				if sc.ackErrors[wire.CodeQuorumLost] == refused {
					sc.fail("no ack refused with QUORUM_LOST in a second without quorum")
				}
				sc.bringBack(others[0])
				sc.when("a repeated ack is confirmed with one follower back", 10_000, func() bool {
					return sc.acksConfirmed > confirmed
				}, func() {
					sc.bringBack(others[1])
					sc.when(others[1].id+" caught up", 10_000, func() bool {
						p, ok := partitionOn(others[1], 0)
						c, _ := partitionOn(coordinator, 0)
						return ok && p.CommitSeq >= c.CommitSeq
					}, func() {
						sc.w.tracef("scenario: kill -9 %s, the coordinator", coordinator.id)
						coordinator.crash()
					})
				})
			})
		})
	})
	return sc.run()
}

// TestFollowerNamesNoLeaderItNoLongerHearsAtNodeLevel (was
// TestClusterFollowerNamesNoLeaderItNoLongerHears): a follower that no
// longer hears partition 0's leader stops pointing clients at it — in
// METADATA and in NOT_LEADER — when the leader and the third node go down
// (no quorum is left to elect another).
func TestFollowerNamesNoLeaderItNoLongerHearsAtNodeLevel(t *testing.T) {
	runSeeds(t, followerNamesNoLeaderItNoLongerHears)
}

func followerNamesNoLeaderItNoLongerHears(seed uint64, m node.Mutations) (Result, error) {
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 100, Mutations: m})
	sc.at(800, func() {
		leader := sc.leaderOf(0)
		if leader == nil {
			sc.fail("no leader of partition 0 at 800 ms")
			return
		}
		var survivor *broker
		sc.when("a follower names the leader it hears", 5_000, func() bool {
			for _, o := range sc.others(leader) {
				if p, ok := partitionOn(o, 0); ok && p.Leader == leader.id && p.LeaderAddr == leader.id {
					survivor = o
					return true
				}
			}
			return false
		}, func() {
			down := sc.others(survivor)
			sc.w.tracef("scenario: %s and %s go down; %s survives", down[0].id, down[1].id, survivor.id)
			for _, o := range down {
				sc.holdDown(o)
			}
			sc.when(survivor.id+" stops naming the dead leader", 5_000, func() bool {
				p, ok := partitionOn(survivor, 0)
				return ok && p.Leader == "" && p.LeaderAddr == ""
			}, func() {
				survivor.node.Publish(&wire.Pub{Topic: simTopic, Partition: 0, ProducerID: 7, ProducerSeq: 1, Value: []byte("b")},
					func(_ wire.PubOK, err *wire.Error) {
						if err == nil || err.Code != wire.CodeNotLeader || strings.Contains(err.Message, leader.id) {
							sc.fail("publish on the survivor = %v; want NOT_LEADER naming no leader", err)
						}
						for _, o := range down {
							sc.bringBack(o)
						}
					})
			})
		})
	})
	return sc.run()
}

// TestLeaderReportsAStoppedFollowerUnreachableAtNodeLevel (was
// TestClusterLeaderReportsAStoppedFollowerUnreachable): partition 0's
// leader reports a follower it no longer hears as Unreachable, not with
// the state it last had, while the other stays InSync; once the follower
// is back it is InSync again.
func TestLeaderReportsAStoppedFollowerUnreachableAtNodeLevel(t *testing.T) {
	runSeeds(t, leaderReportsAStoppedFollowerUnreachable)
}

func leaderReportsAStoppedFollowerUnreachable(seed uint64, m node.Mutations) (Result, error) {
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 100, Mutations: m})
	// states are the replica states of partition 0 as its leader reports them.
	states := func() map[string]string {
		out := map[string]string{}
		if l := sc.leaderOf(0); l != nil {
			p, _ := partitionOn(l, 0)
			for _, r := range p.Replicas {
				out[r.Node] = r.State
			}
		}
		return out
	}
	allInSync := func() bool {
		s := states()
		return len(s) == 3 && s["n1"] == "InSync" && s["n2"] == "InSync" && s["n3"] == "InSync"
	}
	sc.at(500, func() {
		sc.when("every replica InSync", 5_000, allInSync, func() {
			leader := sc.leaderOf(0)
			stopped := sc.others(leader)[0]
			sc.holdDown(stopped)
			sc.when(stopped.id+" reported Unreachable, the other InSync", 5_000, func() bool {
				s := states()
				for id, state := range s {
					if (id == stopped.id) != (state == node.ReplicaUnreachable) || (id != stopped.id && state != "InSync") {
						return false
					}
				}
				return len(s) == 3 && sc.leaderOf(0) == leader
			}, func() {
				sc.bringBack(stopped)
				sc.when("every replica InSync again", 10_000, allInSync, func() {})
			})
		})
	})
	return sc.run()
}

// retentionOptions give partition logs a 4 KiB retention over 1 KiB
// segments, retention passes every 20 ms and a 200 ms reservation, so a
// follower away for a few hundred ms must rebuild (the soaks' preset).
var retentionOptions = RetentionPreset

// TestRetentionRebuildsALaggingReplicaAtNodeLevel (was
// TestClusterRetentionRebuildsALaggingReplica): a follower of partition 0
// is down while the leader compacts past its log end (its reservation
// expired); back, it rebuilds from the leader's snapshot point
// (nereus_replication_rebuilds_total) and catches up, starting after that
// point. The third node restarts (its dedup table rebuilt from its own
// compacted log), then the leader is killed -9: replays of acknowledged
// publishes at the new leader get their original seq, or
// PRODUCER_SEQ_TOO_OLD where its kept log no longer proves them — never a
// second append (NoDuplicateFromReplay, and the final read-back).
func TestRetentionRebuildsALaggingReplicaAtNodeLevel(t *testing.T) {
	runSeeds(t, retentionRebuildsALaggingReplica)
}

func retentionRebuildsALaggingReplica(seed uint64, m node.Mutations) (Result, error) {
	// Without dedup snapshots: a restarted replica's snapshot remembers
	// the compacted records, so its table needs no seal; the scenario is
	// about the tables that lost them (rebuilt, or replayed from the
	// compacted log).
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 400, Retention: retentionOptions, Mutations: m, NoDedupSnapshots: true})
	answered := 0
	sc.at(300, func() {
		leader := sc.leaderOf(0)
		if leader == nil {
			sc.fail("no leader of partition 0 at 300 ms")
			return
		}
		lagger, third := sc.others(leader)[0], sc.others(leader)[1]
		v, _ := lagger.node.Replica(simTopic, 0)
		lagEnd := v.Status.Last
		sc.w.tracef("scenario: %s (log end %d) goes down", lagger.id, lagEnd)
		sc.holdDown(lagger)
		sc.when(fmt.Sprintf("%s compacted past %d", leader.id, lagEnd), 20_000, func() bool {
			v, ok := leader.node.Replica(simTopic, 0)
			return ok && v.Status.SnapSeq > lagEnd
		}, func() {
			sc.bringBack(lagger)
			sc.when(lagger.id+" rebuilt and caught up", 10_000, func() bool {
				p, ok := partitionOn(lagger, 0)
				l, _ := partitionOn(leader, 0)
				return ok && sc.metric(lagger, "nereus_replication_rebuilds_total", 0) >= 1 && p.CommitSeq >= l.CommitSeq && p.CommitSeq > 0
			}, func() {
				if p, _ := partitionOn(lagger, 0); p.StartSeq <= lagEnd+1 {
					sc.fail("rebuilt %s starts at %d, not after the snapshot point (its log ended at %d)", lagger.id, p.StartSeq, lagEnd)
				}
				sc.readsBackAcked(lagger, 0)
				third.crash()
				sc.when(third.id+" back and caught up", 10_000, func() bool {
					p, ok := partitionOn(third, 0)
					l, _ := partitionOn(leader, 0)
					return ok && p.CommitSeq >= l.CommitSeq && p.CommitSeq > 0
				}, func() {
					sc.w.tracef("scenario: kill -9 %s, the leader", leader.id)
					leader.crash()
					sc.when("a new leader of partition 0", 10_000, func() bool {
						l := sc.leaderOf(0)
						return l != nil && l != leader
					}, func() { sc.replayAcked(sc.producers[0], &answered) })
				})
			})
		})
	})
	r, err := sc.run()
	if err == nil && answered != 5 {
		err = fmt.Errorf("%d of 5 replays answered", answered)
	}
	return r, err
}

// replayAcked publishes again, at partition 0's leader, acknowledged
// records of producer p (its first two, middle and last two so far): each
// answer must be a duplicate naming the original position (the checker's
// NoDuplicateFromReplay) or PRODUCER_SEQ_TOO_OLD; a retryable refusal is
// retried. answered counts the answers.
func (sc *script) replayAcked(p *producer, answered *int) {
	var seqs []uint64
	for k := range sc.chk.acked {
		if k.producerID == p.id {
			seqs = append(seqs, k.producerSeq)
		}
	}
	slices.Sort(seqs)
	if len(seqs) < 5 {
		sc.fail("only %d acknowledged records of %s to replay", len(seqs), p.name())
		return
	}
	n := len(seqs)
	for _, seq := range []uint64{seqs[0], seqs[1], seqs[n/2], seqs[n-2], seqs[n-1]} {
		sc.replay(p, seq, answered)
	}
}

func (sc *script) replay(p *producer, seq uint64, answered *int) {
	b := sc.leaderOf(0)
	if b == nil {
		sc.at(20, func() { sc.replay(p, seq, answered) })
		return
	}
	value := sc.chk.acked[prodKey{p.id, seq}].value
	sc.w.tracef("scenario: %s replays %s seq %d", b.id, p.name(), seq)
	sc.scriptSteps++ // until answered
	b.node.Publish(&wire.Pub{Topic: simTopic, Partition: 0, ProducerID: p.id, ProducerSeq: seq, Value: []byte(value)},
		func(ok wire.PubOK, err *wire.Error) {
			sc.scriptSteps--
			switch {
			case err != nil && err.Code.Retryable():
				sc.at(20, func() { sc.replay(p, seq, answered) })
				return
			case err == nil && !ok.Duplicate:
				sc.fail("replay of %s seq %d appended again at %d", p.name(), seq, ok.Seq)
			case err == nil:
				sc.chk.publishAcked(p.id, seq, value, &ok)
			case err.Code != wire.CodeProducerSeqTooOld:
				sc.fail("replay of %s seq %d: %v", p.name(), seq, err)
			}
			*answered++
		})
}

// TestPortedScenariosCatchKernelMutations (was
// TestClusterTestsCatchKernelMutations for these scenarios): the kernels'
// guards are load-bearing at node level — with the mutation on, the
// scenario named for it fails on every seed.
func TestPortedScenariosCatchKernelMutations(t *testing.T) {
	for _, c := range []struct {
		mutation string
		scenario func(uint64, node.Mutations) (Result, error)
	}{
		{"ack-before-commit", acksDuringQuorumLossAreRetriedDurably},
		{"skip-dedup-seal", retentionRebuildsALaggingReplica},
	} {
		for _, seed := range portedSeeds {
			_, err := c.scenario(seed, ClusterMutations[c.mutation])
			if err == nil {
				t.Errorf("mutation %s, seed %d: the scenario passed", c.mutation, seed)
				continue
			}
			t.Logf("mutation %s, seed %d: %s", c.mutation, seed, strings.SplitN(err.Error(), "\n", 2)[0])
		}
	}
}

// TestGroupAcksOutliveRetentionAtNodeLevel (was
// TestClusterGroupAcksOutliveRetention): a group's acks live in partition
// 0's log, so retention compacts partition 0 no further than the oldest
// record the group still needs — its first ack record while it has no
// checkpoint (checked on every node after every tick until the run ends),
// later its latest checkpoint (partition 0 then compacts past the first
// ack). The coordinator is killed -9 once partition 0 has compacted; the
// next one, loading from what partition 0 kept, never redelivers an acked
// record (AckFloorNeverRedelivered) and delivers the rest (liveness).
// The consumers join at 600 ms, so partition 0 holds records to compact
// before the group's first ack; partition 1's producer is quiet from 150
// ms until the crash, so partition 1 still holds the records acked early
// (a coordinator that lost their acks would redeliver them).
func TestGroupAcksOutliveRetentionAtNodeLevel(t *testing.T) {
	for _, checkpoints := range []bool{false, true} {
		t.Run(fmt.Sprint("checkpoints=", checkpoints), func(t *testing.T) {
			runSeeds(t, func(seed uint64, m node.Mutations) (Result, error) {
				return groupAcksOutliveRetention(seed, m, checkpoints)
			})
		})
	}
}

func groupAcksOutliveRetention(seed uint64, m node.Mutations, checkpoints bool) (Result, error) {
	o := ClusterOptions{Seed: seed, MessagesPerProducer: 400, Retention: retentionOptions, LedgerCompactBytes: -1, Mutations: m}
	if checkpoints {
		o.LedgerCompactBytes = 100 // a checkpoint after every ack record or two
	}
	sc := newScript(o)
	for _, c := range sc.consumers {
		sc.partitioned[c.name()] = true
	}
	sc.at(600, func() {
		for _, c := range sc.consumers {
			delete(sc.partitioned, c.name())
		}
	})
	// Partition 1's producer stops at 150 ms until the coordinator's crash,
	// so partition 1 keeps the records the group acked early while
	// partition 0 compacts past their ack records.
	quiet := sc.producers[1]
	sc.at(150, func() {
		sc.partitioned[quiet.name()] = true
		if quiet.c != nil && quiet.c.open {
			quiet.c.breakConn("scenario: partition 1 goes quiet")
		}
	})
	var ackAt uint64 // the group's first ack record is at or below it
	// snapped is the highest snapshot point of partition 0 on any node.
	snapped := func() uint64 {
		var most uint64
		for _, b := range sc.nodes {
			if !b.up {
				continue
			}
			if v, ok := b.node.Replica(simTopic, 0); ok {
				most = max(most, v.Status.SnapSeq)
			}
		}
		return most
	}
	var crashed bool
	sc.when("the group's first ack is confirmed", 10_000, func() bool { return sc.acksConfirmed > 0 }, func() {
		l := sc.leaderOf(0)
		if l == nil {
			sc.fail("no coordinator when the first ack was confirmed")
			return
		}
		p, _ := partitionOn(l, 0)
		ackAt = p.CommitSeq
		if !checkpoints {
			var watch func()
			watch = func() {
				if snap := snapped(); snap >= ackAt {
					sc.fail("partition 0 compacted through %d, past the group's only ack records (the first at or below %d)", snap, ackAt)
					return
				}
				if !sc.healed || !sc.producersDone() {
					sc.w.after(tickMs, watch) // the run's end does not wait for it
				}
			}
			watch()
		}
		sc.when("partition 0 compacted", 20_000, func() bool {
			snap := snapped()
			return snap > 0 && (!checkpoints || snap >= ackAt)
		}, func() {
			coordinator := sc.leaderOf(0)
			if coordinator == nil {
				sc.fail("no coordinator once partition 0 compacted")
				return
			}
			sc.w.tracef("scenario: partition 0 compacted through %d (first ack at or below %d); kill -9 %s, the coordinator", snapped(), ackAt, coordinator.id)
			coordinator.crash()
			crashed = true
			delete(sc.partitioned, quiet.name())
		})
	})
	r, err := sc.run()
	if err == nil && !crashed {
		err = errors.New("the coordinator was never killed")
	}
	return r, err
}
