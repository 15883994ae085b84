package replica

import "encoding/binary"

// AppendState appends a deterministic encoding of the replica's whole state
// to b: equal states encode equally, so the model checker can hash it. Call
// it between a Ready and the next step only after Advance (no pending work).
// Without timers, the election clock (elapsed ticks, timeout, jitter
// source) is left out: a checker that drives elections explicitly and
// never ticks followers may merge states that differ only there.
func (r *Replica) AppendState(b []byte, timers bool) []byte {
	u := func(v uint64) { b = binary.AppendUvarint(b, v) }
	u(uint64(r.cfg.ID))
	u(uint64(r.role))
	u(r.hard.Promised)
	u(uint64(r.hard.PromisedTo))
	u(uint64(r.leader))
	u(uint64(len(r.epochs)))
	for _, e := range r.epochs {
		u(e.Epoch)
		u(e.StartSeq)
	}
	u(r.last)
	u(r.snapSeq)
	flags := uint64(0)
	if r.rebuilding {
		flags |= 1
	}
	if r.uncertain {
		flags |= 2
	}
	if r.lost {
		flags |= 4
	}
	u(flags)
	u(r.uncertainEpoch)
	u(r.lostNonce)
	u(r.reportMax)
	u(r.durable)
	u(r.commit)
	u(uint64(r.heartbeatElapsed))
	if r.heardLeaderTick == 0 {
		u(0)
	} else {
		u(1 + min(r.ticks+1-r.heardLeaderTick, uint64(r.cfg.ElectionTicks)))
	}
	if timers {
		u(uint64(r.electionElapsed))
		u(uint64(r.electionTimeout))
		u(r.rng)
	}
	for i := range r.peers {
		flags := uint64(0)
		if r.grants[i] {
			flags |= 1
		}
		if r.dirty[i] {
			flags |= 2
		}
		if r.preGrants[i] {
			flags |= 4
		}
		if r.uncertainGrants[i] {
			flags |= 8
		}
		if r.damagedRefusals[i] {
			flags |= 16
		}
		if r.preAnswered[i] {
			flags |= 32
		}
		if r.reported[i] {
			flags |= 64
		}
		if r.unknown[i] {
			flags |= 128
		}
		u(flags)
		u(r.match[i])
		u(r.next[i])
		u(uint64(r.heard[i]))
		u(r.chaseLag[i])
		u(uint64(r.chaseAge[i]))
		if r.revoked[i] {
			u(1)
		} else {
			u(0)
		}
	}
	ro := uint64(0)
	if r.readOnly {
		ro = 1
	}
	if r.preVoting {
		ro |= 2
	}
	u(ro)
	u(r.installAt)
	u(r.anomalies)
	u(r.lastCommitOut)
	u(uint64(r.transferee))
	u(uint64(r.transferElapsed))
	if r.timeoutNowSent {
		u(1)
	} else {
		u(0)
	}
	u(uint64(r.preferredStable))
	u(uint64(r.rebalanceIdle))
	u(uint64(r.transferWanted))
	if r.hardChanged || len(r.pending.Entries) > 0 || r.pending.Truncate || len(r.pending.Messages) > 0 || r.pending.Snapshot != nil {
		panic("replica: AppendState with a pending Ready")
	}
	return b
}

// AppendMessage appends a deterministic encoding of m to b.
func AppendMessage(b []byte, m Message) []byte {
	u := func(v uint64) { b = binary.AppendUvarint(b, v) }
	u(uint64(m.Type))
	u(uint64(m.From))
	u(uint64(m.To))
	u(m.Epoch)
	u(m.LastEpoch)
	u(m.LastSeq)
	flags := uint64(0)
	if m.Granted {
		flags |= 1
	}
	if m.Uncertain {
		flags |= 2
	}
	if m.Damaged {
		flags |= 4
	}
	u(flags)
	u(m.PrevSeq)
	u(m.PrevEpoch)
	u(m.FirstSeq)
	u(m.LastSeqSent)
	u(m.CommitSeq)
	u(m.FlushedSeq)
	u(uint64(m.Reject))
	u(m.HintSeq)
	if m.Type == MsgPromiseQuery || m.Type == MsgPromiseReport {
		u(m.Tick) // the loss's nonce (an Append's lease tick is left out)
	}
	u(uint64(len(m.Entries)))
	for _, e := range m.Entries {
		u(e.Seq)
		u(e.Epoch)
		u(uint64(len(e.Data)))
		b = append(b, e.Data...)
	}
	return b
}
