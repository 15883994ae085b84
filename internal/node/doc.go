// Package node is the broker runtime of one node, alone or a cluster
// member: it owns the topics and the consumer groups, and turns the world
// it reaches through Config.Env (files, clock, peer network) into calls on
// the kernels in internal/partition, delivery, acklog, replica and meta.
// In production it runs goroutines (one per partition, per group, the
// metadata applier, replog's members); in Manual mode it runs none and
// its driver (the simulator) calls Step. Sessions (internal/server) call
// it; it never touches client sockets.
//
// # Layout
//
// What differs between a single node and a cluster member is chosen once,
// behind an interface, rather than tested on every call:
//
//   - A partition (partition.go) is a partitionRunner — its names, its
//     publish queue and the positions readers use (readLog, epoch,
//     startSeq, commitSeq, damage) — and a partitionStore chosen when it
//     opens: localStore (local.go, commit.go), a single node's log with
//     group commit, recovery under a new epoch and retention;
//     replicaStore (replicated.go), this node's replog member and the
//     shell of the partition.Member kernel; or unhostedStore, a cluster's
//     partition with no replica here, which sends publishes on.
//     partitionRunner.replica is the one place that asks which store a
//     partition has, for what only a replica can answer.
//   - A consumer group (group.go, dispatch.go, deadletter.go) is a
//     groupRunner — cursors, subscriptions, the batches of acks, counts
//     and replies of one iteration — and an ackLedger chosen when the
//     group starts, by its topic's partition 0: fileLedger (ledger.go), a
//     single node's ack ledger with snapshot generations and compaction;
//     or replicatedLedger (replledger.go), the shell of the acklog kernel,
//     whose records go to partition 0's replicated log on the node that
//     leads it (the coordinator) and which retires the group when that
//     node stops leading.
//
// The node itself differs only where a cluster does something a single
// node does not: starting and stepping the cluster (clusterhost.go,
// manual.go), DECLARE through the metadata log, and the choice of store.
package node
