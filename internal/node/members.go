package node

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nereus-broker/nereus/internal/cluster"
	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/meta"
	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/wire"
)

// Consumer-group membership (internal/group): JOIN, LEAVE, HEARTBEAT and
// CONTROL_ACK from members, and the coordinator that fences silent or slow
// members and pushes NOTICEs. The group state lives in the metadata: in a
// cluster in `__meta` (commands proposed on its leader, the coordinator,
// which members connect to); on a single node in groups.json, where each
// command is applied and made durable before it is answered — the same
// meta.State code either way.

// NoticeSink receives a member's NOTICE frames (on the JOIN's correlation
// id); it must not block.
type NoticeSink interface {
	SendNotice(n *wire.Notice)
}

const (
	groupsFile = "groups.json"
	// noticeRetransmit: a notice not acknowledged within it is sent again.
	noticeRetransmit = time.Second
	// coordinatorTick is how often the coordinator checks its members.
	coordinatorTick = 100 * time.Millisecond
)

type memberKey struct {
	group, member string
	incarnation   uint64
}

type membership struct {
	n  *Node
	mu sync.Mutex
	// local is the single node's applied group state (nil in a cluster).
	local *meta.State
	// coord is the coordinator's soft state while this node coordinates
	// (nil otherwise: a new coordinator starts fresh).
	coord  *group.Coordinator
	sinks  map[memberKey]NoticeSink
	nextMs int64 // Manual mode: the next coordinator tick
	// changes counts the changes to the applied group state (version): a
	// single node's commands and topics, a cluster's metadata applies.
	changes atomic.Uint64
	stop    chan struct{}
	done    chan struct{}
}

// newMembership is allocated with the node, before its cluster starts (the
// cluster's applier counts metadata changes on it); openMembership then
// loads a single node's state and starts the coordinator.
func newMembership(n *Node) *membership {
	return &membership{n: n, sinks: map[memberKey]NoticeSink{}}
}

func (n *Node) openMembership() error {
	m := n.members
	if n.cluster == nil {
		st := m.local // loaded by Open, before the topics (loadGroups)
		st.GroupMutations = n.cfg.Mutations.Group
		n.mu.RLock()
		for name, t := range n.topics {
			if mt, ok := st.Topics[name]; !ok || mt.Incarnation != t.incarnation {
				st.AddTopic(meta.Topic{Config: t.cfg, Incarnation: t.incarnation})
			}
		}
		n.mu.RUnlock()
	}
	if !n.cfg.Manual {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.run()
	}
	return nil
}

// loadGroups reads a single node's groups.json, or its copy when it is
// damaged (GroupsKeptTwice); damaged reports a copy to write again
// (storage.ReadFileEither).
func loadGroups(n *Node) (st *meta.State, damaged, err error) {
	b, damaged, err := storage.ReadFileEither(n.cfg.Env.FS, path.Join(n.cfg.DataDir, groupsFile))
	if errors.Is(err, fs.ErrNotExist) {
		// A fresh state numbers its commands (and so its incarnations)
		// from the clock: after a repair removed a damaged file, a new
		// member never reuses an incarnation of before.
		st := meta.New()
		st.Applied = uint64(max(n.nowMs(), 0))
		return st, nil, groupIncarnationsFromDirectories(n, st)
	}
	if errors.Is(err, storage.ErrCorrupt) {
		return nil, nil, fmt.Errorf("%s: %w (and its copy; stop the node and run nereus repair: the groups' members are forgotten and join again)", groupsFile, err)
	}
	if err != nil {
		return nil, nil, err
	}
	st = meta.New()
	if err := json.Unmarshal(b, st); err != nil {
		return nil, nil, err
	}
	return st, damaged, nil
}

// saveGroups writes a single node's group state to groups.json and its
// copy (GroupsKeptTwice: a bit flip in one leaves the other, where a lone
// file stopped the node until a repair that forgot every member).
func saveGroups(n *Node, st *meta.State) error {
	return n.writeStateTwice(groupsFile, st, n.cfg.Mutations.GroupsOnce)
}

// groupIncarnationsFromDirectories gives a fresh group state (after a
// repair removed a damaged groups.json) the deleted group incarnations
// the directories tell of: a group at name@N had N−1 deleted, so it keeps
// its acks and an older incarnation's leftovers go (GroupsDeleted).
func groupIncarnationsFromDirectories(n *Node, st *meta.State) error {
	keys, err := n.cfg.Env.FS.List(path.Join(n.cfg.DataDir, "groups"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list group directories: %w", err)
	}
	for _, key := range keys {
		if name, inc, ok := meta.ParseTopicKey(key); ok && inc > 1 && inc-1 > st.GroupsDeleted[name] {
			if st.GroupsDeleted == nil {
				st.GroupsDeleted = map[string]uint64{}
			}
			st.GroupsDeleted[name] = inc - 1
		}
	}
	return nil
}

func (m *membership) run() {
	defer close(m.done)
	t := m.n.cfg.Env.Clock.NewTicker(coordinatorTick)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C():
			m.tick()
		}
	}
}

func (m *membership) close() {
	if m.stop != nil {
		close(m.stop)
		<-m.done
	}
}

// step is the Manual node's share: a coordinator tick when one is due.
func (m *membership) step(monoMs int64) bool {
	if monoMs < m.nextMs {
		return false
	}
	m.nextMs = monoMs + coordinatorTick.Milliseconds()
	return m.tick()
}

// coordinating reports whether this node coordinates the groups.
func (m *membership) coordinating() bool {
	if m.n.cluster == nil {
		return true
	}
	here, _ := m.n.cluster.Coordinator()
	return here
}

// read calls f with the applied group state.
func (m *membership) read(f func(*meta.State)) {
	if m.n.cluster != nil {
		m.n.cluster.ReadGroups(f)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m.local)
}

// propose decides and applies (single node) or proposes (cluster) a group
// command; done gets the outcome once it is applied here.
func (m *membership) propose(c group.Command, done func(error)) {
	m.proposeDecided(cluster.DecideGroup(c), done)
}

// proposeDecided is propose of a command decide makes.
func (m *membership) proposeDecided(decide func(*meta.State) (meta.Command, error), done func(error)) {
	if m.n.cluster != nil {
		m.n.cluster.ProposeMeta(decide, done)
		return
	}
	done(m.proposeLocal(decide))
}

// proposeLocal decides a command against a single node's state and
// applies it, durably, before it returns.
func (m *membership) proposeLocal(decide func(*meta.State) (meta.Command, error)) error {
	m.mu.Lock()
	cmd, err := decide(m.local)
	if err == nil {
		err = m.applyLocal(cmd)
	}
	m.mu.Unlock()
	if err == nil {
		m.n.pokeGroups() // (not under m.mu: a declare holds n.mu, then m.mu)
	}
	return err
}

// nextIncarnation is the incarnation a single node's declare of name
// gets (meta.State.NextIncarnation).
func (m *membership) nextIncarnation(name string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.local.NextIncarnation(name)
}

// applyLocal applies a command on a single node and persists the state
// before anyone hears of it; m.mu is held.
func (m *membership) applyLocal(cmd meta.Command) error {
	data, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	next := m.local.Clone()
	if _, err := next.Apply(m.local.Applied+1, data); err != nil {
		return err
	}
	if err := saveGroups(m.n, next); err != nil {
		return wire.Errorf(wire.CodeStorage, "persist group state: %v", err)
	}
	m.local = next
	m.changes.Add(1)
	return nil
}

// tick runs the coordinator: fences for silent or slow members, NOTICEs
// to the members connected here. It reports whether it did anything.
func (m *membership) tick() bool {
	if !m.coordinating() {
		m.mu.Lock()
		m.coord = nil
		m.mu.Unlock()
		return false
	}
	var groups []*group.State
	read := func(st *meta.State) {
		for _, g := range st.SortedGroups() {
			groups = append(groups, g.Clone())
		}
	}
	if m.n.cluster == nil {
		m.read(read)
	} else if !m.n.cluster.ReadPersistedGroups(read) {
		return false // the next tick, once meta.json holds what was applied
	}
	m.mu.Lock()
	if m.coord == nil {
		m.coord = group.NewCoordinator(noticeRetransmit.Milliseconds())
	}
	eff := m.coord.Tick(m.n.monoMs(), groups)
	type send struct {
		sink NoticeSink
		f    *wire.Notice
	}
	var sends []send
	for _, s := range eff.Send {
		if sink := m.sinks[memberKey{s.Group, s.Notice.Member, s.Notice.Incarnation}]; sink != nil {
			sends = append(sends, send{sink, noticeFrame(s.Group, s.Notice)})
		}
	}
	m.mu.Unlock()
	for _, s := range sends {
		s.sink.SendNotice(s.f)
	}
	for _, c := range eff.Propose {
		m.n.log.Info("fencing group member", "group", c.Group, "member", c.Member, "incarnation", c.Incarnation)
		m.propose(c, func(err error) {
			if err != nil {
				m.n.log.Warn("fencing group member failed; will retry", "group", c.Group, "member", c.Member, "err", err)
			}
		})
	}
	return len(sends) > 0 || len(eff.Propose) > 0
}

func noticeFrame(g string, n *group.Notice) *wire.Notice {
	f := &wire.Notice{Group: g, NoticeID: n.ID, Kind: uint8(n.Kind), Incarnation: n.Incarnation}
	for _, h := range n.Partitions {
		f.Partitions = append(f.Partitions, wire.HeldPartition{Topic: h.Partition.Topic, Partition: h.Partition.Index, Epoch: h.Epoch})
	}
	return f
}

// member returns the applied member, if its incarnation is current, and
// the metadata entry applied last.
func (m *membership) member(ref wire.MemberRef) (inc uint64, epoch uint64, ok bool) {
	inc, epoch, ok, _ = m.memberAt(ref)
	return inc, epoch, ok
}

func (m *membership) memberAt(ref wire.MemberRef) (inc uint64, epoch uint64, ok bool, applied uint64) {
	m.read(func(st *meta.State) {
		applied = st.Applied
		if g := st.Groups[ref.Group]; g != nil {
			epoch = g.MembershipEpoch
			if mm := g.Members[ref.Member]; mm != nil && (ref.Incarnation == 0 || mm.Incarnation == ref.Incarnation) {
				inc, ok = mm.Incarnation, true
			}
		}
	})
	return inc, epoch, ok, applied
}

func fenced(ref wire.MemberRef) error {
	return wire.Errorf(wire.CodeStaleAssignment, "member %q of group %s (incarnation %d) is not in the group (left or fenced): join again", ref.Member, ref.Group, ref.Incarnation)
}

// notMember answers a request naming an incarnation that is not a member
// here: STALE_ASSIGNMENT, unless this cluster node has not applied the
// metadata entry that made it (an incarnation is the seq of its JOIN) —
// then the request is early, not stale, and may be retried. (A single
// node's state is the one that answered the JOIN.)
func (m *membership) notMember(ref wire.MemberRef, applied uint64) error {
	if m.n.cluster != nil && ref.Incarnation > applied {
		return wire.Errorf(wire.CodeUnavailable, "member %q of group %s joined at metadata entry %d, not applied here yet (at %d); retry",
			ref.Member, ref.Group, ref.Incarnation, applied)
	}
	return fenced(ref)
}

// JoinGroup joins a member to a group on the coordinator. Its NOTICEs go
// to sink while the member's incarnation lasts (or until DropNotices).
// done is called exactly once.
func (n *Node) JoinGroup(f *wire.Join, sink NoticeSink, done func(*wire.JoinOK, error)) {
	m := n.members
	if !m.coordinating() {
		done(nil, n.cluster.NotCoordinator())
		return
	}
	c := group.Command{Op: group.OpJoin, Group: f.Group, Member: f.Member, Topics: f.Topics, Mode: group.Mode(f.Mode),
		SessionTimeoutMs: int64(f.SessionTimeoutMs), RebalanceTimeoutMs: int64(f.RebalanceTimeoutMs), JoinID: f.JoinID}
	m.propose(c, func(err error) {
		if err != nil {
			done(nil, err)
			return
		}
		var ok *wire.JoinOK
		m.read(func(st *meta.State) {
			g := st.Groups[f.Group]
			if g == nil {
				return
			}
			if mm := g.Members[f.Member]; mm != nil && mm.JoinID == f.JoinID {
				ok = &wire.JoinOK{Incarnation: mm.Incarnation, MembershipEpoch: g.MembershipEpoch, HeartbeatMs: uint32(mm.SessionTimeoutMs / 3)}
			}
		})
		if ok == nil {
			done(nil, wire.Errorf(wire.CodeUnavailable, "the JOIN of %q to group %s was overtaken (joined again or fenced); retry", f.Member, f.Group))
			return
		}
		m.mu.Lock()
		m.sinks[memberKey{f.Group, f.Member, ok.Incarnation}] = sink
		if m.coord != nil {
			m.coord.Heard(f.Group, f.Member, ok.Incarnation, n.monoMs())
			// A tick between the JOIN's apply and now produced its ASSIGN
			// with no sink to take it: send it now, not after a second.
			m.coord.Due(f.Group)
		}
		m.mu.Unlock()
		done(ok, nil)
		m.tick() // its ASSIGN goes out now, not at the next tick
	})
}

// GroupRequest handles a member's LEAVE, HEARTBEAT or CONTROL_ACK on the
// coordinator; done is called exactly once with the membership epoch.
func (n *Node) GroupRequest(f wire.Frame, done func(epoch uint64, err error)) {
	m := n.members
	if !m.coordinating() {
		done(0, n.cluster.NotCoordinator())
		return
	}
	var ref wire.MemberRef
	var c group.Command
	switch f := f.(type) {
	case *wire.Leave:
		ref, c = f.MemberRef, group.Command{Op: group.OpLeave}
	case *wire.ControlAck:
		if f.Incarnation == 0 {
			// A notice is numbered within its incarnation (NoticesOfAnIncarnation):
			// an answer must say which one it answers.
			done(0, wire.Errorf(wire.CodeInvalidArgument, "CONTROL_ACK of notice %d names no incarnation", f.NoticeID))
			return
		}
		ref, c = f.MemberRef, group.Command{Op: group.OpControlAck, Notice: f.NoticeID}
	case *wire.Heartbeat:
		ref = f.MemberRef
	default:
		done(0, wire.Errorf(wire.CodeBadFrame, "not a group request: %s", f.Type()))
		return
	}
	inc, epoch, ok, applied := m.memberAt(ref)
	if !ok {
		if c.Op == group.OpLeave && ref.Incarnation <= applied {
			done(epoch, nil) // gone already: a retried LEAVE
			return
		}
		done(0, m.notMember(ref, applied))
		return
	}
	m.mu.Lock()
	if m.coord != nil {
		m.coord.Heard(ref.Group, ref.Member, inc, n.monoMs())
	}
	m.mu.Unlock()
	if c.Op == "" {
		done(epoch, nil)
		return
	}
	c.Group, c.Member, c.Incarnation = ref.Group, ref.Member, inc
	m.propose(c, func(err error) {
		if err != nil {
			done(0, err)
			return
		}
		if c.Op == group.OpLeave {
			n.DropNotices(ref)
		}
		_, epoch, _ := m.member(wire.MemberRef{Group: ref.Group, Member: ref.Member})
		done(epoch, nil)
		m.tick() // the notices the command made go out now
	})
}

// DropNotices forgets a member's notice sink (its connection closed).
func (n *Node) DropNotices(ref wire.MemberRef) {
	n.members.mu.Lock()
	delete(n.members.sinks, memberKey{ref.Group, ref.Member, ref.Incarnation})
	n.members.mu.Unlock()
}

// DeleteGroup removes a group without members; done is called once.
// force also deletes a name the metadata does not know: a group consumed
// only without membership (meta.State.DecideGroupDelete). incarnation,
// when not 0, is the one the caller means (GROUP_INCARNATION told it): a
// retry of its delete once it was applied is answered OK and deletes
// nothing more (GroupDeleteRetryDeletesOnce).
func (n *Node) DeleteGroup(name string, force bool, incarnation uint64, done func(error)) {
	if err := n.coordinatesGroup(name); err != nil {
		done(err)
		return
	}
	m := n.members
	var decided meta.Command
	decide := func(st *meta.State) (meta.Command, error) {
		cmd, err := cluster.DecideGroupDelete(name, force, incarnation)(st)
		decided = cmd
		return cmd, err
	}
	answer := func(err error) {
		if errors.Is(err, meta.ErrGroupAlreadyDeleted) {
			err = nil // nothing was proposed: the delete it repeats was applied
		}
		done(err)
	}
	if n.cluster != nil {
		// Carried out as it applies (groupDeleted). GroupDeleteAnswersWhatApplied:
		// a member that joined between the decision and the delete's
		// entry makes it apply as nothing (meta applyGroup); the answer
		// says so rather than OK.
		m.proposeDecided(decide, func(err error) {
			if err == nil {
				m.read(func(st *meta.State) {
					if st.GroupsDeleted[name] < decided.Incarnation {
						err = wire.Errorf(wire.CodeInvalidArgument, "group %s: a member joined before the delete applied, so nothing was deleted; its members must leave first", name)
					}
				})
			}
			answer(err)
		})
		return
	}
	m.proposeDecided(decide, func(err error) {
		if err == nil {
			var inc uint64
			m.read(func(st *meta.State) { inc = st.GroupsDeleted[name] })
			n.groupDeleted(name, inc, true) // durable in groups.json
		}
		answer(err)
	})
}

// CoordinatorGroupIncarnation answers GROUP_INCARNATION: the current
// incarnation of group name as the coordinator's applied metadata says —
// the one its next delete removes. Other nodes refuse (NOT_LEADER): their
// metadata may lag the coordinator's.
func (n *Node) CoordinatorGroupIncarnation(name string) (uint64, error) {
	if err := n.coordinatesGroup(name); err != nil {
		return 0, err
	}
	if n.cluster == nil {
		return n.GroupIncarnation(name), nil
	}
	var inc uint64
	err := n.cluster.ReadCoordinated(func(st *meta.State) { inc = st.GroupIncarnation(name) })
	return inc, err
}

// coordinatesGroup refuses an invalid group name, and every group
// administration request on a node that does not coordinate the groups.
func (n *Node) coordinatesGroup(name string) error {
	if err := wire.ValidateName("group", name); err != nil {
		return err
	}
	if !n.members.coordinating() {
		return n.cluster.NotCoordinator()
	}
	return nil
}

// GroupStates returns copies of the applied groups, by name.
func (n *Node) GroupStates() []*group.State {
	var out []*group.State
	n.members.read(func(st *meta.State) {
		for _, g := range st.SortedGroups() {
			out = append(out, g.Clone())
		}
	})
	return out
}

// coordinatorInfo answers METADATA for wire.CoordinatorTopic in a
// cluster: one partition led by the groups' coordinator, as far as this
// node knows.
func (n *Node) coordinatorInfo() wire.TopicInfo {
	here, addr := n.cluster.Coordinator()
	p := wire.PartitionInfo{LeaderAddr: addr}
	if here {
		p.Leader = n.cfg.NodeID
	} else if v, ok := n.cluster.Replica(meta.MetaTopic, 0); ok && v.Status.Leader != 0 {
		p.Leader = n.cluster.Name(v.Status.Leader)
	}
	return wire.TopicInfo{Config: wire.TopicConfig{Name: wire.CoordinatorTopic, Partitions: 1}, Partitions: []wire.PartitionInfo{p}}
}

// topicDeclared gives a single node's new topic to the groups waiting for
// it; the state is persisted with the next command (the topic list is
// topics.json's, read again at every open).
func (m *membership) topicDeclared(tc wire.TopicConfig, incarnation uint64) {
	if m == nil || m.local == nil {
		return
	}
	m.mu.Lock()
	m.local.AddTopic(meta.Topic{Config: tc, Incarnation: incarnation})
	m.changes.Add(1)
	m.mu.Unlock()
}

// mayConsume checks a PULL's membership: a group with JOINed members in
// exclusive mode serves only its members (each the partitions it holds);
// a member must be a current incarnation subscribed to the topic.
func (m *membership) mayConsume(groupName, topic, member string, incarnation uint64) error {
	var err error
	m.read(func(st *meta.State) {
		g := st.Groups[groupName]
		switch {
		case member == "" && g != nil && g.Mode == group.Exclusive && len(g.Members) > 0:
			err = wire.Errorf(wire.CodeInvalidArgument, "group %s assigns partitions to its members: JOIN it before PULL", groupName)
		case member == "":
		case g == nil || g.Members[member] == nil || g.Members[member].Incarnation != incarnation:
			// (The node running the group's delivery may apply the JOIN
			// after the coordinator answered it.)
			err = m.notMember(wire.MemberRef{Group: groupName, Member: member, Incarnation: incarnation}, st.Applied)
		case !slices.Contains(g.Members[member].Topics, topic):
			err = wire.Errorf(wire.CodeInvalidArgument, "member %q of group %s did not subscribe to topic %s", member, groupName, topic)
		}
	})
	return err
}

// version changes whenever the applied group state may have: runners
// re-read their assignment then (an atomic: every dispatch asks).
func (m *membership) version() uint64 { return m.changes.Load() }

// owners returns, per partition of topic, who may be delivered it in
// group (ok false: the group assigns nothing on this topic — no JOINed
// members in exclusive mode — and every subscription competes).
func (m *membership) owners(groupName, topic string, partitions int) (out []partOwner, epoch uint64, ok bool) {
	m.read(func(st *meta.State) {
		g := st.Groups[groupName]
		if g == nil || g.Mode != group.Exclusive || len(g.Members) == 0 {
			return
		}
		ok, epoch = true, g.AssignmentEpoch
		out = make([]partOwner, partitions)
		for i := range out {
			if o := g.Owners[group.Partition{Topic: topic, Index: uint32(i)}]; o != nil {
				out[i] = partOwner{member: o.Member, incarnation: g.Members[o.Member].Incarnation, epoch: o.Epoch, revoking: o.Revoking != 0}
			}
		}
		for _, n := range g.Notices {
			for _, h := range n.Partitions {
				if n.Kind == group.NoticeAssign && h.Partition.Topic == topic && int(h.Partition.Index) < len(out) {
					out[h.Partition.Index].assigning = true
				}
			}
		}
	})
	return out, epoch, ok
}

// partOwner is who holds one partition for a group's delivery.
type partOwner struct {
	member      string
	incarnation uint64
	epoch       uint64
	revoking    bool // no new deliveries; acks still count
	// assigning: its ASSIGN is not acknowledged yet — the member may not
	// know it holds the partition and would drop what came.
	assigning bool
}

// pokeGroups wakes every group runner: the group state changed, and a
// partition may have a new owner to deliver to.
func (n *Node) pokeGroups() {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, g := range n.groups {
		g.poke()
	}
}

// GroupInfos describes the group named name ("" = all), with the ack
// floors of the partitions whose delivery this node runs for it (in a
// cluster: those it leads).
func (n *Node) GroupInfos(name string) ([]wire.GroupInfo, error) {
	if name != "" {
		if err := wire.ValidateName("group", name); err != nil {
			return nil, err
		}
	}
	var out []wire.GroupInfo
	for _, g := range n.GroupStates() {
		if name != "" && g.Name != name {
			continue
		}
		info := wire.GroupInfo{Group: g.Name, Mode: uint8(g.Mode), MembershipEpoch: g.MembershipEpoch, AssignmentEpoch: g.AssignmentEpoch}
		for _, id := range slices.Sorted(maps.Keys(g.Members)) {
			mm := g.Members[id]
			info.Members = append(info.Members, wire.GroupMemberInfo{Member: id, Incarnation: mm.Incarnation, Topics: mm.Topics, Partitions: heldFrames(g.Assigned(id))})
		}
		for _, nt := range g.PendingNotices() {
			info.Pending = append(info.Pending, wire.PendingNotice{NoticeID: nt.ID, Kind: uint8(nt.Kind), Member: nt.Member, Partitions: heldFrames(nt.Partitions)})
		}
		n.mu.RLock()
		var runners []*groupRunner
		for k, r := range n.groups {
			if k.group == g.Name {
				runners = append(runners, r)
			}
		}
		n.mu.RUnlock()
		slices.SortFunc(runners, func(a, b *groupRunner) int { return cmp.Compare(a.topic.cfg.Name, b.topic.cfg.Name) })
		for _, r := range runners {
			for i, p := range r.topic.partitions {
				if !r.delivering[i].Load() {
					continue
				}
				info.Partitions = append(info.Partitions, wire.GroupPartitionInfo{Topic: r.topic.cfg.Name, Partition: uint32(i),
					AckFloor: r.floors[i].Load(), CommitSeq: p.commitSeq.Load()})
			}
		}
		out = append(out, info)
	}
	if name != "" && len(out) == 0 {
		return nil, wire.Errorf(wire.CodeNotFound, "group %s does not exist", name)
	}
	return out, nil
}

func heldFrames(hs []group.Held) []wire.HeldPartition {
	out := make([]wire.HeldPartition, len(hs))
	for i, h := range hs {
		out[i] = wire.HeldPartition{Topic: h.Partition.Topic, Partition: h.Partition.Index, Epoch: h.Epoch}
	}
	return out
}
