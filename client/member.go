package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nereus-broker/nereus/internal/group"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A Consumer with ConsumerOptions.Member is a member of its group: it
// JOINs the group's coordinator, which assigns it partitions (each
// partition to one member at a time), heartbeats, answers the
// coordinator's NOTICEs — ASSIGN: start fetching; REVOKE: stop, wait for
// the Handle callbacks running, call OnRevoked, send the acks, then
// CONTROL_ACK — and LEAVEs at Close. A member fenced by the coordinator
// (silent past its session timeout) joins again as a new incarnation.

// memberJoinTimeout bounds one JOIN attempt.
const memberJoinTimeout = 5 * time.Second

type groupMember struct {
	co   *Consumer
	c    *Client
	join wire.Join

	mu        sync.Mutex
	cn        *conn // the coordinator's connection (nil: join again)
	corr      uint64
	ref       wire.MemberRef // Incarnation 0 until joined
	heartbeat time.Duration
	view      *group.View
	lostHeld  []group.Held // an earlier incarnation's partitions, to give up

	notices chan *wire.Notice
	stop    chan struct{}
	done    chan struct{}
}

func newJoinID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1 // 0 is reserved
}

func newGroupMember(co *Consumer, opts ConsumerOptions) *groupMember {
	mode := wire.GroupExclusive
	if opts.Shared {
		mode = wire.GroupShared
	}
	return &groupMember{co: co, c: co.client,
		join: wire.Join{Group: co.key.group, Member: opts.Member, Topics: []string{co.key.topic}, Mode: mode,
			SessionTimeoutMs:   uint32(min(opts.SessionTimeout.Milliseconds(), 1<<32-1)),
			RebalanceTimeoutMs: uint32(min(opts.RebalanceTimeout.Milliseconds(), 1<<32-1)),
			JoinID:             newJoinID()},
		view: group.NewView(), notices: make(chan *wire.Notice, 64), stop: make(chan struct{}), done: make(chan struct{})}
}

// holds reports whether the member holds partition p of its topic (in
// shared mode every member takes every partition).
func (m *groupMember) holds(p uint32) bool {
	if m.join.Mode == wire.GroupShared {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.view.Epoch(group.Partition{Topic: m.join.Topics[0], Index: p}) != 0
}

// joinOnce joins at the coordinator (found through METADATA of
// wire.CoordinatorTopic; a single node coordinates its own groups).
func (m *groupMember) joinOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, memberJoinTimeout)
	defer cancel()
	m.c.awaitRefresh(ctx, wire.CoordinatorTopic)
	cn, err := m.c.leaderConn(ctx, wire.CoordinatorTopic, 0, true)
	if err != nil {
		return err
	}
	reply := make(chan error, 1)
	var first sync.Once
	join := m.join
	corr, err := cn.openStream(ctx, &join, func(f wire.Frame, err error) {
		if err != nil {
			first.Do(func() { reply <- err })
			m.lost(cn)
			return
		}
		switch f := f.(type) {
		case *wire.JoinOK:
			m.joined(cn, f)
			first.Do(func() { reply <- nil })
		case *wire.Notice:
			select {
			case m.notices <- f:
			default: // the coordinator resends it
			}
		}
	})
	if err != nil {
		return err
	}
	cn.flush()
	select {
	case err := <-reply:
		if err != nil {
			cn.closeStream(corr)
			return err
		}
		m.mu.Lock()
		m.corr = corr
		m.mu.Unlock()
		m.releaseLost()
		return nil
	case <-ctx.Done():
		cn.closeStream(corr)
		return fmt.Errorf("nereus: join %s: %w", m.join.Group, ctx.Err())
	}
}

// joined records a JOIN_OK: a new incarnation starts with an empty view
// and a fresh subscription. What an earlier incarnation held (it was
// fenced while this member was away, and the JOIN made a new one) is given
// up: joinOnce releases it off the connection's reader goroutine.
func (m *groupMember) joined(cn *conn, ok *wire.JoinOK) {
	m.mu.Lock()
	m.cn = cn
	m.heartbeat = max(time.Duration(ok.HeartbeatMs)*time.Millisecond, 100*time.Millisecond)
	changed := m.ref.Incarnation != ok.Incarnation
	m.ref = wire.MemberRef{Group: m.join.Group, Member: m.join.Member, Incarnation: ok.Incarnation}
	if changed {
		m.lostHeld = append(m.lostHeld, m.view.Held()...)
		m.view = group.NewView()
	}
	m.mu.Unlock()
	if changed {
		m.co.setIncarnation(m.join.Member, ok.Incarnation)
	}
}

// releaseLost gives up what an earlier incarnation held (joined found a
// new one): OnRevoked, buffered messages dropped, acks sent.
func (m *groupMember) releaseLost() {
	m.mu.Lock()
	lost := m.lostHeld
	m.lostHeld = nil
	m.mu.Unlock()
	if len(lost) > 0 {
		m.co.release(indexes(lost))
	}
}

// lost forgets the coordinator's connection: the member joins again.
func (m *groupMember) lost(cn *conn) {
	m.mu.Lock()
	if m.cn == cn {
		m.cn = nil
	}
	m.mu.Unlock()
}

func (m *groupMember) run() {
	defer close(m.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.stop:
		case <-m.c.closed:
		}
		cancel()
	}()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		m.mu.Lock()
		cn, every := m.cn, m.heartbeat
		m.mu.Unlock()
		var connDone <-chan struct{}
		wait := every
		if cn == nil {
			if err := m.joinOnce(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				if !IsRetryable(err) && !hasCode(err, wire.CodeNotLeader) {
					m.co.setErr(fmt.Errorf("nereus: join group %s: %w", m.join.Group, err))
					return
				}
				wait = resubscribeDelay * 5
			} else {
				continue
			}
		} else {
			connDone = cn.done
		}
		retry.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-connDone:
			m.lost(cn)
		case n := <-m.notices:
			m.notice(ctx, cn, n)
		case <-retry.C:
			if cn != nil {
				m.beat(ctx, cn)
			}
		}
	}
}

// beat sends one HEARTBEAT; a fenced member joins again as a new
// incarnation, a moved coordinator is looked up again.
func (m *groupMember) beat(ctx context.Context, cn *conn) {
	m.mu.Lock()
	ref := m.ref
	m.mu.Unlock()
	ctx, cancel := m.c.withRequestTimeout(ctx)
	defer cancel()
	_, err := cn.roundTrip(ctx, &wire.Heartbeat{MemberRef: ref})
	switch {
	case err == nil:
	case hasCode(err, wire.CodeStaleAssignment):
		m.revokeAll()
		m.mu.Lock()
		m.join.JoinID = newJoinID()
		m.mu.Unlock()
		cn.closeStream(m.corr)
		m.lost(cn)
	case routeMayHaveMoved(err) || errors.Is(err, context.DeadlineExceeded):
		cn.closeStream(m.corr)
		m.lost(cn)
	}
}

// notice carries out a NOTICE and answers CONTROL_ACK.
func (m *groupMember) notice(ctx context.Context, cn *conn, f *wire.Notice) {
	ref, ok := m.apply(f)
	if !ok {
		return // for an incarnation that is gone
	}
	ctx, cancel := m.c.withRequestTimeout(ctx)
	defer cancel()
	_, _ = cn.roundTrip(ctx, &wire.ControlAck{MemberRef: ref, NoticeID: f.NoticeID}) // lost: the notice comes again
}

// apply carries out a NOTICE of the member's incarnation (ok false for
// another): the view first — Next and Handle take no more messages of the
// partitions it revokes — then the release of those partitions, then
// OnAssigned. What apply did is what the CONTROL_ACK confirms.
func (m *groupMember) apply(f *wire.Notice) (ref wire.MemberRef, ok bool) {
	m.mu.Lock()
	if f.Incarnation != m.ref.Incarnation {
		m.mu.Unlock()
		return wire.MemberRef{}, false
	}
	n := &group.Notice{ID: f.NoticeID, Kind: group.NoticeKind(f.Kind), Incarnation: f.Incarnation}
	for _, p := range f.Partitions {
		n.Partitions = append(n.Partitions, group.Held{Partition: group.Partition{Topic: p.Topic, Index: p.Partition}, Epoch: p.Epoch})
	}
	assigned, revoked := m.view.Notice(n)
	ref = m.ref
	m.mu.Unlock()
	if len(revoked) > 0 {
		m.co.release(indexes(revoked))
	}
	if len(assigned) > 0 && m.co.onAssigned != nil {
		m.co.onAssigned(indexes(assigned))
	}
	return ref, true
}

// revokeAll releases every partition (the member was fenced).
func (m *groupMember) revokeAll() {
	m.mu.Lock()
	held := m.view.Held()
	m.view = group.NewView()
	m.mu.Unlock()
	if len(held) > 0 {
		m.co.release(indexes(held))
	}
}

func indexes(hs []group.Held) []int {
	out := make([]int, len(hs))
	for i, h := range hs {
		out[i] = int(h.Partition.Index)
	}
	return out
}

// leave stops the member: LEAVE, so its partitions move at once.
func (m *groupMember) leave() {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	cn, ref, corr := m.cn, m.ref, m.corr
	m.mu.Unlock()
	if cn == nil || ref.Incarnation == 0 {
		return
	}
	ctx, cancel := m.c.withRequestTimeout(context.Background())
	defer cancel()
	_, _ = cn.roundTrip(ctx, &wire.Leave{MemberRef: ref})
	cn.closeStream(corr)
}
