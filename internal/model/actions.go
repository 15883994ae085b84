package model

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nereus-broker/nereus/internal/replica"
)

// process carries out node i's Readys with the shared executor and checks
// who took office and what became visible. Under EarlyAppends a Ready
// that sent messages before its entries are durable (its Early APPENDs,
// or everything under SendBeforePersist) is held: the fsync is a separate
// action, and a kill -9 before it loses the entries. Under CrashPartial a
// Ready that writes the log or installs a snapshot and sent nothing is
// held silently while a crash is still in the budget (settle resolves it).
func (cfg *Config) process(s *state, i int) string {
	n := s.mut(i)
	// Anomalies come from Step, which may leave nothing to do: check them
	// before the Readys.
	if n.k.Status().Anomalies > 0 {
		return fmt.Sprintf("KernelAssertion: n%d refused an impossible message (a second leader of an epoch, or a rewrite of a committed entry)", i+1)
	}
	for n.held == nil && n.k.HasReady() {
		pre, sent := n.disk.clone(), len(s.net)
		n.writes = nil
		x := cfg.executor(s, i)
		rd, err := x.Begin(n.k)
		if errors.Is(err, errNotCommitted) {
			return err.Error()
		} else if err != nil {
			panic(err) // the model's store fails only on a model bug
		}
		if rd.Snapshot != nil {
			s.events |= evSnapshotInstall
		}
		st := n.k.Status()
		if st.Role == replica.Leader && s.ghost.Leader(st.Hard.Promised) != uint32(i+1) {
			if v := cfg.tookOffice(s, i, st.Hard.Promised); v != "" {
				return v
			}
			if n.transferEpoch == st.Hard.Promised {
				s.events |= evTransferLeader
			}
		}
		// Only a Ready with entries and something sent early is split: a
		// follower's, whose FLUSHED waits for the fsync anyway, would only
		// add states that a crash before the Ready already covers — unless
		// a crash may keep part of its writes (CrashPartial).
		early := cfg.EarlyAppends && len(rd.Entries) > 0 && (len(rd.Early) > 0 || x.SendBeforePersist)
		partial := cfg.CrashPartial && len(s.net) == sent && s.used[budgetCrashes] < cfg.Crashes &&
			(rd.Truncate || len(rd.Entries) > 0 || rd.Snapshot != nil)
		if early || partial {
			n.held, n.silent, n.pre = &rd, !early, &pre
			return ""
		}
		n.writes = nil
		if v := cfg.finish(s, i, rd); v != "" {
			return v
		}
	}
	if n.uncertain && !n.k.Status().Uncertain {
		n.uncertain = false // the shell removes its mark
	}
	if n.rebuilding && !n.k.Status().Rebuilding {
		n.rebuilding = false // whole again: the shell removes its mark
		s.events |= evRebuilt
	}
	if n.promiseLost && !n.k.Status().PromiseLost {
		n.promiseLost = false // the hard state is written: the mark goes
		s.events |= evPromiseRecovered
	}
	return ""
}

// executor is node i's Ready executor: its store is the node's disk, its
// network the state's.
func (cfg *Config) executor(s *state, i int) *replica.Executor {
	return &replica.Executor{Store: modelStore{&s.nodes[i], s.committed}, Send: func(m replica.Message) { s.net = append(s.net, m) },
		SendBeforePersist: cfg.SendBeforePersist}
}

// finish completes node i's Ready (fsync, the rest of its messages,
// Advance) and checks what became visible.
func (cfg *Config) finish(s *state, i int, rd replica.Ready) string {
	if err := cfg.executor(s, i).Finish(s.nodes[i].k, rd); err != nil {
		panic(err)
	}
	return cfg.checkCommit(s, i, rd.CommitSeq)
}

// fsync makes node i's held Ready durable, sends the rest of its messages
// and carries on with the next one.
func (cfg *Config) fsync(s *state, i int) string {
	n := s.mut(i)
	rd := *n.held
	n.held, n.silent, n.pre, n.writes = nil, false, nil, nil
	if v := cfg.finish(s, i, rd); v != "" {
		return v
	}
	return cfg.process(s, i)
}

// crashPoints are the numbers of its held Ready's writes a crash of node i
// may keep: from the writes durable once Begin returned (a snapshot
// install, the hard state), or from none when nothing has left the node
// yet (the crash may as well have come before them); without
// CrashPartial only that least.
func (cfg *Config) crashPoints(n *node) (least, most int) {
	if !n.silent {
		for least < len(n.writes) && n.writes[least].durableAtOnce() {
			least++
		}
	}
	if !cfg.CrashPartial {
		return least, least
	}
	return least, len(n.writes)
}

// crashName names the crash of node i that keeps kept of its held
// Ready's writes.
func (cfg *Config) crashName(n *node, i, kept int) string {
	if least, _ := cfg.crashPoints(n); n.held == nil || kept == least && !n.silent {
		return fmt.Sprintf("n%d kill -9 and restart", i+1)
	}
	names := make([]string, kept)
	for j, w := range n.writes[:kept] {
		names[j] = w.String()
	}
	return fmt.Sprintf("n%d kill -9 keeping %d of %d writes [%s] and restart", i+1, kept, len(n.writes), strings.Join(names, ", "))
}

// crash kills node i, keeping kept of its held Ready's writes, and
// restarts it from its disk.
func (cfg *Config) crash(s *state, i, kept int) {
	n := s.mut(i)
	if n.held != nil {
		s.events |= evMidReadyCrash
		if slices.ContainsFunc(n.writes[kept:], func(w write) bool { return w.kind == writeTruncate }) {
			s.events |= evTruncationUndone
		}
		d := n.pre.clone()
		for _, w := range n.writes[:kept] {
			d.apply(w)
		}
		n.disk = d
	}
	n.held, n.silent, n.pre, n.writes, n.unsynced = nil, false, nil, nil, nil // written, never fsynced: lost
	n.k = cfg.newKernel(replica.NodeID(i+1), n)
}

// settle follows a step that left a node silently holding a Ready with
// every way it can end: its fsync (and whatever follows), or a crash
// after each prefix of its writes.
func (cfg *Config) settle(out []rstep, action string, t *state, err string) []rstep {
	var crashes []rstep
	for err == "" {
		i := slices.IndexFunc(t.nodes, func(n node) bool { return n.silent })
		if i < 0 {
			break
		}
		least, most := cfg.crashPoints(&t.nodes[i])
		for kept := least; kept <= most; kept++ {
			c := t.clone()
			c.events = t.events
			c.used[budgetCrashes]++
			name := cfg.crashName(&c.nodes[i], i, kept)
			cfg.crash(c, i, kept)
			crashes = append(crashes, rstep{action: action + "; " + name, next: c})
		}
		err = cfg.fsync(t, i)
	}
	// The fsync first, the crashes after it: a bounded depth-first search
	// then tries crashes at every Ready near its frontier (with the
	// crashes first, the first one took the budget for the whole run).
	return append(append(out, rstep{action: action, next: t, err: err}), crashes...)
}

// compact replaces node i's log up to its RetainFloor (floor) with a
// snapshot, as replog's compaction does: the kernel must accept the very
// point, the shell must hold it durably, and it must be committed.
func (cfg *Config) compact(s *state, i int, floor uint64) string {
	n := s.mut(i)
	if at := n.k.CompactTo(floor); at != floor {
		return fmt.Sprintf("KernelAssertion: n%d's kernel compacted to %d, not to its RetainFloor %d", i+1, at, floor)
	}
	if floor > n.last() {
		return fmt.Sprintf("KernelAssertion: n%d may compact to %d, past its durable log end %d", i+1, floor, n.last())
	}
	for seq := n.snapSeq + 1; seq <= floor; seq++ {
		e, _ := n.entry(seq, s.committed)
		if seq > uint64(len(s.committed)) || !sameEntry(e, s.committed[seq-1]) {
			return fmt.Sprintf("CommittedPrefixAgreement: n%d compacts to %d; its entry %d (%s) is not the committed one", i+1, floor, seq, entryID(e))
		}
	}
	e, _ := n.entry(floor, s.committed)
	n.log = slices.Clone(n.log[floor-n.snapSeq:])
	n.snapSeq, n.snapEpoch = floor, e.Epoch
	s.events |= evCompaction
	return ""
}

// successors applies every enabled action to s.
func (cfg *Config) successors(s *state) []rstep {
	var out []rstep
	add := func(action string, budget int, apply func(t *state) string) {
		if budget >= 0 && s.used[budget] >= cfg.budget(budget) {
			return
		}
		t := s.clone()
		if budget >= 0 {
			t.used[budget]++
		}
		out = cfg.settle(out, action, t, apply(t))
	}
	status := make([]replica.Status, len(s.nodes))
	for i := range s.nodes {
		status[i] = s.nodes[i].k.Status()
	}
	for mi, m := range s.net {
		mi, m := mi, m
		if to := int(m.To) - 1; s.nodes[to].held == nil { // a node finishing a Ready takes no message
			add("deliver "+m.String(), -1, func(t *state) string {
				t.net = slices.Delete(t.net, mi, mi+1)
				if m.Type == replica.MsgAppend && m.PrevSeq < t.nodes[to].snapSeq {
					t.events |= evAppendBelowSnapshot
				}
				if m.Type == replica.MsgPrepareAck && m.Uncertain {
					t.events |= evUncertainGrant
				}
				if m.Type == replica.MsgPrepareAck && m.Damaged {
					t.events |= evDamagedRefusal
				}
				t.mut(to).k.Step(m)
				if status[to].ReadOnly && !t.nodes[to].k.Status().ReadOnly {
					t.events |= evReadOnlyBack
				}
				if promised := t.nodes[to].k.Status().Hard.Promised; m.Type == replica.MsgTimeoutNow && promised > status[to].Hard.Promised {
					t.events |= evTransferCampaign
					t.nodes[to].transferEpoch = promised
				}
				return cfg.process(t, to)
			})
		}
		add("drop "+m.String(), budgetDrops, func(t *state) string {
			t.net = slices.Delete(t.net, mi, mi+1)
			return ""
		})
		add("duplicate "+m.String(), budgetDups, func(t *state) string {
			t.net = append(t.net, m)
			return ""
		})
	}
	for i := range s.nodes {
		i := i
		st := status[i]
		if n := &s.nodes[i]; n.held != nil {
			add(fmt.Sprintf("n%d fsyncs", i+1), -1, func(t *state) string {
				return cfg.fsync(t, i)
			})
			least, most := cfg.crashPoints(n)
			for kept := least; kept <= most; kept++ {
				add(cfg.crashName(n, i, kept), budgetCrashes, func(t *state) string {
					cfg.crash(t, i, kept)
					return ""
				})
			}
			continue
		}
		switch {
		case st.PromiseLost:
			// Its tick asks the peers that have not reported (once the
			// queries in flight are answered or lost).
			if !slices.ContainsFunc(s.net, func(m replica.Message) bool { return m.Type == replica.MsgPromiseQuery && int(m.From) == i+1 }) {
				add(fmt.Sprintf("n%d asks its peers for their promises", i+1), -1, func(t *state) string {
					t.mut(i).k.Tick()
					return cfg.process(t, i)
				})
			}
		case st.Role != replica.Leader && cfg.PreVote:
			add(fmt.Sprintf("n%d times out and pre-votes", i+1), budgetCampaigns, func(t *state) string {
				t.mut(i).k.ElectionTimeout()
				return cfg.process(t, i)
			})
		case st.Role != replica.Leader:
			add(fmt.Sprintf("n%d times out and campaigns", i+1), budgetCampaigns, func(t *state) string {
				t.mut(i).k.Campaign()
				return cfg.process(t, i)
			})
		default:
			add(fmt.Sprintf("n%d heartbeat", i+1), budgetHeartbeats, func(t *state) string {
				t.mut(i).k.Tick()
				return cfg.process(t, i)
			})
			add(fmt.Sprintf("n%d hears no follower for its ack timeout", i+1), budgetAckTimeouts, func(t *state) string {
				for range cfg.ackTimeoutTicks() + 1 {
					t.mut(i).k.Tick()
				}
				after := t.nodes[i].k.Status()
				if after.ReadOnly {
					t.events |= evReadOnly
				}
				if st.TransferTo != 0 && after.TransferTo == 0 && after.Role == replica.Leader {
					t.events |= evTransferAbandoned
				}
				return cfg.process(t, i)
			})
			for j := range s.nodes {
				if j != i && st.TransferTo == 0 {
					add(fmt.Sprintf("n%d transfers leadership to n%d", i+1, j+1), budgetTransfers, func(t *state) string {
						if err := t.mut(i).k.TransferTo(replica.NodeID(j + 1)); err != nil && !st.ReadOnly {
							return fmt.Sprintf("KernelAssertion: n%d refused to transfer leadership to n%d: %v", i+1, j+1, err)
						}
						return cfg.process(t, i)
					})
				}
			}
			v := fmt.Sprintf("v%d", s.used[budgetProposals]+1)
			add(fmt.Sprintf("n%d proposes %s", i+1, v), budgetProposals, func(t *state) string {
				_, _, err := t.mut(i).k.Propose([]byte(v))
				if st.ReadOnly && err == nil {
					return fmt.Sprintf("ReadOnlyRefusesWrites: n%d accepted %s while READ_ONLY_DEGRADED", i+1, v)
				}
				if st.TransferTo != 0 && err == nil {
					return fmt.Sprintf("TransferRefusesWrites: n%d accepted %s while handing leadership to n%d", i+1, v, st.TransferTo)
				}
				if err != nil {
					return ""
				}
				return cfg.process(t, i)
			})
		}
		if floor := s.nodes[i].k.RetainFloor(); floor > s.nodes[i].snapSeq {
			add(fmt.Sprintf("n%d compacts to %d", i+1, floor), budgetCompactions, func(t *state) string {
				return cfg.compact(t, i, floor)
			})
		}
		add(fmt.Sprintf("n%d kill -9 and restart", i+1), budgetCrashes, func(t *state) string {
			cfg.crash(t, i, 0)
			return ""
		})
		if len(s.nodes[i].log) > 0 {
			add(fmt.Sprintf("n%d's last entry goes bad; it restarts cutting it", i+1), budgetDamages, func(t *state) string {
				n := t.mut(i)
				n.lost = append(n.lost, n.log[len(n.log)-1])
				n.log = n.log[:len(n.log)-1]
				n.uncertain = true
				cfg.crash(t, i, 0)
				return ""
			})
		}
		for k := range s.nodes[i].log {
			seq := s.nodes[i].log[k].Seq
			add(fmt.Sprintf("n%d's entry %d goes bad; it drops it and what follows and restarts rebuilding", i+1, seq), budgetRebuilds, func(t *state) string {
				n := t.mut(i)
				n.lost = append(n.lost, n.log[k:]...)
				n.log = n.log[:k]
				n.rebuilding = true
				cfg.crash(t, i, 0)
				return ""
			})
		}
		add(fmt.Sprintf("n%d's hard state goes bad; it restarts with its promise lost", i+1), budgetPromiseLosses, func(t *state) string {
			n := t.mut(i)
			n.promisedBeforeLoss = max(n.promisedBeforeLoss, n.hard.Promised)
			n.hard, n.promiseLost = replica.HardState{}, true
			n.lostNonce++
			cfg.crash(t, i, 0)
			return cfg.process(t, i) // a mutated kernel may write at once
		})
	}
	return out
}
