package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"

	"github.com/nereus-broker/nereus/internal/sched"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// schedSpill is a shard's sched.Spill on disk: each lane's pending
// schedules beyond the state's window, sorted by (deliver_at, id), in a
// few immutable run files plus a small sorted table in RAM. A lane's
// table becomes a run when it fills; a lane's runs merge into one when
// there are too many of them or too many deleted entries in them. Only
// the lane's position in each run, the table and the deleted entries'
// ids are in RAM: a bounded amount per lane, whatever the shard holds.
//
// The spill is derived from the shard's log and rebuilt from it whenever
// the runner starts, so its files are never synced: a crash leaves
// nothing that is read again. Every entry carries a CRC32C: a damaged
// file is an error, never a wrong schedule.
type schedSpill struct {
	fs    vfs.FS
	dir   string
	find  func(id uint64) (lane string, k sched.Key, ok bool, err error)
	lanes map[string]*spillLane
	files uint64 // names new runs
	// tableMax bounds a lane's table and its runs' deleted entries.
	tableMax int
}

const (
	spillEntryBytes = 32 // deliver_at 8, id 8, partition 4, at 8, CRC32C 4
	spillReadAhead  = 256
)

type spillLane struct {
	table []sched.Key // sorted
	runs  []*spillRun
	dead  int // deleted entries still in the runs
	n     int // schedules held
}

type spillRun struct {
	name string
	f    vfs.File
	n    int64 // entries in the file
	pos  int64 // entries before pos were popped
	head []sched.Key
	dead map[uint64]bool // ids deleted from this run (not yet reached by pops)
}

var spillCRC = crc32.MakeTable(crc32.Castagnoli)

// newSchedSpill empties dir (what a previous run spilled is rebuilt from
// the log) and returns a spill writing there.
func newSchedSpill(fs vfs.FS, dir string, tableMax int, find func(uint64) (string, sched.Key, bool, error)) (*schedSpill, error) {
	if err := fs.MkdirAll(dir); err != nil {
		return nil, err
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if err := fs.Remove(path.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	return &schedSpill{fs: fs, dir: dir, find: find, lanes: map[string]*spillLane{}, tableMax: max(tableMax, 2)}, nil
}

func (s *schedSpill) Put(lane string, k sched.Key) error {
	l := s.lanes[lane]
	if l == nil {
		l = &spillLane{}
		s.lanes[lane] = l
	}
	i, found := slices.BinarySearchFunc(l.table, k, sched.CompareKeys)
	if found {
		return fmt.Errorf("schedule %d spilled twice", k.ID)
	}
	l.table = slices.Insert(l.table, i, k)
	l.n++
	if len(l.table) >= s.tableMax {
		return s.flush(l)
	}
	return nil
}

// flush writes a lane's table as a run. Runs merge like a binary
// counter — the newest two while the older holds at most twice the newer
// — so a lane of n schedules has O(log n) runs and a schedule is
// rewritten O(log n) times as it grows. (Delete merges them all once
// their deleted entries fill a table.)
func (s *schedSpill) flush(l *spillLane) error {
	table := l.table
	r, err := s.writeRun(len(table), func() (sched.Key, bool, error) {
		k := table[0]
		table = table[1:]
		return k, true, nil
	})
	if err != nil {
		return err
	}
	l.table = nil
	l.runs = append(l.runs, r)
	for len(l.runs) >= 2 && l.runs[len(l.runs)-2].live() <= 2*l.runs[len(l.runs)-1].live() {
		if err := s.merge(l, len(l.runs)-2); err != nil {
			return err
		}
	}
	return nil
}

// live is the number of a run's entries not popped or deleted.
func (r *spillRun) live() int64 { return r.n - r.pos - int64(len(r.dead)) }

// merge rewrites a lane's runs from the i-th on as one run.
func (s *schedSpill) merge(l *spillLane, i int) error {
	runs := l.runs[i:]
	var n int64
	for _, r := range runs {
		n += r.live()
	}
	merged, err := s.writeRun(int(n), func() (sched.Key, bool, error) { return l.next(runs, false) })
	if err != nil {
		return err
	}
	for _, old := range runs {
		l.dead -= len(old.dead)
		if err := s.removeRun(old); err != nil {
			return err
		}
	}
	clear(runs)
	l.runs = append(l.runs[:i], merged)
	return nil
}

// writeRun writes n keys taken from next to a new run file.
func (s *schedSpill) writeRun(n int, next func() (sched.Key, bool, error)) (*spillRun, error) {
	s.files++
	name := path.Join(s.dir, strconv.FormatUint(s.files, 10)+".run")
	// Read-write with positional writes: a carry rewrites one entry's At
	// in place (Move).
	f, err := s.fs.OpenRW(name)
	if err != nil {
		return nil, err
	}
	r := &spillRun{name: name, f: f, dead: map[uint64]bool{}}
	buf := make([]byte, 0, spillReadAhead*spillEntryBytes)
	var off int64
	for i := 0; i < n; i++ {
		k, ok, err := next()
		if err == nil && !ok {
			err = fmt.Errorf("spill run %s: %d of %d entries", name, i, n)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		buf = appendSpillEntry(buf, k)
		if len(buf) == cap(buf) || i == n-1 {
			if _, err := f.WriteAt(buf, off); err != nil {
				f.Close()
				return nil, err
			}
			off += int64(len(buf))
			buf = buf[:0]
		}
	}
	r.n = int64(n)
	return r, nil
}

func appendSpillEntry(b []byte, k sched.Key) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint64(b, uint64(k.DeliverAtMs))
	b = binary.BigEndian.AppendUint64(b, k.ID)
	b = binary.BigEndian.AppendUint32(b, k.Partition)
	b = binary.BigEndian.AppendUint64(b, k.At)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], spillCRC))
}

func decodeSpillEntry(b []byte) (sched.Key, error) {
	if crc32.Checksum(b[:28], spillCRC) != binary.BigEndian.Uint32(b[28:32]) {
		return sched.Key{}, errors.New("checksum mismatch")
	}
	return sched.Key{DeliverAtMs: int64(binary.BigEndian.Uint64(b)), ID: binary.BigEndian.Uint64(b[8:]), Partition: binary.BigEndian.Uint32(b[16:]),
		At: binary.BigEndian.Uint64(b[20:])}, nil
}

// read reads the entries [from, from+count) of a run.
func (r *spillRun) read(from, count int64) ([]sched.Key, error) {
	b := make([]byte, count*spillEntryBytes)
	if _, err := r.f.ReadAt(b, from*spillEntryBytes); err != nil && !(errors.Is(err, io.EOF) && from+count == r.n) {
		return nil, fmt.Errorf("spill run %s: %w", r.name, err)
	}
	ks := make([]sched.Key, count)
	for i := range ks {
		k, err := decodeSpillEntry(b[i*spillEntryBytes:])
		if err != nil {
			return nil, fmt.Errorf("spill run %s entry %d: %w", r.name, from+int64(i), err)
		}
		ks[i] = k
	}
	return ks, nil
}

// peek returns a run's next live entry, skipping deleted ones.
func (r *spillRun) peek(l *spillLane) (sched.Key, bool, error) {
	for {
		if len(r.head) == 0 {
			if r.pos == r.n {
				return sched.Key{}, false, nil
			}
			ks, err := r.read(r.pos, min(spillReadAhead, r.n-r.pos))
			if err != nil {
				return sched.Key{}, false, err
			}
			r.head = ks
		}
		k := r.head[0]
		if !r.dead[k.ID] {
			return k, true, nil
		}
		delete(r.dead, k.ID)
		l.dead--
		r.head, r.pos = r.head[1:], r.pos+1
	}
}

// next removes and returns the smallest entry among runs, and the lane's
// table if withTable.
func (l *spillLane) next(runs []*spillRun, withTable bool) (sched.Key, bool, error) {
	var best *spillRun
	var bk sched.Key
	for _, r := range runs {
		k, ok, err := r.peek(l)
		if err != nil {
			return sched.Key{}, false, err
		}
		if ok && (best == nil || sched.CompareKeys(k, bk) < 0) {
			best, bk = r, k
		}
	}
	if withTable && len(l.table) > 0 && (best == nil || sched.CompareKeys(l.table[0], bk) < 0) {
		k := l.table[0]
		l.table = l.table[1:]
		return k, true, nil
	}
	if best == nil {
		return sched.Key{}, false, nil
	}
	best.head, best.pos = best.head[1:], best.pos+1
	return bk, true, nil
}

func (s *schedSpill) Pop(lane string, n int) ([]sched.Key, error) {
	l := s.lanes[lane]
	if l == nil {
		return nil, nil
	}
	var out []sched.Key
	for len(out) < n {
		k, ok, err := l.next(l.runs, true)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		l.n--
		out = append(out, k)
	}
	// Runs popped to their end are gone.
	kept := l.runs[:0]
	for _, r := range l.runs {
		if r.pos == r.n {
			if err := s.removeRun(r); err != nil {
				return nil, err
			}
			continue
		}
		kept = append(kept, r)
	}
	clear(l.runs[len(kept):])
	l.runs = kept
	if l.n == 0 {
		return out, s.Drop(lane)
	}
	return out, nil
}

// errScheduleCompacted is find's answer for a schedule whose first record
// the shard's compaction took: the spill looks for it by id.
var errScheduleCompacted = errors.New("schedule record compacted")

func (s *schedSpill) Delete(id uint64) (string, sched.Key, bool, error) {
	lane, k, ok, err := s.find(id)
	if errors.Is(err, errScheduleCompacted) {
		lane, k, ok, err = s.lookup(id)
	}
	if err != nil || !ok {
		return "", sched.Key{}, false, err
	}
	got, ok, err := s.remove(lane, k)
	return lane, got, ok, err
}

// lookup finds a schedule by id alone, reading every lane's table and
// runs: for a cancel (or a claim, by a replica with another window) of a
// schedule carried so long ago that its first record is gone.
func (s *schedSpill) lookup(id uint64) (string, sched.Key, bool, error) {
	for _, lane := range slices.Sorted(maps.Keys(s.lanes)) {
		var found *sched.Key
		err := s.Scan(lane, nil, func(k sched.Key) bool {
			if k.ID == id {
				found = &k
			}
			return found == nil
		})
		if err != nil || found != nil {
			return lane, *found, found != nil, err
		}
	}
	return "", sched.Key{}, false, nil
}

// Move rewrites the schedule's entry with its new At where it lies: in
// the table, or in place in its run (its order does not change).
func (s *schedSpill) Move(lane string, k sched.Key) (bool, error) {
	l := s.lanes[lane]
	if l == nil {
		return false, nil
	}
	if i, found := slices.BinarySearchFunc(l.table, k, sched.CompareKeys); found {
		l.table[i].At = k.At
		return true, nil
	}
	for _, r := range l.runs {
		got, at, found, err := r.search(k)
		if err != nil {
			return false, err
		}
		if !found || r.dead[k.ID] {
			continue
		}
		got.At = k.At
		if _, err := r.f.WriteAt(appendSpillEntry(nil, got), at*spillEntryBytes); err != nil {
			return false, fmt.Errorf("spill run %s: %w", r.name, err)
		}
		if i := at - r.pos; i >= 0 && i < int64(len(r.head)) {
			r.head[i] = got // read ahead before the move
		}
		return true, nil
	}
	return false, nil
}

// remove deletes lane's schedule k (by deliver_at and id) and returns it
// as the spill held it.
func (s *schedSpill) remove(lane string, k sched.Key) (sched.Key, bool, error) {
	l := s.lanes[lane]
	if l == nil {
		return sched.Key{}, false, nil
	}
	if i, found := slices.BinarySearchFunc(l.table, k, sched.CompareKeys); found {
		k = l.table[i]
		l.table = slices.Delete(l.table, i, i+1)
		l.n--
		if l.n == 0 {
			return k, true, s.Drop(lane)
		}
		return k, true, nil
	}
	for _, r := range l.runs {
		got, _, found, err := r.search(k)
		if err != nil {
			return sched.Key{}, false, err
		}
		if !found || r.dead[k.ID] {
			continue
		}
		r.dead[k.ID] = true
		l.dead++
		l.n--
		if l.n == 0 {
			return got, true, s.Drop(lane)
		}
		if l.dead >= s.tableMax {
			if err := s.merge(l, 0); err != nil {
				return sched.Key{}, false, err
			}
		}
		return got, true, nil
	}
	return sched.Key{}, false, nil
}

// Scan reads a lane's schedules in order without moving its runs'
// positions: a cursor of its own per run, the deleted ones skipped. From
// a key (a listing's page), each run's cursor starts at its first entry
// after it, found by binary search, and so does the table's: a page
// reads O(log n) entries of each run before its own.
func (s *schedSpill) Scan(lane string, from *sched.Key, f func(sched.Key) bool) error {
	l := s.lanes[lane]
	if l == nil {
		return nil
	}
	type cursor struct {
		r    *spillRun
		pos  int64
		head []sched.Key
	}
	cs := make([]*cursor, len(l.runs))
	for i, r := range l.runs {
		cs[i] = &cursor{r: r, pos: r.pos}
		if from != nil {
			pos, err := r.seek(*from)
			if err != nil {
				return err
			}
			cs[i].pos = pos
		}
	}
	peek := func(c *cursor) (sched.Key, bool, error) {
		for {
			if len(c.head) == 0 {
				if c.pos == c.r.n {
					return sched.Key{}, false, nil
				}
				ks, err := c.r.read(c.pos, min(spillReadAhead, c.r.n-c.pos))
				if err != nil {
					return sched.Key{}, false, err
				}
				c.head = ks
			}
			if k := c.head[0]; !c.r.dead[k.ID] {
				return k, true, nil
			}
			c.head, c.pos = c.head[1:], c.pos+1
		}
	}
	table := l.table
	if from != nil {
		i, found := slices.BinarySearchFunc(table, *from, sched.CompareKeys)
		if found {
			i++
		}
		table = table[i:]
	}
	for {
		var best *cursor
		var bk sched.Key
		for _, c := range cs {
			k, ok, err := peek(c)
			if err != nil {
				return err
			}
			if ok && (best == nil || sched.CompareKeys(k, bk) < 0) {
				best, bk = c, k
			}
		}
		if len(table) > 0 && (best == nil || sched.CompareKeys(table[0], bk) < 0) {
			best, bk = nil, table[0]
			table = table[1:]
		} else if best == nil {
			return nil
		} else {
			best.head, best.pos = best.head[1:], best.pos+1
		}
		if !f(bk) {
			return nil
		}
	}
}

// seek is the position of a run's first entry after k among those not
// yet popped (binary search on the file, as search).
func (r *spillRun) seek(k sched.Key) (int64, error) {
	lo, hi := r.pos, r.n
	for lo < hi {
		mid := lo + (hi-lo)/2
		ks, err := r.read(mid, 1)
		if err != nil {
			return 0, err
		}
		if sched.CompareKeys(ks[0], k) <= 0 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// search looks for k among a run's entries not yet popped (binary search
// on the file: the entries are sorted and of one size).
func (r *spillRun) search(k sched.Key) (sched.Key, int64, bool, error) {
	lo, hi := r.pos, r.n
	for lo < hi {
		mid := lo + (hi-lo)/2
		ks, err := r.read(mid, 1)
		if err != nil {
			return sched.Key{}, 0, false, err
		}
		switch c := sched.CompareKeys(ks[0], k); {
		case c == 0:
			return ks[0], mid, true, nil
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return sched.Key{}, 0, false, nil
}

func (s *schedSpill) Drop(lane string) error {
	l := s.lanes[lane]
	if l == nil {
		return nil
	}
	for _, r := range l.runs {
		if err := s.removeRun(r); err != nil {
			return err
		}
	}
	delete(s.lanes, lane)
	return nil
}

func (s *schedSpill) removeRun(r *spillRun) error {
	r.f.Close()
	return s.fs.Remove(r.name)
}

// close closes the spill's files (the runner stops).
func (s *schedSpill) close() {
	for _, l := range s.lanes {
		for _, r := range l.runs {
			r.f.Close()
		}
	}
}
