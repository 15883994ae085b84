package sim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// TestS6TailChasingEscalatesAtNodeLevel (S6 at node level: tail chasing
// that does not converge escalates to a rebuild). Partition 2's producer
// publishes fast (64 in flight) while the link from the partition's leader
// to one follower, C, is slow: it carries the partition's frames at 10
// bytes/ms through a queue that takes no more once it holds 4 KiB (a peer
// connection that cannot keep up: what does not fit is lost). C answers
// what reaches it, so the leader keeps hearing it, but its lag grows past
// an APPEND's worth (256 entries) and, over a chase window (ChaseTicks:
// 400 ms here) after the one that measured it, does not shrink. The
// leader then revokes C's
// reservation — asserted: reported NeedsRebuild while C's match is still
// above the snapshot point (or was a tick before), with C not silent —
// and compacts past C,
// which stays not silent until then (heard within the 600 ms ack timeout:
// inside its reservation by time, so only the chase watch let the leader
// compact). C rebuilds from the snapshot point
// (nereus_replication_rebuilds_total); the link is restored and C ends
// InSync, counted as a recovery by snapshot; one leader and epoch
// throughout, invariants after every event, every acknowledged record
// read back. Without the chase watch's revocation the run fails: C is
// never revoked.
func TestS6TailChasingEscalatesAtNodeLevel(t *testing.T) {
	for _, seed := range portedSeeds {
		st, err := tailChasingEscalates(seed)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		t.Logf("seed %d: %s", seed, st)
	}
}

// s6Stage is what one run of the S6 scenario saw.
type s6Stage struct {
	leader, chaser                string
	epoch                         uint64
	slowAtMs                      int64
	revokedAtMs                   int64
	revokedMatch, revokedLast     uint64 // C's match and the leader's last at the revocation
	revokedSnap                   uint64 // the leader's snapshot point then (below C's match)
	compactedAtMs                 int64
	compactedSnap, compactedMatch uint64 // the first snapshot point past C's match
	rebuiltAtMs, insyncAtMs       int64
	rebuilds                      float64 // C's rebuilds before the link was restored
	recoveredBySnapshot           int
}

func (st s6Stage) String() string {
	return fmt.Sprintf("%s leads epoch %d; %s's link slowed at %d ms; reservation revoked at %d ms (match %d, leader last %d: lag %d; snapshot point %d); compacted past it at %d ms (snapshot point %d, match %d); rebuilt (%v) by %d ms; link restored, InSync at %d ms; %d recoveries by snapshot",
		st.leader, st.epoch, st.chaser, st.slowAtMs, st.revokedAtMs, st.revokedMatch, st.revokedLast, st.revokedLast-st.revokedMatch, st.revokedSnap,
		st.compactedAtMs, st.compactedSnap, st.compactedMatch, st.rebuilds, st.rebuiltAtMs, st.insyncAtMs, st.recoveredBySnapshot)
}

// s6Retention: the reservation is 800 ms — longer than the leader's ack
// timeout (600 ms), so a follower reported not silent is inside its
// reservation by time: only the chase watch can revoke it. The chase
// window is 400 ms: the first after C falls behind measures its lag
// (ChaseFromABaseline), the second revokes, 800 ms after it fell behind —
// before the slow link, dropping what its queue cannot take, silences C.
var s6Retention = ClusterRetention{Bytes: 4096, SegmentBytesMax: 1024, RetentionCheckMs: 50, ReservationMs: 800, ChaseMs: 400}

// tailChasingEscalates runs S6 on one seed: what it saw, and what went
// wrong (nil).
func tailChasingEscalates(seed uint64) (s6Stage, error) {
	const p = uint32(2)
	const linkBytesPerMs, linkQueueBytesMax, linkPeriodMs = 10, 4096, 5
	sc := newScript(ClusterOptions{Seed: seed, MessagesPerProducer: 300, Retention: s6Retention})
	fast := sc.producers[p] // producers[i] publishes to partition i
	fast.window, fast.messagesMax = 64, 4000
	var st s6Stage
	var leader, chaser *broker
	var lid, cid uint32
	slow, silent := false, false
	var pump func()
	budget := 0
	pump = func() { // the slow link: linkBytesPerMs through a queue of linkQueueBytesMax
		if !slow {
			return
		}
		queued, kept := 0, 0
		for _, h := range sc.net.held {
			if queued >= linkQueueBytesMax {
				break // dropped: sent when the queue was full
			}
			queued += len(h.frame)
			kept++
		}
		sc.net.held = sc.net.held[:kept]
		budget += linkBytesPerMs * linkPeriodMs
		n := 0
		for _, h := range sc.net.held {
			if len(h.frame) > budget {
				break
			}
			budget -= len(h.frame)
			n++
		}
		if n == len(sc.net.held) {
			budget = 0 // an idle link saves nothing up
		}
		sc.net.release(func(heldFrame) bool { n--; return n >= 0 })
		sc.w.after(linkPeriodMs, pump)
	}
	// view is the leader's status and its view of C, failing the
	// scenario when the leader changed.
	lost := false
	view := func() (replica.Status, replica.PeerStatus, bool) {
		if lost {
			return replica.Status{}, replica.PeerStatus{}, false
		}
		var v node.ReplicaView
		ok := false
		if leader.up {
			v, ok = leader.node.Replica(simTopic, p)
		}
		if !ok || v.Status.Role != replica.Leader || v.Status.Hard.Promised != st.epoch {
			lost = true
			sc.fail("%s no longer leads partition %d in epoch %d: not tail chasing under one leader", leader.id, p, st.epoch)
			return replica.Status{}, replica.PeerStatus{}, false
		}
		for _, ps := range v.Status.Peers {
			if ps.ID == replica.NodeID(cid) {
				return v.Status, ps, true
			}
		}
		return replica.Status{}, replica.PeerStatus{}, false
	}
	// done is a when condition on the leader's view of C; it ends the
	// chain (held by lost) when the leader changed.
	done := func(cond func(replica.Status, replica.PeerStatus) bool) func() bool {
		return func() bool {
			leaderStatus, ps, ok := view()
			return lost || (ok && cond(leaderStatus, ps))
		}
	}
	sc.at(500, func() {
		if leader = sc.leaderOf(p); leader == nil {
			sc.fail("no leader of partition %d at 500 ms", p)
			return
		}
		v, _ := leader.node.Replica(simTopic, p)
		st.epoch = v.Status.Hard.Promised
		lid = uint32(slices.Index(sc.nodes, leader) + 1)
		// C is a follower that does not coordinate the groups (lead
		// partition 0): the coordinator reads partition 2 from its own
		// replica, so a starved coordinator also holds back delivery.
		cid = lid%3 + 1
		if coord := sc.leaderOf(0); coord == sc.nodes[cid-1] {
			cid = cid%3 + 1
		}
		chaser = sc.nodes[cid-1]
		st.leader, st.chaser, st.slowAtMs = leader.id, chaser.id, sc.w.nowMs-epochMs
		sc.w.tracef("scenario: %s's link to %s carries partition %d's frames at %d bytes/ms", leader.id, chaser.id, p, linkBytesPerMs)
		sc.net.hold = func(from, to uint32, f wire.Frame) bool {
			r, ok := f.(*wire.Replicate)
			return ok && r.Topic == simTopic && r.Partition == p && from == lid && to == cid
		}
		slow = true
		pump()
		// inLog: at the previous look (a tick before) the leader's log
		// still held C's match. The revocation and the compaction it
		// lets go can both land between two looks: C is then seen
		// NeedsRebuild with its match compacted already, right after a
		// look that found it in the log.
		inLog := false
		sc.when(chaser.id+"'s reservation revoked while it is heard", 10_000, done(func(l replica.Status, c replica.PeerStatus) bool {
			wasInLog := inLog
			inLog = c.Match >= l.SnapSeq
			if c.State != replica.NeedsRebuild || !(inLog || wasInLog) || c.Silent {
				return false
			}
			st.revokedAtMs, st.revokedMatch, st.revokedLast, st.revokedSnap = sc.w.nowMs-epochMs, c.Match, l.Last, l.SnapSeq
			return true
		}), func() {
			if lost {
				return
			}
			sc.when(leader.id+" compacted past "+chaser.id, 10_000, done(func(l replica.Status, c replica.PeerStatus) bool {
				if c.Silent && !silent {
					// Heard 600 ms ago or more: its reservation (800 ms)
					// may expire by time, not by the chase watch.
					silent = true
					sc.fail("%s went silent before %s compacted past it", chaser.id, leader.id)
				}
				if c.Match >= l.SnapSeq {
					return false
				}
				st.compactedAtMs, st.compactedSnap, st.compactedMatch = sc.w.nowMs-epochMs, l.SnapSeq, c.Match
				return true
			}), func() {
				if lost {
					return
				}
				sc.when(chaser.id+" rebuilt from the snapshot point", 10_000, done(func(replica.Status, replica.PeerStatus) bool {
					st.rebuilds = sc.metric(chaser, "nereus_replication_rebuilds_total", p)
					return st.rebuilds >= 1
				}), func() {
					if lost {
						return
					}
					st.rebuiltAtMs = sc.w.nowMs - epochMs
					slow = false
					sc.net.hold = nil
					sc.net.held = nil // lost with the slow connection
					sc.w.tracef("scenario: %s's link to %s restored", leader.id, chaser.id)
					sc.when(chaser.id+" InSync", 10_000, done(func(_ replica.Status, c replica.PeerStatus) bool {
						return c.State == replica.InSync
					}), func() { st.insyncAtMs = sc.w.nowMs - epochMs })
				})
			})
		})
	})
	r, err := sc.run()
	st.recoveredBySnapshot = r.Recoveries[RecoveredBySnapshot]
	switch {
	case err != nil:
	case st.insyncAtMs == 0:
		err = fmt.Errorf("the scenario did not finish: %s", st)
	case st.revokedLast-st.revokedMatch <= 256:
		err = fmt.Errorf("revoked with a lag of %d, within one APPEND: not tail chasing (%s)", st.revokedLast-st.revokedMatch, st)
	case st.recoveredBySnapshot == 0:
		err = fmt.Errorf("no lagging replica recovered by snapshot (%s)", st)
	}
	return st, err
}
