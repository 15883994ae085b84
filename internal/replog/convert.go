package replog

import (
	"github.com/nereus-broker/nereus/internal/replica"
	"github.com/nereus-broker/nereus/internal/wire"
)

// ToWire encodes a kernel message for the peer transport.
func ToWire(topic string, partition uint32, m replica.Message) *wire.Replicate {
	w := &wire.Replicate{Topic: topic, Partition: partition, Kind: uint8(m.Type), From: uint32(m.From), To: uint32(m.To),
		Epoch: m.Epoch, LastEpoch: m.LastEpoch, LastSeq: m.LastSeq, Granted: m.Granted, Uncertain: m.Uncertain, Damaged: m.Damaged, Forced: m.Forced, PrevSeq: m.PrevSeq,
		PrevEpoch: m.PrevEpoch, CommitSeq: m.CommitSeq, FlushedSeq: m.FlushedSeq, Reject: uint8(m.Reject), HintSeq: m.HintSeq, Tick: m.Tick}
	if len(m.Entries) > 0 {
		w.Entries = make([]wire.ReplicaEntry, len(m.Entries)) // once, not grown entry by entry
		for i, e := range m.Entries {
			w.Entries[i] = wire.ReplicaEntry{Seq: e.Seq, Epoch: e.Epoch, Data: e.Data}
		}
	}
	return w
}

// FromWire decodes a peer frame into a kernel message. FirstSeq and
// LastSeqSent are derived from the entries it carries.
func FromWire(w *wire.Replicate) replica.Message {
	m := replica.Message{Type: replica.MsgType(w.Kind), From: replica.NodeID(w.From), To: replica.NodeID(w.To),
		Epoch: w.Epoch, LastEpoch: w.LastEpoch, LastSeq: w.LastSeq, Granted: w.Granted, Uncertain: w.Uncertain, Damaged: w.Damaged, Forced: w.Forced, PrevSeq: w.PrevSeq,
		PrevEpoch: w.PrevEpoch, CommitSeq: w.CommitSeq, FlushedSeq: w.FlushedSeq, Reject: replica.Reject(w.Reject), HintSeq: w.HintSeq, Tick: w.Tick}
	if len(w.Entries) > 0 {
		m.Entries = make([]replica.Entry, len(w.Entries)) // once, not grown entry by entry
		for i, e := range w.Entries {
			m.Entries[i] = replica.Entry{Seq: e.Seq, Epoch: e.Epoch, Data: e.Data}
		}
		m.FirstSeq, m.LastSeqSent = m.Entries[0].Seq, m.Entries[len(m.Entries)-1].Seq
	}
	return m
}
