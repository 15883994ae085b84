package wire

import (
	"errors"
	"fmt"
)

// Code is a stable error code carried by an ERR frame or a per-entry result.
// Values never change meaning once released; new codes are only appended.
type Code uint16

// Error codes of protocol v1.
const (
	CodeOK                Code = 0
	CodeAuthFailed        Code = 1  // bad or missing token; generic on purpose
	CodeBadFrame          Code = 2  // malformed or unknown frame; connection closes
	CodeFrameTooLarge     Code = 3  // frame over the negotiated maximum; connection closes
	CodeUnsupportedVer    Code = 4  // no common protocol version
	CodeNotFound          Code = 5  // topic (or partition) does not exist
	CodeTopicConflict     Code = 6  // DECLARE differs from the existing topic
	CodeStaleDelivery     Code = 7  // ACK/NACK names a delivery_id that is no longer current
	CodeInvalidArgument   Code = 8  // a field is out of range
	CodeStorage           Code = 9  // the broker could not make the write durable
	CodeProducerSeqTooOld Code = 10 // producer_seq is below the dedup window; cannot prove it new
	CodeNotLeader         Code = 11 // reserved for replication
	CodeQuorumLost        Code = 12 // reserved for replication: READ_ONLY_DEGRADED
	CodeStaleLeaderEpoch  Code = 13 // reserved for replication
	CodeUnauthorized      Code = 14 // token lacks permission for this topic
	CodeUnavailable       Code = 15 // shutting down or overloaded; retry elsewhere or later
	CodeNotAuthenticated  Code = 16 // a request arrived before HELLO
	CodeDataCorrupt       Code = 17 // the partition's data is damaged; it refuses writes until repaired
	// CodeStaleAssignment: a consumer-group member pulled or acked a
	// partition it does not hold at that assignment epoch (revoked,
	// moved to another member, or the member was fenced).
	CodeStaleAssignment Code = 18
)

var codeNames = map[Code]string{
	CodeOK:                "OK",
	CodeAuthFailed:        "AUTH_FAILED",
	CodeBadFrame:          "BAD_FRAME",
	CodeFrameTooLarge:     "FRAME_TOO_LARGE",
	CodeUnsupportedVer:    "UNSUPPORTED_VERSION",
	CodeNotFound:          "NOT_FOUND",
	CodeTopicConflict:     "TOPIC_CONFLICT",
	CodeStaleDelivery:     "STALE_DELIVERY",
	CodeInvalidArgument:   "INVALID_ARGUMENT",
	CodeStorage:           "STORAGE_ERROR",
	CodeProducerSeqTooOld: "PRODUCER_SEQ_TOO_OLD",
	CodeNotLeader:         "NOT_LEADER",
	CodeQuorumLost:        "QUORUM_LOST",
	CodeStaleLeaderEpoch:  "STALE_LEADER_EPOCH",
	CodeUnauthorized:      "UNAUTHORIZED",
	CodeUnavailable:       "UNAVAILABLE",
	CodeNotAuthenticated:  "NOT_AUTHENTICATED",
	CodeDataCorrupt:       "DATA_CORRUPT",
	CodeStaleAssignment:   "STALE_ASSIGNMENT",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("CODE_%d", uint16(c))
}

// Retryable reports whether a request that failed with c may be sent again
// unchanged (idempotent producers make PUB retries safe).
func (c Code) Retryable() bool {
	switch c {
	case CodeStorage, CodeNotLeader, CodeQuorumLost, CodeUnavailable:
		return true
	}
	return false
}

// Error is a protocol error: a stable code and a human-readable message.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Message
}

// Is matches any *Error with the same code, so callers can write
// errors.Is(err, wire.ErrStaleDelivery).
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Sentinels for errors.Is.
var (
	ErrAuthFailed        = &Error{Code: CodeAuthFailed}
	ErrBadFrame          = &Error{Code: CodeBadFrame}
	ErrFrameTooLarge     = &Error{Code: CodeFrameTooLarge}
	ErrUnsupportedVer    = &Error{Code: CodeUnsupportedVer}
	ErrNotFound          = &Error{Code: CodeNotFound}
	ErrTopicConflict     = &Error{Code: CodeTopicConflict}
	ErrStaleDelivery     = &Error{Code: CodeStaleDelivery}
	ErrInvalidArgument   = &Error{Code: CodeInvalidArgument}
	ErrStorage           = &Error{Code: CodeStorage}
	ErrProducerSeqTooOld = &Error{Code: CodeProducerSeqTooOld}
	ErrUnauthorized      = &Error{Code: CodeUnauthorized}
	ErrUnavailable       = &Error{Code: CodeUnavailable}
	ErrNotAuthenticated  = &Error{Code: CodeNotAuthenticated}
	ErrDataCorrupt       = &Error{Code: CodeDataCorrupt}
	ErrStaleAssignment   = &Error{Code: CodeStaleAssignment}
)
