// Package client is the Go SDK for Nereus: a connection to one broker with
// request pipelining, an idempotent asynchronous producer and a group consumer
// with credit-based flow control and batched acks.
//
// # Connections
//
// A Client owns at most one TCP (or TLS) connection at a time. A reader
// goroutine dispatches replies by correlation id; a writer goroutine batches
// outgoing frames through a bufio.Writer and flushes whenever its bounded
// queue runs empty. When the connection is lost every pending request fails
// with an error wrapping ErrDisconnected. Reconnection is lazy: the next
// request (or a producer retry, or a consumer's background pump) dials again,
// cycling through Options.Servers with bounded exponential backoff between
// failed rounds. A failed authentication is terminal and never retried.
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
