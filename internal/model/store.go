package model

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/replica"
)

// disk is what a node has durably: its hard state, its snapshot point (the
// committed prefix up to snapSeq, whose entries are the ghost `committed`
// ones) and the entries after it.
type disk struct {
	hard               replica.HardState
	snapSeq, snapEpoch uint64
	log                []replica.Entry // entries snapSeq+1.. in seq order
	// uncertain is replog's uncertain mark: set when damage cut the last
	// entry, removed once the kernel is no longer uncertain.
	uncertain bool
	// rebuilding is replog's rebuilding mark: set when damage inside the
	// log dropped a range and everything after it, removed once the
	// kernel is whole again (replica.Persisted.Rebuilding).
	rebuilding bool
	// lost is ghost state: the entries damage took from this disk. The
	// node flushed them, and may have said so: it counts as holding them
	// for VisibleImpliesQuorumFlushed (damage after a flush is not a
	// flush missing) — what the invariants catch is a lost entry the
	// group then forgets.
	lost []replica.Entry
	// promiseLost is replog's promise-lost mark, lostNonce the nonce it
	// holds (counting this disk's losses); promisedBeforeLoss is ghost
	// state: the highest promise a loss took (InstallNeedsQuorumPromise
	// counts it).
	promiseLost        bool
	lostNonce          uint64
	promisedBeforeLoss uint64
}

func (d disk) clone() disk {
	d.log, d.lost = slices.Clone(d.log), slices.Clone(d.lost)
	return d
}

// flushed reports whether the disk holds e at seq, or held it until
// damage took it.
func (d *disk) flushed(seq uint64, e replica.Entry, committed []replica.Entry) bool {
	if oe, ok := d.entry(seq, committed); ok && sameEntry(oe, e) {
		return true
	}
	return slices.ContainsFunc(d.lost, func(l replica.Entry) bool { return l.Seq == seq && sameEntry(l, e) })
}

// last is the seq of the last entry on the disk.
func (d *disk) last() uint64 { return d.snapSeq + uint64(len(d.log)) }

// entry returns the entry at seq when the disk holds it in its log or its
// snapshot (whose entries are committed's).
func (d *disk) entry(seq uint64, committed []replica.Entry) (replica.Entry, bool) {
	switch {
	case seq == 0 || seq > d.last():
		return replica.Entry{}, false
	case seq > d.snapSeq:
		return d.log[seq-d.snapSeq-1], true
	case seq <= uint64(len(committed)):
		return committed[seq-1], true
	}
	return replica.Entry{}, false
}

func (d *disk) appendState(b []byte) []byte {
	b = binary.AppendUvarint(b, d.hard.Promised)
	b = binary.AppendUvarint(b, uint64(d.hard.PromisedTo))
	b = binary.AppendUvarint(b, d.snapSeq)
	b = binary.AppendUvarint(b, d.snapEpoch)
	flags := byte(0)
	if d.uncertain {
		flags |= 1
	}
	if d.promiseLost {
		flags |= 2
	}
	if d.rebuilding {
		flags |= 4
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, d.lostNonce)
	b = binary.AppendUvarint(b, d.promisedBeforeLoss)
	b = binary.AppendUvarint(b, uint64(len(d.lost)))
	for _, e := range d.lost {
		b = binary.AppendUvarint(b, e.Seq)
		b = appendEntry(b, e)
	}
	b = binary.AppendUvarint(b, uint64(len(d.log)))
	for _, e := range d.log {
		b = appendEntry(b, e)
	}
	return b
}

func appendEntry(b []byte, e replica.Entry) []byte {
	b = binary.AppendUvarint(b, e.Epoch)
	b = append(b, e.Data...)
	return append(b, 0)
}

// writeKind is one kind of Store call.
type writeKind uint8

const (
	writeSnapshot writeKind = iota + 1
	writeHardState
	writeTruncate
	writeEntry // one entry of an Append
)

// write is one write the executor made to a node's store, recorded in
// order so that a crash can keep any prefix of a Ready's writes.
type write struct {
	kind       writeKind
	hard       replica.HardState // writeHardState
	seq, epoch uint64            // writeSnapshot: its point; writeTruncate: after seq
	entry      replica.Entry     // writeEntry
}

func (w write) String() string {
	switch w.kind {
	case writeSnapshot:
		return fmt.Sprintf("snapshot (%d,%d)", w.seq, w.epoch)
	case writeHardState:
		return fmt.Sprintf("promise e%d", w.hard.Promised)
	case writeTruncate:
		return fmt.Sprintf("truncation after %d", w.seq)
	}
	return fmt.Sprintf("entry %d (e%d)", w.entry.Seq, w.entry.Epoch)
}

// durableAtOnce: the Store contract makes a snapshot install and a hard
// state durable when the call returns; truncations and appends only at
// the next Sync.
func (w write) durableAtOnce() bool { return w.kind == writeSnapshot || w.kind == writeHardState }

func (w write) appendState(b []byte) []byte {
	b = append(b, byte(w.kind))
	b = binary.AppendUvarint(b, w.hard.Promised)
	b = binary.AppendUvarint(b, uint64(w.hard.PromisedTo))
	b = binary.AppendUvarint(b, w.seq)
	b = binary.AppendUvarint(b, w.epoch)
	b = binary.AppendUvarint(b, w.entry.Seq)
	return appendEntry(b, w.entry)
}

// apply carries out w on d, as the disk will hold it once w is durable.
func (d *disk) apply(w write) {
	switch w.kind {
	case writeSnapshot:
		d.snapSeq, d.snapEpoch, d.log = w.seq, w.epoch, nil
	case writeHardState:
		d.hard = w.hard
	case writeTruncate:
		if w.seq < d.snapSeq {
			panic(fmt.Sprintf("model: truncation after %d below the snapshot point %d", w.seq, d.snapSeq))
		}
		d.log = d.log[:min(uint64(len(d.log)), w.seq-d.snapSeq)]
	case writeEntry:
		if w.entry.Seq != d.last()+1 {
			panic(fmt.Sprintf("model: entry %d appended after %d", w.entry.Seq, d.last()))
		}
		d.log = append(d.log, w.entry)
	}
}

// modelStore is a node's store as the Store contract describes it: a
// snapshot install and the hard state are durable at once, truncations
// and appends wait in unsynced until Sync. Every write is also recorded
// in the node's writes (the current Ready's, for a crash to keep a prefix
// of).
type modelStore struct {
	n         *node
	committed []replica.Entry // ghost: the snapshot a follower installs is this prefix
}

func (ms modelStore) record(w write) {
	ms.n.writes = append(ms.n.writes, w)
	if w.durableAtOnce() {
		ms.n.disk.apply(w)
	} else {
		ms.n.unsynced = append(ms.n.unsynced, w)
	}
}

// InstallSnapshot installs the leader's snapshot: the committed prefix up
// to snap.Seq. A snapshot of anything but the committed prefix (by the
// ghost record) is an error, reported by the checker as a violation.
func (ms modelStore) InstallSnapshot(snap replica.SnapshotMeta) error {
	if snap.Seq > uint64(len(ms.committed)) || snap.Seq > 0 && ms.committed[snap.Seq-1].Epoch != snap.Epoch {
		return fmt.Errorf("%w: n%d installs a snapshot at (%d,%d), not a point of the committed prefix (%d entries)",
			errNotCommitted, ms.n.k.Status().ID, snap.Seq, snap.Epoch, len(ms.committed))
	}
	ms.record(write{kind: writeSnapshot, seq: snap.Seq, epoch: snap.Epoch})
	return nil
}

func (ms modelStore) SetHardState(h replica.HardState) error {
	ms.record(write{kind: writeHardState, hard: h})
	return nil
}

func (ms modelStore) TruncateAfter(seq uint64) error {
	ms.record(write{kind: writeTruncate, seq: seq})
	return nil
}

func (ms modelStore) Append(entries []replica.Entry) error {
	for _, e := range entries {
		ms.record(write{kind: writeEntry, entry: e})
	}
	return nil
}

func (ms modelStore) Sync() error {
	for _, w := range ms.n.unsynced {
		ms.n.disk.apply(w)
	}
	ms.n.unsynced = nil
	return nil
}

// Entries reads the written log (durable or not), as a shell reads its
// own writes.
func (ms modelStore) Entries(first, last uint64) ([]replica.Entry, error) {
	view := ms.n.disk.clone()
	for _, w := range ms.n.unsynced {
		view.apply(w)
	}
	if first <= view.snapSeq {
		return nil, fmt.Errorf("model: entries from %d asked of n%d, compacted to %d", first, ms.n.k.Status().ID, view.snapSeq)
	}
	last = min(last, view.last())
	if first > last {
		return nil, nil
	}
	return slices.Clone(view.log[first-view.snapSeq-1 : last-view.snapSeq]), nil
}
