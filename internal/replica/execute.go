package replica

// Store is a replica's durable state as an Executor writes it: the
// shell's storage (replog's log and state files, the model checker's
// abstract logs, the tests' slices).
type Store interface {
	// InstallSnapshot replaces the log with the leader's snapshot point:
	// the log becomes empty after it. Durable when it returns.
	InstallSnapshot(SnapshotMeta) error
	// SetHardState records the hard state. Durable when it returns.
	SetHardState(HardState) error
	// TruncateAfter drops every entry after seq; Append writes entries
	// after the log's end. Both are durable after the next Sync.
	TruncateAfter(seq uint64) error
	Append([]Entry) error
	Sync() error
	// Entries returns the written entries first..last (fewer when the
	// log holds fewer), with their data, for an Append message.
	Entries(first, last uint64) ([]Entry, error)
}

// Executor carries out a replica's Readys against its Store by the
// ordering rule (see Ready): the one executor of every driver —
// production's replog, the simulator and the model checker — so none
// re-derives the rule.
type Executor struct {
	Store Store
	// Send hands a message to the network; it must not block.
	Send func(Message)
	// SendBeforePersist is a deliberate bug for mutation tests: every
	// message of a Ready (FLUSHED and promises included) goes out before
	// its writes are durable.
	SendBeforePersist bool
}

// Begin takes k's next Ready, writes it (durably for the snapshot and the
// hard state; the log's writes wait for Finish's Sync) and sends its Early
// messages. Finish completes it; a driver may let other things happen in
// between (the model checker explores a crash there).
func (x *Executor) Begin(k *Replica) (Ready, error) {
	rd := k.Ready()
	if x.SendBeforePersist {
		if err := x.send(k, rd, rd.Early); err != nil {
			return rd, err
		}
		if err := x.send(k, rd, rd.Messages); err != nil {
			return rd, err
		}
		rd.Early, rd.Messages = nil, nil
	}
	if rd.Snapshot != nil {
		if err := x.Store.InstallSnapshot(*rd.Snapshot); err != nil {
			return rd, err
		}
	}
	if rd.HardState != nil {
		if err := x.Store.SetHardState(*rd.HardState); err != nil {
			return rd, err
		}
	}
	if rd.Truncate {
		if err := x.Store.TruncateAfter(rd.TruncateAfter); err != nil {
			return rd, err
		}
	}
	if len(rd.Entries) > 0 {
		if err := x.Store.Append(rd.Entries); err != nil {
			return rd, err
		}
	}
	return rd, x.send(k, rd, rd.Early)
}

// Finish makes rd's log writes durable, sends its remaining messages and
// tells k it is carried out.
func (x *Executor) Finish(k *Replica, rd Ready) error {
	if rd.Truncate || len(rd.Entries) > 0 {
		if err := x.Store.Sync(); err != nil {
			return err
		}
	}
	if err := x.send(k, rd, rd.Messages); err != nil {
		return err
	}
	k.Advance(rd)
	return nil
}

// Run carries out every Ready k has. It reports the highest commit point
// the Readys announced (0: none).
func (x *Executor) Run(k *Replica) (commit uint64, err error) {
	for k.HasReady() {
		rd, err := x.Begin(k)
		if err != nil {
			return commit, err
		}
		if err := x.Finish(k, rd); err != nil {
			return commit, err
		}
		commit = max(commit, rd.CommitSeq)
	}
	return commit, nil
}

// send sends msgs, attaching their entries to Appends: from the Ready when
// it holds the range (a leader's fresh proposals, possibly not durable
// yet), else from the store. An Append whose store read stopped short
// goes with what was read, and k hears where it ended (AppendShort).
func (x *Executor) send(k *Replica, rd Ready, msgs []Message) error {
	for _, m := range msgs {
		if m.Type == MsgAppend && m.FirstSeq != 0 {
			if n := len(rd.Entries); n > 0 && m.FirstSeq >= rd.Entries[0].Seq && m.LastSeqSent <= rd.Entries[n-1].Seq {
				m.Entries = rd.Entries[m.FirstSeq-rd.Entries[0].Seq : m.LastSeqSent-rd.Entries[0].Seq+1]
			} else {
				entries, err := x.Store.Entries(m.FirstSeq, m.LastSeqSent)
				if err != nil {
					return err
				}
				m.Entries = entries
				if n := len(entries); n > 0 && entries[n-1].Seq < m.LastSeqSent {
					m.LastSeqSent = entries[n-1].Seq
					k.AppendShort(m.To, m.LastSeqSent)
				}
			}
		}
		x.Send(m)
	}
	return nil
}
