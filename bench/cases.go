package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
)

// workload names one measurement; the names are the ones in latest.json.
type workload string

const (
	// workloadPubSync publishes with one message in flight; it reports
	// throughput and the publish-to-ack latency percentiles.
	workloadPubSync workload = "pub_sync"
	// workloadPubAsync publishes with a window of inflightMax messages; it
	// reports throughput.
	workloadPubAsync workload = "pub_async"
	// workloadConsume consumes a pre-filled stream with explicit acks; it
	// reports throughput.
	workloadConsume workload = "consume"
	// workloadE2E publishes at a fixed offered rate and measures the time
	// from publish to delivery to a consumer in the same process.
	workloadE2E workload = "e2e"
	// workloadFailover kills -9 the leader of a replicated stream during a
	// stream of synchronous publishes and measures the time from the kill
	// to the next acknowledged publish (failover.go). Only systems whose
	// spec is killable run it.
	workloadFailover workload = "failover"
	// workloadGroupConsume1 and workloadGroupConsume3 consume a pre-filled
	// stream of groupPartitions partitions with 1 and 3 members of one
	// group (JetStream: 1 and 3 workers of one durable pull consumer),
	// counting distinct messages; they report throughput (group.go).
	workloadGroupConsume1 workload = "group_consume_1"
	workloadGroupConsume3 workload = "group_consume_3"
	// workloadGroupJoin and workloadGroupLeave measure the time from a
	// member's JOIN (Subscribe) or LEAVE (Close) to a stable assignment of
	// a fresh group (Nereus only: nereus_group.go).
	workloadGroupJoin  workload = "group_join"
	workloadGroupLeave workload = "group_leave"
	// The scheduled-delivery workloads (sched.go), Nereus only:
	// workloadSchedIntake reports SCHEDULE answers per second from
	// limits.SchedIntakeClients goroutines; workloadSchedFire the fired
	// messages per second of a burst due at one instant;
	// workloadSchedLateness receipt time − deliver_at under a steady load;
	// workloadSchedPending, on a node of its own, the heap per pending
	// schedule and the restart time with them pending.
	workloadSchedIntake   workload = "sched_intake"
	workloadSchedFire     workload = "sched_fire"
	workloadSchedLateness workload = "sched_lateness"
	workloadSchedPending  workload = "sched_pending"
	// The KV workloads (kv.go), on a bucket of each system that keeps
	// one revision per key, values of kvValueBytes: workloadKVPutSync puts
	// one at a time (latency); workloadKVPut puts from kvConcurrency
	// goroutines on one connection, workloadKVGet gets existing keys the
	// same way (throughput); workloadKVWatch has one writer
	// (kvConcurrency puts in flight) and kvWatchers watchers and reports
	// the updates delivered to every watcher per second and the latency
	// from a put's send to each watcher's receipt.
	workloadKVPutSync workload = "kv_put_sync"
	workloadKVPut     workload = "kv_put"
	workloadKVGet     workload = "kv_get"
	workloadKVWatch   workload = "kv_watch"
	// workloadIdle creates idleStreams streams and measures the CPU the
	// broker processes use per second while nothing happens (idle.go),
	// on the systems that run in child processes and replicate.
	workloadIdle workload = "idle"
)

// groupMembers returns how many members a group consume workload opens
// (0 for the other workloads).
func (w workload) groupMembers() int {
	switch w {
	case workloadGroupConsume1:
		return 1
	case workloadGroupConsume3:
		return 3
	}
	return 0
}

// createsStream reports whether the workload creates its own (partitioned)
// stream instead of the single-partition one runCase creates.
func (w workload) createsStream() bool {
	return w.groupMembers() > 0 || w == workloadGroupJoin || w == workloadGroupLeave || w == workloadSchedPending || w.isKV() || w == workloadIdle
}

// String returns the workload's name.
func (w workload) String() string { return string(w) }

// cpuSpansTheTimedPhase reports whether the row's CPU per message is
// measured over the phase its msgs/s times (the publish and consume rows),
// so that their product is the cores the case kept busy. Other rows' CPU
// also covers what their rate leaves out (a fill, a subscriber's set-up,
// the wait for a due time), or their rate counts other things.
func (w workload) cpuSpansTheTimedPhase() bool {
	return w == workloadPubSync || w == workloadPubAsync || w == workloadConsume
}

// Names of the systems and durability modes, as written in latest.json.
const (
	systemNereus    = "nereus"
	systemJetStream = "jetstream"
	// modeR1 is one replica with each broker's default durability: Nereus
	// fsyncs before it acks, JetStream acks before it fsyncs (every 2 min).
	// Both run in the harness process, as the issue runs JetStream.
	modeR1 = "r1"
	// modeR1Always is one JetStream replica with sync_interval: always.
	modeR1Always = "r1-always"
	// modeR1Proc is one Nereus replica in a `nereus serve` child process:
	// what the process boundary costs, against modeR1.
	modeR1Proc = "r1-proc"
	// modeR3 is three Nereus processes on this machine, each topic
	// replicated to all three (ack quorum: two fsyncs before the ack).
	// For JetStream, modeR3 is three nats-server child processes in one
	// cluster and an R3 stream, default sync_interval.
	modeR3 = "r3"
	// modeR3Always is the JetStream R3 cluster with sync_interval: always.
	modeR3Always = "r3-always"
	// systemDisk/modeFsync is no broker: one 1 KiB write and fdatasync
	// into a preallocated file, one at a time — the raw fsync the issue
	// measures sync publish latency against, in the same run.
	systemDisk = "disk"
	modeFsync  = "fsync"
	// systemFloor is no broker either: the data movement of a publish
	// acked after a quorum fsync and nothing else (floor.go), in modeR1
	// (one child process) and modeR3 (three) — a ceiling for any broker
	// on this machine.
	systemFloor = "floor"
)

// systemSpec is a broker in one durability mode and the way to start it.
// Adding a mode (say Nereus with 3 replicas) is one more entry in
// systemSpecs with its own start function.
type systemSpec struct {
	System string
	Mode   string
	// start starts the broker with its data under dataDir and returns it
	// ready for clients. The caller closes it.
	start func(ctx context.Context, env *environment, dataDir string) (system, error)
	// workloads, when set, are the only workloads the system runs.
	workloads []workload
	// replicas is the replication factor of its streams (0 means 1): the
	// ratio tables compare Nereus and JetStream of the same factor.
	replicas int
	// killable systems run the failover workload (they are child
	// processes whose stream leader can be killed -9 and started again).
	killable bool
}

// replicationFactor returns the spec's number of replicas per stream.
func (s systemSpec) replicationFactor() int { return max(s.replicas, 1) }

// workloadSpec is one workload at one message size.
type workloadSpec struct {
	Workload  workload
	SizeBytes int
	// systems, when set, are the only "system/mode" keys that run it.
	systems []string
}

// Which systems run the group workloads: Nereus r3 (three processes, a
// 6-partition topic of 3 replicas: while a group's delivery runs on the
// leader of partition 0, that leader must hold every partition), the
// single child process, and JetStream R3 for the consume rows.
var (
	groupConsumeSystems = []string{systemNereus + "/" + modeR1Proc, systemNereus + "/" + modeR3, systemJetStream + "/" + modeR3}
	groupChangeSystems  = []string{systemNereus + "/" + modeR1Proc, systemNereus + "/" + modeR3}
	// kvSystems run the KV workloads: Nereus in the harness process and
	// the three-process cluster, against NATS KV on each JetStream mode.
	kvSystems = []string{systemNereus + "/" + modeR1, systemNereus + "/" + modeR3, systemJetStream + "/" + modeR1,
		systemJetStream + "/" + modeR1Always, systemJetStream + "/" + modeR3, systemJetStream + "/" + modeR3Always}
	// idleSystems run the idle row: the two three-process clusters
	// (JetStream R3-always is the same cluster with another sync
	// interval, which an idle stream never reaches).
	idleSystems = []string{systemNereus + "/" + modeR3, systemJetStream + "/" + modeR3}
)

// kvValueBytes is the value size of every KV workload.
const kvValueBytes = 128

// systemSpecs lists the brokers in the order they appear in the table.
var systemSpecs = []systemSpec{
	{System: systemNereus, Mode: modeR1, start: startNereusInProcess},
	{System: systemNereus, Mode: modeR1Proc, start: startNereus},
	{System: systemNereus, Mode: modeR3, start: startNereusCluster(3), replicas: 3, killable: true},
	{System: systemJetStream, Mode: modeR1, start: startJetStreamMode(false)},
	{System: systemJetStream, Mode: modeR1Always, start: startJetStreamMode(true)},
	{System: systemJetStream, Mode: modeR3, start: startJetStreamCluster(3, false), replicas: 3, killable: true},
	{System: systemJetStream, Mode: modeR3Always, start: startJetStreamCluster(3, true), replicas: 3},
	{System: systemDisk, Mode: modeFsync, start: startDisk, workloads: []workload{workloadPubSync}},
	{System: systemFloor, Mode: modeR1, start: startFloor(1), workloads: floorWorkloads},
	{System: systemFloor, Mode: modeR3, start: startFloor(3), workloads: floorWorkloads, replicas: 3},
}

// floorWorkloads are the rows the floor runs: it publishes, nothing else.
var floorWorkloads = []workload{workloadPubSync, workloadPubAsync}

// workloadSpecs lists the rows of each system, in table order.
var workloadSpecs = []workloadSpec{
	{Workload: workloadIdle, systems: idleSystems}, // first: on fresh clusters
	{Workload: workloadPubSync, SizeBytes: 1024},
	{Workload: workloadPubAsync, SizeBytes: 16},
	{Workload: workloadPubAsync, SizeBytes: 1024},
	{Workload: workloadPubAsync, SizeBytes: 64 << 10},
	{Workload: workloadConsume, SizeBytes: 1024},
	{Workload: workloadE2E, SizeBytes: 1024},
	{Workload: workloadGroupConsume1, SizeBytes: 1024, systems: groupConsumeSystems},
	{Workload: workloadGroupConsume3, SizeBytes: 1024, systems: groupConsumeSystems},
	{Workload: workloadGroupJoin, systems: groupChangeSystems},
	{Workload: workloadGroupLeave, systems: groupChangeSystems},
	{Workload: workloadSchedIntake, SizeBytes: 1024, systems: schedSystems},
	{Workload: workloadSchedFire, SizeBytes: 1024, systems: schedSystems},
	{Workload: workloadSchedLateness, SizeBytes: 1024, systems: schedSystems},
	{Workload: workloadSchedPending, SizeBytes: 1024, systems: schedPendingSystems},
	{Workload: workloadKVPutSync, SizeBytes: kvValueBytes, systems: kvSystems},
	{Workload: workloadKVPut, SizeBytes: kvValueBytes, systems: kvSystems},
	{Workload: workloadKVGet, SizeBytes: kvValueBytes, systems: kvSystems},
	{Workload: workloadKVWatch, SizeBytes: kvValueBytes, systems: kvSystems},
	{Workload: workloadFailover, SizeBytes: 1024}, // last: it kills and restarts processes
}

// benchCase is one row of the results table: a workload run against one
// system in one mode.
type benchCase struct {
	System    string
	Mode      string
	Workload  workload
	SizeBytes int
}

// ID names the case for -only and for progress lines:
// "system/mode/workload/size", e.g. "nereus/r1/pub_async/1024".
func (c benchCase) ID() string {
	return fmt.Sprintf("%s/%s/%s/%d", c.System, c.Mode, c.Workload, c.SizeBytes)
}

// selectCases returns the cases whose ID matches only (all when only is
// nil), ordered by workload row first so that the systems of one row run
// back to back.
func selectCases(systems []systemSpec, workloads []workloadSpec, only *regexp.Regexp) []benchCase {
	var cases []benchCase
	for _, w := range workloads {
		for _, s := range systems {
			if s.workloads != nil && !slices.Contains(s.workloads, w.Workload) {
				continue
			}
			if w.Workload == workloadFailover && !s.killable {
				continue
			}
			if w.systems != nil && !slices.Contains(w.systems, s.System+"/"+s.Mode) {
				continue
			}
			c := benchCase{System: s.System, Mode: s.Mode, Workload: w.Workload, SizeBytes: w.SizeBytes}
			if only == nil || only.MatchString(c.ID()) {
				cases = append(cases, c)
			}
		}
	}
	return cases
}
