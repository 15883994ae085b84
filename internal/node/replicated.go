package node

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nereus-broker/nereus/internal/acklog"
	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/partition"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/replog"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// replicaStore is this node's member of a partition's replica group and
// the shell of its replicated loop: the kernel (partition.Member) holds
// every decision — the dedup table applied from committed entries, the
// applied position, the seal, the install gate, proposals in flight by
// producer identity, the compaction limit — and this shell feeds it the
// member's events and carries out its answers.
type replicaStore struct {
	*partitionRunner

	repl   *replog.Log                // the member; safe for concurrent use
	kernel *partition.Member[replyTo] // owned by runReplicated
	// compactLimit publishes the kernel's compaction limit to the member's
	// storage (read on its goroutine).
	compactLimit atomic.Uint64
	// groupsFrom publishes where each consumer group's records start in
	// the applied log (a new leader's groups rebuild from there), when it
	// changes (groupsVersion, owned by runReplicated).
	groupsFrom    atomic.Pointer[groupsFrom]
	groupsVersion uint64

	wake chan struct{} // poked by the member (Notify) and by completions

	mu          sync.Mutex
	completions []completion
	// spareCompletions is the array applyReplicated answered from last,
	// handed back to completions next time (so that it is not grown anew
	// for every burst). Owned by runReplicated.
	spareCompletions []completion
	snaps            dedupSnapshots // owned by runReplicated
	// marks: a member alone's synced marks (syncedmark.go); nextMarkMs
	// the next period's end in Manual mode. Owned by runReplicated.
	marks      syncedMarks
	nextMarkMs int64
	// applying is the array committed entries are decoded into for
	// applying (repl.Committed), reused. Owned by runReplicated.
	applying []storage.Entry
	// proposing gathers the proposals of one pass of runReplicated (or
	// stepManual), sent to the member at its end in one hand-off
	// (replog.Log.ProposeBatch); their outcomes go to onProposed, the
	// method value of proposed made once. Owned by runReplicated.
	proposing  replog.Batch
	onProposed func(tag replog.Tag, seq, epoch uint64, err error)
	// retainLimit is the log's compaction limit other than the kernel's
	// (a scheduler shard's or bucket's checkpoint; none otherwise).
	retainLimit func() uint64
	// carrying: a dedup carry is in flight (proposeCarry); carryCheckAtMs:
	// when the next retention check is due (checkRetention; owned by
	// runReplicated).
	carrying       atomic.Bool
	carryCheckAtMs int64
	// locating: a member alone was asked to locate a read's damage
	// (foundDamage); applyReplicated notes what it recorded.
	locating atomic.Bool
	// checkpointWant: a group whose latest checkpoint is at or below it
	// checkpoints again (retention would compact past it, or too much
	// log follows it: pins); 0: none, or not leading. As of the last
	// check; the groups' runners read it.
	checkpointWant atomic.Uint64
	// groupFold is a group carry being folded, groupCarrying one in
	// flight, groupCarryAtMs when each group may have its next (owned by
	// runReplicated; groupcarry.go).
	groupFold      *groupCarryFold
	groupCarrying  atomic.Bool
	groupCarryAtMs map[string]int64
	// groupsGoneSeen is the node's groupsGone the kernel last took in
	// (owned by runReplicated).
	groupsGoneSeen *groupsGone
	// published and publishedBytes are the topic's publish counters,
	// bound once (a label lookup per record cost the leader 3% of its CPU).
	published, publishedBytes prometheus.Counter
}

// groupsFrom is acklog.Needs.From as of a moment of the applied log.
type groupsFrom struct{ from map[string]uint64 }

// groupStart is where a rebuild of group's cursor must start reading the
// committed log: its latest checkpoint (or first record) — or, when it
// has none up to the commit point, just after it.
func (p *replicaStore) groupStart(group string) uint64 {
	start := p.startSeq.Load()
	commit := p.commitSeq.Load() // first: groupsFrom is at least as new
	snap := p.groupsFrom.Load()
	if snap == nil {
		return max(start, commit+1)
	}
	if from, ok := snap.from[group]; ok {
		return max(start, from)
	}
	return max(start, commit+1)
}

type completion struct {
	key        partition.ProposalKey
	seq, epoch uint64
	err        error
	bytes      uint64 // the record's key and value
}

// openReplica starts this node's member of the partition's replica
// group (the placement puts a replica here) and its loop (none in Manual
// mode: Step runs it).
func (p *partitionRunner) openReplica() error {
	c := p.node.cluster
	group := p.topic.placement[p.id]
	members := make([]replica.NodeID, len(group))
	for i, id := range group {
		members[i] = replica.NodeID(id)
	}
	policy := replica.SyncQuorum
	if p.topic.cfg.Ack == wire.AckAll {
		policy = replica.SyncAll
	}
	s := &replicaStore{partitionRunner: p, wake: make(chan struct{}, 1)}
	s.onProposed = s.proposed
	s.published = p.node.metrics.publishes.WithLabelValues(p.topic.cfg.Name)
	s.publishedBytes = p.node.metrics.publishBytes.WithLabelValues(p.topic.cfg.Name)
	segmentBytes, retentionBytes, limit := p.compaction()
	ageMs, _ := p.topic.retention()
	s.retainLimit = limit
	durable := p.aloneDurableThrough(len(members))
	l, err := c.OpenGroup(p.topic.key(), p.id, members, policy, s.poke, cluster.GroupOptions{
		RetentionMs: ageMs, RetentionBytes: retentionBytes, Retention: p.retention,
		Limit:           s.compactionLimit,
		PreferredLeader: members[0], SegmentBytesMax: segmentBytes,
		// A scheduler shard's owner drains its publishes in flight before
		// a rebalancing hand-off fences it (schedRunner.release).
		ReleaseBeforeTransfer: p.topic.cfg.Name == wire.SchedTopic,
		// A partition's only replica commits what it synced: its dedup
		// snapshot's point is durable, and a tail cut below it is damage
		// (DurableTailNotTorn). A member of a larger group marks itself
		// uncertain instead and is made whole by a newer leader.
		DurableThrough: durable,
		// Its only replica keeps a torn tail's named seqs
		// (TornSeqsNotReused).
		KeepTornSeqs: len(members) == 1 && !p.node.cfg.Mutations.TornSeqsReused})
	if err != nil {
		return err
	}
	s.marks.point = durable
	s.repl = l
	c.CampaignIfNew(l, members[0])
	p.readLog.Store(l.ReadLog())
	start := l.ReadLog().StartSeq()
	p.startSeq.Store(start)
	s.kernel = partition.NewMember[replyTo](p.node.cfg.Dedup, start, p.node.cfg.Mutations.Partition)
	if snap := p.loadDedupSnapshot(l.ReadLog()); snap != nil && s.kernel.Restore(snap) {
		// Only the entries after the snapshot are applied again.
		s.snaps.applied, s.snaps.epoch = snap.Applied, snap.Epoch
	}
	p.store = s
	if p.node.cfg.Manual {
		s.nextMarkMs = p.node.monoMs() + p.node.cfg.SyncedMarkMs
		return nil // stepManual, from Step
	}
	p.wg.Add(1)
	go s.runReplicated()
	return nil
}

func (p *replicaStore) accept(r *pubReq) { p.queue(r) }

// compactionLimit is the member's compaction limit (on its goroutine, at
// each compaction): the kernel's and the checkpoints'. When the kernel's
// binds, a dedup carry may be due: the loop is woken to see
// (proposeCarry).
func (p *replicaStore) compactionLimit() uint64 {
	own, other := p.compactLimit.Load(), p.retainLimit()
	if own < other {
		p.poke()
	}
	return min(own, other)
}

// stepManual is runReplicated's loop for a Manual node: the queued
// publishes, and the applying and answering a wake-up asks for. It
// reports whether anything ran.
func (p *replicaStore) stepManual(monoMs int64) bool {
	progress := false
	select {
	case <-p.wake:
		progress = true
	default:
	}
	if p.node.cfg.SyncedMarkMs > 0 && monoMs >= p.nextMarkMs {
		p.nextMarkMs = monoMs + p.node.cfg.SyncedMarkMs
		progress = p.markTail() || progress
	}
	for len(p.manualQueue) > 0 {
		r := p.manualQueue[0]
		p.manualQueue = p.manualQueue[1:]
		p.proposeReplicated(r)
		progress = true
	}
	p.repl.ProposeBatch(&p.proposing)
	if progress {
		p.applyReplicated()
	}
	return progress
}

func (p *replicaStore) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// runReplicated is the partition loop on a cluster member: it proposes
// publishes when this member leads, applies what commits, and answers.
func (p *replicaStore) runReplicated() {
	defer p.wg.Done()
	defer p.failReplicated(wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
	var markDue <-chan time.Time // nil: marks off
	if ms := p.node.cfg.SyncedMarkMs; ms > 0 {
		mark := p.node.cfg.Env.Clock.NewTicker(time.Duration(ms) * time.Millisecond)
		defer mark.Stop()
		markDue = mark.C()
	}
	for {
		select {
		case <-p.done:
			return
		case <-markDue:
			p.markTail()
		case <-p.wake:
		case r := <-p.reqs:
			n := p.proposeChain(p.take(r))
		drain:
			for n < p.node.cfg.PublishBatchMax {
				select {
				case r := <-p.reqs:
					n += p.proposeChain(p.take(r))
				default:
					break drain
				}
			}
			p.repl.ProposeBatch(&p.proposing)
		}
		p.applyReplicated()
	}
}

// leaderView is this member's replication state as the kernel sees it.
func (p *replicaStore) leaderView() (replica.Status, partition.View) {
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
func (p *replicaStore) tookOffice() (epoch uint64, ok bool) {
	_, v := p.leaderView()
	return v.Epoch, v.Leader && v.InstallSeq != 0 && p.commitSeq.Load() >= v.InstallSeq
}

// refusal words the kernel's refusal of a publish for the client.
func (p *replicaStore) refusal(st replica.Status, r partition.Refusal) *wire.Error {
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
	case partition.RefusedNotApplied:
		return wire.Errorf(wire.CodeUnavailable, "partition %s/%d: this publish committed but is not applied yet; retry", name, p.id)
	}
	return nil
}

// proposeChain proposes r and the publishes chained after it, in order,
// and returns how many there were.
func (p *replicaStore) proposeChain(r *pubReq) int {
	n := 0
	for r != nil {
		next := r.unlink()
		p.proposeReplicated(r)
		r, n = next, n+1
	}
	return n
}

func (p *replicaStore) proposeReplicated(r *pubReq) {
	if werr := p.corruptError(); werr != nil {
		r.answer(wire.PubOK{}, werr) // a member alone found damage (foundDamage)
		return
	}
	st, view := p.leaderView()
	var d partition.PublishDecision
	if r.retryOnly != nil {
		d = p.kernel.PublishRetryOnly(view, r.producerID, r.producerSeq, r.reply)
	} else {
		d = p.kernel.Publish(view, r.producerID, r.producerSeq, r.reply)
	}
	switch d.Action {
	case partition.NotARetry:
		r.answer(wire.PubOK{}, r.retryOnly)
	case partition.Refuse:
		r.answer(wire.PubOK{}, p.refusal(st, d.Refusal))
	case partition.AnswerDuplicate:
		r.answer(wire.PubOK{Partition: p.id, Seq: d.Seq, Epoch: d.Epoch, Duplicate: true}, nil)
	case partition.AnswerTooOld:
		r.answer(wire.PubOK{}, wire.Errorf(wire.CodeProducerSeqTooOld,
			"producer %d seq %d is below the dedup window of partition %d", r.producerID, r.producerSeq, p.id))
	case partition.Propose:
		// Sent with the rest of this pass's proposals (runReplicated).
		p.proposing.Add(&r.rec, replog.Tag{d.Key.ProducerID, d.Key.ProducerSeq, uint64(len(r.rec.Key) + len(r.rec.Value))}, p.onProposed)
	}
}

// proposed takes the outcome of a proposal (onProposed), on the member's
// goroutine, for applyReplicated to answer.
func (p *replicaStore) proposed(tag replog.Tag, seq, epoch uint64, err error) {
	key := partition.ProposalKey{ProducerID: tag[0], ProducerSeq: tag[1]}
	p.mu.Lock()
	p.completions = append(p.completions, completion{key: key, seq: seq, epoch: epoch, err: err, bytes: tag[2]})
	p.mu.Unlock()
	p.poke()
}

// applyReplicated applies newly committed entries, then answers completed
// proposals. Completions are taken before the commit point is read: the
// member publishes its commit before completing, so every completed entry
// is applied (and deduplicates retries) before its PUB_OK goes out.
func (p *replicaStore) applyReplicated() {
	k := p.kernel
	p.mu.Lock()
	done := p.completions
	p.completions, p.spareCompletions = p.spareCompletions[:0], nil // one owner per array, even if a reply re-enters
	p.mu.Unlock()
	defer func() {
		clear(done) // no error kept alive through the spare
		p.spareCompletions = done[:0]
	}()
	commit := p.repl.CommitSeq()
	p.readLog.Store(p.repl.ReadLog()) // a member restarted in place reads a new one
	if d := p.repl.StuckOnDamage(); d != nil && p.damage.Load() == nil {
		// A member alone found its log damaged restarting in place: down
		// until a repair, corrupt meanwhile (LoneDamageAtRestartIsSaid).
		p.noteDamage([]storage.Damage{*d})
	}
	if p.locating.Load() {
		// A member alone asked to locate a read's damage (foundDamage):
		// what it recorded makes the partition corrupt, once it has.
		if ds := p.repl.ReadLog().Damage(); len(ds) > 0 {
			p.locating.Store(false)
			p.noteDamage(ds)
		}
	}
	p.followStart()
	if d := p.node.groupsGone.Load(); d != p.groupsGoneSeen {
		p.groupsGoneSeen = d
		k.GroupsDeleted(d.gone) // DeletedGroupPinsNothing
	}
	var appliedBytes int64
	for k.Applied() < commit {
		from := k.Applied() + 1
		entries, err := p.repl.Committed(p.applying[:0], from, int(min(commit-k.Applied(), 4096)))
		if errors.Is(err, storage.ErrOutOfRange) && p.followStart() {
			continue // rebuilt from a snapshot point under us
		}
		if d, ok := p.damageAt(from, err); ok {
			// A member alone cannot rebuild the range: the partition goes
			// corrupt, and the kernel steps over the damaged seqs as a
			// single node's replay does. Their records are not applied;
			// publishes are refused until a repair, so the producers'
			// seqs the dedup table misses answer nothing wrongly.
			p.noteDamage([]storage.Damage{d})
			for seq := from; seq <= min(d.LastSeq, commit); seq++ {
				if err := k.Apply(partition.Entry{Seq: seq, Epoch: p.snaps.epoch}); err != nil {
					p.node.logRepeatedError(p.subject(), "stepping over damaged entries failed", "seq", seq, "err", err)
				}
			}
			continue
		}
		if errors.Is(err, storage.ErrCorrupt) {
			// Damage in this replica's copy of committed entries: the
			// member drops the damaged range and is made whole from a
			// healthy replica (as when the scrubber finds it); applying
			// resumes from its rebuilt log. A member alone locates
			// damage nobody named yet, and the next pass steps over it.
			if !p.alone() {
				p.node.logRepeatedError(p.subject(), "committed entries damaged in this replica; dropping the range to rebuild it", "from", from, "err", err)
			}
			p.foundDamage(nil, from)
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
			if err := k.Apply(kernelEntry(&e)); err != nil {
				p.node.logRepeatedError(p.subject()+"/carry", "dedup carry refused; the log stays uncompacted past it", "seq", e.Seq, "err", err)
			}
			appliedBytes += int64(len(e.Record.Value) + len(e.Record.Key))
			p.snaps.epoch = e.Epoch
		}
		clear(entries) // no record kept alive through the scratch
		p.applying = entries[:0]
	}
	if p.dueDedupSnapshot(&p.snaps, appliedBytes) {
		p.snapshotDedup()
	}
	p.compactLimit.Store(k.CompactLimit())
	p.checkRetention()
	if v := k.GroupsVersion(); v != p.groupsVersion {
		// Before the commit point moves: a reader that loads commitSeq,
		// then groupsFrom, sees every group record at or below it.
		p.groupsVersion = v
		p.groupsFrom.Store(&groupsFrom{from: k.GroupsFrom()})
	}
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
			reply.answer(wire.PubOK{}, werr)
		}
		p.topic.notifyGroups() // their ack records are stuck too
	}
	var acked, ackedBytes uint64
	for _, c := range done {
		a, ok := k.Completed(c.key, c.seq, c.epoch, c.err)
		if !ok {
			continue
		}
		var werr *wire.Error
		switch a.Outcome {
		case partition.Failed:
			werr = p.replicationError(a.Err)
		case partition.NotApplied:
			werr = wire.Errorf(wire.CodeUnavailable, "partition %s/%d: commit not applied yet; retry", p.topic.cfg.Name, p.id)
		}
		for _, reply := range a.Replies {
			reply.answer(wire.PubOK{Partition: p.id, Seq: a.Seq, Epoch: a.Epoch}, werr)
		}
		clear(a.Replies) // answered: the kernel's shared block keeps no reply alive
		if werr == nil {
			acked++
			ackedBytes += c.bytes
		}
	}
	if acked > 0 {
		p.published.Add(float64(acked))
		p.publishedBytes.Add(float64(ackedBytes))
	}
}

// kernelEntry is what the kernel needs of a committed entry.
func kernelEntry(e *storage.Entry) partition.Entry {
	ke := partition.Entry{Seq: e.Seq, Epoch: e.Epoch}
	if r := &e.Record; !replog.IsControl(r) {
		ke.ProducerID, ke.ProducerSeq = r.ProducerID, r.ProducerSeq
	} else if kind, group, ok := groupRecordOf(r); ok {
		ke.Group, ke.GroupKind = group, kind
		if kind == acklog.KindCarry {
			ke.GroupBase, _, _ = acklog.CarryOf(r.Value)
		}
	} else if isDedupCarry(r) {
		ke.Carry = r.Value
	}
	return ke
}

// followStart takes in a change of the log's start: retention deleted old
// segments (groups treat what is gone as done), or the member rebuilt from
// the leader's snapshot point past what was applied — the kernel's derived
// state then starts over from the kept log. It reports whether applied
// moved.
func (p *replicaStore) followStart() bool {
	start := p.repl.ReadLog().StartSeq()
	if start != p.startSeq.Load() {
		p.startSeq.Store(start)
		p.topic.notifyGroups()
	}
	if !p.kernel.LogStart(start) {
		return false
	}
	p.snaps.applied, p.snaps.epoch = 0, 0 // the next snapshot is of the new start's state
	return true
}

// markTail writes a member alone's synced mark at a period's end over a
// tail that stayed idle through it (syncedmark.go): it commits only what
// it synced, so what it applied is synced. A member of a larger group
// writes none (its open reads no point: it is made whole by a leader).
func (p *replicaStore) markTail() bool {
	if !p.alone() {
		return false
	}
	applied := p.kernel.Applied()
	return p.markLog(&p.marks, applied, applied)
}

// snapshotDedup writes the member's dedup snapshot of what it applied,
// if that moved since the last. What it applied may not be durable here
// yet (a leader applies entries two followers flushed before its own
// fsync): a crash that loses them leaves a log without the snapshot's
// last entry, which the restart's check refuses (SnapshotUsable).
func (p *replicaStore) snapshotDedup() {
	k := p.kernel
	applied, epoch := k.Applied(), p.snaps.epoch
	if epoch == 0 || applied <= p.snaps.applied {
		return
	}
	p.saveDedupSnapshot(&p.snaps, applied, func(b []byte) ([]byte, error) { return k.AppendSnapshot(b, epoch) })
}

// replicationError maps a proposal's failure to what the client sees; all
// of them are safe to retry with the same producer identity.
func (p *replicaStore) replicationError(err error) *wire.Error {
	name := p.topic.cfg.Name
	switch {
	case err == nil:
		return nil
	case errors.Is(err, replica.ErrNotLeader):
		return wire.Errorf(wire.CodeNotLeader, "partition %s/%d: leadership moved; retry at the new leader", name, p.id)
	case errors.Is(err, replica.ErrQuorumLost):
		return wire.Errorf(wire.CodeQuorumLost, "partition %s/%d is READ_ONLY_DEGRADED", name, p.id)
	case errors.Is(err, replica.ErrTransferring):
		// Refused before any append: the leader is handing the partition
		// to its preferred leader (about one round trip; at most an
		// election timeout). NOT_LEADER sends the client to look again.
		to := "another replica"
		if st := p.repl.Status(); st.TransferTo != 0 {
			to = p.node.cluster.Name(st.TransferTo) + " at " + p.node.cluster.ClientAddr(st.TransferTo)
		}
		return wire.Errorf(wire.CodeNotLeader, "partition %s/%d: leadership is moving to %s; retry there", name, p.id, to)
	case errors.Is(err, replog.ErrLost):
		return wire.Errorf(wire.CodeNotLeader, "partition %s/%d: the write was superseded by a new leader; retry", name, p.id)
	}
	return wire.Errorf(wire.CodeUnavailable, "partition %s/%d: %v", name, p.id, err)
}

// failReplicated answers everything queued or in flight (shutdown).
func (p *replicaStore) failReplicated(werr *wire.Error) {
	for {
		select {
		case r := <-p.reqs:
			answerChain(r, werr)
			continue
		default:
		}
		break
	}
	for _, reply := range p.kernel.Close() {
		reply.answer(wire.PubOK{}, werr)
	}
}

// describe reports the member's view: its epoch, whether it is degraded,
// the leader it hears and each replica's state as far as it knows it.
func (p *replicaStore) describe(info *wire.PartitionInfo) {
	c := p.node.cluster
	st := p.repl.Status()
	info.Epoch, info.ReadOnly = st.Hard.Promised, st.ReadOnly && st.Role == replica.Leader
	if !st.LeaderSilent { // a leader this follower no longer hears may be dead: name none
		info.Leader, info.LeaderAddr = c.Name(st.Leader), c.ClientAddr(st.Leader)
	}
	for _, id := range p.topic.placement[p.id] {
		ri := wire.ReplicaInfo{Node: c.Name(replica.NodeID(id))}
		switch {
		case st.Role != replica.Leader:
			if replica.NodeID(id) == c.Self() {
				ri.FlushedSeq = st.Durable
				switch {
				case st.PromiseLost:
					ri.State = ReplicaPromiseLost
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

// ReplicaPromiseLost is the state a follower reports of itself while its
// hard state, damaged, is being recovered: it waits for every other
// replica's promise and takes no part in the group meanwhile
// (replica.Persisted.PromiseLost).
const ReplicaPromiseLost = "PromiseLost"

// shutdown answers everything queued or in flight (Manual mode; the
// production loop does it as it returns).
func (p *replicaStore) shutdown() {
	p.failReplicated(wire.Errorf(wire.CodeUnavailable, "partition is shutting down"))
	p.failQueued()
}

// release closes the member once the loop ended, with a dedup snapshot
// of what it applied (a member alone: or its synced mark).
func (p *replicaStore) release() {
	p.snapshotDedup()
	if applied := p.kernel.Applied(); p.alone() && p.snaps.applied < applied {
		// No snapshot stands for the tail: the mark does (a member
		// alone commits only what it synced).
		p.node.writeSyncedMark(&p.marks, p.dir, applied, p.subject(), "topic", p.topic.cfg.Name, "partition", p.id)
	}
	p.node.cluster.CloseGroup(p.topic.key(), p.id)
	p.repl.Close()
}

// foundDamage drops the damaged range of this replica's copy of committed
// records (a group's delivery or replay, a client read or the scrubber
// found it): the member is made whole from a healthy replica, without a
// restart, and readers retry. It logs what it drops. A member alone has
// no healthy copy: the partition goes corrupt instead — publishes refused
// with DATA_CORRUPT, /readyz — until `nereus repair`, as a single node's
// does (DamageNeverSilent). A read's failure that names no range (at)
// has the member alone locate it (replog.Log.DamagedAt, which verifies
// the segment holding at and notifies): the next pass of applyReplicated
// notes what it recorded (locating). Before, a group's delivery retried such a record for good
// unless the scrubber's pass (sealed segments only) or the apply found
// it, as on a single node (N7f).
func (p *replicaStore) foundDamage(ds []storage.Damage, at uint64) {
	switch {
	case !p.alone():
		p.repl.Damaged()
	case len(ds) == 0 && at != 0 && !p.node.cfg.Mutations.ReadDamageUnverified:
		p.locating.Store(true)
		p.repl.DamagedAt(at) // it notifies once it recorded the damage
	default:
		p.noteDamage(ds)
	}
}

// damageAt returns, for a member alone whose read from seq from failed
// with err, the damaged range holding from that err names. Damage no
// check located yet is the member's to locate (foundDamage, DamagedAt:
// the segment holding from, on its goroutine); the next pass finds it
// named here.
func (p *replicaStore) damageAt(from uint64, err error) (storage.Damage, bool) {
	ce := (*storage.CorruptError)(nil)
	if !p.alone() || !errors.As(err, &ce) {
		return storage.Damage{}, false
	}
	d := ce.Damage
	return d, d.Seqs() > 0 && d.FirstSeq <= from && from <= d.LastSeq
}

// alone reports whether this member is its partition's only replica.
func (p *replicaStore) alone() bool { return len(p.topic.placement[p.id]) == 1 }

// forwardTo names the leader this member hears, unless this node leads or
// knows no leader: then its own answer says so.
func (p *replicaStore) forwardTo(int) (replica.NodeID, bool) {
	st := p.repl.Status()
	if st.Role == replica.Leader || st.Leader == 0 || st.Leader == p.node.cluster.Self() {
		return 0, false
	}
	return st.Leader, true
}

// collect reports the member's replication gauges.
func (p *replicaStore) collect(ch chan<- prometheus.Metric, topic, part string) {
	st := p.repl.Status()
	leads := st.Role == replica.Leader
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, boolGauge(leads), topic, part)
	ch <- prometheus.MustNewConstMetric(readOnlyDesc, prometheus.GaugeValue, boolGauge(leads && st.ReadOnly), topic, part)
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(p.repl.Dropped()), topic, part)
	ch <- prometheus.MustNewConstMetric(rebuildsDesc, prometheus.CounterValue, float64(p.repl.Installs()), topic, part)
	ch <- prometheus.MustNewConstMetric(uncertainDesc, prometheus.GaugeValue, boolGauge(st.Uncertain), topic, part)
	ch <- prometheus.MustNewConstMetric(promiseLostDesc, prometheus.GaugeValue, boolGauge(st.PromiseLost), topic, part)
}
