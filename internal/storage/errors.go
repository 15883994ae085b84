package storage

import "errors"

// Errors returned by the storage package; match them with errors.Is.
var (
	// ErrCorrupt marks data whose checksum or structure is invalid.
	ErrCorrupt = errors.New("storage: corrupt data")
	// ErrOutOfRange is returned by Read for a seq below StartSeq or above
	// NextSeq, and by TruncateAfter for a seq below StartSeq-1.
	ErrOutOfRange = errors.New("storage: seq out of range")
	// ErrClosed is returned by every method of a closed Log.
	ErrClosed = errors.New("storage: log closed")
	// ErrSyncFailed marks a failed fsync. After it the log is failed: the
	// durability of every unsynced record is unknown.
	ErrSyncFailed = errors.New("storage: sync failed")
	// ErrFailed is returned by writer methods after an earlier write or
	// sync error left the log in an unknown state; Close and re-Open the
	// log to recover.
	ErrFailed = errors.New("storage: log failed by an earlier error")
	// ErrRecordTooLarge is returned by Append for a record whose encoding
	// exceeds Options.RecordBytesMax.
	ErrRecordTooLarge = errors.New("storage: record too large")
	// ErrBatchTooLarge is returned by Append for a batch whose encoding
	// exceeds Options.BatchBytesMax.
	ErrBatchTooLarge = errors.New("storage: batch too large")
	// ErrEmptyBatch is returned by Append with no records.
	ErrEmptyBatch = errors.New("storage: empty batch")
	// ErrEpochRegression is returned by Append with an epoch below
	// LastEpoch.
	ErrEpochRegression = errors.New("storage: epoch below last epoch")
	// ErrInvalidOptions is returned by Open for invalid Options.
	ErrInvalidOptions = errors.New("storage: invalid options")
)
