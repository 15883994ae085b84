package client

import (
	"context"
	"fmt"

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
	// Partitions: ack floor and lag of the partitions whose delivery the
	// answering node runs for the group (others are absent).
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

// Groups describes the named group, or every group when name is "".
func (c *Client) Groups(ctx context.Context, name string) ([]GroupInfo, error) {
	reply, err := c.idempotentRequest(ctx, &wire.GroupList{Group: name})
	if err != nil {
		return nil, fmt.Errorf("nereus: groups: %w", err)
	}
	ok, isOK := reply.(*wire.GroupListOK)
	if !isOK {
		return nil, unexpected("GROUP_LIST", reply)
	}
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

func held(hs []wire.HeldPartition) []HeldPartition {
	out := make([]HeldPartition, len(hs))
	for i, h := range hs {
		out[i] = HeldPartition{Topic: h.Topic, Partition: int(h.Partition), Epoch: h.Epoch}
	}
	return out
}

// DeleteGroup removes a group without members (at the coordinator).
func (c *Client) DeleteGroup(ctx context.Context, name string) error {
	ctx, cancel := c.withRequestTimeout(ctx)
	defer cancel()
	c.awaitRefresh(ctx, wire.CoordinatorTopic)
	cn, err := c.leaderConn(ctx, wire.CoordinatorTopic, 0, true)
	if err != nil {
		return fmt.Errorf("nereus: delete group %s: %w", name, err)
	}
	if _, err := cn.roundTrip(ctx, &wire.GroupDelete{Group: name}); err != nil {
		return fmt.Errorf("nereus: delete group %s: %w", name, err)
	}
	return nil
}
