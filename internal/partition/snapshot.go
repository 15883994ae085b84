package partition

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Snapshot is a partition's derived state — its dedup table and, on a
// replicated partition, what its consumer groups need of the log — as of
// one applied entry. A node keeps the latest in a file beside the log so
// that a restart applies only the entries after it instead of reading the
// whole retained log again, payloads included.
//
// It holds only facts about committed (on a single node: durable) entries
// at or below Applied, which stay true for as long as those entries are in
// the log. So it is usable while the log still holds its entry at Applied
// under the same epoch, or starts right after it (SnapshotUsable);
// anything else (a rebuilt, repaired or lost log) falls back to replaying
// the log.
type Snapshot struct {
	// Applied is the last entry the state includes; Epoch is its epoch.
	Applied, Epoch uint64
	producers      *Producers
	groups         map[string]uint64
}

// snapshotVersion is the first byte of an encoded Snapshot.
const snapshotVersion = 1

// SnapshotBytesMax bounds an encoded snapshot; a larger table is not
// snapshotted (the restart replays the log). A variable only so that
// tests can reach the bound with a small table.
var SnapshotBytesMax = 64 << 20

// ErrSnapshotTooLarge: the table encodes to more than SnapshotBytesMax.
var ErrSnapshotTooLarge = errors.New("partition: dedup snapshot too large")

// appendSnapshot encodes the state as of (applied, epoch).
func appendSnapshot(b []byte, applied, epoch uint64, p *Producers, groups map[string]uint64) ([]byte, error) {
	b = append(b, snapshotVersion)
	b = binary.LittleEndian.AppendUint64(b, applied)
	b = binary.LittleEndian.AppendUint64(b, epoch)
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	slices.Sort(names) // the same state, the same bytes
	b = binary.LittleEndian.AppendUint32(b, uint32(len(names)))
	for _, g := range names {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(g)))
		b = append(b, g...)
		b = binary.LittleEndian.AppendUint64(b, groups[g])
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.byID)))
	for w := p.oldest; w != nil; w = w.newer { // recency order, oldest first
		if len(b) > SnapshotBytesMax {
			return nil, ErrSnapshotTooLarge
		}
		b = binary.LittleEndian.AppendUint64(b, w.id)
		b = binary.LittleEndian.AppendUint64(b, w.floor)
		b = binary.LittleEndian.AppendUint64(b, w.lastSeq)
		b = binary.LittleEndian.AppendUint64(b, w.maxSeen)
		b = binary.LittleEndian.AppendUint32(b, uint32(w.n))
		for i := range w.n { // lowest producer_seq first
			e := w.at(i)
			b = binary.LittleEndian.AppendUint64(b, e.producerSeq)
			b = binary.LittleEndian.AppendUint64(b, e.seq)
			b = binary.LittleEndian.AppendUint64(b, e.epoch)
		}
	}
	if len(b) > SnapshotBytesMax {
		return nil, ErrSnapshotTooLarge
	}
	return b, nil
}

// ErrSnapshotPointGone: the entry a dedup snapshot stands for is among
// the seqs a repair dropped, so no log can match it any more.
var ErrSnapshotPointGone = errors.New("partition: dedup snapshot's point is gone")

// ForgetGoneSeqs rewrites an encoded snapshot as if the appends at seqs
// for which gone reports true (a repair dropped them, or filled them
// with lost records) had never happened (SnapshotForgetsOnlyGoneSeqs): a
// retry of one appends it again instead of being answered with a record
// that is gone, while every other fact stays — above all the producers
// whose every record retention deleted, which nothing else remembers.
//
// A window loses the entries at gone seqs. One that loses its highest
// producer_seq, or whose latest mention is gone (a carry), takes the
// highest kept as what it saw and that entry's append as its latest
// mention: a mention still in the log, and no later than the truth (a
// carry after it may mention it too), so compaction keeps more, never
// less. One that loses every entry is forgotten, as a replay of the log
// would. Floors stay — what they refuse as too old was evicted, or sealed
// as unprovable after retention — except that a window sealed at a
// producer_seq that is gone is sealed just past the highest kept, where a
// replay of the kept log would seal it: the gone one's retry appends
// again. A gone entry below the floor is too old then, as after a replay.
// A snapshot whose own point is gone is ErrSnapshotPointGone (the caller
// removes it). The writer's bounds are not known here; the next start
// checks them (DecodeSnapshot).
func ForgetGoneSeqs(b []byte, gone func(seq uint64) bool) ([]byte, error) {
	s, err := DecodeSnapshot(b, Config{DedupWindowMax: math.MaxInt, ProducersMax: math.MaxInt})
	if err != nil {
		return nil, err
	}
	if s.Applied > 0 && gone(s.Applied) {
		return nil, ErrSnapshotPointGone
	}
	kept := NewProducers(math.MaxInt, math.MaxInt)
	for w := s.producers.oldest; w != nil; w = w.newer {
		entries := make([]dedupEntry, 0, w.n)
		for i := range w.n {
			if e := *w.at(i); !gone(e.seq) {
				entries = append(entries, e)
			}
		}
		if len(entries) == 0 {
			continue
		}
		nw := &producerWindow{id: w.id, floor: w.floor, lastSeq: w.lastSeq, maxSeen: w.maxSeen, ring: entries, n: len(entries)}
		if top := entries[len(entries)-1]; top.producerSeq != w.maxSeen || gone(w.lastSeq) {
			nw.maxSeen, nw.lastSeq = top.producerSeq, top.seq
			nw.floor = min(nw.floor, top.producerSeq+1)
		}
		kept.byID[nw.id] = nw
		kept.link(nw)
	}
	return appendSnapshot(nil, s.Applied, s.Epoch, kept, s.groups)
}

// SnapshotPoint reads only the seq a dedup snapshot stands for (its
// Applied), without decoding its table: a single node opens its log
// knowing the log held that seq durably.
func SnapshotPoint(b []byte) (uint64, error) {
	d := snapDecoder{b: b}
	if v := d.u8(); d.err == nil && v != snapshotVersion {
		return 0, fmt.Errorf("partition: dedup snapshot version %d, want %d", v, snapshotVersion)
	}
	applied := d.u64()
	return applied, d.err
}

// DecodeSnapshot decodes an encoded Snapshot for a partition bounded by
// cfg. It checks every field it can on its own: a snapshot that does not
// fit cfg's bounds (they were lowered since) or is inconsistent is an
// error, and the caller replays the log instead.
func DecodeSnapshot(b []byte, cfg Config) (*Snapshot, error) {
	d := snapDecoder{b: b}
	if v := d.u8(); d.err == nil && v != snapshotVersion {
		return nil, fmt.Errorf("partition: dedup snapshot version %d, want %d", v, snapshotVersion)
	}
	s := &Snapshot{Applied: d.u64(), Epoch: d.u64(), producers: NewProducers(cfg.DedupWindowMax, cfg.ProducersMax)}
	if d.err == nil && (s.Applied == 0) != (s.Epoch == 0) {
		d.fail("applied %d under epoch %d", s.Applied, s.Epoch)
	}
	for n := d.count(11); n > 0 && d.err == nil; n-- {
		name := d.bytes(int(d.u16()))
		from := d.u64()
		switch {
		case d.err != nil:
		case len(name) == 0 || from == 0 || from > s.Applied:
			d.fail("group %q needs seq %d of %d applied", name, from, s.Applied)
		case s.groups[string(name)] != 0:
			d.fail("group %q twice", name)
		default:
			if s.groups == nil {
				s.groups = map[string]uint64{}
			}
			s.groups[string(name)] = from
		}
	}
	producers := d.count(36)
	if d.err == nil && producers > cfg.ProducersMax {
		d.fail("%d producers, at most %d", producers, cfg.ProducersMax)
	}
	for ; producers > 0 && d.err == nil; producers-- {
		w := &producerWindow{id: d.u64(), floor: d.u64(), lastSeq: d.u64(), maxSeen: d.u64()}
		n := d.count(24)
		switch {
		case d.err != nil:
		case n == 0 || n > cfg.DedupWindowMax:
			d.fail("producer %d remembers %d seqs, want 1 to %d", w.id, n, cfg.DedupWindowMax)
		case w.lastSeq == 0 || w.lastSeq > s.Applied || s.producers.byID[w.id] != nil:
			d.fail("producer %d last appended at %d of %d applied, or twice", w.id, w.lastSeq, s.Applied)
		case s.producers.newest != nil && cmp.Or(cmp.Compare(s.producers.newest.lastSeq, w.lastSeq), cmp.Compare(s.producers.newest.id, w.id)) >= 0:
			d.fail("producer %d out of recency order", w.id)
		}
		entries := make([]dedupEntry, 0, n)
		for ; n > 0 && d.err == nil; n-- {
			e := dedupEntry{producerSeq: d.u64(), seq: d.u64(), epoch: d.u64()}
			if d.err == nil && (e.seq == 0 || e.seq > s.Applied || e.epoch == 0 || e.epoch > s.Epoch || e.producerSeq > w.maxSeen) {
				d.fail("producer %d seq %d at %d (epoch %d) outside its window", w.id, e.producerSeq, e.seq, e.epoch)
			}
			entries = append(entries, e)
		}
		if d.err != nil {
			break
		}
		// The window is sorted by producer_seq, whatever order they came in.
		slices.SortFunc(entries, func(a, b dedupEntry) int { return cmp.Compare(a.producerSeq, b.producerSeq) })
		// A window never forgets its highest producer_seq (it evicts the
		// lowest), and its floor is raised only past seqs it saw: a maxSeen
		// above its entries would stop appends below it from moving the
		// producer's latest mention, a floor past maxSeen+1 would refuse
		// new seqs as too old.
		if top := entries[len(entries)-1].producerSeq; top != w.maxSeen || w.floor > w.maxSeen+1 {
			d.fail("producer %d: highest seq %d, highest seen %d, floor %d", w.id, top, w.maxSeen, w.floor)
			break
		}
		w.ring, w.n = entries, len(entries)
		s.producers.byID[w.id] = w
		s.producers.link(w) // the newest so far: O(1)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes after the table", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return s, nil
}

// SnapshotUsable reports whether s can stand for the log's entries up to
// s.Applied, given the log's start and, when the log holds seq s.Applied,
// the epoch of that entry (inLog false: it does not hold it). The log must
// hold the snapshot's last entry under the same epoch, or start right
// after it; a snapshot below the log's start misses entries, one beyond
// the log's end or of another epoch describes another log.
func SnapshotUsable(s *Snapshot, start, epochAtApplied uint64, inLog bool) bool {
	switch {
	case s.Applied+1 < start:
		return false
	case s.Applied+1 == start:
		return true
	}
	return inLog && epochAtApplied == s.Epoch
}

type snapDecoder struct {
	b   []byte
	err error
}

func (d *snapDecoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("partition: dedup snapshot corrupt: "+format, args...)
	}
}

func (d *snapDecoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *snapDecoder) u8() uint8 {
	if b := d.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *snapDecoder) u16() uint16 {
	if b := d.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *snapDecoder) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// count reads a u32 count of items of at least minBytes each, refusing
// one the remaining bytes cannot hold (no allocation from a bad count).
func (d *snapDecoder) count(minBytes int) int {
	b := d.bytes(4)
	if b == nil {
		return 0
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > len(d.b)/minBytes {
		d.fail("%d items in %d bytes", n, len(d.b))
		return 0
	}
	return n
}

// AppendSnapshot encodes the member's state as of its applied entry, whose
// epoch the shell reads from its log.
func (m *Member[R]) AppendSnapshot(b []byte, epochAtApplied uint64) ([]byte, error) {
	return appendSnapshot(b, m.applied, epochAtApplied, m.producers, m.groups.From())
}

// Restore starts the member from s instead of from its log's start: the
// shell then applies only the entries after s.Applied. The shell checked
// s against its log (SnapshotUsable); a snapshot behind what is applied
// already changes nothing. It reports whether it took s.
func (m *Member[R]) Restore(s *Snapshot) bool {
	if s.Applied <= m.applied || len(m.inflight) > 0 {
		return false
	}
	m.producers, m.applied = s.producers, s.Applied
	m.groups.Restore(s.groups, s.Applied)
	if m.groupGone != nil {
		m.groups.Forget(m.groupGone)
	}
	return true
}

// AppendSnapshot encodes the table as of the last committed seq, whose
// epoch the shell reads from its log. Only a state with nothing assigned
// beyond the commit point may be snapshotted: the table then holds no
// entry the log might lose.
func (s *State) AppendSnapshot(b []byte, epochAtCommit uint64) ([]byte, error) {
	if s.commitSeq != s.nextSeq-1 {
		return nil, fmt.Errorf("partition: snapshot with seqs %d-%d not yet durable", s.commitSeq+1, s.nextSeq-1)
	}
	return appendSnapshot(b, s.commitSeq, epochAtCommit, s.producers, nil)
}

// Restore takes the table of s during recovery, before Replay of the
// entries after s.Applied; the shell checked s against its log
// (SnapshotUsable).
func (s *State) Restore(snap *Snapshot) {
	if snap.Applied >= s.nextSeq {
		panic(fmt.Sprintf("partition: snapshot at %d beyond the log's end %d", snap.Applied, s.nextSeq-1))
	}
	s.producers = snap.producers
}
