package node

import (
	"context"
	"log/slog"
	"sync"
)

// repeatWindowMs is how often one repeating ERROR line gets through.
const repeatWindowMs = 10_000

// repeatLimiter keeps a persistent fault (a full disk: every publish
// fails the same way) from flooding the log: a line with a given key gets
// through once per window, and the next one that does says how many were
// suppressed meanwhile. Safe for concurrent use.
type repeatLimiter struct {
	mu   sync.Mutex
	seen map[string]*repeatState
}

type repeatState struct {
	lastMs     int64
	suppressed int
}

// repeatKeysMax bounds the limiter's memory; past it, it starts over.
const repeatKeysMax = 1024

// allow reports whether the line keyed key may be logged at nowMs, and how
// many of its repeats were suppressed since it last was.
func (r *repeatLimiter) allow(key string, nowMs int64) (ok bool, suppressed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.seen[key]
	if st != nil && nowMs-st.lastMs < repeatWindowMs {
		st.suppressed++
		return false, 0
	}
	if st == nil {
		if r.seen == nil || len(r.seen) >= repeatKeysMax {
			r.seen = map[string]*repeatState{}
		}
		st = &repeatState{}
		r.seen[key] = st
	}
	suppressed = st.suppressed
	st.lastMs, st.suppressed = nowMs, 0
	return true, suppressed
}

// logRepeatedError logs msg at ERROR unless the same msg for the same
// subject (e.g. "topic/partition") was logged within the window.
func (n *Node) logRepeatedError(subject, msg string, args ...any) {
	n.logRepeated(slog.LevelError, subject, msg, args...)
}

// logRepeated logs msg at level unless the same msg for the same subject
// was logged within the window.
func (n *Node) logRepeated(level slog.Level, subject, msg string, args ...any) {
	ok, suppressed := n.repeats.allow(subject+"\x00"+msg, n.monoMs())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed_repeats", suppressed)
	}
	n.log.Log(context.Background(), level, msg, args...)
}
