// Package model is an explicit-state model checker for the replication
// kernel: it explores every interleaving of a small configuration (a few
// replicas, proposals, elections, crashes, message loss and duplication) by
// running the real internal/replica code, hashes each state to visit it
// once, checks the DESIGN §4 invariants in every state, and returns the
// shortest-found action trace to a violation.
package model

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/nereus-broker/nereus/internal/replica"
)

// Config bounds the exploration. Every budget limits how often an action
// kind may occur along one path.
type Config struct {
	Replicas  int
	Policy    replica.AckPolicy
	Proposals int // values proposed
	Campaigns int // election timeouts
	// PreVote: an election timeout starts a pre-vote round, as in
	// production (Replica.ElectionTimeout); otherwise it campaigns at once
	// (Replica.Campaign, the forced path). Followers never tick here, so a
	// follower that knows a leader grants a pre-vote only once its own
	// timer fired.
	PreVote bool
	// EarlyAppends: a node carries out a Ready without a promise or a
	// truncation as the replog shell may (the Ready's relaxation): its
	// APPENDs go out as soon as its entries are written, the fsync is a
	// separate action ("fsyncs"), and a kill -9 before it loses those
	// entries. Otherwise every Ready is durable before anything is sent.
	EarlyAppends bool
	Heartbeats   int // leader ticks (retransmissions)
	Crashes      int // kill -9 and restart from durable state
	Drops        int // messages lost
	Dups         int // messages duplicated
	NetworkMax   int // states with more messages in flight are not explored further
	DepthMax     int // actions along one path
	StatesMax    int // distinct states before giving up (reported, not a failure)
	Mutations    replica.Mutations
	// SendBeforePersist breaks the shared executor (replica.Executor): a
	// Ready's messages all go before its writes are durable.
	SendBeforePersist bool
}

// Result is the outcome of a check.
type Result struct {
	States    int      // distinct states visited
	Pruned    int      // states not expanded (network or depth bound)
	Complete  bool     // false when StatesMax stopped the search
	Violation string   // "" when every visited state satisfied the invariants
	Trace     []string // actions from the initial state to the violation
	MaxEpoch  uint64   // the highest epoch some leader took office in
	Committed int      // the most values any visited state committed
}

type node struct {
	k    *replica.Replica
	hard replica.HardState
	log  []replica.Entry // durable
	// held is the Ready whose APPENDs went out early (EarlyAppends): its
	// Entries are written but not durable, its Messages are the rest,
	// sent after the fsync. The kernel takes no step until then (a shell
	// finishes one Ready before the next event); a crash loses it.
	held *replica.Ready
	// unsynced: entries written, not yet fsynced (held's, between the
	// executor's Begin and Finish).
	unsynced []replica.Entry
}

type state struct {
	nodes     []node
	net       []replica.Message
	used      [6]int   // proposals, campaigns, heartbeats, crashes, drops, dups
	committed []string // ghost: value ever committed at seq i+1 ("epoch/value")
	leaders   []uint32 // ghost: leaders[e] = node that led epoch e (0 = none)
}

const (
	budgetProposals = iota
	budgetCampaigns
	budgetHeartbeats
	budgetCrashes
	budgetDrops
	budgetDups
)

func (c *Config) budget(i int) int {
	return [6]int{c.Proposals, c.Campaigns, c.Heartbeats, c.Crashes, c.Drops, c.Dups}[i]
}

func (s *state) clone() *state {
	c := &state{nodes: make([]node, len(s.nodes)), net: slices.Clone(s.net), used: s.used,
		committed: slices.Clone(s.committed), leaders: slices.Clone(s.leaders)}
	for i, n := range s.nodes {
		c.nodes[i] = node{k: n.k.Clone(), hard: n.hard, log: slices.Clone(n.log), unsynced: slices.Clone(n.unsynced)}
		if n.held != nil {
			rd := *n.held
			rd.Entries, rd.Messages, rd.Early = slices.Clone(rd.Entries), slices.Clone(rd.Messages), slices.Clone(rd.Early)
			c.nodes[i].held = &rd
		}
	}
	return c
}

func (s *state) key() [16]byte {
	var b []byte
	for _, n := range s.nodes {
		if n.held == nil {
			b = n.k.AppendState(b, false) // elections are explicit actions here
			b = append(b, 0)
		} else {
			// A kernel between Ready and Advance has no encoding; its
			// future is the fsync (Advance) or a crash, so encode it as
			// the fsync will leave it, plus what the fsync will do.
			k := n.k.Clone()
			k.Advance(*n.held)
			b = k.AppendState(b, false)
			b = append(b, 1)
			b = binary.AppendUvarint(b, n.held.CommitSeq)
			for _, e := range n.held.Entries {
				b = binary.AppendUvarint(b, e.Epoch)
				b = append(b, e.Data...)
				b = append(b, 0)
			}
			for _, m := range n.held.Messages {
				b = replica.AppendMessage(b, m)
			}
			b = append(b, 0)
		}
		b = binary.AppendUvarint(b, n.hard.Promised)
		b = binary.AppendUvarint(b, uint64(n.hard.PromisedTo))
		b = binary.AppendUvarint(b, uint64(len(n.log)))
		for _, e := range n.log {
			b = binary.AppendUvarint(b, e.Epoch)
			b = append(b, e.Data...)
			b = append(b, 0)
		}
	}
	msgs := make([][]byte, len(s.net))
	for i, m := range s.net {
		msgs[i] = replica.AppendMessage(nil, m)
	}
	slices.SortFunc(msgs, bytes.Compare) // the network is a multiset
	for _, m := range msgs {
		b = binary.AppendUvarint(b, uint64(len(m)))
		b = append(b, m...)
	}
	for _, u := range s.used {
		b = binary.AppendUvarint(b, uint64(u))
	}
	for _, c := range s.committed {
		b = append(b, c...)
		b = append(b, 0)
	}
	for _, l := range s.leaders {
		b = binary.AppendUvarint(b, uint64(l))
	}
	sum := sha256.Sum256(b)
	var k [16]byte
	copy(k[:], sum[:])
	return k
}

func (cfg *Config) ids() []replica.NodeID {
	ids := make([]replica.NodeID, cfg.Replicas)
	for i := range ids {
		ids[i] = replica.NodeID(i + 1)
	}
	return ids
}

func (cfg *Config) newKernel(id replica.NodeID, n *node) *replica.Replica {
	p := replica.PersistedFrom(n.hard, n.log)
	// Election timeouts are explicit actions: a huge ElectionTicks keeps
	// ticks from starting elections on their own.
	k, err := replica.New(replica.Config{ID: id, Replicas: cfg.ids(), Policy: cfg.Policy, HeartbeatTicks: 1,
		ElectionTicks: 1 << 20, AckTimeoutTicks: 1 << 20, Seed: 1, Mutations: cfg.Mutations}, p)
	if err != nil {
		panic(err)
	}
	return k
}

// process carries out node i's Readys with the shared executor and checks
// who took office and what became visible. Under EarlyAppends a Ready
// that sent messages before its entries are durable (its Early APPENDs,
// or everything under SendBeforePersist) is held: the fsync is a separate
// action, and a kill -9 before it loses the entries.
func (cfg *Config) process(s *state, i int) string {
	n := &s.nodes[i]
	x := cfg.executor(s, i)
	for n.held == nil && n.k.HasReady() {
		rd, err := x.Begin(n.k)
		if err != nil {
			panic(err) // the model's store does not fail
		}
		st := n.k.Status()
		if st.Role == replica.Leader && (uint64(len(s.leaders)) <= st.Hard.Promised || s.leaders[st.Hard.Promised] != uint32(i+1)) {
			if v := cfg.tookOffice(s, i, st.Hard.Promised); v != "" {
				return v
			}
		}
		if st.Anomalies > 0 {
			return fmt.Sprintf("KernelAssertion: n%d refused an impossible message (a second leader of an epoch, or a rewrite of a committed entry)", i+1)
		}
		// Only a Ready with entries and something sent early is split: a
		// follower's, whose FLUSHED waits for the fsync anyway, would only
		// add states that a crash before the Ready already covers.
		if cfg.EarlyAppends && len(rd.Entries) > 0 && (len(rd.Early) > 0 || x.SendBeforePersist) {
			n.held = &rd
			return ""
		}
		if v := cfg.finish(s, i, rd); v != "" {
			return v
		}
	}
	return ""
}

// executor is node i's Ready executor: its store is the node's logs, its
// network the state's.
func (cfg *Config) executor(s *state, i int) *replica.Executor {
	return &replica.Executor{Store: modelStore{&s.nodes[i]}, Send: func(m replica.Message) { s.net = append(s.net, m) },
		SendBeforePersist: cfg.SendBeforePersist}
}

// modelStore is a node's durable state: the hard state and truncations are
// durable at once, appends at Sync (a crash loses them before).
type modelStore struct{ n *node }

func (ms modelStore) InstallSnapshot(replica.SnapshotMeta) error {
	panic("model: nothing compacts, so no snapshot is installed")
}
func (ms modelStore) SetHardState(h replica.HardState) error { ms.n.hard = h; return nil }
func (ms modelStore) TruncateAfter(seq uint64) error {
	ms.n.log, ms.n.unsynced = ms.n.log[:seq], nil
	return nil
}
func (ms modelStore) Append(entries []replica.Entry) error {
	ms.n.unsynced = append(ms.n.unsynced, entries...)
	return nil
}
func (ms modelStore) Sync() error {
	ms.n.log, ms.n.unsynced = append(ms.n.log, ms.n.unsynced...), nil
	return nil
}
func (ms modelStore) Entries(first, last uint64) ([]replica.Entry, error) {
	all := append(slices.Clone(ms.n.log), ms.n.unsynced...)
	return slices.Clone(all[first-1 : min(last, uint64(len(all)))]), nil
}

// finish completes node i's Ready (fsync, the rest of its messages,
// Advance) and checks what became visible.
func (cfg *Config) finish(s *state, i int, rd replica.Ready) string {
	if err := cfg.executor(s, i).Finish(s.nodes[i].k, rd); err != nil {
		panic(err)
	}
	return cfg.checkCommit(s, i, rd.CommitSeq)
}

// fsync makes node i's early-sent entries durable, sends the rest of
// their Ready and carries on with the next one.
func (cfg *Config) fsync(s *state, i int) string {
	n := &s.nodes[i]
	rd := *n.held
	n.held = nil
	if v := cfg.finish(s, i, rd); v != "" {
		return v
	}
	return cfg.process(s, i)
}

func (cfg *Config) quorum() int { return cfg.Replicas/2 + 1 }

// tookOffice checks OneLeaderPerEpoch and InstallNeedsQuorumPromise.
func (cfg *Config) tookOffice(s *state, i int, epoch uint64) string {
	for uint64(len(s.leaders)) <= epoch {
		s.leaders = append(s.leaders, 0)
	}
	if l := s.leaders[epoch]; l != 0 && l != uint32(i+1) {
		return fmt.Sprintf("OneLeaderPerEpoch: epoch %d led by n%d and n%d", epoch, l, i+1)
	}
	s.leaders[epoch] = uint32(i + 1)
	promised := 0
	for _, n := range s.nodes {
		if n.hard.Promised >= epoch {
			promised++
		}
	}
	if promised < cfg.quorum() {
		return fmt.Sprintf("InstallNeedsQuorumPromise: n%d installed epoch %d with %d durable promises", i+1, epoch, promised)
	}
	return ""
}

// checkCommit checks VisibleImpliesQuorumFlushed, CommittedPrefixAgreement
// and VisibleMonotonic for what node i just made visible.
func (cfg *Config) checkCommit(s *state, i int, commit uint64) string {
	if commit == 0 {
		return ""
	}
	n := &s.nodes[i]
	need := cfg.quorum()
	if cfg.Policy == replica.SyncAll {
		need = cfg.Replicas
	}
	for seq := uint64(1); seq <= commit; seq++ {
		if seq > uint64(len(n.log)) {
			return fmt.Sprintf("VisibleImpliesQuorumFlushed: n%d made %d visible, its log ends at %d", i+1, seq, len(n.log))
		}
		e := n.log[seq-1]
		id := fmt.Sprintf("%d/%s", e.Epoch, e.Data)
		if int(seq) <= len(s.committed) {
			if s.committed[seq-1] != id {
				return fmt.Sprintf("CommittedPrefixAgreement: seq %d visible as %s on n%d, before as %s", seq, id, i+1, s.committed[seq-1])
			}
			continue
		}
		holders := 0
		for _, o := range s.nodes {
			if uint64(len(o.log)) >= seq && o.log[seq-1].Epoch == e.Epoch && string(o.log[seq-1].Data) == string(e.Data) {
				holders++
			}
		}
		if holders < need {
			return fmt.Sprintf("VisibleImpliesQuorumFlushed: seq %d (%s) visible on n%d, durable on %d of %d needed", seq, id, i+1, holders, need)
		}
		s.committed = append(s.committed, id)
	}
	return ""
}

type step struct {
	action string
	next   *state
	err    string
}

// successors applies every enabled action to s.
func (cfg *Config) successors(s *state) []step {
	var out []step
	add := func(action string, budget int, apply func(t *state) string) {
		if budget >= 0 && s.used[budget] >= cfg.budget(budget) {
			return
		}
		t := s.clone()
		if budget >= 0 {
			t.used[budget]++
		}
		out = append(out, step{action: action, next: t, err: apply(t)})
	}
	for mi, m := range s.net {
		mi, m := mi, m
		if s.nodes[m.To-1].held == nil { // a node finishing a Ready takes no message
			add("deliver "+m.String(), -1, func(t *state) string {
				t.net = slices.Delete(t.net, mi, mi+1)
				to := int(m.To) - 1
				t.nodes[to].k.Step(m)
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
		st := s.nodes[i].k.Status()
		if s.nodes[i].held != nil {
			add(fmt.Sprintf("n%d fsyncs", i+1), -1, func(t *state) string {
				return cfg.fsync(t, i)
			})
		} else if st.Role != replica.Leader && cfg.PreVote {
			add(fmt.Sprintf("n%d times out and pre-votes", i+1), budgetCampaigns, func(t *state) string {
				t.nodes[i].k.ElectionTimeout()
				return cfg.process(t, i)
			})
		} else if st.Role != replica.Leader {
			add(fmt.Sprintf("n%d times out and campaigns", i+1), budgetCampaigns, func(t *state) string {
				t.nodes[i].k.Campaign()
				return cfg.process(t, i)
			})
		} else {
			add(fmt.Sprintf("n%d heartbeat", i+1), budgetHeartbeats, func(t *state) string {
				t.nodes[i].k.Tick()
				return cfg.process(t, i)
			})
			v := fmt.Sprintf("v%d", s.used[budgetProposals]+1)
			add(fmt.Sprintf("n%d proposes %s", i+1, v), budgetProposals, func(t *state) string {
				if _, _, err := t.nodes[i].k.Propose([]byte(v)); err != nil {
					return ""
				}
				return cfg.process(t, i)
			})
		}
		add(fmt.Sprintf("n%d kill -9 and restart", i+1), budgetCrashes, func(t *state) string {
			t.nodes[i].held, t.nodes[i].unsynced = nil, nil // written, never fsynced: lost
			t.nodes[i].k = cfg.newKernel(replica.NodeID(i+1), &t.nodes[i])
			return ""
		})
	}
	return out
}

// initial is the state every exploration starts from: empty logs, no
// promise, nothing in flight.
func (cfg *Config) initial() *state {
	s := &state{nodes: make([]node, cfg.Replicas)}
	for i := range s.nodes {
		s.nodes[i].k = cfg.newKernel(replica.NodeID(i+1), &s.nodes[i])
	}
	return s
}

// Check explores the configuration depth-first and returns the first
// violation with its trace, or the counts of a clean exploration.
func Check(cfg Config) Result {
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	if cfg.NetworkMax == 0 {
		cfg.NetworkMax = 6
	}
	if cfg.DepthMax == 0 {
		cfg.DepthMax = 40
	}
	if cfg.StatesMax == 0 {
		cfg.StatesMax = 500_000
	}
	init := cfg.initial()
	res := Result{Complete: true}
	visited := map[[16]byte]struct{}{init.key(): {}}
	type frame struct {
		s     *state
		steps []step
		next  int
		via   string
	}
	stack := []*frame{{s: init, steps: cfg.successors(init)}}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		if f.next >= len(f.steps) {
			stack = stack[:len(stack)-1]
			continue
		}
		st := f.steps[f.next]
		f.next++
		if st.err != "" {
			res.Violation = st.err
			for _, fr := range stack[1:] {
				res.Trace = append(res.Trace, fr.via)
			}
			res.Trace = append(res.Trace, st.action)
			res.States = len(visited)
			return res
		}
		k := st.next.key()
		if _, seen := visited[k]; seen {
			continue
		}
		visited[k] = struct{}{}
		if n := uint64(len(st.next.leaders)); n > 0 {
			res.MaxEpoch = max(res.MaxEpoch, n-1)
		}
		res.Committed = max(res.Committed, len(st.next.committed))
		if len(visited) >= cfg.StatesMax {
			res.Complete = false
			break
		}
		if len(st.next.net) > cfg.NetworkMax || len(stack) >= cfg.DepthMax {
			res.Pruned++
			continue
		}
		stack = append(stack, &frame{s: st.next, steps: cfg.successors(st.next), via: st.action})
	}
	res.States = len(visited)
	return res
}
