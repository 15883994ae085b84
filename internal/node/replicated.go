package node

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// replState is what the replicated loop of one partition owns. The dedup
// table is derived state: every replica applies the committed entries to
// it in log order, so a new leader already knows what its predecessors
// appended and a producer's retry gets its original PUB_OK.
type replState struct {
	producers *partition.Producers
	applied   uint64 // last committed entry applied to producers
	// truncated: the entries before the log's start are gone (retention,
	// or a rebuild from the leader's snapshot point), so the dedup table
	// knows only what came after; it is sealed before this member takes
	// publishes (sealedEpoch: the epoch it was last sealed for).
	truncated   bool
	sealedEpoch uint64
	// groupsFrom: partition 0's log holds its groups' acks; each group
	// needs its records from its latest checkpoint on (from its first ack
	// when it has none). compactLimit is what the member may compact
	// through: what it applied, and below every group's need.
	groupsFrom   map[string]uint64
	compactLimit atomic.Uint64
	// inflight: proposals not yet committed, by producer identity, so a
	// retry of one that is still in flight waits for it instead of
	// appending twice.
	inflight map[prodKey]*inflightPub
	anon     uint64 // key space for non-idempotent publishes

	wake chan struct{} // poked by the member (Notify) and by completions

	mu          sync.Mutex
	completions []completion
}

type prodKey struct{ id, seq uint64 }

type inflightPub struct{ replies []PubReply }

type completion struct {
	key        prodKey
	seq, epoch uint64
	err        error
}

// openReplicated starts this node's member of the partition's replica
// group when the placement puts a replica here; otherwise the partition
// is known (metadata) but not hosted.
func (p *partitionRunner) openReplicated() error {
	c := p.node.cluster
	group := p.topic.placement[p.id]
	if !p.topic.hosts(int(p.id), uint32(c.self)) {
		return nil
	}
	members := make([]replica.NodeID, len(group))
	for i, id := range group {
		members[i] = replica.NodeID(id)
	}
	policy := replica.SyncQuorum
	if p.topic.cfg.Ack == wire.AckAll {
		policy = replica.SyncAll
	}
	p.rs = &replState{producers: partition.NewProducers(p.node.cfg.Dedup.DedupWindowMax, p.node.cfg.Dedup.ProducersMax),
		inflight: map[prodKey]*inflightPub{}, wake: make(chan struct{}, 1)}
	l, err := c.openGroup(p.topic.cfg.Name, p.id, members, policy, p.rs.poke, groupStorage{
		retentionMs: p.topic.cfg.RetentionMs, retentionBytes: p.topic.cfg.RetentionBytes, limit: p.rs.compactLimit.Load})
	if err != nil {
		return err
	}
	p.repl = l
	c.campaignIfNew(l, members[0])
	p.readLog.Store(l.ReadLog())
	start := l.ReadLog().StartSeq()
	p.startSeq.Store(start)
	p.rs.applied, p.rs.truncated = start-1, start > 1
	p.wg.Add(1)
	go p.runReplicated()
	return nil
}

func (t *topic) hosts(partition int, node uint32) bool {
	for _, id := range t.placement[partition] {
		if id == node {
			return true
		}
	}
	return false
}

func (rs *replState) poke() {
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// runReplicated is the partition loop on a cluster member: it proposes
// publishes when this member leads, applies what commits, and answers.
func (p *partitionRunner) runReplicated() {
	defer p.wg.Done()
	defer p.failReplicated(wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
	for {
		select {
		case <-p.done:
			return
		case <-p.rs.wake:
		case r := <-p.reqs:
			p.proposeReplicated(r)
		drain:
			for i := 0; i < p.node.cfg.PublishBatchMax; i++ {
				select {
				case r := <-p.reqs:
					p.proposeReplicated(r)
				default:
					break drain
				}
			}
		}
		p.applyReplicated()
	}
}

// leaderView reports whether this member leads and may take publishes: it
// leads, and its install entry (the first entry of its epoch) is applied,
// so the dedup table covers everything earlier leaders appended.
func (p *partitionRunner) leaderView() (replica.Status, *wire.Error) {
	st := p.repl.Status()
	c := p.node.cluster
	switch {
	case st.Role != replica.Leader:
		leader := "unknown (an election is running)"
		if st.Leader != 0 {
			leader = c.name(st.Leader) + " at " + c.clientAddr(st.Leader)
		}
		return st, wire.Errorf(wire.CodeNotLeader, "partition %s/%d: this node does not lead it; leader: %s", p.topic.cfg.Name, p.id, leader)
	case st.ReadOnly:
		return st, wire.Errorf(wire.CodeQuorumLost, "partition %s/%d is READ_ONLY_DEGRADED: no quorum of replicas acknowledges", p.topic.cfg.Name, p.id)
	}
	var start uint64
	for _, e := range st.Epochs {
		if e.Epoch == st.Hard.Promised {
			start = e.StartSeq
		}
	}
	if start == 0 || p.rs.applied < start {
		return st, wire.Errorf(wire.CodeUnavailable, "partition %s/%d: the new leader is taking office; retry", p.topic.cfg.Name, p.id)
	}
	if rs := p.rs; rs.truncated && rs.sealedEpoch != st.Hard.Promised {
		// Sequences appended before the kept log are unknown here: seal
		// each producer's window at its oldest known sequence, so that a
		// retry of an older one is PRODUCER_SEQ_TOO_OLD, never a duplicate.
		rs.producers.SealHistory()
		rs.sealedEpoch = st.Hard.Promised
	}
	return st, nil
}

func (p *partitionRunner) proposeReplicated(r *pubReq) {
	if _, werr := p.leaderView(); werr != nil {
		r.reply(wire.PubOK{}, werr)
		return
	}
	rs := p.rs
	key := prodKey{id: r.producerID, seq: r.producerSeq}
	if r.producerID != 0 {
		switch v, seq, epoch := rs.producers.Check(r.producerID, r.producerSeq); v {
		case partition.VerdictDuplicate:
			r.reply(wire.PubOK{Partition: p.id, Seq: seq, Epoch: epoch, Duplicate: true}, nil)
			return
		case partition.VerdictTooOld:
			r.reply(wire.PubOK{}, wire.Errorf(wire.CodeProducerSeqTooOld,
				"producer %d seq %d is below the dedup window of partition %d", r.producerID, r.producerSeq, p.id))
			return
		}
		if in := rs.inflight[key]; in != nil {
			in.replies = append(in.replies, r.reply)
			return
		}
	} else {
		rs.anon++
		key = prodKey{seq: rs.anon}
	}
	rs.inflight[key] = &inflightPub{replies: []PubReply{r.reply}}
	p.repl.ProposeFunc(r.rec, func(seq, epoch uint64, err error) {
		rs.mu.Lock()
		rs.completions = append(rs.completions, completion{key: key, seq: seq, epoch: epoch, err: err})
		rs.mu.Unlock()
		rs.poke()
	})
}

// applyReplicated applies newly committed entries, then answers completed
// proposals. Completions are taken before the commit point is read: the
// member publishes its commit before completing, so every completed entry
// is applied (and deduplicates retries) before its PUB_OK goes out.
func (p *partitionRunner) applyReplicated() {
	rs := p.rs
	rs.mu.Lock()
	done := rs.completions
	rs.completions = nil
	rs.mu.Unlock()
	commit := p.repl.CommitSeq()
	p.followStart()
	for rs.applied < commit {
		entries, err := p.repl.ReadLog().Read(rs.applied+1, int(min(commit-rs.applied, 4096)), 16<<20)
		if errors.Is(err, storage.ErrOutOfRange) && p.followStart() {
			continue // rebuilt from a snapshot point under us
		}
		if err != nil || len(entries) == 0 {
			p.node.log.Error("apply committed entries failed; will retry", "topic", p.topic.cfg.Name, "partition", p.id, "from", rs.applied+1, "err", err)
			break
		}
		for _, e := range entries {
			if e.Seq > commit {
				break
			}
			if r := &e.Record; r.ProducerID != 0 && !replog.IsControl(r) {
				rs.producers.Record(r.ProducerID, r.ProducerSeq, e.Seq, e.Epoch)
			} else if kind, group, ok := groupRecordOf(r); ok && (kind == groupCheckpoint || rs.groupsFrom[group] == 0) {
				if rs.groupsFrom == nil {
					rs.groupsFrom = map[string]uint64{}
				}
				rs.groupsFrom[group] = e.Seq
			}
			rs.applied = e.Seq
		}
	}
	limit := rs.applied
	for _, from := range rs.groupsFrom {
		limit = min(limit, from-1)
	}
	rs.compactLimit.Store(limit)
	if rs.applied > p.commitSeq.Load() {
		p.commitSeq.Store(rs.applied)
		p.node.metrics.commitBatch.Observe(float64(len(done)))
		p.topic.notifyGroups()
	}
	st := p.repl.Status()
	p.epoch.Store(st.Hard.Promised)
	if st.Role == replica.Leader && st.ReadOnly {
		p.answerDegraded()
		p.topic.notifyGroups() // their ack records are stuck too
	}
	for _, c := range done {
		in := rs.inflight[c.key]
		delete(rs.inflight, c.key)
		if in == nil {
			continue
		}
		ok, werr := wire.PubOK{Partition: p.id, Seq: c.seq, Epoch: c.epoch}, replicationError(p, c.err)
		if werr == nil && c.seq > rs.applied {
			werr = wire.Errorf(wire.CodeUnavailable, "partition %s/%d: commit not applied yet; retry", p.topic.cfg.Name, p.id)
		}
		for _, reply := range in.replies {
			reply(ok, werr)
		}
		if werr == nil {
			p.node.metrics.publishes.WithLabelValues(p.topic.cfg.Name).Inc()
		}
	}
}

// followStart takes in a change of the log's start: retention deleted old
// segments (groups treat what is gone as done), or the member rebuilt from
// the leader's snapshot point past what was applied — the derived state
// then starts over from the kept log. It reports whether applied moved.
func (p *partitionRunner) followStart() bool {
	rs := p.rs
	start := p.repl.ReadLog().StartSeq()
	if start != p.startSeq.Load() {
		p.startSeq.Store(start)
		p.topic.notifyGroups()
	}
	if start <= rs.applied+1 {
		return false
	}
	rs.producers = partition.NewProducers(p.node.cfg.Dedup.DedupWindowMax, p.node.cfg.Dedup.ProducersMax)
	rs.applied, rs.truncated, rs.sealedEpoch, rs.groupsFrom = start-1, true, 0, nil
	return true
}

// answerDegraded answers the publishes in flight with QUORUM_LOST once the
// leader is READ_ONLY_DEGRADED, instead of leaving them hanging. Their
// entries stay in flight: they may still commit when the quorum returns,
// so a retry keeps waiting on the same entry rather than appending again.
func (p *partitionRunner) answerDegraded() {
	werr := wire.Errorf(wire.CodeQuorumLost, "partition %s/%d is READ_ONLY_DEGRADED: the write may still commit if the quorum returns; retry with the same producer identity",
		p.topic.cfg.Name, p.id)
	for _, in := range p.rs.inflight {
		for _, reply := range in.replies {
			reply(wire.PubOK{}, werr)
		}
		in.replies = nil
	}
}

// replicationError maps a proposal's failure to what the client sees; all
// of them are safe to retry with the same producer identity.
func replicationError(p *partitionRunner, err error) *wire.Error {
	name := p.topic.cfg.Name
	switch {
	case err == nil:
		return nil
	case errors.Is(err, replica.ErrNotLeader):
		return wire.Errorf(wire.CodeNotLeader, "partition %s/%d: leadership moved; retry at the new leader", name, p.id)
	case errors.Is(err, replica.ErrQuorumLost):
		return wire.Errorf(wire.CodeQuorumLost, "partition %s/%d is READ_ONLY_DEGRADED", name, p.id)
	case errors.Is(err, replog.ErrLost):
		return wire.Errorf(wire.CodeNotLeader, "partition %s/%d: the write was superseded by a new leader; retry", name, p.id)
	}
	return wire.Errorf(wire.CodeUnavailable, "partition %s/%d: %v", name, p.id, err)
}

// failReplicated answers everything queued or in flight (shutdown).
func (p *partitionRunner) failReplicated(werr *wire.Error) {
	for {
		select {
		case r := <-p.reqs:
			r.reply(wire.PubOK{}, werr)
			continue
		default:
		}
		break
	}
	for key, in := range p.rs.inflight {
		for _, reply := range in.replies {
			reply(wire.PubOK{}, werr)
		}
		delete(p.rs.inflight, key)
	}
}

// info describes the partition for METADATA.
func (p *partitionRunner) info() wire.PartitionInfo {
	info := wire.PartitionInfo{Partition: p.id, Epoch: p.epoch.Load(), StartSeq: p.startSeq.Load(), CommitSeq: p.commitSeq.Load()}
	if p.damage.Load() != nil {
		info.State = wire.PartitionStateCorrupt
	}
	c := p.node.cluster
	if c == nil {
		info.Leader, info.LeaderAddr = p.node.cfg.NodeID, p.node.cfg.ClientAddr
		return info
	}
	group := p.topic.placement[p.id]
	if p.repl == nil {
		// Not hosted here: the first replica is the best hint (the only
		// one with R=1); the client is redirected from there if needed.
		info.Leader, info.LeaderAddr = c.name(replica.NodeID(group[0])), c.clientAddr(replica.NodeID(group[0]))
		for _, id := range group {
			info.Replicas = append(info.Replicas, wire.ReplicaInfo{Node: c.name(replica.NodeID(id))})
		}
		return info
	}
	st := p.repl.Status()
	info.Epoch, info.ReadOnly = st.Hard.Promised, st.ReadOnly && st.Role == replica.Leader
	info.Leader, info.LeaderAddr = c.name(st.Leader), c.clientAddr(st.Leader)
	for _, id := range group {
		ri := wire.ReplicaInfo{Node: c.name(replica.NodeID(id))}
		switch {
		case st.Role != replica.Leader:
			if replica.NodeID(id) == c.self {
				ri.FlushedSeq = st.Durable
				if st.Rebuilding {
					ri.State = "Rebuilding"
				}
			}
		case replica.NodeID(id) == c.self:
			ri.State, ri.FlushedSeq = replica.InSync.String(), st.Durable
		default:
			for _, ps := range st.Peers {
				if ps.ID == replica.NodeID(id) {
					ri.State, ri.FlushedSeq = ps.State.String(), ps.Match
				}
			}
		}
		info.Replicas = append(info.Replicas, ri)
	}
	return info
}

// notHosted answers a publish to a partition this node has no replica of.
func (p *partitionRunner) notHosted() *wire.Error {
	info := p.info()
	return wire.Errorf(wire.CodeNotLeader, "partition %s/%d has no replica on this node; try %s at %s",
		p.topic.cfg.Name, p.id, info.Leader, info.LeaderAddr)
}
