package sched

import (
	"encoding/binary"
	"fmt"
)

// The layout of a KindCheckpoint record, after its kind byte: base u64,
// chunk u32 (its high bit set when refusing spans follow the entries),
// chunks u32, the five counts u64; topics (u16 count, each a
// u8 length and bytes), lanes (u32 count of topic u16, gate u8,
// incarnation u64), fires (u32 count of topic u16, partition u32, last
// u64), entries (u32 count of topic u16, status u8, id u64, deliver_at
// u64, partition u32, at u64, and for a firing one fire seq, epoch and
// incarnation u64), and when the chunk's high bit is set the lanes'
// refusing spans (u32 count, at least one, of topic u16, from u64, to
// u64). Canonical, like every record; no prefix of one is another.

// ckptRefusingFlag marks a chunk whose refusing spans follow its entries
// (a checkpoint without spans reads as before they were kept).
const ckptRefusingFlag = 1 << 31

func (c *Checkpoint) check() error {
	switch {
	case c.Chunks == 0 || c.Chunks > CheckpointChunksMax || c.Chunk >= c.Chunks:
		return fmt.Errorf("sched: checkpoint chunk %d of %d, want fewer than %d chunks", c.Chunk, c.Chunks, CheckpointChunksMax+1)
	case len(c.Topics) > ckptTopicsMax:
		return fmt.Errorf("sched: checkpoint chunk with %d topics, want at most %d", len(c.Topics), ckptTopicsMax)
	case len(c.Lanes) > RecordEntriesMax || len(c.Fires) > RecordEntriesMax || len(c.Entries) > RecordEntriesMax:
		return fmt.Errorf("sched: checkpoint chunk with %d lanes, %d fires, %d entries, want at most %d each",
			len(c.Lanes), len(c.Fires), len(c.Entries), RecordEntriesMax)
	}
	for _, t := range c.Topics {
		if err := checkTopic(t); err != nil {
			return err
		}
	}
	topic := func(i uint16) error {
		if int(i) >= len(c.Topics) {
			return fmt.Errorf("sched: checkpoint names topic %d of %d", i, len(c.Topics))
		}
		return nil
	}
	for _, l := range c.Lanes {
		if err := topic(l.Topic); err != nil {
			return err
		}
		if l.Gate < GateOpen || l.Gate > GateRetired {
			return fmt.Errorf("sched: checkpoint lane gate %v", l.Gate)
		}
	}
	for _, f := range c.Fires {
		if err := topic(f.Topic); err != nil {
			return err
		}
	}
	if len(c.Refusing) > min(len(c.Topics)*RefusingSpansMax, RecordEntriesMax) || len(c.Refusing) > 0 && c.Chunk != 0 {
		return fmt.Errorf("sched: checkpoint chunk %d with %d refusing spans for %d topics (only the first chunk has them, at most %d a topic)",
			c.Chunk, len(c.Refusing), len(c.Topics), RefusingSpansMax)
	}
	for _, sp := range c.Refusing {
		if err := topic(sp.Topic); err != nil {
			return err
		}
		if sp.To != 0 && sp.To <= sp.From {
			return fmt.Errorf("sched: checkpoint refusing span %d-%d", sp.From, sp.To)
		}
	}
	for _, e := range c.Entries {
		if err := topic(e.Topic); err != nil {
			return err
		}
		switch {
		case e.Status != StatusPending && e.Status != StatusFiring:
			return fmt.Errorf("sched: checkpoint entry status %v", e.Status)
		case e.Status == StatusPending && (e.FireSeq != 0 || e.Epoch != 0 || e.Incarnation != 0):
			return fmt.Errorf("sched: checkpoint entry %d is pending with a fire sequence", e.ID)
		}
	}
	return nil
}

func (c *Checkpoint) encode(b []byte) ([]byte, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	u64 := binary.BigEndian.AppendUint64
	u32 := binary.BigEndian.AppendUint32
	u16 := binary.BigEndian.AppendUint16
	b = u64(b, c.Base)
	if len(c.Refusing) > 0 {
		b = u32(b, c.Chunk|ckptRefusingFlag)
	} else {
		b = u32(b, c.Chunk)
	}
	b = u32(b, c.Chunks)
	for _, n := range []uint64{c.Counts.Admitted, c.Counts.Fired, c.Counts.Unknown, c.Counts.Cancelled, c.Counts.Rejected} {
		b = u64(b, n)
	}
	b = u16(b, uint16(len(c.Topics)))
	for _, t := range c.Topics {
		b = appendTopic(b, t)
	}
	b = u32(b, uint32(len(c.Lanes)))
	for _, l := range c.Lanes {
		b = u16(b, l.Topic)
		b = append(b, byte(l.Gate))
		b = u64(b, l.Incarnation)
	}
	b = u32(b, uint32(len(c.Fires)))
	for _, f := range c.Fires {
		b = u16(b, f.Topic)
		b = u32(b, f.Partition)
		b = u64(b, f.Last)
	}
	b = u32(b, uint32(len(c.Entries)))
	for _, e := range c.Entries {
		b = u16(b, e.Topic)
		b = append(b, byte(e.Status))
		b = u64(b, e.ID)
		b = u64(b, uint64(e.DeliverAtMs))
		b = u32(b, e.Partition)
		b = u64(b, e.At)
		if e.Status == StatusFiring {
			b = u64(b, e.FireSeq)
			b = u64(b, e.Epoch)
			b = u64(b, e.Incarnation)
		}
	}
	if len(c.Refusing) > 0 {
		b = u32(b, uint32(len(c.Refusing)))
		for _, sp := range c.Refusing {
			b = u16(b, sp.Topic)
			b = u64(b, sp.From)
			b = u64(b, sp.To)
		}
	}
	return b, nil
}

func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

// checkpoint reads a checkpoint chunk; every list's count is checked
// against what the value can hold before it is allocated.
func (d *decoder) checkpoint() Checkpoint {
	var c Checkpoint
	c.Base = d.u64()
	c.Chunk = d.u32()
	refusing := c.Chunk&ckptRefusingFlag != 0
	c.Chunk &^= ckptRefusingFlag
	c.Chunks = d.u32()
	c.Counts = Counts{Admitted: d.u64(), Fired: d.u64(), Unknown: d.u64(), Cancelled: d.u64(), Rejected: d.u64()}
	nt := int(d.u16())
	if d.err == nil && len(d.b) < nt*ckptTopicBytesMin {
		d.err = errShort
	}
	if d.err != nil {
		return Checkpoint{}
	}
	if nt > 0 {
		c.Topics = make([]string, nt)
	}
	for i := range c.Topics {
		c.Topics[i] = d.topic()
	}
	if n := d.list(ckptLaneBytes); n > 0 {
		c.Lanes = make([]CheckpointLane, n)
		for i := range c.Lanes {
			c.Lanes[i] = CheckpointLane{Topic: d.u16(), Gate: Gate(d.u8()), Incarnation: d.u64()}
		}
	}
	if n := d.list(ckptFireBytes); n > 0 {
		c.Fires = make([]CheckpointFire, n)
		for i := range c.Fires {
			c.Fires[i] = CheckpointFire{Topic: d.u16(), Partition: d.u32(), Last: d.u64()}
		}
	}
	if n := d.list(ckptEntryBytes); n > 0 {
		c.Entries = make([]CheckpointEntry, n)
		for i := range c.Entries {
			e := CheckpointEntry{Topic: d.u16(), Status: Status(d.u8()), ID: d.u64(), DeliverAtMs: int64(d.u64()), Partition: d.u32(), At: d.u64()}
			if e.Status == StatusFiring {
				e.FireSeq, e.Epoch, e.Incarnation = d.u64(), d.u64(), d.u64()
			}
			c.Entries[i] = e
		}
	}
	if refusing {
		n := d.list(ckptSpanBytes)
		if d.err == nil && n == 0 {
			d.err = fmt.Errorf("sched: checkpoint with an empty list of refusing spans (not canonical)")
		}
		if n > 0 {
			c.Refusing = make([]CheckpointSpan, n)
			for i := range c.Refusing {
				c.Refusing[i] = CheckpointSpan{Topic: d.u16(), From: d.u64(), To: d.u64()}
			}
		}
	}
	if d.err == nil {
		d.err = c.check()
	}
	return c
}
