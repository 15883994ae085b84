// Package storage implements the segmented, append-only log that holds one
// partition replica, plus atomic small-state files, all on top of vfs.FS.
//
// # Sequence numbers
//
// Records are numbered with 1-based uint64 sequence numbers: the first
// record ever appended has seq 1; seq 0 means "none". A log holds the
// contiguous range [StartSeq, NextSeq).
//
// # Directory layout
//
//	<dir>/00000000000000000001.log   segment whose first record has seq 1
//	<dir>/00000000000000000001.idx   sparse index of that segment (sealed only)
//	<dir>/00000000000000004242.log   active (last) segment, base seq 4242
//
// Segment and index names are the zero-padded 20-digit base seq. Files
// ending in ".tmp" are leftovers of an interrupted atomic write and are
// removed on Open.
//
// # Segment format
//
// A segment is a sequence of batches, written at explicit offsets. The
// active segment's file is preallocated: past its last batch it holds
// zeroes written ahead by the writer (as many bytes as the segment uses,
// at most 1 MiB, never past SegmentBytesMax), so that an append lands
// inside the file and its fdatasync need not also flush a new file size.
// A batch of 256 KiB or more is preallocated only up to its own end: it
// would grow the file anyway, and zeroes ahead of it would reach the disk
// only to be written over.
// A segment is sealed when the log rolls to a new one: its zero tail is
// cut off first, so a sealed segment's file is exactly its batches.
// A segment's size (for retention and in its index) is always its used
// length, never its preallocated length. All integers are little-endian.
//
//	offset size field
//	0      1    magic (0xB7)
//	1      1    format version (1, 2 or 3; see below)
//	2      4    length u32: number of bytes after this field
//	6      4    crc32c (Castagnoli) u32 of every byte after this field
//	10     8    base seq u64 (seq of the first record of the batch)
//	18     8    epoch u64 (leader epoch that wrote the batch)
//	26     4    record count u32 (at least 1)
//	30     8    max timestamp i64 (unix milliseconds)
//	38     ...  body
//
// The body of a version 2 batch (what Append writes) starts with the
// writer's synced-through seq u64: the last seq that was durable when the
// batch was written. Version 1 batches (written before it existed) have
// no such prefix and are still read. Then come the records. A version 3
// batch is a gap: it has no body, and its count names seqs that a repair
// dropped on purpose; Read returns a *GapError for them.
//
// Each record is:
//
//	timestamp i64, producer id u64, producer seq u64,
//	key length u32, key, value length u32, value,
//	header count u32, then per header: key length u32, key, value length u32, value
//
// Every length is checked against the bytes that remain, a record against
// Options.RecordBytesMax when it is appended, and a batch against the
// format limit of batchBytesLimit. A batch is valid only if its magic,
// version, length, CRC and record structure check out and its base seq
// continues the previous batch. Batches in one segment have non-decreasing
// epochs.
//
// # Index format
//
// A sealed segment has a sparse index "<base>.idx", written with
// WriteFileAtomic when the segment is rolled: segment size i64, base seq
// u64, next seq u64, last epoch u64, max timestamp i64, entry count u32,
// then entries of (batch base seq u64, file offset i64), one per
// Options.IndexIntervalBytes of segment. An index whose checksum, size or
// structure does not match its segment is ignored and rebuilt by scanning.
//
// # Recovery: torn tails and damage
//
// Open scans the last segment and every segment without a valid index,
// batch by batch. A scan ends cleanly at the end of the file or at a batch
// header of all zeroes when every byte after it is zero too: the unused
// preallocated tail. The last segment keeps such a tail for its next
// appends; an earlier segment (sealed, but its trim was not durable) is
// trimmed to its batches.
//
// Any other invalid batch is either a torn tail or damage, and the two are
// never confused in the direction that loses data silently:
//   - A sealed segment was synced whole when the log rolled past it, so an
//     invalid range in it is damage. The scan looks for the next valid
//     batch that continues the segment; without one the damage runs to
//     the end of the file and covers the seqs up to the next segment.
//   - In the last segment, an invalid range is damage only when a later
//     valid batch proves it was durable: its synced-through seq reaches
//     the range's first seq. Otherwise (the next batches of a group commit
//     were written while the invalid one was not yet synced, or nothing
//     valid follows) it is a torn tail: the segment is truncated there,
//     everything after it included, and Open reports it (TornTail) so the
//     caller can log the bytes dropped. After recovery nothing but zeroes
//     follows the last batch. A log with no other copy opens with
//     Options.KeepTornSeqs: the seqs the cut batches' headers still name
//     (a torn write's header is written first; a flipped bit elsewhere
//     leaves it whole; a header a flip made undecodable names as many
//     records as its batch's bytes could hold, one whose count or
//     length a flip changed names the records that still decode, within
//     BatchBytesMax) are filled with gap batches, or copies of
//     Options.Filler, in a segment rewritten and renamed over the old one,
//     so they are never handed out again (TornSeqsNotReused): those
//     batches may have been synced and acknowledged.
//
// Damage is never truncated and its seqs are never reused: Open keeps the
// log at its full length, lists each damaged range (Damage: file, offset,
// bytes, seq range, cause), indexes the batch after it, and Read answers a
// seq inside it with a *CorruptError and serves every record around it.
// TruncateAfter drops a damaged range whole or keeps it with records after
// it: a cut inside one or at its end is refused with a *CorruptError and
// changes nothing; splitting a gap keeps a gap. Before it changes anything
// it verifies the segment the log will end in up to the cut, so damage
// nobody had recorded yet is recorded there and refused alike, and it
// refuses to keep a range there that no later batch proves durable
// (recovery would take it for a torn tail). Verify
// re-reads sealed segments trusted through their index (the scrubber) and
// records what it finds the same way. Repair, on a closed
// log, replaces each damaged range with a gap batch (RepairSalvage) or
// cuts the log at the first one and covers everything after with a gap
// (RepairTruncate); either way the log's next seq stays above every seq
// it ever held. A segment whose base seq overlaps its predecessor is
// deleted with every later one; one that leaves seqs missing after its
// predecessor is damage. The recovered state is then synced. Reads verify
// every batch's CRC and never return a damaged record.
//
// # Atomic files
//
// WriteFileAtomic stores small state files as: magic "NAF1", length u32,
// crc32c u32 of the data, data. It writes path+".tmp", syncs it, renames it
// over path and syncs the directory.
package storage
