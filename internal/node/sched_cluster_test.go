package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/wire"
)

// scheduleOn sends a SCHEDULE to n and waits for its answer.
func scheduleOn(t *testing.T, n *Node, f *wire.Schedule) (wire.ScheduleOK, *wire.Error) {
	t.Helper()
	type res struct {
		ok  wire.ScheduleOK
		err *wire.Error
	}
	ch := make(chan res, 1)
	n.Schedule(f, func(ok wire.ScheduleOK, err *wire.Error) { ch <- res{ok, err} })
	select {
	case r := <-ch:
		return r.ok, r.err
	case <-time.After(waitMax):
		t.Fatal("schedule: no reply")
		return wire.ScheduleOK{}, nil
	}
}

// scheduleAnywhere offers f to every running node until one (its shard's
// owner) takes it.
func (tc *testCluster) scheduleAnywhere(f *wire.Schedule) (string, wire.ScheduleOK) {
	tc.t.Helper()
	var at string
	var ok wire.ScheduleOK
	eventually(tc.t, "a node takes the schedule", func() bool {
		for id, n := range tc.nodes {
			var err *wire.Error
			if ok, err = scheduleOn(tc.t, n, f); err == nil {
				at = id
				return true
			}
		}
		return false
	})
	return at, ok
}

// valuesOn counts the values of topic's records on node n.
func valuesOn(t *testing.T, n *Node, topic string) map[string]int {
	t.Helper()
	out := map[string]int{}
	info := n.Metadata([]string{topic})[0]
	for _, p := range info.Partitions {
		for from := p.StartSeq; ; {
			es, err := n.Read(topic, p.Partition, from, 1000)
			if err != nil || len(es) == 0 {
				break
			}
			for _, e := range es {
				if len(e.Record.Headers) == 0 || e.Record.Headers[0].Key != "nereus-control" {
					out[string(e.Record.Value)]++
				}
				from = e.Seq + 1
			}
		}
	}
	return out
}

// In a cluster each schedule shard is a replica group whose leader owns
// it: schedules are taken there, and when that node stops the shard's
// new leader takes office and publishes what was due and what falls due
// later — every schedule once, none before its time.
func TestClusterScheduledDeliveryAcrossAShardOwnerStop(t *testing.T) {
	tc := newTestCluster(t, 3)
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 2, Replicas: 3})
	start := time.Now()
	due := map[string]time.Time{}
	owners := map[string]bool{}
	for i := range 12 {
		v := fmt.Sprint("s", i)
		// deliver_at has millisecond resolution: due is what the broker holds.
		at := time.UnixMilli(start.Add(time.Duration(300+100*i) * time.Millisecond).UnixMilli())
		due[v] = at
		id, _ := tc.scheduleAnywhere(&wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Key: []byte(v), Value: []byte(v)}, DeliverAtMs: at.UnixMilli()})
		owners[id] = true
	}
	// Stop the owner of shard 0 while schedules are due and pending.
	time.Sleep(time.Until(start.Add(600 * time.Millisecond)))
	var stopped string
	for id, n := range tc.nodes {
		if r := n.sched[0]; r != nil && r.p.replica() != nil {
			if _, ok := r.p.replica().tookOffice(); ok {
				stopped = id
			}
		}
	}
	if stopped == "" {
		t.Fatal("no node owns shard 0")
	}
	tc.stop(stopped)
	seen := map[string]time.Time{}
	var reader *Node
	for id, n := range tc.nodes {
		if id != stopped {
			reader = n
		}
	}
	eventually(t, "every schedule published", func() bool {
		values := valuesOn(t, reader, "t")
		// After the read, not before: a value that became visible while
		// the read ran was visible by now, not necessarily before.
		now := time.Now()
		for v, c := range values {
			if c > 1 {
				t.Fatalf("%s published %d times", v, c)
			}
			if _, ok := seen[v]; !ok {
				seen[v] = now
				if now.Before(due[v]) {
					t.Fatalf("%s visible at %v, due at %v", v, now, due[v])
				}
			}
		}
		return len(seen) == len(due)
	})
	tc.start(stopped)
	time.Sleep(300 * time.Millisecond)
	for v, c := range valuesOn(t, reader, "t") {
		if c != 1 {
			t.Fatalf("%s published %d times after the old owner returned", v, c)
		}
	}
	var fired uint64
	eventually(t, "every shard's owner reports the schedules fired", func() bool {
		fired = 0
		for _, n := range tc.nodes {
			for _, r := range n.sched {
				if r == nil {
					continue
				}
				st := make(chan uint64, 1)
				r.send(schedCmd{admin: &wire.SchedAdmin{Op: wire.SchedStatus, Shard: r.shard}, adminReply: func(ok *wire.SchedAdminOK, _ *wire.Error) {
					if ok != nil && len(ok.Shards) == 1 && ok.Shards[0].Lifecycle == sched.Active.String() {
						st <- ok.Shards[0].Fired
						return
					}
					st <- 0
				}})
				fired += <-st
			}
		}
		return fired == uint64(len(due))
	})
}

// A shard owner cut off from its replicas is fenced by its lease guard
// (replica.Status.LeaseTicks) — before its replica even turns read-only,
// which takes four times as long: by then another replica could have
// taken the shard.
func TestClusterShardOwnerFencedByItsLeaseBeforeReadOnly(t *testing.T) {
	// Long elections: the lease closes after 100 ticks (0.5 s), read-only
	// mode starts after 400 (2 s).
	tc := newTestClusterWith(t, 3, func(c *Config) { c.Cluster.ElectionTicks = 200 })
	tc.declare("n1", wire.TopicConfig{Name: "t", Partitions: 1, Replicas: 3})
	owner, ok := tc.scheduleAnywhere(&wire.Schedule{Pub: wire.Pub{Topic: "t", Partition: wire.PartitionAuto, Key: []byte("k"), Value: []byte("v")},
		DeliverAtMs: time.Now().Add(time.Hour).UnixMilli()})
	r := tc.nodes[owner].sched[ok.Shard]
	lifecycle := func() string {
		ch := make(chan string, 1)
		r.send(schedCmd{admin: &wire.SchedAdmin{Op: wire.SchedStatus, Shard: r.shard}, adminReply: func(ok *wire.SchedAdminOK, err *wire.Error) {
			if err != nil || len(ok.Shards) != 1 {
				ch <- fmt.Sprint(err)
				return
			}
			ch <- ok.Shards[0].Lifecycle
		}})
		return <-ch
	}
	if got := lifecycle(); got != sched.Active.String() {
		t.Fatalf("the owner's shard is %s, want %v", got, sched.Active)
	}
	for id := range tc.nodes {
		if id != owner {
			tc.stop(id)
		}
	}
	eventually(t, "the owner is fenced", func() bool { return lifecycle() == sched.Fenced.String() })
	if st := r.p.replica().repl.Status(); st.ReadOnly || st.Role != replica.Leader {
		t.Fatalf("fenced only once its replica was %v (read-only %v): the lease guard did not close first", st.Role, st.ReadOnly)
	}
}
