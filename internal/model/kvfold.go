package model

// The KV applied-loop models: the real loop kernel (internal/kvfold)
// folding a bucket's watch into a store, against a server that writes a
// fixed history record by record, serves one watch at a time (checking
// the floor at resume time only: live, it skips what retention evicted
// without a word, as JetStream does), answers listings and floor probes,
// and a store whose atomic applies and key reads may fail. The loop may
// restart (losing its memory) at any point. Three scenarios:
//   - applied: cursor authority over delivery, flush boundaries, store
//     failures and restarts;
//   - resync: a store behind the floor resyncs while a key is deleted and
//     recreated around the listing;
//   - live: retention overruns a live watcher while records are in flight.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nereus-broker/nereus/internal/kvfold"
)

// The KV loop's invariants (DESIGN §4, cursor authority).
const (
	// KVStoreMatchesCursor: the store's contents are the bucket folded up
	// to the store's cursor — no hole behind the cursor, nothing ahead.
	KVStoreMatchesCursor = "KVStoreMatchesCursor"
	// KVFoldConverges: whenever the loop is quiescent (nothing in flight,
	// nothing pending, the watch has nothing more to send and a probe
	// finds nothing) the store equals the bucket, and the store's cursor
	// is as far as the loop got (a restart would not redo work).
	KVFoldConverges = "KVFoldConverges"
	// KVLoopLive: a running loop never gets stuck with work outstanding.
	KVLoopLive = "KVLoopLive"
)

// KVConfig bounds a KV exploration. Budgets limit how often an action
// kind may occur along one path.
type KVConfig struct {
	Failures        int // store applies or key reads that fail
	Restarts        int // the loop restarts, losing its memory
	Compactions     int // retention advances the floor by one
	Overwrites      int // a record overwritten later is compacted above the floor
	ListingFailures int // listings that fail
	// StoreFailuresMax is the loop's consecutive-failure stop (0: its
	// default, 16).
	StoreFailuresMax int
	// PendingOpsMax is the loop's bound on held ops (0: its default).
	PendingOpsMax int
	NetworkMax    int // records in flight to the loop
	DepthMax      int
	StatesMax     int
	Mutations     kvfold.Mutations
}

// KVResult is the outcome of a KV exploration.
type KVResult struct {
	Outcome
	// What the exploration reached (distinct states entered that way).
	Applies       int // a batch committed
	StoreFailures int // a store operation failed
	Restarts      int // the loop restarted
	Trips         int // the floor guard or a probe resumed the watch
	Resyncs       int // a listing was taken
	Stopped       int // the loop failed (stopped with an error)
	Quiescent     int // quiescent states, each checked against the bucket
	BenignGaps    int // a delivery jumped the cursor above the floor and was folded
	Paused        int // the loop stopped taking records at PendingOpsMax
}

type kvrecord struct {
	key, value string // value "" is a delete
}

func (r kvrecord) String() string {
	if r.value == "" {
		return "-" + r.key
	}
	return r.key + "=" + r.value
}

// kvscenario is a model's fixed part.
type kvscenario struct {
	history []kvrecord // revision r is history[r-1]
	written int        // records written at the start
	floor   int        // the floor at the start
	cursor  int        // the store's cursor at the start (its contents: the fold to it)
	// checkCursor: check KVStoreMatchesCursor in every state, and keep
	// compaction out (a benign gap leaves the store without an overwritten
	// value the fold to its cursor has, until the overwrite arrives).
	checkCursor bool
}

const (
	kbFailures = iota
	kbRestarts
	kbCompactions
	kbOverwrites
	kbListingFailures
	kbudgets
)

func (c *KVConfig) budget(i int) int {
	return [kbudgets]int{c.Failures, c.Restarts, c.Compactions, c.Overwrites, c.ListingFailures}[i]
}

// kvmsg is a server frame on the watch: a record or CURSOR_EXPIRED.
type kvmsg struct {
	watch   uint64
	rev     int
	floor   int
	expired bool
}

type kvstate struct {
	written int
	floor   int    // revisions below it are gone unless a live key's latest put
	gone    uint64 // bit r: revision r was compacted
	// The server's watch (one at a time; a new one cancels the old).
	watch     uint64
	watchNext int
	net       []kvmsg
	listing   uint64 // an outstanding List
	keys      uint64 // an outstanding ReadKeys
	apply     *kvfold.Apply
	store     map[string]string // shared between states: copied on write
	cursor    int
	loop      *kvfold.Loop
	used      [kbudgets]int
	events    kvevent
	broken    string // an invariant an effect broke
}

type kvevent uint16

const (
	keApply kvevent = 1 << iota
	keStoreFailure
	keRestart
	keTrip
	keResync
	keStopped
	keQuiescent
	keBenignGap
	kePaused
)

var errModelStore = errors.New("store failed")

func (s *kvstate) clone() *kvstate {
	c := *s
	c.net = slices.Clone(s.net)
	c.loop = s.loop.Clone()
	c.events = 0
	return &c
}

// fold is the bucket's live keys after revision n.
func (sc *kvscenario) fold(n int) map[string]string {
	m := map[string]string{}
	for _, r := range sc.history[:n] {
		if r.value == "" {
			delete(m, r.key)
		} else {
			m[r.key] = r.value
		}
	}
	return m
}

// latest reports whether revision r is its key's last write so far.
func (sc *kvscenario) latest(s *kvstate, r int) bool {
	for q := r + 1; q <= s.written; q++ {
		if sc.history[q-1].key == sc.history[r-1].key {
			return false
		}
	}
	return true
}

// compactBelowFloor drops every revision under the floor but the latest
// puts of live keys (a compacted log keeps the current state).
func (sc *kvscenario) compactBelowFloor(s *kvstate) {
	for r := 1; r < s.floor && r <= s.written; r++ {
		if !sc.latest(s, r) || sc.history[r-1].value == "" {
			s.gone |= 1 << r
		}
	}
}

// nextRecord is the next revision the server's watch would send (0: none).
func (s *kvstate) nextRecord() int {
	if s.watch == 0 {
		return 0
	}
	for r := s.watchNext; r <= s.written; r++ {
		if s.gone&(1<<r) == 0 {
			return r
		}
	}
	return 0
}

// step hands the loop an event and carries out its effects.
func (sc *kvscenario) step(s *kvstate, ev kvfold.Event) {
	for _, e := range s.loop.Step(ev) {
		switch e := e.(type) {
		case kvfold.Watch:
			s.watch, s.watchNext, s.listing = e.ID, int(e.From), 0
			if _, ok := ev.(kvfold.Delivery); ok {
				s.events |= keTrip
			} else if _, ok := ev.(kvfold.Probe); ok {
				s.events |= keTrip
			}
			// The resume-time check: the server cannot serve a cursor
			// below the floor and says so in band.
			if int(e.From) < s.floor {
				s.net = append(s.net, kvmsg{watch: e.ID, floor: s.floor, expired: true})
				s.watch = 0
			}
		case kvfold.List:
			s.watch, s.listing = 0, e.Request
		case kvfold.ReadKeys:
			s.keys = e.Request
		case kvfold.Apply:
			if s.apply != nil {
				s.broken = fmt.Sprintf("%s: apply %v while %v is outstanding (the later may commit first)", KVStoreMatchesCursor, kvbatch(e), kvbatch(*s.apply))
			}
			s.apply = &e
		case kvfold.Fail:
			s.watch, s.listing, s.keys = 0, 0, 0
			s.events |= keStopped
		}
	}
}

func (sc *kvscenario) storeKeys(s *kvstate) []string {
	return slices.Sorted(maps.Keys(s.store))
}

func sameMap(a, b map[string]string) bool { return maps.Equal(a, b) }

func showMap(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// quiescent: nothing is in flight or pending, the watch has nothing more
// to send, and a probe would change nothing.
func (sc *kvscenario) quiescent(s *kvstate) bool {
	if len(s.net) > 0 || s.apply != nil || s.listing != 0 || s.keys != 0 || s.nextRecord() != 0 {
		return false
	}
	return len(s.loop.Clone().Step(kvfold.Flush{})) == 0 && len(s.loop.Clone().Step(kvfold.Probe{Floor: kvfold.Revision(s.floor)})) == 0
}

// check returns the invariant s breaks, or "".
func (sc *kvscenario) check(s *kvstate) string {
	if s.broken != "" {
		return s.broken
	}
	if sc.checkCursor {
		if want := sc.fold(s.cursor); !sameMap(s.store, want) {
			return fmt.Sprintf("%s: the store holds %s at cursor %d, the bucket folded to it is %s", KVStoreMatchesCursor, showMap(s.store), s.cursor, showMap(want))
		}
	}
	if s.loop.Phase() != kvfold.Failed && sc.quiescent(s) {
		s.events |= keQuiescent
		if want := sc.fold(s.written); !sameMap(s.store, want) {
			return fmt.Sprintf("%s: quiescent at cursor %d with %s, the bucket at %d is %s", KVFoldConverges, s.cursor, showMap(s.store), s.written, showMap(want))
		}
		if s.cursor != int(s.loop.Frontier()) {
			return fmt.Sprintf("%s: quiescent with the store's cursor at %d, the loop's frontier at %d", KVFoldConverges, s.cursor, s.loop.Frontier())
		}
	}
	return ""
}

type kstep = step[*kvstate]

func (cfg *KVConfig) successors(sc *kvscenario, s *kvstate) []kstep {
	var out []kstep
	try := func(name string, budget int, f func(t *kvstate) bool) {
		if budget >= 0 && s.used[budget] >= cfg.budget(budget) {
			return
		}
		t := s.clone()
		if budget >= 0 {
			t.used[budget]++
		}
		if f(t) {
			out = append(out, kstep{action: name, next: t, err: sc.check(t)})
		}
	}
	if s.written < len(sc.history) {
		try(fmt.Sprintf("server writes %d: %v", s.written+1, sc.history[s.written]), -1, func(t *kvstate) bool {
			t.written++
			return true
		})
	}
	if r := s.nextRecord(); r != 0 && len(s.net) < cfg.NetworkMax {
		try(fmt.Sprintf("server sends %d (floor %d)", r, s.floor), -1, func(t *kvstate) bool {
			t.net = append(t.net, kvmsg{watch: t.watch, rev: r, floor: t.floor})
			t.watchNext = r + 1
			return true
		})
	}
	if len(s.net) > 0 {
		m := s.net[0]
		name := fmt.Sprintf("loop receives CURSOR_EXPIRED (watch %d, floor %d)", m.watch, m.floor)
		if !m.expired {
			name = fmt.Sprintf("loop receives %d: %v (watch %d, floor %d)", m.rev, sc.history[m.rev-1], m.watch, m.floor)
		}
		try(name, -1, func(t *kvstate) bool {
			t.net = t.net[1:]
			if m.expired {
				sc.step(t, kvfold.CursorExpired{Watch: m.watch, Floor: kvfold.Revision(m.floor)})
				return true
			}
			r := sc.history[m.rev-1]
			if m.watch == t.loop.Watch() && m.rev > int(t.loop.Frontier())+1 && m.floor <= int(t.loop.Frontier())+1 {
				t.events |= keBenignGap
			}
			sc.step(t, kvfold.Delivery{Watch: m.watch, Revision: kvfold.Revision(m.rev), Key: r.key, Value: []byte(r.value), Delete: r.value == "", Floor: kvfold.Revision(m.floor)})
			if t.loop.Paused() {
				t.events |= kePaused
			}
			return true
		})
	}
	try("loop flushes", -1, func(t *kvstate) bool {
		sc.step(t, kvfold.Flush{})
		return t.apply != s.apply // else it changed nothing
	})
	// Probes are explored while nothing is in flight to the loop: one
	// that races a resume or CURSOR_EXPIRED only resumes once more (new
	// watch ids without end), and the in-band guard, not the probe, is
	// what covers records in flight.
	if len(s.net) == 0 {
		try(fmt.Sprintf("probe finds floor %d", s.floor), -1, func(t *kvstate) bool {
			sc.step(t, kvfold.Probe{Floor: kvfold.Revision(t.floor)})
			return t.events&keTrip != 0 // else it changed nothing
		})
	}
	if s.apply != nil {
		a := *s.apply
		try(fmt.Sprintf("store applies %v", kvbatch(a)), -1, func(t *kvstate) bool {
			t.apply = nil
			t.store = maps.Clone(t.store)
			for _, op := range a.Ops {
				if op.Delete {
					delete(t.store, op.Key)
				} else {
					t.store[op.Key] = string(op.Value)
				}
			}
			t.cursor = int(a.Cursor)
			t.events |= keApply
			sc.step(t, kvfold.Applied{Batch: a.ID})
			return true
		})
		try(fmt.Sprintf("store fails %v", kvbatch(a)), kbFailures, func(t *kvstate) bool {
			t.apply = nil
			t.events |= keStoreFailure
			sc.step(t, kvfold.Applied{Batch: a.ID, Err: errModelStore})
			return true
		})
	}
	if s.keys != 0 {
		req := s.keys
		try(fmt.Sprintf("store reads its keys %v", sc.storeKeys(s)), -1, func(t *kvstate) bool {
			t.keys = 0
			sc.step(t, kvfold.StoreKeys{Request: req, Keys: sc.storeKeys(t)})
			return true
		})
		try("store fails to read its keys", kbFailures, func(t *kvstate) bool {
			t.keys = 0
			t.events |= keStoreFailure
			sc.step(t, kvfold.StoreKeys{Request: req, Err: errModelStore})
			return true
		})
	}
	if s.listing != 0 {
		req := s.listing
		try(fmt.Sprintf("server lists at %d: %s", s.written, showMap(sc.fold(s.written))), -1, func(t *kvstate) bool {
			t.listing = 0
			var entries []kvfold.Entry
			live := sc.fold(t.written)
			for _, k := range slices.Sorted(maps.Keys(live)) {
				entries = append(entries, kvfold.Entry{Key: k, Value: []byte(live[k])})
			}
			t.events |= keResync
			sc.step(t, kvfold.Listing{Request: req, Revision: kvfold.Revision(t.written), Entries: entries})
			return true
		})
		try("listing fails", kbListingFailures, func(t *kvstate) bool {
			t.listing = 0
			sc.step(t, kvfold.Listing{Request: req, Err: errModelStore})
			return true
		})
	}
	try(fmt.Sprintf("loop restarts from the store's cursor %d", s.cursor), kbRestarts, func(t *kvstate) bool {
		// Its connection and store calls die with it: what was in
		// flight is lost (an apply not yet done never happens).
		t.net, t.watch, t.listing, t.keys, t.apply = nil, 0, 0, 0, nil
		t.events |= keRestart
		sc.step(t, kvfold.Restart{Persisted: kvfold.Revision(t.cursor)})
		return true
	})
	if !sc.checkCursor {
		if s.floor <= s.written {
			try(fmt.Sprintf("retention moves the floor to %d", s.floor+1), kbCompactions, func(t *kvstate) bool {
				t.floor++
				sc.compactBelowFloor(t)
				return true
			})
		}
		for r := s.floor; r <= s.written; r++ {
			if s.gone&(1<<r) == 0 && !sc.latest(s, r) {
				try(fmt.Sprintf("compaction drops overwritten %d: %v", r, sc.history[r-1]), kbOverwrites, func(t *kvstate) bool {
					t.gone |= 1 << r
					return true
				})
			}
		}
	}
	if len(out) == 0 && s.loop.Phase() != kvfold.Failed && !sc.quiescent(s) {
		out = append(out, kstep{action: "nothing can happen", err: fmt.Sprintf("%s: the loop is stuck in %v with work outstanding", KVLoopLive, s.loop.Phase())})
	}
	return out
}

func kvbatch(a kvfold.Apply) string {
	var parts []string
	for _, op := range a.Ops {
		if op.Delete {
			parts = append(parts, "-"+op.Key)
		} else {
			parts = append(parts, op.Key+"="+string(op.Value))
		}
	}
	return fmt.Sprintf("[%s]@%d", strings.Join(parts, " "), a.Cursor)
}

func (s *kvstate) key() [16]byte {
	var b []byte
	for _, x := range []uint64{uint64(s.written), uint64(s.floor), s.gone, s.watch, uint64(s.watchNext), s.listing, s.keys, uint64(s.cursor)} {
		b = binary.AppendUvarint(b, x)
	}
	for _, m := range s.net {
		b = binary.AppendUvarint(binary.AppendUvarint(binary.AppendUvarint(b, m.watch), uint64(m.rev)), uint64(m.floor))
		b = append(b, boolByte(m.expired))
	}
	b = append(b, ';')
	if s.apply != nil {
		b = append(binary.AppendUvarint(b, s.apply.ID), 'a')
	}
	for _, k := range slices.Sorted(maps.Keys(s.store)) {
		b = append(append(append(append(b, k...), 0), s.store[k]...), 0)
	}
	for _, x := range s.used {
		b = binary.AppendUvarint(b, uint64(x))
	}
	b = s.loop.AppendKey(append(b, ';'))
	return stateKey(b)
}

func (cfg *KVConfig) run(sc *kvscenario) KVResult {
	if cfg.NetworkMax == 0 {
		cfg.NetworkMax = 3
	}
	if cfg.DepthMax == 0 {
		cfg.DepthMax = 80
	}
	if cfg.StatesMax == 0 {
		cfg.StatesMax = 1_000_000
	}
	init := &kvstate{written: sc.written, floor: sc.floor, store: sc.fold(sc.cursor), cursor: sc.cursor,
		loop: kvfold.New(kvfold.Config{StoreFailuresMax: cfg.StoreFailuresMax, PendingOpsMax: cfg.PendingOpsMax, Mutations: cfg.Mutations})}
	sc.compactBelowFloor(init)
	sc.step(init, kvfold.Restart{Persisted: kvfold.Revision(sc.cursor)})
	res := KVResult{}
	res.Outcome = search[*kvstate]{
		successors: func(s *kvstate) []kstep { return cfg.successors(sc, s) },
		key:        (*kvstate).key,
		visit:      func(s *kvstate) { res.count(s.events) },
		bounded:    func(*kvstate) bool { return false },
		depthMax:   cfg.DepthMax,
		statesMax:  cfg.StatesMax,
	}.run(init)
	return res
}

func (res *KVResult) count(ev kvevent) {
	for _, c := range []struct {
		ev kvevent
		n  *int
	}{{keApply, &res.Applies}, {keStoreFailure, &res.StoreFailures}, {keRestart, &res.Restarts}, {keTrip, &res.Trips},
		{keResync, &res.Resyncs}, {keStopped, &res.Stopped}, {keQuiescent, &res.Quiescent}, {keBenignGap, &res.BenignGaps}, {kePaused, &res.Paused}} {
		if ev&c.ev != 0 {
			*c.n++
		}
	}
}

// CheckKVApplied is the cursor-authority model: a four-record history
// delivered, flushed at every boundary, with store failures and restarts
// in every interleaving (no compaction: Compactions and Overwrites are
// not used). KVStoreMatchesCursor holds in every state and
// KVFoldConverges in every quiescent one.
func CheckKVApplied(cfg KVConfig) KVResult {
	return cfg.run(&kvscenario{
		history:     []kvrecord{{"a", "1"}, {"b", "1"}, {"a", ""}, {"b", "2"}},
		floor:       1,
		checkCursor: true,
	})
}

// CheckKVResync is the resync-ordering model: the store holds k and j at
// cursor 2, behind a floor of 4 (j's delete was purged), so its watch
// expires; the bucket then deletes k and recreates it while the loop
// lists, the listing landing before the delete, between the two, or
// after the recreate. KVFoldConverges in every quiescent state.
func CheckKVResync(cfg KVConfig) KVResult {
	return cfg.run(&kvscenario{
		history: []kvrecord{{"k", "1"}, {"j", "1"}, {"j", ""}, {"k", ""}, {"k", "2"}},
		written: 3,
		floor:   4,
		cursor:  2,
	})
}

// CheckKVLive is the live-watch model: an empty store watches a bucket
// whose records are written, delivered and evicted by retention (the
// floor moves past the watcher's cursor while records are in flight) or
// compacted as overwritten, in every interleaving. KVFoldConverges in
// every quiescent state: every maximal run ends with the fold equal to
// the bucket.
func CheckKVLive(cfg KVConfig) KVResult {
	return cfg.run(&kvscenario{
		history: []kvrecord{{"a", "1"}, {"a", ""}, {"b", "1"}, {"b", "2"}},
		floor:   1,
	})
}
