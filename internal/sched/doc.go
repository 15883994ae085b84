// Package sched is the kernel of scheduled delivery (DESIGN §2, §3): a
// message with a deliver_at is stored in a schedule shard, a partition of
// an internal replicated topic, and published to its destination topic
// when it falls due — exactly once, never early.
//
// State is what every replica of a shard derives from its committed log:
// the live schedules, each destination's lane with its admission gate
// (changed only by management records, in log order), and each
// destination partition's fire sequences. Owner is the shard's scheduler
// at the node that holds both gates — the shard's assignment in __meta
// and the leader lease of its replica group, whose epoch is the owner
// epoch — with its lifecycle, the lanes' runtime readiness (READY is a
// certificate, re-validated before every claim and publish), and the
// intent → publish → fired protocol:
//
//  1. a due schedule is claimed by an intent record that gives it a
//     destination partition and a fire sequence;
//  2. once the intent committed, the owner publishes the message under
//     the producer identity of (shard, destination partition) with the
//     fire sequence as producer_seq, so a retry by this or any later
//     owner is deduplicated by the destination;
//  3. a FIRED record resolves it; if the destination can no longer prove
//     the outcome (its dedup window moved past the sequence) an UNKNOWN
//     record does, visibly — never a guess, never a blind resend.
//
// Both are pure: no goroutines, I/O, clock or randomness. The shell
// applies committed records, feeds the owner the gates, the clock, probe
// answers and publish outcomes, and carries out its effects.
package sched
