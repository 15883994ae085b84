package sim

import (
	"testing"

	"github.com/nereus-broker/nereus/internal/wire"
)

// TestKVWatcherChecks feeds the workload's watcher event streams and
// requires KVWatchEveryRevision exactly where a revision is missed,
// repeated, or not what was written.
func TestKVWatcherChecks(t *testing.T) {
	putEv := func(rev uint64, key, value string) wire.Frame {
		return &wire.KVEvent{Kind: wire.KVEventPut, Entry: wire.KVEntry{Key: []byte(key), Revision: rev, Op: wire.KVOpPut, Value: []byte(value)}}
	}
	skipped := func(from, to uint64) wire.Frame { return &wire.KVEvent{Kind: wire.KVEventSkipped, From: from, To: to} }
	expired := func(floor uint64) wire.Frame {
		return &wire.Err{Code: wire.CodeCursorExpired, Message: wire.CursorExpired(floor, "purged").Message}
	}
	cases := []struct {
		name   string
		acked  map[uint64]kvInput // writes acknowledged before the stream
		stream []wire.Frame
		ok     bool
		next   uint64
	}{
		{"in order", nil, []wire.Frame{putEv(1, "k0", "a"), putEv(2, "k1", "b")}, true, 3},
		{"a skipped range", nil, []wire.Frame{skipped(1, 3), putEv(4, "k0", "a")}, true, 5},
		{"a gap", nil, []wire.Frame{putEv(1, "k0", "a"), putEv(3, "k1", "b")}, false, 0},
		{"a repeat", nil, []wire.Frame{putEv(1, "k0", "a"), putEv(1, "k0", "a")}, false, 0},
		{"a skip that does not start at the cursor", nil, []wire.Frame{skipped(2, 3)}, false, 0},
		{"a value nobody wrote", nil, []wire.Frame{putEv(1, "k0", "zz")}, false, 0},
		{"a value of another key", nil, []wire.Frame{putEv(1, "k1", "a")}, false, 0},
		{"not the acknowledged write", map[uint64]kvInput{2: put("k1", "b")}, []wire.Frame{putEv(1, "k0", "a"), putEv(2, "k1", "c")}, false, 0},
		{"the acknowledged write", map[uint64]kvInput{2: put("k1", "b")}, []wire.Frame{putEv(1, "k0", "a"), putEv(2, "k1", "b")}, true, 3},
		{"cursor expired in band", nil, []wire.Frame{putEv(1, "k0", "a"), expired(10)}, true, 10},
		{"cursor expired below the cursor", nil, []wire.Frame{putEv(1, "k0", "a"), expired(2)}, false, 0},
	}
	for _, c := range cases {
		w := newWorld(1, false)
		s := &sim{w: w, chk: newChecker(w, map[uint32]bool{}), nodes: []*broker{{w: w}}}
		kw := &kvWorkload{s: s}
		wt := &kvWatcher{kw: kw, kvConns: kvConns{make([]*conn, 1)}, next: 1, acked: map[uint64]kvWritten{}, seen: map[uint64]kvWritten{},
			keyOf: map[string]string{"a": "k0", "b": "k1", "c": "k1"}}
		kw.watcher = wt
		for rev, in := range c.acked {
			wt.acknowledged(rev, in)
		}
		watch := &conn{b: s.nodes[0]}
		wt.watch, wt.corr = watch, 1
		for _, f := range c.stream {
			wt.onFrame(watch, 1, f)
		}
		if got := s.chk.violation == nil; got != c.ok {
			t.Errorf("%s: violation %v, want ok=%v", c.name, s.chk.violation, c.ok)
			continue
		}
		if c.ok && wt.next != c.next {
			t.Errorf("%s: cursor %d, want %d", c.name, wt.next, c.next)
		}
	}
}
