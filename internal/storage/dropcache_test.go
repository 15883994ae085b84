package storage

import (
	"bytes"
	"slices"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

// mib1 is a batch of 16 records of 64 KiB values, about 1 MiB encoded.
func mib1(fill byte) []Record {
	recs := make([]Record, 16)
	for i := range recs {
		recs[i] = Record{TimestampMs: int64(i), Key: []byte("k"), Value: bytes.Repeat([]byte{fill}, 64<<10)}
	}
	return recs
}

// appendMiB appends a 1 MiB batch filled with fill, and syncs.
func appendMiB(t *testing.T, l *Log, mod *model, epoch uint64, fill byte) {
	t.Helper()
	mod.append(t, l, epoch, mib1(fill))
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
}

// cacheDrops sums, over the log's segment files, the bytes DropCache was
// asked to drop and those of them that were not durable then.
func cacheDrops(t *testing.T, m *vfs.MemFS) (dropped, unsynced int64) {
	t.Helper()
	for _, name := range segmentFiles(t, m, ".log") {
		d, u := m.CacheDrops(testDir + "/" + name)
		dropped, unsynced = dropped+d, unsynced+u
	}
	return dropped, unsynced
}

// logBytes is the used length of every segment together.
func logBytes(l *Log) int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var n int64
	for _, s := range l.segments {
		n += s.sizeBytes
	}
	return n
}

// Each Sync leaves the last CachedTailBytes of the log in the page cache
// and drops what is older, across segment rolls, a step of at least
// dropStepBytes at a time, and never a byte that is not durable.
func TestSyncDropsTheCacheBehindItsTail(t *testing.T) {
	m := vfs.NewMem()
	const keep = 3 << 20
	l := openLog(t, m, Options{SegmentBytesMax: 7 << 20, CachedTailBytes: keep})
	defer l.Close()
	var mod model
	for i := 0; i < 40; i++ {
		appendMiB(t, l, &mod, 1, byte(i))
		dropped, unsynced := cacheDrops(t, m)
		size := logBytes(l)
		if unsynced != 0 {
			t.Fatalf("after batch %d: %d unsynced bytes dropped", i, unsynced)
		}
		if dropped > size-keep && dropped > 0 {
			t.Fatalf("after batch %d: %d bytes dropped of a %d-byte log, keeping %d", i, dropped, size, keep)
		}
		if dropped < size-keep-dropStepBytes {
			t.Fatalf("after batch %d: only %d bytes dropped of a %d-byte log, keeping %d", i, dropped, size, keep)
		}
	}
	if n := len(segmentFiles(t, m, ".log")); n < 5 {
		t.Fatalf("%d segments: the test crossed too few rolls", n)
	}
	checkAgainst(t, l, &mod)
}

// Fewer DropCache calls than Syncs: a step of dropStepBytes at least.
func TestDropBehindWaitsForAStep(t *testing.T) {
	m := vfs.NewMem()
	calls := 0
	fsys := hookFS{MemFS: m, dropCache: func() { calls++ }}
	l := openLog(t, fsys, Options{CachedTailBytes: 1 << 20})
	defer l.Close()
	var mod model
	const batches = 40
	for i := 0; i < batches; i++ {
		appendMiB(t, l, &mod, 1, byte(i))
	}
	if want := batches / (dropStepBytes >> 20); calls == 0 || calls > want {
		t.Fatalf("%d DropCache calls for %d Syncs of 1 MiB, want 1 to %d", calls, batches, want)
	}
}

// Appends made while a Sync's fsync runs are not durable when it returns:
// the drop stops at what the fsync covered.
func TestDropBehindStopsAtWhatTheSyncCovered(t *testing.T) {
	m := vfs.NewMem()
	var l *Log
	var mod model
	armed := false
	fsys := hookFS{MemFS: m, sync: func() {
		if armed {
			armed = false
			for i := 0; i < 6; i++ {
				mod.append(t, l, 1, mib1(byte(100+i)))
			}
		}
	}}
	l = openLog(t, fsys, Options{CachedTailBytes: 1 << 20})
	defer l.Close()
	for i := 0; i < 9; i++ {
		mod.append(t, l, 1, mib1(byte(i)))
	}
	armed = true
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	dropped, unsynced := cacheDrops(t, m)
	if dropped == 0 {
		t.Fatal("nothing dropped: the test shows nothing")
	}
	if unsynced != 0 {
		t.Fatalf("%d bytes appended during the fsync were dropped", unsynced)
	}
}

// After a truncation below what was dropped, the drops go on from the
// log's new end, not from where they had reached.
func TestDropBehindFollowsATruncation(t *testing.T) {
	m := vfs.NewMem()
	const keep = 1 << 20
	l := openLog(t, m, Options{CachedTailBytes: keep})
	defer l.Close()
	var mod model
	for i := 0; i < 12; i++ {
		appendMiB(t, l, &mod, 1, byte(i))
	}
	before, _ := cacheDrops(t, m)
	if err := l.TruncateAfter(2 * 16); err != nil { // two batches left
		t.Fatal(err)
	}
	mod.truncate(2 * 16)
	cut := logBytes(l)
	if before <= cut {
		t.Fatalf("%d bytes dropped before a cut at %d: the test shows nothing", before, cut)
	}
	for i := 0; i < 20; i++ {
		appendMiB(t, l, &mod, 2, byte(50+i))
	}
	after, unsynced := cacheDrops(t, m)
	if unsynced != 0 {
		t.Fatalf("%d unsynced bytes dropped", unsynced)
	}
	if want := logBytes(l) - cut - keep - dropStepBytes - 1<<20; after-before < want {
		t.Fatalf("%d bytes dropped after the cut at %d, want at least %d", after-before, cut, want)
	}
	checkAgainst(t, l, &mod)
}

// hookFS is a MemFS whose OpenRW files call sync at the end of each Sync
// (after the fsync) and dropCache before each DropCache, when set, with
// no lock of the MemFS held.
type hookFS struct {
	*vfs.MemFS
	sync, dropCache func()
}

func (h hookFS) OpenRW(name string) (vfs.File, error) {
	f, err := h.MemFS.OpenRW(name)
	if err != nil {
		return nil, err
	}
	return hookFile{f, h}, nil
}

type hookFile struct {
	vfs.File
	h hookFS
}

func (f hookFile) Sync() error {
	err := f.File.Sync()
	if f.h.sync != nil {
		f.h.sync()
	}
	return err
}

func (f hookFile) DropCache(off, n int64) error {
	if f.h.dropCache != nil {
		f.h.dropCache()
	}
	return f.File.DropCache(off, n)
}

// Verify drops from the page cache each sealed segment it read that lies
// wholly behind the cached tail, and no other.
func TestVerifyDropsWhatLiesBehindTheCachedTail(t *testing.T) {
	m := vfs.NewMem()
	const keep = 5 << 20
	l := openLog(t, m, Options{SegmentBytesMax: 2 << 20, CachedTailBytes: keep})
	defer l.Close()
	var mod model
	for i := 0; i < 12; i++ { // no Sync: only Verify drops
		mod.append(t, l, 1, mib1(byte(i)))
	}
	if _, err := l.VerifyAll(); err != nil {
		t.Fatal(err)
	}
	l.mu.RLock()
	segs := slices.Clone(l.segments)
	l.mu.RUnlock()
	var after int64
	dropped := 0
	for i := len(segs) - 1; i >= 0; i-- {
		s := segs[i]
		d, u := m.CacheDrops(s.path)
		want := int64(0)
		if i < len(segs)-1 && after >= keep {
			want = s.sizeBytes
			dropped++
		}
		if d != want || u != 0 {
			t.Fatalf("segment %d (%d bytes, %d after it): %d bytes dropped, %d unsynced; want %d", s.baseSeq, s.sizeBytes, after, d, u, want)
		}
		after += s.sizeBytes
	}
	if dropped == 0 || dropped == len(segs)-1 {
		t.Fatalf("%d of %d segments dropped: the test shows nothing", dropped, len(segs))
	}
	checkAgainst(t, l, &mod)
}
