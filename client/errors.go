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

// isTerminalDialError reports whether a dial failure must not be retried
// (credentials or protocol version rejected).
func isTerminalDialError(err error) bool {
	return errors.Is(err, wire.ErrAuthFailed) || errors.Is(err, wire.ErrUnsupportedVer)
}
