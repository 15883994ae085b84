package replog

import (
	"errors"
	"slices"
	"sync"

	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/storage"
)

// Bounds of a member's entry cache: the most recent entries it keeps in
// memory, at most this many, of at most this many bytes of data together.
// They cover what a leader has in flight to its followers and what its
// applier has not taken yet at 256 publishes of 64 KiB in flight.
const (
	cacheEntriesMax = 16 << 10
	cacheBytesMax   = 32 << 20
)

// entryCache keeps a member's most recent log entries in their replication
// encoding (replica.Entry.Data, as Append wrote them), so that neither
// the executor (sending them to a follower) nor the partition's applier
// (Log.Committed) reads back from the log, and re-encodes, what this
// member has just written.
//
// Coherence: the log changes only by appends through memberStore.Append,
// which also add to the cache, and by truncations (a kernel truncation,
// dropping a damaged range), which lower the log's end, and resets and
// deletions (a snapshot install, dropping a damaged log, compaction),
// which move the log's start past every entry before it. So the cache
// keeps its entries a run of consecutive seqs, an add that does not
// continue the run replaces it (after a truncation below the run's end
// the log's next append lands inside the run), and a read is cut at the
// log's end (a truncation not followed by an append yet) and refused
// below the log's start. A cached entry thus never outlives a truncation,
// a reset or a restart: a process restart starts with an empty cache, and
// what a restart in place does to the log (restartDamaged drops a damaged
// range, Recover reopens the log cut back to its synced end) is one of the
// changes above. entrycache_test.go breaks each of these rules in turn.
//
// Eviction: entries leave from the front once committed and taken by the
// applier (or, while no applier uses the cache, once committed), and
// whenever the bounds are exceeded; a miss reads the log.
//
// Concurrency: the member's goroutine appends and evicts; the applier
// (another goroutine) reads through Log.Committed. mu guards everything.
type entryCache struct {
	mu      sync.Mutex
	entries []replica.Entry // consecutive seqs, ascending
	bytes   int             // the entries' data, together
	// applier: an applier takes committed entries through the cache, up
	// to taken; evict keeps what it has not taken yet.
	applier bool
	taken   uint64
}

// reset empties the cache. Caller holds mu.
func (c *entryCache) reset() {
	clear(c.entries)
	c.entries, c.bytes = c.entries[:0], 0
}

// add caches entries the member just wrote to the log.
func (c *entryCache) add(entries []replica.Entry) {
	if len(entries) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.entries); n > 0 && c.entries[n-1].Seq+1 != entries[0].Seq {
		c.reset() // not a continuation: the log was rewritten under us
	}
	c.entries = append(c.entries, entries...)
	for i := range entries {
		c.bytes += len(entries[i].Data)
	}
	c.trim(0)
}

// evict drops the entries at or below commit that the applier (if one
// uses the cache) has taken, and what exceeds the bounds.
func (c *entryCache) evict(commit uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	floor := commit
	if c.applier {
		floor = min(floor, c.taken)
	}
	c.trim(floor)
}

// trim drops entries from the front: those at or below floor, then the
// oldest while the bounds are exceeded. Caller holds mu.
func (c *entryCache) trim(floor uint64) {
	i := 0
	for i < len(c.entries) && (c.entries[i].Seq <= floor || len(c.entries)-i > cacheEntriesMax || c.bytes > cacheBytesMax) {
		c.bytes -= len(c.entries[i].Data)
		c.entries[i] = replica.Entry{}
		i++
	}
	if i == len(c.entries) {
		c.entries = c.entries[:0] // reuse the array from its start
	} else {
		c.entries = c.entries[i:]
	}
}

// get returns the cached entries first..last (fewer when the log ends
// before last), or false when the cache does not hold first; start and
// end are the log's first and last seqs. The slice is the cache's own:
// valid only while the caller holds mu.
func (c *entryCache) get(first, last, start, end uint64) ([]replica.Entry, bool) {
	if len(c.entries) == 0 || first < start || first < c.entries[0].Seq || first > end {
		return nil, false
	}
	i := int(first - c.entries[0].Seq)
	j := int(min(last, end) - c.entries[0].Seq + 1)
	return c.entries[i:j], true
}

// read is the executor's read of first..last through the cache: a copy.
func (c *entryCache) read(log *storage.Log, first, last uint64) ([]replica.Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	entries, ok := c.get(first, last, log.StartSeq(), log.NextSeq()-1)
	return slices.Clone(entries), ok
}

// Committed returns up to maxEntries committed entries from fromSeq on, as Read
// does, from the member's cache of recent entries when it holds fromSeq
// (decoded from their replication encoding, into dst's array: the
// applier's scratch, reused from one call to the next), else from the log.
// It is for the one applier of the member's committed entries: what it
// returns counts as taken, and the cache keeps committed entries until
// taken. Records alias the cache's or a fresh buffer; never write to them.
func (l *Log) Committed(dst []storage.Entry, fromSeq uint64, maxEntries int) ([]storage.Entry, error) {
	m, c := l.m, &l.m.cache
	commit := m.commitSeq.Load()
	if fromSeq > commit {
		return nil, nil
	}
	rl := m.ReadLog() // not m.log: the driver may replace it (Recover)
	c.mu.Lock()
	c.applier = true
	cached, ok := c.get(fromSeq, min(commit, fromSeq+uint64(max(maxEntries, 1))-1), rl.StartSeq(), rl.NextSeq()-1)
	if ok {
		out, err := decodeCached(dst, cached) // under mu: cached is the cache's own slice
		if len(cached) > 0 {
			c.taken = cached[len(cached)-1].Seq
		}
		c.mu.Unlock()
		return out, err
	}
	c.mu.Unlock()
	entries, err := m.Read(fromSeq, maxEntries)
	if len(entries) > 0 {
		c.mu.Lock()
		c.taken = entries[len(entries)-1].Seq
		c.mu.Unlock()
	}
	return entries, err
}

// decodeCached decodes cached entries into the log's entries, in
// scratch's array; the records alias the entries' data (which is never
// written to once cached).
func decodeCached(scratch []storage.Entry, cached []replica.Entry) ([]storage.Entry, error) {
	out := slices.Grow(scratch[:0], len(cached))[:len(cached)]
	for i, e := range cached {
		out[i] = storage.Entry{Seq: e.Seq, Epoch: e.Epoch, Record: installRecord}
		if len(e.Data) > 0 {
			rec, err := storage.DecodeRecord(e.Data)
			if err != nil { // Append decoded it before writing it: impossible
				return out[:i], errors.Join(errors.New("replog: cached entry does not decode"), err)
			}
			out[i].Record = rec
		}
	}
	return out, nil
}
