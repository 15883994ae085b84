package sim

import (
	"strings"

	"github.com/nereus-broker/nereus/internal/wire"
)

// The KV workload's watcher: one client watches the bucket from revision
// 1 through a connection to every node, for the whole run, resuming from
// its cursor on another node when a watch ends (NOT_LEADER, UNAVAILABLE,
// a closed connection, or no event for kvWatchIdleMs while the bucket
// moved on). It checks that every revision reaches it exactly once and in
// order — each event is the cursor's revision, or a SKIPPED range that
// starts there — unless the server ends the watch with CURSOR_EXPIRED,
// in band, when it resumes from the floor; that every put or delete it
// sees is what was written (its key and value, and for an acknowledged
// write its revision); and, at the end, that it reached every
// acknowledged revision. It is a slow consumer at times (grant), so
// compaction — deletes are purged after kvTombstoneTTLMs — may overrun it.

// KVWatchEveryRevision: a watcher sees every revision once, in order,
// with what was written there, or CURSOR_EXPIRED in band.
const KVWatchEveryRevision = "KVWatchEveryRevision"

const (
	kvWatchCredit = 16
	// kvWatchIdleMs: a watch silent this long while acknowledged
	// revisions lie ahead of its cursor is started again elsewhere.
	kvWatchIdleMs = 3000
)

// kvWritten is a write as the watcher compares it.
type kvWritten struct {
	op    uint8 // wire.KVOpPut or wire.KVOpDelete
	key   string
	value string
}

type kvWatcher struct {
	kw *kvWorkload
	kvConns
	at      int
	next    uint64 // the next revision the watcher must see
	corr    uint64
	watch   *conn // the connection of the watch running (nil: none)
	credit  int
	quietMs int64 // when the watch last heard something
	// startedMs: when the watch running was asked.
	startedMs int64
	expired   int // CURSOR_EXPIRED ends seen
	resumes   int // watches started
	// acked: acknowledged writes by revision; seen: what the watcher saw
	// at each revision, to compare with writes acknowledged later.
	acked map[uint64]kvWritten
	seen  map[uint64]kvWritten
	// keyOf: every value a client sent, with its key (values are unique).
	keyOf map[string]string
	// owed, when set, says why the watcher must hear CURSOR_EXPIRED before
	// its next event: it went past a revision the bucket lost (owedLoss,
	// what of that it passed; kvloss.go).
	owed     string
	owedLoss kvLoss
	// bucketStart: the floor of the CURSOR_EXPIRED that followed the
	// bucket's latest re-creation (recreating until then): the watcher
	// holds nothing from below it.
	bucketStart uint64
	recreating  bool
}

func newKVWatcher(kw *kvWorkload) *kvWatcher {
	s := kw.s
	wt := &kvWatcher{kw: kw, kvConns: kvConns{make([]*conn, len(s.nodes))}, next: 1, acked: map[uint64]kvWritten{},
		seen: map[uint64]kvWritten{}, keyOf: map[string]string{}}
	for at := range s.nodes {
		s.w.after(s.w.between(0, 10), func() { wt.connect(s, wt, at) })
	}
	s.w.after(s.w.between(100, 300), wt.start)
	s.w.after(500, wt.check)
	return wt
}

func (wt *kvWatcher) name() string { return "kvwatch" }

func (wt *kvWatcher) onClose(c *conn) {
	if wt.closed(wt.kw.s, wt, c) && wt.watch == c {
		wt.ended("connection closed", true)
	}
}

// start starts a watch from the cursor at the node believed to lead.
func (wt *kvWatcher) start() {
	w := wt.kw.s.w
	if wt.watch != nil {
		return
	}
	c := wt.conns[wt.at]
	if c == nil || !c.open {
		wt.at = (wt.at + 1) % len(wt.conns)
		w.after(w.between(10, 100), wt.start)
		return
	}
	wt.corr++
	wt.watch, wt.credit, wt.quietMs, wt.startedMs = c, kvWatchCredit, w.nowMs, w.nowMs
	wt.resumes++
	w.tracef("kvwatch -> n%d watch from %d", wt.at+1, wt.next)
	c.send(wt.corr, &wire.KVWatch{Bucket: kvBucket, FromRevision: wt.next, Credit: kvWatchCredit})
}

// ended: the watch is over; another starts later (on the next node when
// this one may not lead).
func (wt *kvWatcher) ended(why string, move bool) {
	w := wt.kw.s.w
	wt.watch = nil
	if move {
		wt.at = (wt.at + 1) % len(wt.conns)
	}
	w.tracef("kvwatch ended at %d: %s", wt.next, why)
	w.after(w.between(10, 100), wt.start)
}

// check restarts a watch that stays silent while acknowledged revisions
// lie ahead of its cursor (its node paused, or its replies lost).
func (wt *kvWatcher) check() {
	w := wt.kw.s.w
	w.after(500, wt.check)
	if wt.watch == nil || w.nowMs-wt.quietMs < kvWatchIdleMs || wt.caughtUp() {
		return
	}
	wt.watch.send(0, &wire.KVWatchCancel{Watch: wt.corr})
	wt.ended("silent", true)
}

// caughtUp reports whether the watcher saw every acknowledged revision
// (and heard the CURSOR_EXPIRED it is owed).
func (wt *kvWatcher) caughtUp() bool {
	if wt.owed != "" {
		return false
	}
	for rev := range wt.acked {
		if rev >= wt.next {
			return false
		}
	}
	return true
}

func (wt *kvWatcher) onFrame(c *conn, corr uint64, f wire.Frame) {
	if c != wt.watch || corr != wt.corr {
		return // a watch that ended
	}
	w, chk := wt.kw.s.w, wt.kw.s.chk
	wt.quietMs = w.nowMs
	switch f := f.(type) {
	case *wire.KVEvent:
		if wt.owed != "" {
			chk.violate(LossExpiresEveryCursor, "the watch from %d went on (event kind %d at %d) without CURSOR_EXPIRED: %s", wt.next, f.Kind, f.Entry.Revision, wt.owed)
			return
		}
		if f.Kind == wire.KVEventSkipped {
			if f.From != wt.next || f.To < f.From {
				chk.violate(KVWatchEveryRevision, "the watch's cursor is at %d, the server skipped %d..%d", wt.next, f.From, f.To)
				return
			}
			wt.next = f.To + 1
			return
		}
		rev := f.Entry.Revision
		if rev != wt.next {
			chk.violate(KVWatchEveryRevision, "the watch's cursor is at %d, the server sent revision %d", wt.next, rev)
			return
		}
		got := kvWritten{op: f.Entry.Op, key: string(f.Entry.Key), value: string(f.Entry.Value)}
		wt.observe(rev, got)
		wt.next = rev + 1
		if wt.credit--; wt.credit == kvWatchCredit/2 {
			wt.grant(c, wt.corr)
		}
	case *wire.Err:
		switch f.Code {
		case wire.CodeCursorExpired:
			floor, ok := wire.ExpiredFloor(f.AsError())
			if !ok || floor <= wt.next {
				chk.violate(KVWatchEveryRevision, "CURSOR_EXPIRED at cursor %d names no floor above it: %s", wt.next, f.AsError())
				return
			}
			wt.expired++
			if wt.owed != "" {
				wt.kw.s.repaired["watcher told of a loss"]++
			}
			wt.owed, wt.owedLoss = "", kvLoss{}
			if wt.recreating {
				wt.bucketStart, wt.recreating = floor, false
			}
			wt.next = floor // told in band: revisions below the floor were purged
			wt.ended("CURSOR_EXPIRED", false)
		default:
			if f.Code == wire.CodeDataCorrupt && strings.Contains(f.Message, kvRecreateAdvice) {
				wt.kw.operator.start(wt.at, wt.startedMs)
			}
			wt.ended(f.Code.String(), f.Code != wire.CodeUnavailable)
		}
	}
}

// grant gives the watch more credit; one time in three only after a
// while (a slow consumer: compaction may overrun it, and its watch end
// CURSOR_EXPIRED).
func (wt *kvWatcher) grant(c *conn, corr uint64) {
	w := wt.kw.s.w
	send := func() {
		if wt.watch == c && wt.corr == corr {
			wt.credit += kvWatchCredit
			c.send(0, &wire.KVWatchCredit{Watch: corr, Credit: kvWatchCredit})
		}
	}
	if w.rng.IntN(3) == 0 {
		w.after(w.between(500, 2500), send)
		return
	}
	send()
}

// observe checks what the watcher saw at rev against what was written.
func (wt *kvWatcher) observe(rev uint64, got kvWritten) {
	chk := wt.kw.s.chk
	wt.seen[rev] = got
	if want, ok := wt.acked[rev]; ok && want != got {
		chk.violate(KVWatchEveryRevision, "revision %d: watched %+v, acknowledged %+v", rev, got, want)
		return
	}
	if got.op == wire.KVOpPut && wt.keyOf[got.value] != got.key {
		chk.violate(KVWatchEveryRevision, "revision %d: watched %s=%s, a value no client wrote to that key", rev, got.key, got.value)
	}
}

// acknowledged records a write answered with its revision.
func (wt *kvWatcher) acknowledged(rev uint64, in kvInput) {
	want := kvWritten{op: wire.KVOpPut, key: in.Key, value: in.Value}
	if in.Op == kvDel {
		want.op = wire.KVOpDelete
	}
	wt.acked[rev] = want
	if got, ok := wt.seen[rev]; ok && got != want {
		wt.kw.s.chk.violate(KVWatchEveryRevision, "revision %d: watched %+v, acknowledged %+v", rev, got, want)
	}
}
