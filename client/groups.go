package client

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/internal/wire"
)

// GroupInfo describes a consumer group with JOINed members.
type GroupInfo struct {
	Name            string          `json:"name"`
	Mode            string          `json:"mode"` // exclusive or shared
	MembershipEpoch uint64          `json:"membership_epoch"`
	AssignmentEpoch uint64          `json:"assignment_epoch"`
	Members         []GroupMember   `json:"members"`
	Pending         []PendingNotice `json:"pending_notices"`
	// Partitions: ack floor and lag of the partitions whose delivery runs
	// for the group (in a cluster each partition's leader reports its own,
	// for the topics its members subscribe to; a partition without a
	// reachable leader, or never subscribed at its leader, is absent).
	Partitions []GroupPartition `json:"partitions"`
}

// GroupMember is one member and the partitions it holds.
type GroupMember struct {
	ID          string          `json:"id"`
	Incarnation uint64          `json:"incarnation"`
	Topics      []string        `json:"topics"`
	Partitions  []HeldPartition `json:"partitions"`
}

// HeldPartition is a partition held at an assignment epoch.
type HeldPartition struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Epoch     uint64 `json:"epoch"`
}

// PendingNotice is a NOTICE its member has not acknowledged yet.
type PendingNotice struct {
	ID         uint64          `json:"id"`
	Kind       string          `json:"kind"` // ASSIGN or REVOKE
	Member     string          `json:"member"`
	Partitions []HeldPartition `json:"partitions"`
}

// GroupPartition is a partition's delivery state in a group.
type GroupPartition struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	AckFloor  uint64 `json:"ack_floor"` // the lowest seq not yet done
	CommitSeq uint64 `json:"commit_seq"`
	Lag       uint64 `json:"lag"` // visible records not yet done: CommitSeq + 1 - AckFloor
}

// Groups describes the named group, or every group when name is "". In a
// cluster, each node knows the ack floors of the partitions it leads: the
// membership comes from one node, and every leader of the groups' topics
// is asked for its partitions' floors.
func (c *Client) Groups(ctx context.Context, name string) ([]GroupInfo, error) {
	reply, err := c.idempotentRequest(ctx, &wire.GroupList{Group: name})
	if err != nil {
		return nil, fmt.Errorf("nereus: groups: %w", err)
	}
	ok, isOK := reply.(*wire.GroupListOK)
	if !isOK {
		return nil, unexpected("GROUP_LIST", reply)
	}
	c.addLeadersFloors(ctx, name, ok.Groups)
	out := make([]GroupInfo, 0, len(ok.Groups))
	for _, g := range ok.Groups {
		info := GroupInfo{Name: g.Group, Mode: "exclusive", MembershipEpoch: g.MembershipEpoch, AssignmentEpoch: g.AssignmentEpoch,
			Members: []GroupMember{}, Pending: []PendingNotice{}, Partitions: []GroupPartition{}}
		if g.Mode == wire.GroupShared {
			info.Mode = "shared"
		}
		for _, m := range g.Members {
			info.Members = append(info.Members, GroupMember{ID: m.Member, Incarnation: m.Incarnation, Topics: m.Topics, Partitions: held(m.Partitions)})
		}
		for _, n := range g.Pending {
			kind := "ASSIGN"
			if n.Kind == wire.NoticeRevoke {
				kind = "REVOKE"
			}
			info.Pending = append(info.Pending, PendingNotice{ID: n.NoticeID, Kind: kind, Member: n.Member, Partitions: held(n.Partitions)})
		}
		for _, p := range g.Partitions {
			info.Partitions = append(info.Partitions, GroupPartition{Topic: p.Topic, Partition: int(p.Partition), AckFloor: p.AckFloor,
				CommitSeq: p.CommitSeq, Lag: p.CommitSeq + 1 - min(p.AckFloor, p.CommitSeq+1)})
		}
		out = append(out, info)
	}
	return out, nil
}

// addLeadersFloors asks the leader of every partition of the groups'
// topics for the floors it keeps and puts them in groups (replacing what
// the first answer said of that partition). It is best effort: a leader
// that does not answer leaves its partitions as they were.
func (c *Client) addLeadersFloors(ctx context.Context, name string, groups []wire.GroupInfo) {
	var topics []string
	for _, g := range groups {
		for _, m := range g.Members {
			for _, t := range m.Topics {
				if !slices.Contains(topics, t) {
					topics = append(topics, t)
				}
			}
		}
	}
	if len(topics) == 0 {
		return
	}
	metas, err := c.Topics(ctx, topics...)
	if err != nil {
		return
	}
	type key struct {
		topic string
		part  uint32
	}
	led := map[*conn][]key{} // what each leader's connection leads
	for _, t := range metas {
		for _, p := range t.Partitions {
			if p.Leader == "" {
				continue
			}
			if cn, err := c.leaderConn(ctx, t.Config.Name, int32(p.Partition), true); err == nil && cn != nil {
				led[cn] = append(led[cn], key{t.Config.Name, uint32(p.Partition)})
			}
		}
	}
	for cn, keys := range led {
		rctx, cancel := c.withRequestTimeout(ctx)
		reply, err := cn.roundTrip(rctx, &wire.GroupList{Group: name})
		cancel()
		ok, isOK := reply.(*wire.GroupListOK)
		if err != nil || !isOK {
			continue
		}
		for _, their := range ok.Groups {
			i := slices.IndexFunc(groups, func(g wire.GroupInfo) bool { return g.Group == their.Group })
			if i < 0 {
				continue
			}
			for _, p := range their.Partitions {
				if !slices.Contains(keys, key{p.Topic, p.Partition}) {
					continue // not its leader's word
				}
				ps := &groups[i].Partitions
				if j := slices.IndexFunc(*ps, func(q wire.GroupPartitionInfo) bool { return q.Topic == p.Topic && q.Partition == p.Partition }); j >= 0 {
					(*ps)[j] = p
				} else {
					*ps = append(*ps, p)
				}
			}
		}
	}
	for i := range groups {
		slices.SortFunc(groups[i].Partitions, func(a, b wire.GroupPartitionInfo) int {
			return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
		})
	}
}

func held(hs []wire.HeldPartition) []HeldPartition {
	out := make([]HeldPartition, len(hs))
	for i, h := range hs {
		out[i] = HeldPartition{Topic: h.Topic, Partition: int(h.Partition), Epoch: h.Epoch}
	}
	return out
}

// DeleteGroup removes a group without members (at the coordinator), and
// its progress: a group of the name used later starts afresh, with no
// acks. The delete names the incarnation it found and is sent again after
// a lost connection or a coordinator change (DeleteGroupIncarnation).
func (c *Client) DeleteGroup(ctx context.Context, name string) error {
	_, err := c.DeleteGroupIncarnation(ctx, name, 0, false)
	return err
}

// DeleteGroupForce is DeleteGroup that also deletes a group the
// coordinator does not know: one consumed only by consumers without
// ConsumerOptions.Member, which no member ever joined. Its acks on every
// partition are dropped as DeleteGroup drops a member group's, and a
// consumer still attached to it fails with ErrNotFound. The coordinator
// cannot tell such a group from a mistyped name: a name never used is
// "deleted" too (its next use starts afresh, as it would have anyway).
func (c *Client) DeleteGroupForce(ctx context.Context, name string) error {
	_, err := c.DeleteGroupIncarnation(ctx, name, 0, true)
	return err
}

// DeleteGroupIncarnation deletes incarnation of group name — 0: the
// current one, asked of the coordinator first — with force as
// DeleteGroupForce, and returns the incarnation it deleted. The request
// names that incarnation, so it is sent again after a lost connection, a
// coordinator change or a delete the metadata log did not apply in time,
// until ctx (bounded by RequestTimeout) ends: once the incarnation is
// deleted, by this call or another, a delete of it is answered OK and
// deletes nothing more — never the incarnation consumers started next.
// A script that runs a delete again after a failure should pass the
// incarnation the first run returned or printed. An incarnation above
// the current one fails with ErrNotFound.
//
// A broker of before protocol version 3 knows no incarnation on the
// wire: the delete is then sent once as GROUP_DELETE (or
// GROUP_DELETE_FORCE), deleting whichever incarnation is current, and
// returns 0; incarnation must be 0 there.
func (c *Client) DeleteGroupIncarnation(ctx context.Context, name string, incarnation uint64, force bool) (uint64, error) {
	ctx, cancel := c.withRequestTimeout(ctx)
	defer cancel()
	if cn, err := c.leaderConn(ctx, wire.CoordinatorTopic, 0, true); err == nil && !cn.groupIncarnations {
		return 0, c.deleteGroupOfBefore(ctx, name, incarnation, force)
	}
	if incarnation == 0 {
		reply, err := c.coordinatorRetry(ctx, &wire.GroupIncarnation{Group: name})
		if err != nil {
			return 0, fmt.Errorf("nereus: delete group %s: %w", name, err)
		}
		ok, isOK := reply.(*wire.GroupIncarnationOK)
		if !isOK {
			return 0, unexpected("GROUP_INCARNATION", reply)
		}
		incarnation = ok.Incarnation
	}
	f := &wire.GroupDeleteIncarnation{GroupRef: wire.GroupRef{Group: name, Incarnation: incarnation}, Force: force}
	if _, err := c.coordinatorRetry(ctx, f); err != nil {
		return 0, fmt.Errorf("nereus: delete group %s incarnation %d: %w", name, incarnation, err)
	}
	return incarnation, nil
}

// deleteGroupOfBefore deletes group name's current incarnation with the
// frames a broker of before protocol version 3 knows, once: nothing
// tells its retry from a new delete.
func (c *Client) deleteGroupOfBefore(ctx context.Context, name string, incarnation uint64, force bool) error {
	if incarnation != 0 {
		return fmt.Errorf("nereus: delete group %s incarnation %d: the broker speaks a protocol version below %d, which names no incarnation",
			name, incarnation, wire.VersionGroupIncarnation)
	}
	var f wire.Frame = &wire.GroupDelete{Group: name}
	if force {
		f = &wire.GroupDeleteForce{Group: name}
	}
	if _, err := c.coordinatorRequest(ctx, f); err != nil {
		return fmt.Errorf("nereus: delete group %s: %w", name, err)
	}
	return nil
}

// coordinatorRetry is coordinatorRequest sent again, after a backoff,
// while it fails in a way a retry may mend (a lost connection, NOT_LEADER,
// UNAVAILABLE, QUORUM_LOST) and ctx lasts: only for requests that are
// safe to repeat.
func (c *Client) coordinatorRetry(ctx context.Context, f wire.Frame) (wire.Frame, error) {
	var last error
	for attempt := 1; ; attempt++ {
		reply, err := c.coordinatorRequest(ctx, f)
		if err == nil || !routeMayHaveMoved(err) {
			return reply, err
		}
		last = err
		if ctx.Err() != nil || !retryPause(ctx, attempt) {
			return nil, ctxError(ctx, last)
		}
	}
}

// coordinatorRequest sends f to the metadata leader (the groups'
// coordinator), which alone decides metadata deletions, and returns its
// reply.
func (c *Client) coordinatorRequest(ctx context.Context, f wire.Frame) (wire.Frame, error) {
	ctx, cancel := c.withRequestTimeout(ctx)
	defer cancel()
	c.awaitRefresh(ctx, wire.CoordinatorTopic)
	cn, err := c.leaderConn(ctx, wire.CoordinatorTopic, 0, true)
	if err != nil {
		return nil, err
	}
	return cn.roundTrip(ctx, f)
}

// GroupUpdate is a change to a consumer group's settings. A nil field
// keeps the value an earlier update gave, else the broker's default —
// not what the group's consumers asked.
type GroupUpdate struct {
	AckWait     *time.Duration // a whole number of milliseconds, 1 ms to about 49.7 days
	MaxDeliver  *uint32        // at least 1
	Incarnation uint64         // when not 0, the incarnation to update (another is ErrNotFound)
}

// GroupSettings are a group's settings after an update.
type GroupSettings struct {
	Group       string
	Incarnation uint64
	AckWait     time.Duration
	MaxDeliver  uint32
}

// UpdateGroup sets a consumer group's ack wait and max deliveries for
// every topic it consumes and returns its settings after the update (an
// update that changes nothing succeeds too). They hold on every node
// that delivers one of the group's partitions, from the next delivery
// on, for consumers of any ConsumerOptions; a lowered max deliveries
// sends a message that has used it up to the dead letters rather than
// out again. A group never updated keeps the settings its first
// consumer asked on each node. In a cluster it goes to the coordinator,
// and is sent again after a lost connection or a coordinator change
// until ctx ends: it sets values, so a repeat changes nothing more.
func (c *Client) UpdateGroup(ctx context.Context, name string, u GroupUpdate) (GroupSettings, error) {
	f := wire.GroupUpdate{GroupRef: wire.GroupRef{Group: name, Incarnation: u.Incarnation}}
	if u.AckWait != nil {
		ms := u.AckWait.Milliseconds()
		if *u.AckWait%time.Millisecond != 0 || ms < 1 || ms > math.MaxUint32 {
			return GroupSettings{}, fmt.Errorf("nereus: update group %s: %w", name,
				wire.Errorf(wire.CodeInvalidArgument, "ack wait %v: want a whole number of milliseconds from 1 ms to %v", *u.AckWait, time.Duration(math.MaxUint32)*time.Millisecond))
		}
		f.Set |= wire.SetAckWaitMs
		f.AckWaitMs = uint32(ms)
	}
	if u.MaxDeliver != nil {
		f.Set |= wire.SetMaxDeliver
		f.MaxDeliver = *u.MaxDeliver
	}
	if err := wire.ValidateName("group", name); err != nil {
		return GroupSettings{}, fmt.Errorf("nereus: update group: %w", err)
	}
	if err := f.Validate(); err != nil {
		return GroupSettings{}, fmt.Errorf("nereus: update group %s: %w", name, err)
	}
	ctx, cancel := c.withRequestTimeout(ctx)
	defer cancel()
	if cn, err := c.leaderConn(ctx, wire.CoordinatorTopic, 0, true); err == nil && !cn.groupUpdates {
		return GroupSettings{}, fmt.Errorf("nereus: update group %s: the broker speaks a protocol version below %d, which cannot update a group",
			name, wire.VersionGroupUpdate)
	}
	reply, err := c.coordinatorRetry(ctx, &f)
	if err != nil {
		return GroupSettings{}, fmt.Errorf("nereus: update group %s: %w", name, err)
	}
	ok, isOK := reply.(*wire.GroupUpdateOK)
	if !isOK {
		return GroupSettings{}, unexpected("GROUP_UPDATE", reply)
	}
	return GroupSettings{Group: ok.Group, Incarnation: ok.Incarnation, AckWait: time.Duration(ok.AckWaitMs) * time.Millisecond, MaxDeliver: ok.MaxDeliver}, nil
}
