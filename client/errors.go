package client

import (
	"errors"

	"github.com/nereus-broker/nereus/internal/wire"
)

// ErrDisconnected is wrapped by every error caused by the loss of (or the
// failure to establish) the connection. Such failures are retryable.
var ErrDisconnected = errors.New("nereus: disconnected")

// ErrClosed is returned by operations on a closed Client, Producer or Consumer.
var ErrClosed = errors.New("nereus: closed")

// Broker error sentinels, re-exported from the protocol so callers can write
// errors.Is(err, client.ErrTopicConflict) without importing internal packages.
// Server errors are returned as values that match these by code.
var (
	ErrAuthFailed        = wire.ErrAuthFailed
	ErrUnsupportedVer    = wire.ErrUnsupportedVer
	ErrNotFound          = wire.ErrNotFound
	ErrTopicConflict     = wire.ErrTopicConflict
	ErrStaleDelivery     = wire.ErrStaleDelivery
	ErrInvalidArgument   = wire.ErrInvalidArgument
	ErrStorage           = wire.ErrStorage
	ErrProducerSeqTooOld = wire.ErrProducerSeqTooOld
	ErrUnauthorized      = wire.ErrUnauthorized
	ErrUnavailable       = wire.ErrUnavailable
	ErrFrameTooLarge     = wire.ErrFrameTooLarge
	ErrBadFrame          = wire.ErrBadFrame
	// ErrDataCorrupt: the partition's log is damaged; it refuses publishes
	// until an operator runs `nereus repair`.
	ErrDataCorrupt = wire.ErrDataCorrupt
)

// Cluster errors; wire has no sentinels for them.
var (
	// ErrNotLeader: the node does not lead the partition (or coordinate the
	// topic's consumer groups). The SDK follows the leader by itself; it
	// surfaces only when that does not succeed in time.
	ErrNotLeader = &wire.Error{Code: wire.CodeNotLeader}
	// ErrQuorumLost: the partition's leader cannot reach its ack quorum
	// (READ_ONLY_DEGRADED). Producers retry it until their deadline.
	ErrQuorumLost = &wire.Error{Code: wire.CodeQuorumLost}
)

// IsRetryable reports whether an operation that failed with err may be
// retried unchanged: the connection was lost, or the broker answered with a
// retryable code (storage error, not leader, quorum lost, unavailable).
func IsRetryable(err error) bool {
	if errors.Is(err, ErrDisconnected) {
		return true
	}
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code.Retryable()
	}
	return false
}

// hasCode reports whether err carries a broker error with one of codes.
func hasCode(err error, codes ...wire.Code) bool {
	var we *wire.Error
	if !errors.As(err, &we) {
		return false
	}
	for _, c := range codes {
		if we.Code == c {
			return true
		}
	}
	return false
}

// routeMayHaveMoved reports whether a request failed in a way that calls
// for fresh metadata: the leader changed, stepped down, lost its quorum
// (a new leader may exist on the majority side) or became unreachable.
func routeMayHaveMoved(err error) bool {
	return errors.Is(err, ErrDisconnected) || hasCode(err, wire.CodeNotLeader, wire.CodeUnavailable, wire.CodeQuorumLost)
}

// isTerminalDialError reports whether a dial failure must not be retried
// (credentials or protocol version rejected).
func isTerminalDialError(err error) bool {
	return errors.Is(err, wire.ErrAuthFailed) || errors.Is(err, wire.ErrUnsupportedVer)
}
