package sim

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/nereus-broker/nereus/internal/kv"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// kvHistory builds a history from rows: client, call, return (-1: never
// returned), input, output.
type kvRow struct {
	client       int
	call, ret    int64
	in           kvInput
	out          kvOutput
	unknownWrite bool
}

func kvHistoryOf(rows []kvRow) []porcupine.Operation {
	var h []porcupine.Operation
	for _, r := range rows {
		op := porcupine.Operation{ClientId: r.client, Input: r.in, Call: r.call, Output: r.out, Return: r.ret}
		if r.ret < 0 {
			op.Output, op.Return = kvOutput{Unknown: true}, math.MaxInt64
		}
		h = append(h, op)
	}
	return h
}

func put(k, v string) kvInput { return kvInput{Op: kvPut, Key: k, Value: v} }
func get(k string) kvInput    { return kvInput{Op: kvGet, Key: k} }
func del(k string) kvInput    { return kvInput{Op: kvDel, Key: k} }
func cas(k, v string, expected uint64) kvInput {
	return kvInput{Op: kvCAS, Key: k, Value: v, Expected: expected}
}
func rev(r uint64) kvOutput             { return kvOutput{Rev: r} }
func found(v string, r uint64) kvOutput { return kvOutput{Found: true, Value: v, Rev: r} }
func mismatch(current uint64) kvOutput  { return kvOutput{Mismatch: true, Rev: current} }
func absent() kvOutput                  { return kvOutput{} }
func row(c int, call, ret int64, in kvInput, out kvOutput) kvRow {
	return kvRow{client: c, call: call, ret: ret, in: in, out: out}
}

// TestKVModel checks the linearizability model of the KV workload on
// small histories, legal and illegal: what the simulator's check accepts
// and what it must refuse.
func TestKVModel(t *testing.T) {
	cases := []struct {
		name  string
		rows  []kvRow
		legal bool
	}{
		{"read your write", []kvRow{row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, get("a"), found("x", 5))}, true},
		{"stale read after an acknowledged write", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, put("a", "y"), rev(6)), row(1, 4, 5, get("a"), found("x", 5))}, false},
		{"absent after an acknowledged write", []kvRow{row(0, 0, 1, put("a", "x"), rev(5)), row(1, 2, 3, get("a"), absent())}, false},
		{"concurrent read sees either", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 6, put("a", "y"), rev(6)), row(1, 3, 4, get("a"), found("x", 5))}, true},
		{"read with the wrong value", []kvRow{row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, get("a"), found("y", 5))}, false},
		{"read with the wrong revision", []kvRow{row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, get("a"), found("x", 4))}, false},
		{"revisions go backwards", []kvRow{row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, put("a", "y"), rev(4))}, false},
		{"cas on the seen revision", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, cas("a", "y", 5), rev(7)), row(1, 4, 5, get("a"), found("y", 7))}, true},
		{"cas succeeds on a stale revision", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, put("a", "y"), rev(6)), row(1, 4, 5, cas("a", "z", 5), rev(7))}, false},
		{"cas refused with the current revision", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(1, 2, 3, cas("a", "z", 4), mismatch(5))}, true},
		{"cas refused although it held", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(1, 2, 3, cas("a", "z", 5), mismatch(5))}, false},
		{"create-only cas on a live key", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(1, 2, 3, cas("a", "z", 0), rev(6))}, false},
		{"create-only cas after a delete", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, del("a"), rev(6)), row(1, 4, 5, cas("a", "z", 0), rev(8)),
			row(1, 6, 7, get("a"), found("z", 8))}, true},
		{"cas on a tombstone's revision", []kvRow{
			row(0, 0, 1, del("a"), rev(3)), row(1, 2, 3, cas("a", "z", 3), rev(4))}, true},
		{"read after a delete", []kvRow{row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, del("a"), rev(6)), row(1, 4, 5, get("a"), found("x", 5))}, false},
		{"unknown write seen later", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, put("a", "y"), kvOutput{}), row(1, 10, 11, get("a"), found("y", 9))}, true},
		{"unknown write never taking effect", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, put("a", "y"), kvOutput{}), row(1, 10, 11, get("a"), found("x", 5))}, true},
		{"unknown write explains a cas refusal", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, del("a"), kvOutput{}), row(1, 10, 11, cas("a", "z", 5), mismatch(8)),
			row(1, 12, 13, get("a"), absent())}, true},
		{"unknown write cannot take effect before it was sent", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(1, 2, 3, get("a"), found("y", 9)), row(0, 4, -1, put("a", "y"), kvOutput{})}, false},
		{"unknown delete between two revisions", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, del("a"), kvOutput{}), row(1, 3, 4, get("a"), absent()),
			row(1, 5, 6, put("a", "z"), rev(7))}, true},
		{"unknown delete with no revision left for it", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, del("a"), kvOutput{}), row(1, 3, 4, get("a"), absent()),
			row(1, 5, 6, put("a", "z"), rev(6))}, false},
		{"a refusal naming a revision the unknown delete must be above", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, del("a"), kvOutput{}), row(1, 3, 4, get("a"), absent()),
			row(1, 5, 6, cas("a", "z", 4), mismatch(5))}, false},
		{"unknown cas that took effect", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, cas("a", "y", 5), kvOutput{}), row(1, 10, 11, get("a"), found("y", 9))}, true},
		{"unknown cas refused", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, cas("a", "y", 4), kvOutput{}), row(1, 10, 11, get("a"), found("x", 5))}, true},
		{"unknown cas that could not hold", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, -1, cas("a", "y", 4), kvOutput{}), row(1, 10, 11, get("a"), found("y", 9))}, false},
		{"a purged tombstone", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, del("a"), rev(6)), row(1, 4, 5, cas("a", "z", 6), mismatch(0)),
			row(1, 6, 7, cas("a", "z", 0), rev(9))}, true},
		{"a purge revives nothing", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, del("a"), rev(6)), row(1, 4, 5, get("a"), found("x", 5))}, false},
		{"a live key is never purged", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(1, 4, 5, cas("a", "z", 5), mismatch(0))}, false},
		{"a value never written", []kvRow{row(1, 0, 1, get("a"), found("q", 2))}, false},
		{"keys are independent", []kvRow{
			row(0, 0, 1, put("a", "x"), rev(5)), row(0, 2, 3, put("b", "y"), rev(6)), row(1, 4, 5, get("a"), found("x", 5)),
			row(1, 6, 7, get("b"), found("y", 6))}, true},
	}
	for _, c := range cases {
		got := porcupine.CheckOperations(kvModel, kvHistoryOf(c.rows))
		if got != c.legal {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.legal)
		}
	}
}

// kvLeader is the up node whose replica leads the KV bucket, if any.
func (s *sim) kvLeader() *broker {
	for _, b := range s.nodes {
		if v, ok := b.node.Replica(wire.KVTopic(kvBucket), 0); b.up && ok && v.Status.Role == replica.Leader {
			return b
		}
	}
	return nil
}

// runKVZombieLeader runs a cluster with the KV workload and no random
// fault: at 800 ms harm strikes the bucket's leader for 2.5 s (it returns
// what heals it then) while its clients go on. The others elect a new
// leader and take writes; reads that still reach the old one (a third of
// the reads go to a random node, and from 1 s in all of one client's)
// must be refused, the lease being gone. With cas, a client that joins
// at the harm sends the zombie CASes it can only refuse meanwhile, and
// its other operations to the rest (kvWorkload.addRefuser).
func runKVZombieLeader(t *testing.T, seed uint64, m node.Mutations, cas bool, harm func(s *sim, zombie *broker) (heal func())) (Result, *broker) {
	s := newClusterSim(ClusterOptions{Seed: seed, KV: 200, MessagesPerProducer: 100, Mutations: m})
	var zombie *broker
	s.w.after(800, func() {
		if zombie = s.kvLeader(); zombie == nil {
			return
		}
		heal := harm(s, zombie)
		reader := s.kv.clients[0]
		var refuser *kvClient
		if cas {
			refuser = s.kv.addRefuser(slices.Index(s.nodes, zombie))
		}
		s.w.after(1000, func() {
			s.w.tracef("scenario: %s reads from %s only", reader.name(), zombie.id)
			reader.readsTo = slices.Index(s.nodes, zombie) + 1
		})
		s.w.after(2500, func() {
			heal()
			reader.readsTo = 0
			if refuser != nil {
				refuser.casTo = 0
			}
		})
	})
	r := s.runPhases()
	if zombie == nil {
		t.Fatalf("seed %d: no leader of the KV bucket at 800 ms", seed)
	}
	return r, zombie
}

// runKVCutOffLeader: the bucket's leader is cut off its peers.
func runKVCutOffLeader(t *testing.T, seed uint64, m node.Mutations) (Result, *broker) {
	return runKVZombieLeader(t, seed, m, false, func(s *sim, zombie *broker) func() {
		id := uint32(slices.Index(s.nodes, zombie) + 1)
		s.w.tracef("scenario: cut %s, the KV bucket's leader, off its peers", zombie.id)
		s.net.setCut(id, true, true)
		return func() { s.net.setCut(id, false, false) }
	})
}

// runKVHeldUpLeader: the bucket leader's member of the bucket's replica
// group is held up (replog.Log.HoldUp: a hung fsync) while the rest of
// its node — its KV runner, its network — runs on. Its followers hear no
// heartbeat; the held-up member's published status still says it leads
// with lease ticks left.
func runKVHeldUpLeader(t *testing.T, seed uint64, m node.Mutations) (Result, *broker) {
	return runKVHeldUp(t, seed, m, false)
}

// runKVHeldUpCAS is runKVHeldUpLeader with a client's CASes sent to the
// held-up leader too (runKVZombieLeader).
func runKVHeldUpCAS(t *testing.T, seed uint64, m node.Mutations) (Result, *broker) {
	return runKVHeldUp(t, seed, m, true)
}

func runKVHeldUp(t *testing.T, seed uint64, m node.Mutations, cas bool) (Result, *broker) {
	return runKVZombieLeader(t, seed, m, cas, func(s *sim, zombie *broker) func() {
		s.w.tracef("scenario: hold up %s's member of the KV bucket's group, its leader", zombie.id)
		if !zombie.node.HoldUpReplica(wire.KVTopic(kvBucket), 0, s.w.nowMs+2500) {
			t.Errorf("seed %d: %s has no member of the bucket's group to hold up", seed, zombie.id)
		}
		return func() {}
	})
}

// zombieReadsFenced runs a zombie-leader script on seeds 1 and 2, as
// written and with mutation m: as written the history is linearizable
// (clean sees the run too), with m it is not (mutated sees the run).
func zombieReadsFenced(t *testing.T, run func(*testing.T, uint64, node.Mutations) (Result, *broker), m node.Mutations, clean, mutated func(seed uint64, r Result)) {
	for seed := uint64(1); seed <= 2; seed++ {
		r, zombie := run(t, seed, node.Mutations{})
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\ntrace tail:\n%s", seed, r.Violation, strings.Join(r.Tail, "\n"))
		}
		if r.KVOps < 300 {
			t.Fatalf("seed %d: only %d KV operations recorded", seed, r.KVOps)
		}
		clean(seed, r)
		r, _ = run(t, seed, m)
		if r.Violation == nil || r.Violation.Invariant != KVLinearizable {
			t.Fatalf("seed %d: mutated %+v, %s struck: got %v, want a %s violation", seed, m, zombie.id, r.Violation, KVLinearizable)
		}
		mutated(seed, r)
		t.Logf("seed %d: %s struck; mutation found: %v", seed, zombie.id, r.Violation)
	}
}

// TestKVHeldUpLeaderReadsFenced (KV7b, LeaseOnTheClock): a bucket leader
// whose member is held up stops answering reads once its lease ran out on
// the clock, though the status its member last published still counts
// lease ticks; the history is linearizable. With KVLeaseFromTicks (the
// lease taken from those ticks) it serves stale values and the
// linearizability check fails the run.
func TestKVHeldUpLeaderReadsFenced(t *testing.T) {
	zombieReadsFenced(t, runKVHeldUpLeader, node.Mutations{KVLeaseFromTicks: true}, func(uint64, Result) {}, func(uint64, Result) {})
}

// TestKVHeldUpLeaderRefusesNoCASWithoutTheLease (KV7c,
// RefusalUnderLease): the same hold-up; a client joins as it begins,
// puts keys of its own at the other nodes and sends the held-up leader
// CASes of them it can only refuse. A refusal reads the leader's applied
// state, so it is answered only under the lease, and seeds 1 and 2 are
// linearizable. With RefuseWithoutLease the leader refuses from a state
// that misses the client's own put, and the linearizability check fails
// each seed (9 of the first 10). (Found by the campaign once the stall
// fault held up every member of a node: seed 13 of --kv 60.)
func TestKVHeldUpLeaderRefusesNoCASWithoutTheLease(t *testing.T) {
	zombieReadsFenced(t, runKVHeldUpCAS, node.Mutations{KV: kv.Mutations{RefuseWithoutLease: true}}, func(uint64, Result) {}, func(seed uint64, r Result) {
		if !strings.Contains(r.Violation.Detail, "] cas r") {
			t.Fatalf("seed %d: the first operation not linearizable is not the refuser's CAS: %v", seed, r.Violation)
		}
	})
}

// TestKVCutOffLeaderReadsFenced (KV7): an ex-leader cut off from the
// replicas that elected another refuses reads once its lease lapsed, and
// the history is linearizable; with KVReadWithoutLease it serves stale
// values and the linearizability check fails the run. Its writes, once it
// is read-only, are refused definitely (QUORUM_LOST), not left unknown.
func TestKVCutOffLeaderReadsFenced(t *testing.T) {
	zombieReadsFenced(t, runKVCutOffLeader, node.Mutations{KVReadWithoutLease: true}, func(seed uint64, r Result) {
		// The cut-off leader refuses writes definitely (QUORUM_LOST) once
		// read-only: only writes in flight at the cut stay unknown.
		if r.KVUnknown > 10 {
			t.Fatalf("seed %d: %d writes with unknown outcomes", seed, r.KVUnknown)
		}
	}, func(seed uint64, r Result) {
		if !strings.Contains(r.Violation.Detail, "] get k") {
			t.Fatalf("seed %d: the first operation not linearizable is not a read: %v", seed, r.Violation)
		}
	})
}

// TestClusterKVLinearizableCampaign (KV6) runs the KV workload in
// whole-cluster runs with every fault (kill -9, power loss, kill points,
// partitions, network, disk and clock faults, client disconnects, pauses):
// each seed's history, final reads after the last power loss included,
// is linearizable, the watcher sees every revision once in order across
// the failovers (KVWatchEveryRevision) and reaches every acknowledged
// one, the bucket's log was truncated behind its checkpoints and replicas
// rebuilt from them, every replica ends with the same bucket
// (KVReplicasAgree), and seed 1 replays bit for bit.
// NEREUS_SIM_KV_SEEDS raises the seed count for a soak.
func TestClusterKVLinearizableCampaign(t *testing.T) {
	seeds := envUint(t, "NEREUS_SIM_KV_SEEDS", 3)
	ops, unknown, watches, expired, rebuilds := 0, 0, 0, 0, 0
	for seed := uint64(1); seed <= seeds; seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, KV: 60}
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("seed %d: %v\nreproduce: %s\ntrace tail:\n%s", seed, r.Violation, ClusterReproduce(o), strings.Join(r.Tail, "\n"))
		}
		if r.KVOps < 100 {
			t.Fatalf("seed %d: only %d KV operations recorded", seed, r.KVOps)
		}
		if r.KVLogStartMax <= 1 || r.KVCheckpointMax == 0 {
			t.Fatalf("seed %d: the bucket's log starts at %d, latest checkpoint %d: nothing was truncated", seed, r.KVLogStartMax, r.KVCheckpointMax)
		}
		ops, unknown, watches, expired = ops+r.KVOps, unknown+r.KVUnknown, watches+r.KVWatches, expired+r.KVExpired
		rebuilds += r.KVRebuilds
		if seed == 1 {
			if again := RunCluster(o); again.TraceHash != r.TraceHash {
				t.Fatalf("seed 1 replayed differently")
			}
		}
	}
	if watches <= int(seeds) {
		t.Fatalf("the watcher never had to resume (%d watches in %d seeds): no failover exercised it", watches, seeds)
	}
	if rebuilds == 0 {
		t.Fatalf("no replica rebuilt the bucket from a checkpoint in %d seeds", seeds)
	}
	t.Logf("%d seeds: %d KV operations checked, %d writes with unknown outcomes; the watcher saw every revision through %d watches (%d ended CURSOR_EXPIRED); %d rebuilds from a checkpoint",
		seeds, ops, unknown, watches, expired, rebuilds)
}

// TestClusterKVCheckpointMutationIsCaught: with the bucket's log
// compacted through what its runner applied rather than its latest
// checkpoint (KVCompactPastCheckpoint), replicas restarted after the
// final power loss find no checkpoint to rebuild from, and the run fails.
func TestClusterKVCheckpointMutationIsCaught(t *testing.T) {
	o := ClusterOptions{Seed: 1, Faults: AllClusterFaults, KV: 200, Mutations: ClusterMutations["kv-compact-past-checkpoint"]}
	r := RunCluster(o)
	if r.Violation == nil || (r.Violation.Invariant != Liveness && r.Violation.Invariant != KVReplicasAgree) {
		t.Fatalf("with KVCompactPastCheckpoint: %v, want a %s or %s violation (reproduce: %s)", r.Violation, Liveness, KVReplicasAgree, ClusterReproduce(o))
	}
	t.Logf("caught: %v", r.Violation)
}

// TestClusterKVMutationSearch runs KVReadWithoutLease in whole-cluster
// runs with every fault and counts the seeds whose history the check
// finds not linearizable; it requires one. The random faults seldom cut
// a bucket's leader off cleanly enough for a stale read (none in 40
// seeds), so it runs only with NEREUS_SIM_KV_MUTATION_SEEDS set; the
// scripted TestKVCutOffLeaderReadsFenced finds the mutation every time.
func TestClusterKVMutationSearch(t *testing.T) {
	seeds := envUint(t, "NEREUS_SIM_KV_MUTATION_SEEDS", 0)
	if seeds == 0 {
		t.Skip("set NEREUS_SIM_KV_MUTATION_SEEDS to search")
	}
	var found []uint64
	for seed := uint64(1); seed <= seeds; seed++ {
		o := ClusterOptions{Seed: seed, Faults: AllClusterFaults, KV: 200, Mutations: node.Mutations{KVReadWithoutLease: true}}
		r := RunCluster(o)
		switch {
		case r.Violation == nil:
		case r.Violation.Invariant == KVLinearizable:
			found = append(found, seed)
			t.Logf("seed %d: %v (reproduce: %s)", seed, r.Violation, ClusterReproduce(o))
		default:
			t.Fatalf("seed %d: %v", seed, r.Violation)
		}
	}
	if len(found) == 0 {
		t.Fatalf("KVReadWithoutLease not found in %d seeds", seeds)
	}
	t.Logf("KVReadWithoutLease found in %d of %d seeds: %v", len(found), seeds, found)
}
