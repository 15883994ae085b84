package storage

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/nereus-broker/nereus/internal/vfs"
)

const testDir = "data/p0"

func openLog(t testing.TB, fsys vfs.FS, opts Options) *Log {
	t.Helper()
	l, err := Open(fsys, testDir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

func smallOpts() Options {
	return Options{SegmentBytesMax: 2048, IndexIntervalBytes: 256}
}

// testRecord returns a deterministic record number i.
func testRecord(i int) Record {
	r := Record{
		TimestampMs: int64(1000 + i),
		Key:         []byte(fmt.Sprintf("key-%d", i)),
		Value:       bytes.Repeat([]byte{byte(i)}, 10+i%50),
		ProducerID:  uint64(i % 3),
		ProducerSeq: uint64(i),
	}
	if i%4 == 0 {
		r.Headers = []Header{{Key: "h", Value: []byte("v")}, {Key: "empty"}}
	}
	return r
}

func sameRecord(a, b Record) bool {
	if a.TimestampMs != b.TimestampMs || !bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) ||
		a.ProducerID != b.ProducerID || a.ProducerSeq != b.ProducerSeq || len(a.Headers) != len(b.Headers) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !bytes.Equal(a.Headers[i].Value, b.Headers[i].Value) {
			return false
		}
	}
	return true
}

// model is what the test appended: records[seq-1] and epochs[seq-1].
type model struct {
	records []Record
	epochs  []uint64
}

func (m *model) append(t testing.TB, l *Log, epoch uint64, recs []Record) {
	t.Helper()
	first, err := l.Append(epoch, recs)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	if first != uint64(len(m.records))+1 {
		t.Fatalf("Append returned first seq %d, want %d", first, len(m.records)+1)
	}
	for _, r := range recs {
		m.records = append(m.records, r)
		m.epochs = append(m.epochs, epoch)
	}
}

func (m *model) truncate(seq uint64) {
	m.records, m.epochs = m.records[:seq], m.epochs[:seq]
}

// readAll reads [StartSeq, NextSeq) in small reads.
func readAll(t testing.TB, l *Log) []Entry {
	t.Helper()
	var all []Entry
	for seq := l.StartSeq(); seq < l.NextSeq(); {
		es, err := l.Read(seq, 7, 1<<20)
		if err != nil {
			t.Fatalf("Read(%d): %v", seq, err)
		}
		if len(es) == 0 {
			t.Fatalf("Read(%d) returned nothing below NextSeq %d", seq, l.NextSeq())
		}
		all = append(all, es...)
		seq = es[len(es)-1].Seq + 1
	}
	return all
}

// checkAgainst asserts the log holds exactly model records [StartSeq, NextSeq).
func checkAgainst(t testing.TB, l *Log, m *model) {
	t.Helper()
	for _, e := range readAll(t, l) {
		if e.Seq == 0 || e.Seq > uint64(len(m.records)) {
			t.Fatalf("entry seq %d beyond the %d appended", e.Seq, len(m.records))
		}
		if !sameRecord(e.Record, m.records[e.Seq-1]) || e.Epoch != m.epochs[e.Seq-1] {
			t.Fatalf("seq %d: got %+v epoch %d, want %+v epoch %d", e.Seq, e.Record, e.Epoch, m.records[e.Seq-1], m.epochs[e.Seq-1])
		}
	}
}

func appendMany(t testing.TB, l *Log, m *model, n int, epoch uint64) {
	t.Helper()
	for i := 0; i < n; {
		size := 1 + i%5
		var recs []Record
		for j := 0; j < size && i < n; j++ {
			recs = append(recs, testRecord(len(m.records)+len(recs)+1))
			i++
		}
		m.append(t, l, epoch, recs)
	}
}

func segmentFiles(t testing.TB, fsys vfs.FS, suffix string) []string {
	t.Helper()
	names, err := fsys.List(testDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, suffix) {
			out = append(out, n)
		}
	}
	return out
}

func TestAppendReadRoundTripAcrossRolls(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	if l.StartSeq() != 1 || l.NextSeq() != 1 || l.LastEpoch() != 0 {
		t.Fatalf("empty log: start %d next %d epoch %d", l.StartSeq(), l.NextSeq(), l.LastEpoch())
	}
	appendMany(t, l, &mod, 300, 1)
	appendMany(t, l, &mod, 200, 2)
	if l.NextSeq() != 501 || l.LastEpoch() != 2 {
		t.Fatalf("next %d epoch %d", l.NextSeq(), l.LastEpoch())
	}
	logs := segmentFiles(t, m, ".log")
	if len(logs) < 5 {
		t.Fatalf("only %d segments: %v", len(logs), logs)
	}
	if logs[0] != "00000000000000000001.log" {
		t.Fatalf("first segment %q", logs[0])
	}
	if idx := segmentFiles(t, m, ".idx"); len(idx) != len(logs)-1 {
		t.Fatalf("%d indexes for %d segments", len(idx), len(logs))
	}
	checkAgainst(t, l, &mod)
	// Every starting seq, one record at a time and in bulk.
	for seq := uint64(1); seq <= 500; seq += 13 {
		es, err := l.Read(seq, 1000, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != int(501-seq) || es[0].Seq != seq {
			t.Fatalf("Read(%d) got %d entries from %d", seq, len(es), es[0].Seq)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, smallOpts())
	defer l.Close()
	checkAgainst(t, l, &mod)
	if l.NextSeq() != 501 || l.LastEpoch() != 2 || l.SyncedSeq() != 500 {
		t.Fatalf("after reopen: next %d epoch %d synced %d", l.NextSeq(), l.LastEpoch(), l.SyncedSeq())
	}
	mod.append(t, l, 3, []Record{testRecord(501)})
	checkAgainst(t, l, &mod)
}

func TestReadBounds(t *testing.T) {
	l := openLog(t, vfs.NewMem(), Options{})
	defer l.Close()
	var recs []Record
	for i := range 10 {
		recs = append(recs, Record{Value: bytes.Repeat([]byte{'x'}, 100), ProducerSeq: uint64(i)})
	}
	if _, err := l.Append(1, recs); err != nil {
		t.Fatal(err)
	}
	recordBytes := RecordBytes(&recs[0])
	cases := []struct {
		from       uint64
		maxRecords int
		maxBytes   int
		want       int
	}{
		{1, 3, 1 << 20, 3},
		{1, 100, 1 << 20, 10},
		{4, 100, 1 << 20, 7},
		{1, 100, 2*recordBytes + 1, 2},
		{1, 100, 2 * recordBytes, 2},
		{1, 100, 1, 1},
		{10, 100, 0, 1},
		{5, 0, 1 << 20, 1},
		{11, 5, 1 << 20, 0},
	}
	for _, c := range cases {
		es, err := l.Read(c.from, c.maxRecords, c.maxBytes)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if len(es) != c.want {
			t.Fatalf("%+v: got %d entries", c, len(es))
		}
		if len(es) > 0 && (es[0].Seq != c.from || es[0].Record.ProducerSeq != c.from-1) {
			t.Fatalf("%+v: first entry %+v", c, es[0])
		}
	}
	for _, from := range []uint64{0, 12, 1000} {
		if _, err := l.Read(from, 1, 1); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("Read(%d): got %v, want ErrOutOfRange", from, err)
		}
	}
}

func TestAppendErrors(t *testing.T) {
	l := openLog(t, vfs.NewMem(), Options{RecordBytesMax: 100})
	defer l.Close()
	if _, err := l.Append(1, nil); !errors.Is(err, ErrEmptyBatch) {
		t.Fatalf("empty: %v", err)
	}
	if _, err := l.Append(1, []Record{{Value: make([]byte, 100)}}); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("large: %v", err)
	}
	if _, err := l.Append(5, []Record{{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(4, []Record{{}}); !errors.Is(err, ErrEpochRegression) {
		t.Fatalf("regression: %v", err)
	}
	if l.NextSeq() != 2 {
		t.Fatalf("failed appends changed NextSeq to %d", l.NextSeq())
	}
	if _, err := Open(vfs.NewMem(), testDir, Options{SegmentBytesMax: -1}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("bad options: %v", err)
	}
}

// TestCrashKeepsSyncedPrefix appends and syncs at random, crashes with a
// torn-write model, and checks the recovered log is a prefix of what was
// appended that holds everything synced.
func TestCrashKeepsSyncedPrefix(t *testing.T) {
	for seed := uint64(0); seed < 150; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x6e657265))
			m := vfs.NewMem()
			var mod model
			l := openLog(t, m, smallOpts())
			for round := 0; round < 3; round++ {
				epoch := uint64(round + 1)
				for range rng.IntN(60) {
					var recs []Record
					for range 1 + rng.IntN(4) {
						recs = append(recs, testRecord(len(mod.records)+len(recs)+1))
					}
					mod.append(t, l, epoch, recs)
					if rng.IntN(8) == 0 {
						if err := l.Sync(); err != nil {
							t.Fatal(err)
						}
					}
				}
				synced := l.SyncedSeq()
				m.Crash(rng)
				l = openLog(t, m, smallOpts())
				last := l.NextSeq() - 1
				if last < synced || last > uint64(len(mod.records)) {
					t.Fatalf("seed %d (go test -run 'TestCrashKeepsSyncedPrefix/^%d$'): recovered up to %d, synced %d, appended %d",
						seed, seed, last, synced, len(mod.records))
				}
				mod.truncate(last)
				checkAgainst(t, l, &mod)
			}
			l.Close()
		})
	}
}

// TestTornTailTruncated writes a torn batch where the next append goes,
// over the preallocated zero tail (so it is followed by zeroes) or at the
// end of a file without one: either way it is a torn tail, cut off with
// everything after it.
func TestTornTailTruncated(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendMany(t, l, &mod, 10, 1)
	usedBytes := l.active().sizeBytes
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	name := testDir + "/00000000000000000001.log"
	if size, _ := m.Stat(name); size <= usedBytes {
		t.Fatalf("segment of %d bytes for %d used: not preallocated", size, usedBytes)
	}
	torn, err := appendBatch(nil, 11, 1, 0, []Record{testRecord(11)}, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// Over zeroes, a batch missing only trailing zero bytes is whole (and
	// its CRC verifies): the longest torn prefix stops at its last
	// non-zero byte.
	lastNonZero := len(torn) - 1
	for torn[lastNonZero] == 0 {
		lastNonZero--
	}
	for _, zeroTail := range []bool{true, false} {
		for _, cut := range []int{1, batchHeaderBytes - 1, batchHeaderBytes + 3, lastNonZero} {
			f, err := m.OpenRW(name)
			if err != nil {
				t.Fatal(err)
			}
			if zeroTail {
				if err := f.Allocate(usedBytes + 4096); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := f.WriteAt(torn[:cut], usedBytes); err != nil {
				t.Fatal(err)
			}
			f.Sync()
			f.Close()
			l = openLog(t, m, Options{})
			if l.NextSeq() != 11 {
				t.Fatalf("zero tail %v cut %d: NextSeq %d", zeroTail, cut, l.NextSeq())
			}
			if size, _ := m.Stat(name); size != usedBytes {
				t.Fatalf("zero tail %v cut %d: size %d, want %d", zeroTail, cut, size, usedBytes)
			}
			checkAgainst(t, l, &mod)
			l.Close()
		}
	}
}

func TestBitFlipInSealedSegmentNeverServed(t *testing.T) {
	for _, reopen := range []bool{false, true} {
		for flip := int64(0); flip < 600; flip += 37 {
			m := vfs.NewMem()
			l := openLog(t, m, smallOpts())
			var mod model
			appendMany(t, l, &mod, 200, 1)
			if reopen {
				l.Close()
			}
			if err := m.FlipBit(testDir+"/00000000000000000001.log", flip, uint(flip)); err != nil {
				t.Fatal(err)
			}
			if reopen {
				l = openLog(t, m, smallOpts())
			}
			sawCorrupt := false
			for seq := l.StartSeq(); seq < l.NextSeq(); {
				es, err := l.Read(seq, 5, 1<<20)
				if errors.Is(err, ErrCorrupt) {
					sawCorrupt = true
					seq++
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range es {
					if !sameRecord(e.Record, mod.records[e.Seq-1]) {
						t.Fatalf("flip at %d: served a wrong record at seq %d", flip, e.Seq)
					}
				}
				seq = es[len(es)-1].Seq + 1
			}
			if !sawCorrupt {
				t.Fatalf("flip at %d (reopen %v): no ErrCorrupt", flip, reopen)
			}
			l.Close()
		}
	}
}

func TestBitFlipInLastBatchTruncatedOnRecovery(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendMany(t, l, &mod, 10, 1)
	name := testDir + "/00000000000000000001.log"
	sizeBefore := l.active().sizeBytes
	mod.append(t, l, 2, []Record{testRecord(11), testRecord(12)})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.FlipBit(name, sizeBefore+batchHeaderBytes+5, 2); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, Options{})
	defer l.Close()
	if l.NextSeq() != 11 || l.LastEpoch() != 1 {
		t.Fatalf("NextSeq %d LastEpoch %d, want 11 and 1", l.NextSeq(), l.LastEpoch())
	}
	mod.truncate(10)
	checkAgainst(t, l, &mod)
	if d, _ := m.DurableBytes(name); int64(len(d)) != sizeBefore {
		t.Fatalf("durable size %d, want %d", len(d), sizeBefore)
	}
}

func TestRetentionByBytes(t *testing.T) {
	m := vfs.NewMem()
	opts := smallOpts()
	opts.RetentionBytes = 5000
	l := openLog(t, m, opts)
	defer l.Close()
	var mod model
	appendMany(t, l, &mod, 400, 1)
	before := len(segmentFiles(t, m, ".log"))
	n, err := l.ApplyRetention(0)
	if err != nil {
		t.Fatal(err)
	}
	after := segmentFiles(t, m, ".log")
	if n == 0 || len(after) != before-n || len(after) < 1 {
		t.Fatalf("deleted %d: %d -> %d segments", n, before, len(after))
	}
	// Sealed segments take exactly their used bytes on disk; the active
	// one counts its used bytes, not its preallocated zeroes.
	var total int64
	for i, name := range after {
		size, _ := m.Stat(testDir + "/" + name)
		s := l.segments[i]
		if i < len(after)-1 && size != s.sizeBytes {
			t.Fatalf("sealed segment %s: %d bytes on disk, %d used", name, size, s.sizeBytes)
		}
		if i == len(after)-1 && size < s.sizeBytes {
			t.Fatalf("active segment %s: %d bytes on disk, %d used", name, size, s.sizeBytes)
		}
		total += s.sizeBytes
	}
	if total > opts.RetentionBytes {
		t.Fatalf("total %d bytes after retention", total)
	}
	if l.StartSeq() <= 1 {
		t.Fatalf("StartSeq %d", l.StartSeq())
	}
	if _, err := l.Read(l.StartSeq()-1, 1, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read below start: %v", err)
	}
	checkAgainst(t, l, &mod)
	if idx := segmentFiles(t, m, ".idx"); len(idx) != len(after)-1 {
		t.Fatalf("stale indexes %v", idx)
	}
	start := l.StartSeq()
	m.CrashClean()
	l = openLog(t, m, opts)
	if l.StartSeq() != start {
		t.Fatalf("retention not durable: start %d, want %d", l.StartSeq(), start)
	}
}

func TestRetentionByAge(t *testing.T) {
	m := vfs.NewMem()
	opts := smallOpts()
	opts.RetentionAgeMs = 1000
	l := openLog(t, m, opts)
	defer l.Close()
	// Segment-sized groups with timestamps 0.., 10000.., 20000..
	for group := range 3 {
		for i := range 40 {
			r := testRecord(i)
			r.TimestampMs = int64(group*10000 + i)
			if _, err := l.Append(1, []Record{r}); err != nil {
				t.Fatal(err)
			}
		}
	}
	segs := len(segmentFiles(t, m, ".log"))
	if n, err := l.ApplyRetention(500); err != nil || n != 0 {
		t.Fatalf("nothing is old yet: deleted %d, %v", n, err)
	}
	n, err := l.ApplyRetention(15000)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no segment deleted")
	}
	es, err := l.Read(l.StartSeq(), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if es[0].Record.TimestampMs >= 10000 && n < 1 {
		t.Fatalf("unexpected first record %+v", es[0])
	}
	// Everything retained but the first segment must hold a record newer than now-age.
	if _, err := l.ApplyRetention(1 << 40); err != nil {
		t.Fatal(err)
	}
	if got := len(segmentFiles(t, m, ".log")); got != 1 {
		t.Fatalf("%d segments of %d left; the active one must stay alone", got, segs)
	}
	if l.NextSeq() != 121 {
		t.Fatalf("NextSeq %d", l.NextSeq())
	}
}

func TestTruncateAfter(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	var mod model
	appendMany(t, l, &mod, 300, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	segs := len(segmentFiles(t, m, ".log"))
	// Inside a batch of a sealed segment.
	cut := uint64(101)
	if err := l.TruncateAfter(cut); err != nil {
		t.Fatal(err)
	}
	if l.NextSeq() != cut+1 || l.SyncedSeq() != cut {
		t.Fatalf("NextSeq %d SyncedSeq %d", l.NextSeq(), l.SyncedSeq())
	}
	if got := len(segmentFiles(t, m, ".log")); got >= segs {
		t.Fatalf("segments %d -> %d", segs, got)
	}
	mod.truncate(cut)
	checkAgainst(t, l, &mod)
	mod.append(t, l, 2, []Record{testRecord(9001), testRecord(9002)})
	appendMany(t, l, &mod, 50, 2)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	checkAgainst(t, l, &mod)
	m.CrashClean()
	l = openLog(t, m, smallOpts())
	if l.NextSeq() != uint64(len(mod.records))+1 || l.LastEpoch() != 2 {
		t.Fatalf("after crash NextSeq %d LastEpoch %d", l.NextSeq(), l.LastEpoch())
	}
	checkAgainst(t, l, &mod)
	// At a segment boundary.
	boundary := l.segments[len(l.segments)-1].baseSeq - 1
	if err := l.TruncateAfter(boundary); err != nil {
		t.Fatal(err)
	}
	mod.truncate(boundary)
	checkAgainst(t, l, &mod)
	// No-ops and out of range.
	if err := l.TruncateAfter(l.NextSeq() + 5); err != nil {
		t.Fatal(err)
	}
	// Everything.
	if err := l.TruncateAfter(0); err != nil {
		t.Fatal(err)
	}
	if l.NextSeq() != 1 || l.StartSeq() != 1 || l.LastEpoch() != 0 {
		t.Fatalf("empty: next %d start %d epoch %d", l.NextSeq(), l.StartSeq(), l.LastEpoch())
	}
	mod.truncate(0)
	mod.append(t, l, 7, []Record{testRecord(1)})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, smallOpts())
	defer l.Close()
	checkAgainst(t, l, &mod)
	if l.LastEpoch() != 7 {
		t.Fatalf("LastEpoch %d", l.LastEpoch())
	}
}

func TestTruncateAfterBelowStartIsOutOfRange(t *testing.T) {
	m := vfs.NewMem()
	opts := smallOpts()
	opts.RetentionBytes = 3000
	l := openLog(t, m, opts)
	defer l.Close()
	var mod model
	appendMany(t, l, &mod, 200, 1)
	if _, err := l.ApplyRetention(0); err != nil {
		t.Fatal(err)
	}
	if err := l.TruncateAfter(l.StartSeq() - 2); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("got %v", err)
	}
	if err := l.TruncateAfter(l.StartSeq() - 1); err != nil {
		t.Fatal(err)
	}
	if l.NextSeq() != l.StartSeq() {
		t.Fatalf("next %d start %d", l.NextSeq(), l.StartSeq())
	}
}

func TestSyncErrorIsReported(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	var mod model
	appendMany(t, l, &mod, 5, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	appendMany(t, l, &mod, 5, 1)
	injected := errors.New("injected EIO")
	m.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSync {
			return injected
		}
		return nil
	})
	err := l.Sync()
	if !errors.Is(err, ErrSyncFailed) || !errors.Is(err, injected) {
		t.Fatalf("Sync: got %v, want ErrSyncFailed wrapping the injected error", err)
	}
	if l.SyncedSeq() != 5 {
		t.Fatalf("SyncedSeq advanced to %d", l.SyncedSeq())
	}
	m.SetInjector(nil)
	if _, err := l.Append(1, []Record{{}}); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append after failed sync: %v", err)
	}
	if err := l.Sync(); !errors.Is(err, ErrFailed) || !errors.Is(err, injected) {
		t.Fatalf("second Sync: %v", err)
	}
	if _, err := l.Read(1, 100, 1<<20); err != nil {
		t.Fatalf("reads still work: %v", err)
	}
	l.Close()
	m.CrashClean()
	l = openLog(t, m, Options{})
	defer l.Close()
	if l.NextSeq() != 6 {
		t.Fatalf("recovered NextSeq %d, want 6", l.NextSeq())
	}
}

func TestWriteErrorFailsLog(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, Options{})
	defer l.Close()
	injected := errors.New("injected ENOSPC")
	m.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpWrite {
			return injected
		}
		return nil
	})
	if _, err := l.Append(1, []Record{{}}); !errors.Is(err, injected) {
		t.Fatalf("Append: %v", err)
	}
	if l.NextSeq() != 1 {
		t.Fatalf("NextSeq %d", l.NextSeq())
	}
	m.SetInjector(nil)
	if _, err := l.Append(1, []Record{{}}); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append after failure: %v", err)
	}
}

func TestIndexRebuild(t *testing.T) {
	for _, damage := range []string{"remove", "flip"} {
		m := vfs.NewMem()
		l := openLog(t, m, smallOpts())
		var mod model
		appendMany(t, l, &mod, 300, 1)
		l.Close()
		idx := segmentFiles(t, m, ".idx")
		if len(idx) < 2 {
			t.Fatalf("indexes %v", idx)
		}
		name := testDir + "/" + idx[1]
		want, _ := m.ReadFile(name)
		if damage == "remove" {
			if err := m.Remove(name); err != nil {
				t.Fatal(err)
			}
		} else if err := m.FlipBit(name, 20, 1); err != nil {
			t.Fatal(err)
		}
		l = openLog(t, m, smallOpts())
		checkAgainst(t, l, &mod)
		got, err := m.ReadFile(name)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: index not rebuilt identically (%v)", damage, err)
		}
		l.Close()
	}
}

func TestConcurrentReadersAndWriter(t *testing.T) {
	l := openLog(t, vfs.NewMem(), smallOpts())
	defer l.Close()
	const total = 2000
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := uint64(1)
			for seq <= total {
				if seq >= l.NextSeq() {
					runtime.Gosched()
					continue
				}
				es, err := l.Read(seq, 10, 4096)
				if err != nil {
					errs <- err
					return
				}
				for _, e := range es {
					if e.Seq != seq || !sameRecord(e.Record, testRecord(int(seq))) {
						errs <- fmt.Errorf("seq %d: wrong entry %d", seq, e.Seq)
						return
					}
					seq++
				}
			}
		}()
	}
	for i := 1; i <= total; i++ {
		if _, err := l.Append(1, []Record{testRecord(i)}); err != nil {
			t.Fatal(err)
		}
		if i%64 == 0 {
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestOSLog(t *testing.T) {
	dir := t.TempDir() + "/p0"
	l, err := Open(vfs.OS(), dir, smallOpts())
	if err != nil {
		t.Fatal(err)
	}
	var mod model
	appendMany(t, l, &mod, 100, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(vfs.OS(), dir, smallOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkAgainst(t, l, &mod)
	if l.NextSeq() != 101 {
		t.Fatalf("NextSeq %d", l.NextSeq())
	}
}

// ReadFileEither serves path, or its copy when path is damaged or
// missing, and says when a copy must be written again: damaged, or
// behind path (a crash between WriteFileTwice's two writes).
func TestFileKeptTwice(t *testing.T) {
	type want struct {
		data          string // "" with err
		damaged       bool
		corrupt, none bool // err matches ErrCorrupt / fs.ErrNotExist
	}
	for _, tc := range []struct {
		name  string
		setup func(m *vfs.MemFS)
		want  want
	}{
		{"neither", func(m *vfs.MemFS) {}, want{none: true}},
		{"both", func(m *vfs.MemFS) {}, want{data: "v2"}},
		{"path flipped", func(m *vfs.MemFS) { m.FlipBit("state/f", 13, 0) }, want{data: "v2", damaged: true}},
		{"copy flipped", func(m *vfs.MemFS) { m.FlipBit("state/f.copy", 13, 0) }, want{data: "v2", damaged: true}},
		{"both flipped", func(m *vfs.MemFS) { m.FlipBit("state/f", 13, 0); m.FlipBit("state/f.copy", 13, 0) }, want{corrupt: true}},
		{"copy behind", func(m *vfs.MemFS) { WriteFileAtomic(m, "state/f", []byte("v3")) }, want{data: "v3", damaged: true}},
		{"path missing", func(m *vfs.MemFS) { m.Remove("state/f") }, want{data: "v2"}},
		{"path missing, copy flipped", func(m *vfs.MemFS) { m.Remove("state/f"); m.FlipBit("state/f.copy", 13, 0) }, want{corrupt: true}},
		{"path flipped, copy missing", func(m *vfs.MemFS) { m.FlipBit("state/f", 13, 0); m.Remove("state/f.copy") }, want{corrupt: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := vfs.NewMem()
			m.MkdirAll("state")
			if tc.name != "neither" {
				for _, v := range []string{"v1", "v2"} {
					if err := WriteFileTwice(m, "state/f", []byte(v)); err != nil {
						t.Fatal(err)
					}
				}
			}
			tc.setup(m)
			data, damaged, err := ReadFileEither(m, "state/f")
			if string(data) != tc.want.data || (damaged != nil) != tc.want.damaged ||
				errors.Is(err, ErrCorrupt) != tc.want.corrupt || errors.Is(err, fs.ErrNotExist) != tc.want.none ||
				(err == nil) != (tc.want.data != "") {
				t.Fatalf("got %q, damaged %v, %v; want %+v", data, damaged, err, tc.want)
			}
		})
	}
}

func TestAtomicFile(t *testing.T) {
	m := vfs.NewMem()
	m.MkdirAll("state")
	path := "state/promise"
	if _, err := ReadFileAtomic(m, path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
	if err := WriteFileAtomic(m, path, []byte("epoch=1")); err != nil {
		t.Fatal(err)
	}
	m.SetInjector(func(op vfs.Op, name string) error {
		if op == vfs.OpSyncDir {
			return errors.New("injected")
		}
		return nil
	})
	if err := WriteFileAtomic(m, path, []byte("epoch=2")); err == nil {
		t.Fatal("expected SyncDir error")
	}
	m.SetInjector(nil)
	m.CrashClean()
	got, err := ReadFileAtomic(m, path)
	if err != nil || string(got) != "epoch=1" {
		t.Fatalf("after crash: %q %v", got, err)
	}
	if err := WriteFileAtomic(m, path, []byte("epoch=3")); err != nil {
		t.Fatal(err)
	}
	m.CrashClean()
	if got, err := ReadFileAtomic(m, path); err != nil || string(got) != "epoch=3" {
		t.Fatalf("after durable write: %q %v", got, err)
	}
	if err := m.FlipBit(path, 14, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFileAtomic(m, path); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("flipped: %v", err)
	}
}

func BenchmarkAppend1KiB(b *testing.B) {
	l := openLog(b, vfs.NewMem(), Options{})
	defer l.Close()
	recs := []Record{{TimestampMs: 1, Key: []byte("key"), Value: make([]byte, 1024)}}
	b.ReportAllocs()
	b.SetBytes(1024)
	for i := 0; b.Loop(); i++ {
		if _, err := l.Append(1, recs); err != nil {
			b.Fatal(err)
		}
		if i%64 == 63 {
			if err := l.Sync(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// IdleLogExpires: a log that stopped growing rolls its active segment once
// every record in it is older than RetentionAgeMs, so that retention can
// delete its last records too; the log is then empty and takes the next
// seq after a restart, and a roll makes what it sealed durable. A segment
// of undated records, or a log without an age limit, is not rolled.
func TestSealExpiredLetsAnIdleLogExpire(t *testing.T) {
	m := vfs.NewMem()
	opts := smallOpts()
	opts.RetentionAgeMs = 1000
	l := openLog(t, m, opts)
	for i := range 3 {
		r := testRecord(i)
		r.TimestampMs = int64(100 + i)
		if _, err := l.Append(1, []Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	if sealed, err := l.SealExpired(1102); sealed || err != nil {
		t.Fatalf("at 1102 the newest record is 1000 ms old: sealed %v, %v", sealed, err)
	}
	if got := len(segmentFiles(t, m, ".log")); got != 1 {
		t.Fatalf("%d segments, want 1", got)
	}
	if sealed, err := l.SealExpired(1103); !sealed || err != nil {
		t.Fatalf("at 1103 every record is older than 1000 ms: sealed %v, %v", sealed, err)
	}
	if sealed, err := l.SealExpired(5000); sealed || err != nil {
		t.Fatalf("an empty active segment was sealed: %v, %v", sealed, err)
	}
	if sealed, err := l.Seal(); sealed || err != nil {
		t.Fatalf("Seal sealed an empty active segment: %v, %v", sealed, err)
	}
	if got := len(segmentFiles(t, m, ".log")); got != 2 {
		t.Fatalf("%d segments after the roll, want 2", got)
	}
	m.CrashClean() // the roll synced the records it sealed
	l = openLog(t, m, opts)
	if l.StartSeq() != 1 || l.NextSeq() != 4 {
		t.Fatalf("after a crash: [%d, %d), want [1, 4)", l.StartSeq(), l.NextSeq())
	}
	point := l.RetentionPoint(1103, math.MaxUint64)
	if point != 3 {
		t.Fatalf("retention point %d, want 3", point)
	}
	if n, err := l.DeleteThrough(point); n != 1 || err != nil {
		t.Fatalf("DeleteThrough: %d, %v", n, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, m, opts)
	defer l.Close()
	if l.StartSeq() != 4 || l.NextSeq() != 4 {
		t.Fatalf("an expired log reopened at [%d, %d), want [4, 4)", l.StartSeq(), l.NextSeq())
	}
	if seq, err := l.Append(1, []Record{{Value: []byte("undated")}}); seq != 4 || err != nil {
		t.Fatalf("append after expiry: seq %d, %v; want 4", seq, err)
	}
	if sealed, err := l.SealExpired(math.MaxInt64); sealed || err != nil {
		t.Fatalf("a segment of an undated record was sealed: %v, %v", sealed, err)
	}

	opts.RetentionAgeMs = 0
	l2 := openLog(t, vfs.NewMem(), opts)
	defer l2.Close()
	if _, err := l2.Append(1, []Record{testRecord(1)}); err != nil {
		t.Fatal(err)
	}
	if sealed, err := l2.SealExpired(math.MaxInt64); sealed || err != nil {
		t.Fatalf("a log without an age limit was sealed: %v, %v", sealed, err)
	}
}

// SetRetention: a log opened without retention keeps everything until its
// retention is set (a topic update), then seals and lets go of what the new
// retention no longer keeps; negative values are refused and change
// nothing.
func TestSetRetentionTakesEffectAtTheNextPass(t *testing.T) {
	m := vfs.NewMem()
	l := openLog(t, m, smallOpts())
	for i := range 3 {
		r := testRecord(i)
		r.TimestampMs = int64(100 + i)
		if _, err := l.Append(1, []Record{r}); err != nil {
			t.Fatal(err)
		}
	}
	if sealed, err := l.SealExpired(1_000_000); sealed || err != nil {
		t.Fatalf("without retention: sealed %v, %v", sealed, err)
	}
	if err := l.SetRetention(-1, 0); err == nil {
		t.Fatal("a negative retention age was taken")
	}
	if err := l.SetRetention(0, -1); err == nil {
		t.Fatal("a negative retention size was taken")
	}
	if age, bytes := l.Retention(); age != 0 || bytes != 0 {
		t.Fatalf("after refused settings: retention %d ms, %d bytes", age, bytes)
	}
	if err := l.SetRetention(1000, 0); err != nil {
		t.Fatal(err)
	}
	if age, bytes := l.Retention(); age != 1000 || bytes != 0 {
		t.Fatalf("retention %d ms, %d bytes, want 1000 ms", age, bytes)
	}
	if sealed, err := l.SealExpired(1103); !sealed || err != nil {
		t.Fatalf("with 1000 ms set: sealed %v, %v", sealed, err)
	}
	if point := l.RetentionPoint(1103, math.MaxUint64); point != 3 {
		t.Fatalf("retention point %d, want 3", point)
	}
	if err := l.SetRetention(0, 0); err != nil {
		t.Fatal(err)
	}
	if point := l.RetentionPoint(1103, math.MaxUint64); point != 0 {
		t.Fatalf("retention point %d with retention unlimited again, want 0", point)
	}
}
