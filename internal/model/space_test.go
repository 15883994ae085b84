package model

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/replica"
)

// truncation is the walk to a follower's Ready that truncates: n1 leads
// epoch 1 and writes v1 at seq 2, which no one else receives; n2 wins
// epoch 2 with n3's grant and installs at seq 2; its APPEND makes n1
// promise epoch 2, truncate after 1 and append the install entry (three
// writes).
var truncation = []string{
	"n1 times out", "deliver PREPARE 1->2", "deliver PREPARE_ACK 2->1",
	"deliver APPEND 1->2", "deliver APPEND 1->3", "n1 proposes v1",
	"n2 times out", "deliver PREPARE 2->3", "deliver PREPARE_ACK 3->2",
	"deliver APPEND 2->1 e=2 prev=(1,1)",
}

func crashPartialConfig() Config {
	return Config{Replicas: 3, CrashPartial: true, Proposals: 1, Campaigns: 2, Heartbeats: 1, Crashes: 1}
}

// TestCrashPartialKeepsAPrefixOfTheWrites: a kill -9 in the middle of a
// follower's Ready keeps a prefix of its writes — the promise, the
// truncation, the entries — and, the truncation being durable only at
// the fsync (the Store contract), a crash that kept only the promise
// brings the truncated v1 back. The leader's retry truncates it again and
// commits its own entry at seq 2.
func TestCrashPartialKeepsAPrefixOfTheWrites(t *testing.T) {
	cfg := crashPartialConfig()
	want := []struct {
		kept    string
		promise uint64
		log     string
	}{
		{"keeping 0 of 3 writes", 1, "1/ 1/v1"},
		{"keeping 1 of 3 writes [promise e2]", 2, "1/ 1/v1"},
		{"keeping 2 of 3 writes [promise e2, truncation after 1]", 2, "1/"},
		{"keeping 3 of 3 writes [promise e2, truncation after 1, entry 2 (e2)]", 2, "1/ 2/"},
	}
	for _, w := range want {
		actions := append(append([]string(nil), truncation[:len(truncation)-1]...), truncation[len(truncation)-1]+"…n1 kill -9 "+w.kept)
		s := walk(t, cfg, actions...)
		n := &s.nodes[0]
		if n.hard.Promised != w.promise || logString(n, s.committed) != w.log || n.held != nil {
			t.Errorf("%s: promise e%d, log %q (held %v), want e%d, %q", w.kept, n.hard.Promised, logString(n, s.committed), n.held != nil, w.promise, w.log)
		}
		if st := n.k.Status(); st.Last != n.last() || st.Hard != n.hard {
			t.Errorf("%s: restarted kernel at last %d, hard %+v; disk %d, %+v", w.kept, st.Last, st.Hard, n.last(), n.hard)
		}
	}
	if s := walk(t, cfg, truncation...); logString(&s.nodes[0], s.committed) != "1/ 2/" {
		t.Fatalf("without a crash n1 should hold the new epoch's entry: %q", logString(&s.nodes[0], s.committed))
	}
	// The resurrected v1 is truncated again by n2's retry (after n1
	// refuses a heartbeat that assumes the install), and n2's install
	// commits at seq 2 with n1.
	back := append(append([]string(nil), truncation[:len(truncation)-1]...), truncation[len(truncation)-1]+"…n1 kill -9 keeping 1 of 3",
		"n2 heartbeat", "deliver APPEND 2->1 e=2 prev=(2,2)", "deliver FLUSHED 1->2 e=2 reject")
	s := walk(t, cfg, back...)
	// n1 holds seq 2 of epoch 1, its one epoch: it points n2 before the
	// whole run, and n2 sends from seq 1 (held, skipped).
	s = walk2(t, cfg, s, "deliver APPEND 2->1 e=2 prev=(0,0)", "deliver FLUSHED 1->2 e=2 flushed=2")
	if logString(&s.nodes[0], s.committed) != "1/ 2/" || len(s.committed) != 2 || s.committed[1].Epoch != 2 {
		t.Fatalf("n1 %q, committed %v: want v1 truncated again and epoch 2's install committed", logString(&s.nodes[0], s.committed), s.committed)
	}
}

// walk2 continues a walk from s.
func walk2(t *testing.T, cfg Config, s *state, actions ...string) *state {
	t.Helper()
	for _, a := range actions {
		var next *state
		for _, st := range cfg.successors(s) {
			if matches(st.action, a) {
				if st.err != "" {
					t.Fatalf("%s: %s", a, st.err)
				}
				next = st.next
				break
			}
		}
		if next == nil {
			t.Fatalf("no action %q", a)
		}
		s = next
	}
	return s
}

// logString is n's log as "epoch/value" entries, its snapshot's included
// (committed's).
func logString(n *node, committed []replica.Entry) string {
	var b strings.Builder
	for seq := uint64(1); seq <= n.last(); seq++ {
		e, _ := n.entry(seq, committed)
		if seq > 1 {
			b.WriteByte(' ')
		}
		b.WriteString(entryID(e))
	}
	return b.String()
}

// TestAckTimeoutMakesTheLeaderReadOnlyUntilItsQuorumAnswers: an ack
// timeout leaves the leader READ_ONLY_DEGRADED: it refuses a proposal
// (ErrQuorumLost, nothing appended); the FLUSHED that answers its next
// heartbeat brings its quorum back, and it accepts writes again.
func TestAckTimeoutMakesTheLeaderReadOnlyUntilItsQuorumAnswers(t *testing.T) {
	cfg := Config{Replicas: 3, Proposals: 2, Campaigns: 1, AckTimeouts: 1}
	elected := []string{"n1 times out", "deliver PREPARE 1->2", "deliver PREPARE_ACK 2->1", "deliver APPEND 1->2", "deliver FLUSHED 2->1"}
	s := walk(t, cfg, append(elected, "n1 hears no follower for its ack timeout")...)
	if st := s.nodes[0].k.Status(); st.Role != replica.Leader || !st.ReadOnly || s.events&evReadOnly == 0 {
		t.Fatalf("after the ack timeout n1 is %v, read-only %v", st.Role, st.ReadOnly)
	}
	s = walk2(t, cfg, s, "n1 proposes v1")
	if st := s.nodes[0].k.Status(); st.Last != 1 || s.nodes[0].k.HasReady() {
		t.Fatalf("a read-only leader appended: last %d", st.Last)
	}
	s = walk2(t, cfg, s, "deliver APPEND 1->2 e=1 prev=(1,1)", "deliver FLUSHED 2->1")
	if st := s.nodes[0].k.Status(); st.ReadOnly || s.events&evReadOnlyBack == 0 {
		t.Fatal("n1 still read-only after n2 answered")
	}
	s = walk2(t, cfg, s, "n1 proposes v2")
	if st := s.nodes[0].k.Status(); st.Last != 2 {
		t.Fatalf("the leader back from read-only did not accept v2: last %d", st.Last)
	}
}

// snapshotInstall walks to S7 + S9 in the model: n3 hears nothing of
// epoch 1 while v1 commits with n2; an ack timeout expires n3's
// reservation, so n1 compacts to 2; n3 refuses the next APPEND, gets the
// snapshot instead, installs it and takes v2 as the tail after it.
var snapshotInstall = []string{
	"n1 times out", "deliver PREPARE 1->2", "deliver PREPARE_ACK 2->1", "deliver APPEND 1->2", "deliver FLUSHED 2->1",
	"n1 proposes v1", "deliver APPEND 1->2 e=1 prev=(1,1)", "deliver FLUSHED 2->1 e=1 flushed=2",
	"n1 hears no follower for its ack timeout", "n1 compacts to 2",
	"deliver APPEND 1->3 e=1 prev=(2,1)", "deliver FLUSHED 3->1 e=1 reject", "deliver SNAPSHOT 1->3 e=1 snapshot=(2,1)",
}

func snapshotConfig() Config {
	return Config{Replicas: 3, Proposals: 2, Campaigns: 1, AckTimeouts: 1, Compactions: 1}
}

// TestSnapshotInstallThenTheTail (S9): the follower behind the leader's
// snapshot installs it — the committed prefix — and the tail after it
// commits with it.
func TestSnapshotInstallThenTheTail(t *testing.T) {
	cfg := snapshotConfig()
	s := walk(t, cfg, snapshotInstall...)
	n3 := &s.nodes[2]
	if s.events&evSnapshotInstall == 0 || n3.snapSeq != 2 || n3.snapEpoch != 1 || len(n3.log) != 0 {
		t.Fatalf("n3 did not install the snapshot at (2,1): snapshot (%d,%d), log %v", n3.snapSeq, n3.snapEpoch, n3.log)
	}
	if st := n3.k.Status(); st.SnapSeq != 2 || st.Last != 2 || st.CommitSeq != 2 {
		t.Fatalf("n3's kernel after the install: %+v", st)
	}
	// A kill -9 in the middle of the install keeps it or not: the
	// restarted kernel starts from the snapshot, or from the empty log.
	cfg.CrashPartial, cfg.Crashes = true, 1
	last := len(snapshotInstall) - 1
	for kept, want := range []uint64{0, 2} {
		c := walk(t, cfg, append(append([]string(nil), snapshotInstall[:last]...),
			fmt.Sprintf("%s…n3 kill -9 keeping %d of 1 writes", snapshotInstall[last], kept))...)
		if st := c.nodes[2].k.Status(); c.nodes[2].snapSeq != want || st.SnapSeq != want || st.CommitSeq != want || st.Last != want {
			t.Errorf("crash keeping %d of the install: disk snapshot %d, kernel %+v", kept, c.nodes[2].snapSeq, st)
		}
	}
	cfg.CrashPartial, cfg.Crashes = false, 0
	s = walk2(t, cfg, s, "deliver FLUSHED 3->1 e=1 flushed=2", "n1 proposes v2", "deliver APPEND 1->3 e=1 prev=(2,1) entries=3..3",
		"deliver FLUSHED 3->1 e=1 flushed=3")
	if len(s.committed) != 3 || string(s.committed[2].Data) != "v2" || logString(&s.nodes[2], s.committed) != "1/ 1/v1 1/v2" || s.nodes[2].snapSeq != 2 {
		t.Fatalf("v2 should commit with n3's snapshot plus tail: committed %v, n3 %q from %d", s.committed, logString(&s.nodes[2], s.committed), s.nodes[2].snapSeq)
	}
}

// belowSnapshot walks to S8 in the model: n2 compacts to 2 (its commit),
// then a duplicated APPEND of epoch 1's install (prev 0) reaches it.
var belowSnapshot = []string{
	"n1 times out", "deliver PREPARE 1->2", "deliver PREPARE_ACK 2->1", "duplicate APPEND 1->2", "deliver APPEND 1->2",
	"deliver FLUSHED 2->1", "n1 proposes v1", "deliver APPEND 1->2 e=1 prev=(1,1)", "deliver FLUSHED 2->1 e=1 flushed=2",
	"n1 heartbeat", "deliver APPEND 1->2 e=1 prev=(2,1)", "n2 compacts to 2",
}

func belowSnapshotConfig() Config {
	return Config{Replicas: 3, Proposals: 1, Campaigns: 1, Heartbeats: 1, Dups: 1, Compactions: 1}
}

// TestSnapshotCannotAnswerForAnOlderSeq (S8): a compacted follower takes
// an APPEND that starts below its snapshot point by matching at the
// snapshot point — no truncation, FLUSHED of the snapshot point. With the
// guard removed (Mutations.AppendBelowSnapshot) it looks the compacted
// entries up and refuses the message as a rewrite of committed entries.
func TestSnapshotCannotAnswerForAnOlderSeq(t *testing.T) {
	cfg := belowSnapshotConfig()
	s := walk(t, cfg, append(belowSnapshot, "deliver APPEND 1->2 e=1 prev=(0,0)")...)
	n2 := &s.nodes[1]
	if s.events&evAppendBelowSnapshot == 0 || n2.snapSeq != 2 || len(n2.log) != 0 {
		t.Fatalf("n2 after the old APPEND: snapshot %d, log %v, events %b", n2.snapSeq, n2.log, s.events)
	}
	flushed := false
	for _, m := range s.net {
		flushed = flushed || m.Type == replica.MsgAppendAck && m.From == 2 && m.FlushedSeq == 2 && m.Reject == replica.RejectNone
	}
	if !flushed {
		t.Fatalf("n2 did not answer FLUSHED(2): %v", s.net)
	}
	cfg.Mutations.AppendBelowSnapshot = true
	s = walk(t, cfg, belowSnapshot...)
	for _, st := range cfg.successors(s) {
		if strings.HasPrefix(st.action, "deliver APPEND 1->2 e=1 prev=(0,0)") {
			if !strings.HasPrefix(st.err, "KernelAssertion") {
				t.Fatalf("without the guard: %q, want KernelAssertion", st.err)
			}
			return
		}
	}
	t.Fatal("no duplicate APPEND to deliver")
}

// TestModelStoreRefusesWhatNoShellCouldDo: the model's store installs only
// a snapshot of the committed prefix (else CommittedPrefixAgreement), and
// serves no entries it compacted.
func TestModelStoreRefusesWhatNoShellCouldDo(t *testing.T) {
	cfg := snapshotConfig()
	s := walk(t, cfg, snapshotInstall[:10]...) // n1 compacted to 2
	ms := modelStore{s.mut(0), s.committed}
	if err := ms.InstallSnapshot(replica.SnapshotMeta{Seq: 3, Epoch: 1}); !errors.Is(err, errNotCommitted) {
		t.Errorf("a snapshot past the committed prefix: %v", err)
	}
	if err := ms.InstallSnapshot(replica.SnapshotMeta{Seq: 2, Epoch: 2}); !errors.Is(err, errNotCommitted) {
		t.Errorf("a snapshot of another epoch's entry: %v", err)
	}
	if _, err := ms.Entries(2, 2); err == nil {
		t.Error("served a compacted entry")
	}
	if e, err := ms.Entries(3, 3); err != nil || len(e) != 0 {
		t.Errorf("entries past the end: %v, %v", e, err)
	}
}

// TestCompactionOfAnUncommittedEntryIsCaught: the checker refuses a
// compaction of an entry the ghost record does not hold as committed.
func TestCompactionOfAnUncommittedEntryIsCaught(t *testing.T) {
	cfg := snapshotConfig()
	s := walk(t, cfg, snapshotInstall[:9]...) // v1 committed at 2
	s.committed = s.committed[:1]             // as if v1 never committed
	if v := cfg.compact(s, 0, 2); !strings.HasPrefix(v, "CommittedPrefixAgreement") {
		t.Fatalf("compaction over an uncommitted entry: %q", v)
	}
}

// TestCrashKeepsWhatBeginMadeDurable: once a held Ready sent something,
// its Begin returned, so a crash keeps its snapshot install and hard
// state (durable when they return) and any prefix of the rest; a silent
// one may lose them too.
func TestCrashKeepsWhatBeginMadeDurable(t *testing.T) {
	cfg := Config{CrashPartial: true}
	n := &node{held: &replica.Ready{}, writes: []write{{kind: writeHardState}, {kind: writeTruncate}, {kind: writeEntry}}}
	if least, most := cfg.crashPoints(n); least != 1 || most != 3 {
		t.Errorf("sent early: a crash keeps %d..%d writes, want 1..3", least, most)
	}
	n.silent = true
	if least, most := cfg.crashPoints(n); least != 0 || most != 3 {
		t.Errorf("silent: a crash keeps %d..%d writes, want 0..3", least, most)
	}
	cfg.CrashPartial = false
	if least, most := cfg.crashPoints(n); least != 0 || most != 0 {
		t.Errorf("without CrashPartial: %d..%d, want 0..0", least, most)
	}
}
