package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nereus-broker/nereus/client"
	"github.com/nereus-broker/nereus/internal/wire"
)

// The Nereus side of the group workloads (group.go): a partitioned topic,
// members of one group, and the time a JOIN or a LEAVE takes to reach a
// stable assignment, which only Nereus has (a JetStream consumer's workers
// are not assigned anything).

func (s *nereusSystem) CreateGroupStream(ctx context.Context, name string, partitions int) error {
	return s.createTopic(ctx, name, partitions)
}

func (s *nereusSystem) NewSpreadPublisher(ctx context.Context, stream string, partitions, inflightMax int) (publisher, error) {
	pub, err := s.NewPublisher(ctx, stream, inflightMax)
	if err != nil {
		return nil, err
	}
	p := pub.(*nereusPublisher)
	for i := range partitions {
		p.targets = append(p.targets, i)
	}
	return p, nil
}

func (s *nereusSystem) NewGroupMember(ctx context.Context, stream, group, member string, batchMax int) (subscriber, error) {
	c, err := s.dial(ctx, "bench-member-"+member)
	if err != nil {
		return nil, err
	}
	co, err := c.Subscribe(ctx, stream, group, client.ConsumerOptions{Credit: batchMax, Member: member})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &nereusMember{nereusSubscriber: nereusSubscriber{conn: c, consumer: co, batchMax: batchMax}, stream: stream, group: group, member: member}, nil
}

// memberResubscribesMax bounds how often one member subscribes again after
// its subscription was refused STALE_ASSIGNMENT.
const memberResubscribesMax = 3

// nereusMember is a member of a group. Unlike the plain subscriber its
// Close does not fail on stale or failed acks: ackCounts reports them
// (a rebalance may legitimately make an ack stale; the harness logs them).
//
// In a cluster a member's first PULL, sent at once after JOIN_OK, can
// reach the leader of partition 0 before that node has applied the JOIN
// from the metadata log; it answers STALE_ASSIGNMENT, which the SDK's
// Consumer takes as final (docs/PERFORMANCE.md, consumer groups). The
// member then closes its consumer and subscribes again (a new JOIN), at
// most memberResubscribesMax times, inside the timed part; the workload
// logs how often (transientErrors).
type nereusMember struct {
	nereusSubscriber
	stream, group, member string
	resubscribes          int64
}

func (m *nereusMember) ReceiveBatch(ctx context.Context, wait time.Duration, handle func([]byte)) (int, error) {
	n, err := m.nereusSubscriber.ReceiveBatch(ctx, wait, handle)
	var we *wire.Error
	if err == nil || !errors.As(err, &we) || we.Code != wire.CodeStaleAssignment || m.resubscribes >= memberResubscribesMax {
		return n, err
	}
	m.resubscribes++
	if cerr := m.consumer.Close(); cerr != nil {
		return n, errors.Join(err, cerr)
	}
	co, serr := m.conn.Subscribe(ctx, m.stream, m.group, client.ConsumerOptions{Credit: m.batchMax, Member: m.member})
	if serr != nil {
		return n, fmt.Errorf("%w; subscribe again: %w", err, serr)
	}
	m.consumer = co
	return n, nil
}

func (m *nereusMember) transientErrors() int64 { return m.resubscribes }

func (m *nereusMember) ackCounts() (failed, stale uint64) {
	st := m.consumer.Stats()
	return st.FailedAcks, st.StaleAcks
}

func (m *nereusMember) Close() error {
	return errors.Join(m.consumer.Close(), m.conn.Close())
}

// stableAssignment reports whether group info shows exactly members
// members holding between them every one of topic's partitions once, with
// counts that differ by at most one, and no notice awaiting its answer.
func stableAssignment(info client.GroupInfo, topic string, partitions, members int) bool {
	if len(info.Members) != members || len(info.Pending) > 0 {
		return false
	}
	held := make([]int, partitions)
	least, most := partitions+1, -1
	for _, m := range info.Members {
		n := 0
		for _, p := range m.Partitions {
			if p.Topic != topic {
				continue
			}
			if p.Partition < 0 || p.Partition >= partitions {
				return false
			}
			held[p.Partition]++
			n++
		}
		least, most = min(least, n), max(most, n)
	}
	return !slices.ContainsFunc(held, func(n int) bool { return n != 1 }) && most-least <= 1
}

// groupChange is which membership change a join/leave run measures.
type groupChange int

const (
	changeJoin groupChange = iota
	changeLeave
)

// runGroupChange measures, lim.GroupChangeRepeats times on a fresh group
// of one empty partitioned topic, the time from the start of a member's
// Subscribe (JOIN) or Close (LEAVE) until the coordinator's description of
// the group (client.Groups, polled every groupPollInterval) shows the
// expected members, every partition held once, counts balanced and no
// notice pending. Each repetition starts groupMembersMax members one
// after another, each connection dialled before its clock starts; join
// samples are taken for each of them, a leave sample when the first one
// then closes.
func runGroupChange(ctx context.Context, sys system, stream string, change groupChange, lim limits, prog *progress, logf func(string, ...any)) (runResult, error) {
	s, ok := sys.(*nereusSystem)
	if !ok {
		return runResult{}, errors.New("the join and leave workloads need Nereus (JetStream assigns nothing to its workers)")
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	err := s.createTopic(sctx, stream, groupPartitions)
	cancel()
	if err != nil {
		return runResult{}, fmt.Errorf("create stream %s: %w", stream, err)
	}
	watcher, err := s.coordinatorClient(ctx)
	if err != nil {
		return runResult{}, err
	}
	defer watcher.Close()
	var samples []time.Duration
	byPosition := make([][]time.Duration, groupMembersMax)
	var subscribed []time.Duration // until Subscribe returned, per join
	prog.phase(map[groupChange]string{changeJoin: "joins", changeLeave: "leaves"}[change])
	for rep := 1; rep <= lim.GroupChangeRepeats; rep++ {
		group := fmt.Sprintf("%s-g%d", stream, rep)
		joins, returned, leave, err := groupChangeOnce(ctx, s, watcher, stream, group, change == changeLeave)
		if err != nil {
			return runResult{}, fmt.Errorf("repetition %d: %w", rep, err)
		}
		if change == changeJoin {
			samples = append(samples, joins...)
			subscribed = append(subscribed, returned...)
			for i, d := range joins {
				byPosition[i] = append(byPosition[i], d)
			}
		} else {
			samples = append(samples, leave)
		}
		prog.count.Store(int64(len(samples)))
		dctx, cancel := context.WithTimeout(ctx, setupTimeout)
		if err := s.admin.DeleteGroup(dctx, group); err != nil {
			logf("delete group %s: %v", group, err)
		}
		cancel()
	}
	if change == changeJoin {
		for i, ds := range byPosition {
			logf("%s: join of member %d of %d to a stable assignment, in ms: %s", stream, i+1, groupMembersMax, formatSamplesMs(ds))
		}
		logf("%s: Subscribe returned (JOIN_OK, then the PULL sent) after p50 %.1f ms, p99 %.1f ms", stream,
			percentileMicros(subscribed, 50)/1e3, percentileMicros(subscribed, 99)/1e3)
	} else {
		logf("%s: leave of 1 of %d members to a stable assignment, in ms: %s", stream, groupMembersMax, formatSamplesMs(samples))
	}
	return runResult{Messages: int64(len(samples)), Latencies: samples}, ctx.Err()
}

// groupChangeOnce starts groupMembersMax members of group one after
// another and returns the time each took from its Subscribe to a stable
// assignment, and to Subscribe's return; with leave it then closes the
// first one and returns the time to the next stable assignment. Every
// member is closed on return.
func groupChangeOnce(ctx context.Context, s *nereusSystem, watcher *client.Client, topic, group string, leave bool) (joins, returned []time.Duration, left time.Duration, err error) {
	var members []*client.Consumer
	var conns []*client.Client
	defer func() {
		for _, co := range members {
			err = errors.Join(err, co.Close())
		}
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 1; i <= groupMembersMax; i++ {
		member := fmt.Sprintf("m%d", i)
		dctx, cancel := context.WithTimeout(ctx, setupTimeout)
		c, err := s.dial(dctx, "bench-member-"+member)
		cancel()
		if err != nil {
			return nil, nil, 0, err
		}
		conns = append(conns, c)
		sctx, cancel := context.WithTimeout(ctx, groupStableTimeout)
		start := time.Now()
		co, err := c.Subscribe(sctx, topic, group, client.ConsumerOptions{Credit: consumeBatchMax, Member: member})
		if err == nil {
			returned = append(returned, time.Since(start))
			members = append(members, co)
			err = awaitStable(sctx, watcher, group, topic, i)
		}
		took := time.Since(start)
		cancel()
		if err != nil {
			return nil, nil, 0, fmt.Errorf("join of %s: %w", member, err)
		}
		joins = append(joins, took)
	}
	if !leave {
		return joins, returned, 0, nil
	}
	sctx, cancel := context.WithTimeout(ctx, groupStableTimeout)
	defer cancel()
	start := time.Now()
	err = members[0].Close()
	members = members[1:]
	if err == nil {
		err = awaitStable(sctx, watcher, group, topic, groupMembersMax-1)
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("leave of m1: %w", err)
	}
	return joins, returned, time.Since(start), nil
}

// awaitStable polls the group's description until stableAssignment holds.
func awaitStable(ctx context.Context, watcher *client.Client, group, topic string, members int) error {
	var last error
	var seen client.GroupInfo
	for {
		infos, err := watcher.Groups(ctx, group)
		if err == nil && len(infos) == 1 {
			seen = infos[0]
			if stableAssignment(seen, topic, groupPartitions, members) {
				return nil
			}
		} else if err != nil {
			last = err
		}
		if err := sleepCtx(ctx, groupPollInterval); err != nil {
			return fmt.Errorf("no stable assignment of %d members: %w (last seen: %d members, %d notices pending; last error: %v)",
				members, err, len(seen.Members), len(seen.Pending), last)
		}
	}
}

// coordinatorClient dials the group coordinator (the leader of the
// metadata log; a single node is its own), whose description of a group
// is current: the others describe it from their applied copy.
func (s *nereusSystem) coordinatorClient(ctx context.Context) (*client.Client, error) {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	addrs := s.addrs
	if len(s.addrs) > 1 {
		for {
			infos, err := s.admin.Topics(sctx, wire.CoordinatorTopic)
			if err == nil && len(infos) == 1 && allLed(infos[0]) {
				addrs = []string{infos[0].Partitions[0].LeaderAddr}
				break
			}
			if err := sleepCtx(sctx, clusterPollInterval); err != nil {
				return nil, fmt.Errorf("find the group coordinator: %w", err)
			}
		}
	}
	return client.Dial(sctx, client.Options{Servers: addrs, ClientName: "bench-group-watch"})
}
