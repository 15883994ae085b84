package kvfold

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

var errDisk = errors.New("disk full")

// fixture drives a loop and remembers its last watch, batch and requests,
// so scenarios read as the shell would see them.
type fixture struct {
	t     *testing.T
	l     *Loop
	watch Watch
	batch *Apply
	list  uint64
	keys  uint64
	fail  error
}

func newFixture(t *testing.T, cfg Config, persisted Revision) *fixture {
	f := &fixture{t: t, l: New(cfg)}
	f.step(Restart{Persisted: persisted})
	return f
}

func (f *fixture) step(ev Event) []Effect {
	f.t.Helper()
	effects := f.l.Step(ev)
	for _, e := range effects {
		switch e := e.(type) {
		case Watch:
			f.watch = e
		case Apply:
			if f.batch != nil {
				f.t.Fatalf("%T: a second apply while batch %d is outstanding", ev, f.batch.ID)
			}
			f.batch = &e
		case List:
			f.list = e.Request
		case ReadKeys:
			f.keys = e.Request
		case Fail:
			f.fail = e.Err
		}
	}
	return effects
}

func (f *fixture) put(rev Revision, key, value string, floor Revision) {
	f.t.Helper()
	f.step(Delivery{Watch: f.watch.ID, Revision: rev, Key: key, Value: []byte(value), Floor: floor})
}

func (f *fixture) del(rev Revision, key string, floor Revision) {
	f.t.Helper()
	f.step(Delivery{Watch: f.watch.ID, Revision: rev, Key: key, Delete: true, Floor: floor})
}

// flush asks for an apply and returns it as text (or "" when none went
// out), leaving it outstanding.
func (f *fixture) flush() string {
	f.t.Helper()
	had := f.batch
	f.step(Flush{})
	if f.batch == nil || f.batch == had {
		return ""
	}
	return f.batch.String()
}

// answer answers the outstanding apply.
func (f *fixture) answer(err error) {
	f.t.Helper()
	if f.batch == nil {
		f.t.Fatal("no apply outstanding")
	}
	b := f.batch
	f.batch = nil
	f.step(Applied{Batch: b.ID, Err: err})
}

func (f *fixture) expectWatchFrom(from Revision) {
	f.t.Helper()
	if f.watch.From != from {
		f.t.Fatalf("watch from %d, want %d", f.watch.From, from)
	}
}

func (a Apply) String() string {
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

func expect(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %q, want %q", what, got, want)
	}
}

func TestFirstRestartWatchesAfterThePersistedCursor(t *testing.T) {
	f := newFixture(t, Config{}, 7)
	f.expectWatchFrom(8)
	f.put(8, "a", "1", 1)
	expect(t, "flush", f.flush(), "[a=1]@8")
}

// A failed apply goes back ahead of what came after it: the next apply
// commits everything since the store's cursor, in stream order.
func TestFailedApplyIsRequeuedInStreamOrder(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	f.put(2, "b", "1", 1)
	expect(t, "first flush", f.flush(), "[a=1 b=1]@2")
	f.del(3, "a", 1)
	expect(t, "flush with a batch in flight", f.flush(), "")
	f.answer(errDisk)
	if f.l.Persisted() != 0 {
		t.Fatalf("persisted %d after a failed apply", f.l.Persisted())
	}
	expect(t, "retry", f.flush(), "[a=1 b=1 -a]@3")
	f.answer(nil)
	if f.l.Persisted() != 3 || f.l.PendingOps() != 0 {
		t.Fatalf("persisted %d, %d pending", f.l.Persisted(), f.l.PendingOps())
	}
}

func TestBatchOpsMaxAppliesWithoutAFlush(t *testing.T) {
	f := newFixture(t, Config{BatchOpsMax: 2}, 0)
	f.put(1, "a", "1", 1)
	if f.batch != nil {
		t.Fatal("applied below BatchOpsMax")
	}
	f.put(2, "b", "1", 1)
	if f.batch == nil {
		t.Fatal("no apply at BatchOpsMax")
	}
	expect(t, "batch", f.batch.String(), "[a=1 b=1]@2")
}

// At PendingOpsMax the loop stops taking records while the store is busy,
// and resumes the watch after what it took once an apply took them.
func TestPendingOpsMaxPausesTheWatch(t *testing.T) {
	f := newFixture(t, Config{PendingOpsMax: 2}, 0)
	f.put(1, "a", "1", 1)
	expect(t, "flush", f.flush(), "[a=1]@1")
	f.put(2, "b", "1", 1)
	f.put(3, "c", "1", 1)
	paused := f.watch.ID
	f.put(4, "d", "1", 1) // not taken
	if f.l.Frontier() != 3 || f.l.PendingOps() != 2 {
		t.Fatalf("at the bound: frontier %d, %d pending", f.l.Frontier(), f.l.PendingOps())
	}
	f.answer(errDisk) // the batch goes back: still at the bound
	if f.watch.ID != paused {
		t.Fatal("resumed while still at the bound")
	}
	expect(t, "retry", f.flush(), "[a=1 b=1 c=1]@3")
	f.expectWatchFrom(4)
	f.put(4, "d", "1", 1)
	if f.l.Frontier() != 4 {
		t.Fatalf("the resumed watch's record: frontier %d", f.l.Frontier())
	}
}

// A duplicate or older revision (a transport redelivery) neither folds
// again nor moves the frontier back.
func TestDuplicateDeliveriesAreIgnored(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	f.put(2, "a", "2", 1)
	f.put(2, "a", "2", 1)
	f.put(1, "a", "1", 1)
	if f.l.Frontier() != 2 {
		t.Fatalf("frontier %d", f.l.Frontier())
	}
	expect(t, "flush", f.flush(), "[a=1 a=2]@2")
}

// Answers meant for an earlier incarnation of the loop (its store calls
// and listing may still finish after an in-process restart) are not
// taken for this one's.
func TestAnswersToAnEarlierIncarnationAreIgnored(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	f.flush()
	stale := f.batch.ID
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 3})
	staleList := f.list
	f.batch = nil
	f.step(Restart{Persisted: 0})
	f.put(1, "a", "1", 1)
	f.put(2, "b", "1", 1)
	f.flush()
	f.step(Applied{Batch: stale, Err: errDisk})
	if f.l.Persisted() != 0 || f.batch == nil {
		t.Fatal("the earlier incarnation's apply answer was taken")
	}
	f.answer(nil)
	if f.l.Persisted() != 2 {
		t.Fatalf("persisted %d after this incarnation's apply", f.l.Persisted())
	}
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 9})
	f.step(Listing{Request: staleList, Revision: 1}) // older than the store's cursor 2
	if f.l.Phase() != Resyncing || f.l.Frontier() != 2 {
		t.Fatalf("the earlier incarnation's listing was taken: phase %v, frontier %d", f.l.Phase(), f.l.Frontier())
	}
	f.step(Listing{Request: f.list, Revision: 9})
	f.expectWatchFrom(10)
}

// A key read of an earlier incarnation predates what this one applied:
// its deletes would miss keys the store has now.
func TestKeyReadOfAnEarlierIncarnationIsIgnored(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 3})
	f.step(Listing{Request: f.list, Revision: 3})
	stale := f.keys
	f.step(Restart{Persisted: 0})
	f.put(1, "a", "1", 1)
	f.flush()
	f.answer(nil)
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 5})
	f.step(Listing{Request: f.list, Revision: 5})
	f.step(StoreKeys{Request: stale}) // read when the store was empty
	if f.batch != nil {
		t.Fatalf("the earlier incarnation's key read was taken: %v", f.batch)
	}
	f.step(StoreKeys{Request: f.keys, Keys: []string{"a"}})
	expect(t, "resync batch", f.batch.String(), "[-a]@5")
}

// A CURSOR_EXPIRED of a watch the loop already replaced does not start
// another listing of the whole bucket.
func TestExpiryOfAReplacedWatchIsIgnored(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	old := f.watch.ID
	f.step(Probe{Floor: 2}) // frontier 0, floor 2: resumes from 1
	if f.watch.ID == old {
		t.Fatal("the probe did not resume the watch")
	}
	f.step(CursorExpired{Watch: old, Floor: 2})
	if f.l.Phase() != Watching || f.list != 0 {
		t.Fatalf("a replaced watch's expiry: phase %v, list request %d", f.l.Phase(), f.list)
	}
}

func TestSixteenConsecutiveStoreFailuresStop(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	for i := range 15 {
		f.flush()
		f.answer(errDisk)
		if f.l.Phase() != Watching {
			t.Fatalf("stopped after %d failures", i+1)
		}
	}
	f.flush()
	f.answer(nil) // a success resets the streak
	f.put(2, "a", "2", 1)
	for range 15 {
		f.flush()
		f.answer(errDisk)
	}
	if f.l.Phase() != Watching {
		t.Fatal("the streak was not reset by the success")
	}
	f.flush()
	f.answer(errDisk)
	if f.l.Phase() != Failed || !errors.Is(f.fail, ErrStoreFailing) {
		t.Fatalf("after 16 failures in a row: phase %v, fail %v", f.l.Phase(), f.fail)
	}
	if effects := f.l.Step(Flush{}); effects != nil {
		t.Fatalf("a failed loop acted: %v", effects)
	}
}

// A restart forgets what it held and resumes from the store's cursor,
// which lags the frontier after a failed apply.
func TestRestartResumesFromThePersistedCursor(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	f.put(2, "b", "1", 1)
	f.flush()
	f.answer(errDisk)
	if f.l.Frontier() != 2 {
		t.Fatalf("frontier %d", f.l.Frontier())
	}
	old := f.watch.ID
	f.step(Restart{Persisted: 0})
	f.expectWatchFrom(1)
	if f.l.PendingOps() != 0 {
		t.Fatal("a restart kept pending ops")
	}
	f.step(Delivery{Watch: old, Revision: 1, Key: "a", Value: []byte("1"), Floor: 1})
	if f.l.PendingOps() != 0 {
		t.Fatal("a delivery of the watch before the restart was folded")
	}
}

// expire drives a loop holding a..c at cursor 3 into a resync whose
// listing is at revision 5.
func expireAndList(t *testing.T, cfg Config, entries ...Entry) *fixture {
	f := newFixture(t, cfg, 3)
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 5})
	if f.l.Phase() != Resyncing || f.list == 0 {
		t.Fatalf("CURSOR_EXPIRED: phase %v, list request %d", f.l.Phase(), f.list)
	}
	f.step(Listing{Request: f.list, Revision: 5, Entries: entries})
	f.expectWatchFrom(6)
	return f
}

// The ack barrier: the synthetic deletes of keys the listing lacks come
// strictly before the first re-listed put, and nothing the resumed watch
// delivers is applied before them — a key deleted before the listing and
// recreated after it ends up present.
func TestResyncDeletesBeforeTheRelistedPuts(t *testing.T) {
	f := expireAndList(t, Config{}, Entry{"b", []byte("2")}, Entry{"d", []byte("1")})
	if f.keys == 0 {
		t.Fatal("no store-key read after the listing")
	}
	f.put(6, "a", "9", 1) // a was deleted before the listing, recreated after it
	expect(t, "flush at the barrier", f.flush(), "")
	f.step(StoreKeys{Request: f.keys, Keys: []string{"a", "b", "c"}})
	if f.batch == nil {
		t.Fatal("no apply once the store's keys are known")
	}
	expect(t, "resync batch", f.batch.String(), "[-a -c b=2 d=1 a=9]@6")
}

// What the expired watch had queued is dropped (the listing supersedes
// it), and a failed read of the store's keys is retried.
func TestResyncDropsTheExpiredWatchsQueueAndRetriesTheKeyRead(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 3})
	f.step(Listing{Request: f.list, Revision: 4, Entries: []Entry{{"b", []byte("1")}}})
	first := f.keys
	f.step(StoreKeys{Request: first, Err: errDisk})
	if f.keys == first || f.l.Phase() != Barrier {
		t.Fatalf("a failed key read: request %d (was %d), phase %v", f.keys, first, f.l.Phase())
	}
	f.step(StoreKeys{Request: f.keys})
	expect(t, "resync batch", f.batch.String(), "[b=1]@4")
}

// A resync that changes nothing still moves the store's cursor past the
// floor, so that a restart does not resync again.
func TestEmptyResyncMovesTheCursor(t *testing.T) {
	f := newFixture(t, Config{}, 2)
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 4})
	f.step(Listing{Request: f.list, Revision: 6})
	f.step(StoreKeys{Request: f.keys})
	expect(t, "resync batch", f.batch.String(), "[]@6")
	f.answer(errDisk)
	expect(t, "retry", f.flush(), "[]@6")
	f.answer(nil)
	if f.l.Persisted() != 6 {
		t.Fatalf("persisted %d", f.l.Persisted())
	}
	expect(t, "nothing more", f.flush(), "")
}

// A listing that lands while an apply is in flight waits for its answer
// before the store's keys are read.
func TestResyncReadsTheStoreKeysWithNothingInFlight(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	f.flush()
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 5})
	f.step(Listing{Request: f.list, Revision: 5})
	if f.keys != 0 {
		t.Fatal("store keys read while an apply is in flight")
	}
	f.answer(errDisk) // superseded by the listing: not re-queued
	if f.keys == 0 {
		t.Fatal("no store-key read after the apply's answer")
	}
	f.step(StoreKeys{Request: f.keys, Keys: []string{"x"}})
	expect(t, "resync batch", f.batch.String(), "[-x]@5")
}

func TestFailedListingIsFatal(t *testing.T) {
	f := newFixture(t, Config{}, 3)
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 5})
	f.step(Listing{Request: f.list, Err: errDisk})
	if f.l.Phase() != Failed || !errors.Is(f.fail, ErrListing) || !errors.Is(f.fail, errDisk) {
		t.Fatalf("phase %v, fail %v", f.l.Phase(), f.fail)
	}
}

func TestFloorGuard(t *testing.T) {
	for _, c := range []struct {
		name  string
		floor Revision
		trips bool
	}{
		{"interior gap above the floor passes", 3, false},
		{"floor below the cursor passes", 1, false},
		{"head evicted past the cursor trips", 4, true},
		{"unreported floor trips", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, Config{}, 0)
			f.put(1, "a", "1", 1)
			f.put(2, "a", "2", 1)
			before := f.watch.ID
			f.put(5, "b", "1", c.floor) // 3 and 4 are not delivered
			if tripped := f.watch.ID != before; tripped != c.trips {
				t.Fatalf("tripped %v, want %v", tripped, c.trips)
			}
			if !c.trips {
				expect(t, "flush", f.flush(), "[a=1 a=2 b=1]@5")
				return
			}
			f.expectWatchFrom(3)
			expect(t, "flush", f.flush(), "[a=1 a=2]@2") // nothing of the gapped delivery
			f.step(CursorExpired{Watch: f.watch.ID, Floor: c.floor})
			if f.l.Phase() != Resyncing {
				t.Fatalf("the resumed watch's CURSOR_EXPIRED: phase %v", f.l.Phase())
			}
		})
	}
}

func TestProbeTripsAnIdleWatch(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	f.step(Probe{Floor: 2})
	f.expectWatchFrom(1) // floor 2 = frontier+1: nothing missed
	f.step(Probe{Floor: 3})
	f.expectWatchFrom(2)
	f.step(CursorExpired{Watch: f.watch.ID, Floor: 3})
	if f.l.Phase() != Resyncing {
		t.Fatalf("phase %v after the resumed watch expired", f.l.Phase())
	}
}

// Every guard is load-bearing: with its mutation on, the same scenario
// goes wrong.

func TestMutationDropFailedBatch(t *testing.T) {
	f := newFixture(t, Config{Mutations: Mutations{DropFailedBatch: true}}, 0)
	f.put(1, "a", "1", 1)
	f.flush()
	f.answer(errDisk)
	f.put(2, "b", "1", 1)
	expect(t, "next apply (a hole behind the cursor)", f.flush(), "[b=1]@2")
}

func TestMutationResumeFromMemApplied(t *testing.T) {
	f := newFixture(t, Config{Mutations: Mutations{ResumeFromMemApplied: true}}, 0)
	f.put(1, "a", "1", 1)
	f.flush()
	f.answer(errDisk)
	f.step(Restart{Persisted: 0})
	f.expectWatchFrom(2) // revision 1 is in neither the store nor the stream
}

func TestMutationNoAckBarrier(t *testing.T) {
	f := expireAndList(t, Config{Mutations: Mutations{NoAckBarrier: true}}, Entry{"b", []byte("2")})
	f.put(6, "a", "9", 1)
	expect(t, "flush before the store's keys", f.flush(), "[b=2 a=9]@6")
	f.answer(nil)
	f.step(StoreKeys{Request: f.keys, Keys: []string{"a", "b", "c"}}) // read after the recreate landed
	expect(t, "the synthetic deletes, last", f.flush(), "[-a -c]@6")
}

func TestMutationUnguardedLiveWatch(t *testing.T) {
	f := newFixture(t, Config{Mutations: Mutations{UnguardedLiveWatch: true}}, 0)
	f.put(1, "a", "1", 1)
	f.put(3, "b", "1", 3) // revision 2 (a's delete) was evicted
	f.expectWatchFrom(1)
	expect(t, "flush", f.flush(), "[a=1 b=1]@3")
}

func TestCloneIsIndependent(t *testing.T) {
	f := newFixture(t, Config{}, 0)
	f.put(1, "a", "1", 1)
	c := f.l.Clone()
	key := string(c.AppendKey(nil))
	f.put(2, "b", "1", 1)
	f.flush()
	if string(c.AppendKey(nil)) != key || c.PendingOps() != 1 {
		t.Fatal("stepping the original changed the clone")
	}
	if reflect.DeepEqual(f.l.AppendKey(nil), c.AppendKey(nil)) {
		t.Fatal("different states share a key")
	}
}
