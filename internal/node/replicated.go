package node

import (
	"errors"
	"github.com/nereus-broker/nereus/internal/cluster"
	"sync"
	"sync/atomic"

	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// replState is the shell of one partition's replicated loop: the kernel
// (partition.Member) holds every decision — the dedup table applied from
// committed entries, the applied position, the seal, the install gate,
// proposals in flight by producer identity, the compaction limit — and
// this shell feeds it the member's events and carries out its answers.
type replState struct {
	kernel *partition.Member[PubReply] // owned by runReplicated
	// compactLimit publishes the kernel's compaction limit to the member's
	// storage (read on its goroutine).
	compactLimit atomic.Uint64

	wake chan struct{} // poked by the member (Notify) and by completions

	mu          sync.Mutex
	completions []completion
	// spareCompletions is the array applyReplicated answered from last,
	// handed back to completions next time (so that it is not grown anew
	// for every burst). Owned by runReplicated.
	spareCompletions []completion
}

type completion struct {
	key        partition.ProposalKey
	seq, epoch uint64
	err        error
}

// openReplicated starts this node's member of the partition's replica
// group when the placement puts a replica here; otherwise the partition
// is known (metadata) but not hosted.
func (p *partitionRunner) openReplicated() error {
	c := p.node.cluster
	group := p.topic.placement[p.id]
	if !p.topic.hosts(int(p.id), uint32(c.Self())) {
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
	p.rs = &replState{wake: make(chan struct{}, 1)}
	l, err := c.OpenGroup(p.topic.cfg.Name, p.id, members, policy, p.rs.poke, cluster.GroupStorage{
		RetentionMs: p.topic.cfg.RetentionMs, RetentionBytes: p.topic.cfg.RetentionBytes, Limit: p.rs.compactLimit.Load})
	if err != nil {
		return err
	}
	p.repl = l
	c.CampaignIfNew(l, members[0])
	p.readLog.Store(l.ReadLog())
	start := l.ReadLog().StartSeq()
	p.startSeq.Store(start)
	p.rs.kernel = partition.NewMember[PubReply](p.node.cfg.Dedup, start, p.node.cfg.Mutations.Partition)
	if p.node.cfg.Manual {
		return nil // stepReplicated, from Step
	}
	p.wg.Add(1)
	go p.runReplicated()
	return nil
}

// stepReplicated is runReplicated's loop for a Manual node: the queued
// publishes, and the applying and answering a wake-up asks for. It
// reports whether anything ran.
func (p *partitionRunner) stepReplicated() bool {
	progress := false
	select {
	case <-p.rs.wake:
		progress = true
	default:
	}
	for len(p.manualQueue) > 0 {
		r := p.manualQueue[0]
		p.manualQueue = p.manualQueue[1:]
		p.proposeReplicated(r)
		progress = true
	}
	if progress {
		p.applyReplicated()
	}
	return progress
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

// leaderView is this member's replication state as the kernel sees it.
func (p *partitionRunner) leaderView() (replica.Status, partition.View) {
	st := p.repl.Status()
	v := partition.View{Leader: st.Role == replica.Leader, ReadOnly: st.ReadOnly, Epoch: st.Hard.Promised}
	for _, e := range st.Epochs {
		if e.Epoch == st.Hard.Promised {
			v.InstallSeq = e.StartSeq
		}
	}
	return st, v
}

// tookOffice reports whether this member leads and has applied its
// epoch's install entry — so everything earlier leaders committed is
// applied here — and in which epoch.
func (p *partitionRunner) tookOffice() (epoch uint64, ok bool) {
	if p.repl == nil {
		return 0, false
	}
	_, v := p.leaderView()
	return v.Epoch, v.Leader && v.InstallSeq != 0 && p.commitSeq.Load() >= v.InstallSeq
}

// refusal words the kernel's refusal of a publish for the client.
func (p *partitionRunner) refusal(st replica.Status, r partition.Refusal) *wire.Error {
	name := p.topic.cfg.Name
	switch r {
	case partition.RefusedNotLeader:
		leader := "unknown (an election is running)"
		if c := p.node.cluster; st.Leader != 0 && !st.LeaderSilent { // never a leader it no longer hears
			leader = c.Name(st.Leader) + " at " + c.ClientAddr(st.Leader)
		}
		return wire.Errorf(wire.CodeNotLeader, "partition %s/%d: this node does not lead it; leader: %s", name, p.id, leader)
	case partition.RefusedQuorumLost:
		return wire.Errorf(wire.CodeQuorumLost, "partition %s/%d is READ_ONLY_DEGRADED: no quorum of replicas acknowledges", name, p.id)
	case partition.RefusedTakingOffice:
		return wire.Errorf(wire.CodeUnavailable, "partition %s/%d: the new leader is taking office; retry", name, p.id)
	}
	return nil
}

func (p *partitionRunner) proposeReplicated(r *pubReq) {
	st, view := p.leaderView()
	d := p.rs.kernel.Publish(view, r.producerID, r.producerSeq, r.reply)
	switch d.Action {
	case partition.Refuse:
		r.reply(wire.PubOK{}, p.refusal(st, d.Refusal))
	case partition.AnswerDuplicate:
		r.reply(wire.PubOK{Partition: p.id, Seq: d.Seq, Epoch: d.Epoch, Duplicate: true}, nil)
	case partition.AnswerTooOld:
		r.reply(wire.PubOK{}, wire.Errorf(wire.CodeProducerSeqTooOld,
			"producer %d seq %d is below the dedup window of partition %d", r.producerID, r.producerSeq, p.id))
	case partition.Propose:
		rs := p.rs
		p.repl.ProposeFunc(r.rec, func(seq, epoch uint64, err error) {
			rs.mu.Lock()
			rs.completions = append(rs.completions, completion{key: d.Key, seq: seq, epoch: epoch, err: err})
			rs.mu.Unlock()
			rs.poke()
		})
	}
}

// applyReplicated applies newly committed entries, then answers completed
// proposals. Completions are taken before the commit point is read: the
// member publishes its commit before completing, so every completed entry
// is applied (and deduplicates retries) before its PUB_OK goes out.
func (p *partitionRunner) applyReplicated() {
	rs, k := p.rs, p.rs.kernel
	rs.mu.Lock()
	done := rs.completions
	rs.completions, rs.spareCompletions = rs.spareCompletions[:0], nil // one owner per array, even if a reply re-enters
	rs.mu.Unlock()
	defer func() {
		clear(done) // no error kept alive through the spare
		rs.spareCompletions = done[:0]
	}()
	commit := p.repl.CommitSeq()
	p.readLog.Store(p.repl.ReadLog()) // a member restarted in place reads a new one
	p.followStart()
	for k.Applied() < commit {
		from := k.Applied() + 1
		entries, err := p.repl.Committed(from, int(min(commit-k.Applied(), 4096)))
		if errors.Is(err, storage.ErrOutOfRange) && p.followStart() {
			continue // rebuilt from a snapshot point under us
		}
		if errors.Is(err, storage.ErrCorrupt) {
			// Damage in this replica's copy of committed entries: the
			// member drops the damaged range and is made whole from a
			// healthy replica (as when the scrubber finds it); applying
			// resumes from its rebuilt log.
			p.node.logRepeatedError(p.subject(), "committed entries damaged in this replica; dropping the range to rebuild it", "from", from, "err", err)
			p.repl.Damaged()
			break
		}
		if err != nil || len(entries) == 0 {
			p.node.log.Error("apply committed entries failed; will retry", "topic", p.topic.cfg.Name, "partition", p.id, "from", from, "err", err)
			break
		}
		for _, e := range entries {
			if e.Seq > commit {
				break
			}
			k.Apply(kernelEntry(&e))
		}
	}
	rs.compactLimit.Store(k.CompactLimit())
	if applied := k.Applied(); applied > p.commitSeq.Load() {
		p.commitSeq.Store(applied)
		p.node.metrics.commitBatch.Observe(float64(len(done)))
		p.topic.notifyGroups()
	}
	st := p.repl.Status()
	p.epoch.Store(st.Hard.Promised)
	if st.Role == replica.Leader && st.ReadOnly {
		// The entries stay in flight: a retry waits on the same one.
		werr := wire.Errorf(wire.CodeQuorumLost, "partition %s/%d is READ_ONLY_DEGRADED: the write may still commit if the quorum returns; retry with the same producer identity",
			p.topic.cfg.Name, p.id)
		for _, reply := range k.Degraded() {
			reply(wire.PubOK{}, werr)
		}
		p.topic.notifyGroups() // their ack records are stuck too
	}
	for _, c := range done {
		a, ok := k.Completed(c.key, c.seq, c.epoch, c.err)
		if !ok {
			continue
		}
		var werr *wire.Error
		switch a.Outcome {
		case partition.Failed:
			werr = replicationError(p, a.Err)
		case partition.NotApplied:
			werr = wire.Errorf(wire.CodeUnavailable, "partition %s/%d: commit not applied yet; retry", p.topic.cfg.Name, p.id)
		}
		for _, reply := range a.Replies {
			reply(wire.PubOK{Partition: p.id, Seq: a.Seq, Epoch: a.Epoch}, werr)
		}
		if werr == nil {
			p.node.metrics.publishes.WithLabelValues(p.topic.cfg.Name).Inc()
		}
	}
}

// kernelEntry is what the kernel needs of a committed entry.
func kernelEntry(e *storage.Entry) partition.Entry {
	ke := partition.Entry{Seq: e.Seq, Epoch: e.Epoch}
	if r := &e.Record; !replog.IsControl(r) {
		ke.ProducerID, ke.ProducerSeq = r.ProducerID, r.ProducerSeq
	} else if kind, group, ok := groupRecordOf(r); ok {
		ke.Group, ke.GroupKind = group, kind
	}
	return ke
}

// followStart takes in a change of the log's start: retention deleted old
// segments (groups treat what is gone as done), or the member rebuilt from
// the leader's snapshot point past what was applied — the kernel's derived
// state then starts over from the kept log. It reports whether applied
// moved.
func (p *partitionRunner) followStart() bool {
	start := p.repl.ReadLog().StartSeq()
	if start != p.startSeq.Load() {
		p.startSeq.Store(start)
		p.topic.notifyGroups()
	}
	return p.rs.kernel.LogStart(start)
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
	for _, reply := range p.rs.kernel.Close() {
		reply(wire.PubOK{}, werr)
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
		info.Leader, info.LeaderAddr = c.Name(replica.NodeID(group[0])), c.ClientAddr(replica.NodeID(group[0]))
		for _, id := range group {
			info.Replicas = append(info.Replicas, wire.ReplicaInfo{Node: c.Name(replica.NodeID(id))})
		}
		return info
	}
	st := p.repl.Status()
	info.Epoch, info.ReadOnly = st.Hard.Promised, st.ReadOnly && st.Role == replica.Leader
	if !st.LeaderSilent { // a leader this follower no longer hears may be dead: name none
		info.Leader, info.LeaderAddr = c.Name(st.Leader), c.ClientAddr(st.Leader)
	}
	for _, id := range group {
		ri := wire.ReplicaInfo{Node: c.Name(replica.NodeID(id))}
		switch {
		case st.Role != replica.Leader:
			if replica.NodeID(id) == c.Self() {
				ri.FlushedSeq = st.Durable
				switch {
				case st.Rebuilding:
					ri.State = "Rebuilding"
				case st.Uncertain:
					ri.State = ReplicaUncertain
				}
			}
		case replica.NodeID(id) == c.Self():
			ri.State, ri.FlushedSeq = replica.InSync.String(), st.Durable
		default:
			for _, ps := range st.Peers {
				if ps.ID == replica.NodeID(id) {
					ri.State, ri.FlushedSeq = ps.State.String(), ps.Match
					if ps.Silent {
						ri.State = ReplicaUnreachable
					}
				}
			}
		}
		info.Replicas = append(info.Replicas, ri)
	}
	return info
}

// ReplicaUnreachable is the state a leader reports for a follower it has
// not heard from within the ack timeout (2 election timeouts): whatever it
// last flushed, it is not known to be in sync, and it counts toward no
// quorum.
const ReplicaUnreachable = "Unreachable"

// ReplicaUncertain is the state a follower reports of itself while it may
// lack entries it acknowledged (it cut an invalid last batch that nothing
// proved torn): its election votes count for less until a newer leader
// has made it whole (replica.Persisted.Uncertain).
const ReplicaUncertain = "Uncertain"

// notHosted answers a publish to a partition this node has no replica of.
func (p *partitionRunner) notHosted() *wire.Error {
	info := p.info()
	return wire.Errorf(wire.CodeNotLeader, "partition %s/%d has no replica on this node; try %s at %s",
		p.topic.cfg.Name, p.id, info.Leader, info.LeaderAddr)
}
