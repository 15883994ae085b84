package replog

import "github.com/nereus-broker/nereus/internal/storage"

// applyCommitted reads committed entries as node's applyReplicated does.
func applyCommitted(l *Log, from uint64, n int) []storage.Entry {
	entries, err := l.Committed(nil, from, n)
	if err != nil {
		panic(err)
	}
	return entries
}
