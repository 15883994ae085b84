// Package client is the Go SDK for Nereus: a connection to one broker with
// request pipelining, an idempotent asynchronous producer and a group consumer
// with credit-based flow control and batched acks.
//
// # Connections
//
// A Client owns one TCP (or TLS) connection to a seed server and, in a
// cluster, one to each partition leader it routes to (pooled by address,
// closed by Close). On each, a reader goroutine dispatches replies by
// correlation id. Outgoing frames are encoded into one buffer (bounded at
// 4 MiB: a sender then waits for room, up to its deadline); a writer
// goroutine writes it out, and on plain TCP a sender writes it itself, with
// one non-blocking write, once it holds 64 KiB and before the sender waits
// for a reply or a window slot, so a burst leaves as it is made. When a
// connection is lost every pending request on it fails with an error
// wrapping ErrDisconnected. So does a connection on which a request waited
// a whole RequestTimeout while the broker sent nothing at all: a stopped
// (SIGSTOPped, hung) broker keeps its socket open, and the client gives it
// up rather than send every retry and metadata request back to it; the
// next seed dial then starts at the next server, and the silent node is
// not redialed as a leader for a RequestTimeout. Reconnection is lazy: the next request (or a
// producer retry, or a consumer opening a lane again) dials again, cycling
// through Options.Servers (or redialing the leader) with bounded exponential
// backoff between failed attempts. A failed authentication is terminal and
// never retried.
//
// # Clusters
//
// Each partition of a cluster is led by one node. The client caches every
// topic's leaders (from METADATA, asked of any node) and refreshes them,
// rate-limited, when a request fails with NOT_LEADER, UNAVAILABLE or
// QUORUM_LOST or a connection is lost. A Producer picks each message's
// partition itself, with the broker's rule, and sends it to the leader;
// a retry keeps the partition and the producer sequence, so it is
// deduplicated by the new leader. A Consumer subscribes at every node that
// leads a partition of its topic (a lane per node, each with its own
// credit), acks each message at the node that delivered it, and follows
// the leaders as they move; a node that does not serve the group refuses
// the subscription and is asked again a few hundred milliseconds later.
// While a leader is unknown, requests go to a seed, whose NOT_LEADER
// triggers the refresh.
// DeclareTopic and Topics may be answered by any node. A single node leads
// every partition, so none of this changes how it is used.
//
// # Delivery guarantees
//
// An idempotent Producer (the default) numbers every message with the next
// producer sequence when it is handed over and reuses that number for every
// retry, so a publish retried across a disconnect or broker restart is
// appended exactly once. A Consumer delivers at least once: unacked messages
// are redelivered by the broker after AckWait with a new delivery id, and an
// ack naming an old delivery id fails with ErrStaleDelivery.
package client
