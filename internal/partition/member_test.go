package partition

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/acklog"
)

// The events of a member's scenario, each with the decision it must
// produce written as text (see memberScenario.step).
type (
	// lead sets the replication state later publishes see.
	lead View
	// pub is a publish of (id, seq) answered through reply; it yields
	// "Refuse <why>", "Duplicate seq@epoch", "TooOld", "Wait" or
	// "Propose id/seq".
	pub struct {
		id, seq uint64
		reply   string
	}
	// apply feeds committed entries; it yields "applied N limit L".
	apply []Entry
	// start reports the log's start; it yields "moved" or "kept".
	start uint64
	// done completes a proposal; it yields "<Outcome> seq@epoch [replies]"
	// ("Failed <err> [replies]" on failure), or "unknown".
	done struct {
		id, seq   uint64 // the proposal key
		at, epoch uint64
		err       error
	}
	// carry asks for a dedup carry toward compacting through want; it
	// yields "none" or "carry" and the producers carried, and keeps the
	// carry for carried.
	carry uint64
	// replica replaces the member with another replica's, whose log
	// starts at the seq (the carry is kept); it yields "".
	replica uint64
	// carried applies the kept carry at seq under epoch 1; it yields
	// "applied N limit L", or the error.
	carried uint64
	// degrade reports READ_ONLY_DEGRADED; it yields the replies answered.
	degrade struct{}
	// shutdown yields the replies answered at shutdown.
	shutdown struct{}
)

type step struct {
	event any
	want  string
}

var errLost = errors.New("lost")

// Entries of a committed log: an install (control) entry, an idempotent
// publish, a group record.
func install(seq, epoch uint64) Entry { return Entry{Seq: seq, Epoch: epoch} }
func published(seq, epoch, id, pseq uint64) Entry {
	return Entry{Seq: seq, Epoch: epoch, ProducerID: id, ProducerSeq: pseq}
}
func groupRec(seq uint64, group string, kind acklog.Kind) Entry {
	return Entry{Seq: seq, Epoch: 1, Group: group, GroupKind: kind}
}

// runMember feeds the steps to a fresh member whose log starts at
// startSeq and returns the first decision that differs from the script.
func runMember(startSeq uint64, mut Mutations, steps []step) error {
	cfg := Config{DedupWindowMax: 8, ProducersMax: 8}
	m := NewMember[string](cfg, startSeq, mut)
	var view View
	var kept []byte // the last carry
	for i, s := range steps {
		var got string
		switch e := s.event.(type) {
		case lead:
			view = View(e)
			continue
		case pub:
			d := m.Publish(view, e.id, e.seq, e.reply)
			switch d.Action {
			case Refuse:
				got = "Refuse " + d.Refusal.String()
			case AnswerDuplicate:
				got = fmt.Sprintf("Duplicate %d@%d", d.Seq, d.Epoch)
			case AnswerTooOld:
				got = "TooOld"
			case Wait:
				got = "Wait"
			case Propose:
				got = fmt.Sprintf("Propose %d/%d", d.Key.ProducerID, d.Key.ProducerSeq)
			}
		case apply:
			for _, entry := range e {
				m.Apply(entry)
			}
			got = fmt.Sprintf("applied %d limit %d", m.Applied(), m.CompactLimit())
		case carry:
			var ok bool
			if kept, ok = m.AppendCarry(nil, uint64(e)); !ok {
				got = "none"
				break
			}
			ps, err := decodeCarry(kept, math.MaxUint64, math.MaxUint64)
			if err != nil {
				return fmt.Errorf("step %d: carry does not decode: %v", i, err)
			}
			got = "carry"
			for _, p := range ps {
				got += fmt.Sprintf(" %d%v", p.id, p.entries)
			}
		case replica:
			m = NewMember[string](cfg, uint64(e), mut)
		case carried:
			if err := m.Apply(Entry{Seq: uint64(e), Epoch: 1, Carry: kept}); err != nil {
				got = err.Error()
			} else {
				got = fmt.Sprintf("applied %d limit %d", m.Applied(), m.CompactLimit())
			}
		case start:
			got = "kept"
			if m.LogStart(uint64(e)) {
				got = "moved"
			}
		case done:
			a, ok := m.Completed(ProposalKey{e.id, e.seq}, e.at, e.epoch, e.err)
			switch {
			case !ok:
				got = "unknown"
			case a.Outcome == Failed:
				got = fmt.Sprintf("Failed %v %v", a.Err, a.Replies)
			default:
				got = fmt.Sprintf("%v %d@%d %v", a.Outcome, a.Seq, a.Epoch, a.Replies)
			}
		case degrade:
			got = fmt.Sprint(m.Degraded())
		case shutdown:
			got = fmt.Sprint(m.Close())
		default:
			panic(fmt.Sprintf("unknown event %T", e))
		}
		if got != s.want {
			return fmt.Errorf("step %d %T%+v: got %q, want %q", i, s.event, s.event, got, s.want)
		}
	}
	return nil
}

// leader1 leads epoch 1, installed at seq 1; leader2 the next epoch,
// installed at seq 3.
var (
	leader1 = lead{Leader: true, Epoch: 1, InstallSeq: 1}
	leader2 = lead{Leader: true, Epoch: 2, InstallSeq: 3}
)

var memberScenarios = []struct {
	name     string
	startSeq uint64
	steps    []step
}{
	{"retry of an in-flight publish waits for it", 1, []step{
		{leader1, ""},
		{apply{install(1, 1)}, "applied 1 limit 1"},
		{pub{7, 1, "a"}, "Propose 7/1"},
		{pub{7, 1, "b"}, "Wait"}, // not appended twice
		{pub{7, 2, "c"}, "Propose 7/2"},
		{apply{published(2, 1, 7, 1)}, "applied 2 limit 1"},
		{done{7, 1, 2, 1, nil}, "Committed 2@1 [a b]"},
		{pub{7, 1, "d"}, "Duplicate 2@1"},
		{shutdown{}, "[c]"},
		{done{7, 2, 3, 1, nil}, "unknown"},
	}},
	{"a retry after failover gets the original PUB_OK", 1, []step{
		{lead{Epoch: 1}, ""}, // a follower applies what the old leader appended
		{apply{install(1, 1), published(2, 1, 7, 1)}, "applied 2 limit 1"},
		{pub{7, 1, "a"}, "Refuse NotLeader"},
		{leader2, ""}, // elected; its install entry (seq 3) is not applied yet
		{pub{7, 1, "b"}, "Refuse TakingOffice"},
		{apply{install(3, 2)}, "applied 3 limit 1"},
		{pub{7, 1, "c"}, "Duplicate 2@1"},
	}},
	{"a leader whose install seq is unknown takes no publish", 1, []step{
		{lead{Leader: true, Epoch: 2}, ""},
		{apply{install(1, 1), published(2, 1, 7, 1)}, "applied 2 limit 1"},
		{pub{7, 1, "a"}, "Refuse TakingOffice"},
	}},
	{"a lost proposal fails and its retry is proposed again", 1, []step{
		{leader1, ""},
		{apply{install(1, 1)}, "applied 1 limit 1"},
		{pub{7, 1, "a"}, "Propose 7/1"},
		{pub{7, 1, "b"}, "Wait"},
		{done{7, 1, 2, 1, errLost}, "Failed lost [a b]"},
		{pub{7, 1, "c"}, "Propose 7/1"},
	}},
	{"a commit not applied yet is not answered OK", 1, []step{
		{leader1, ""},
		{apply{install(1, 1)}, "applied 1 limit 1"},
		{pub{7, 1, "a"}, "Propose 7/1"},
		{done{7, 1, 2, 1, nil}, "NotApplied 2@1 [a]"},
		// Neither in flight nor in the table yet: its retry is refused,
		// not appended again (CommittedNotAppliedRefused), until the
		// entry is applied.
		{pub{7, 1, "b"}, "Refuse NotApplied"},
		{apply{published(2, 1, 7, 1)}, "applied 2 limit 1"},
		{pub{7, 1, "c"}, "Duplicate 2@1"},
	}},
	{"a rebuilt replica keeps a higher seq that landed before a lower one", 1, []step{
		// Producer 7's seq 1 was refused and retried after 2 and 3 landed:
		// its latest append is not its highest seq, which the log keeps
		// (HighestSeqKeptInLog: the limit stays below seq 3's entry).
		{apply{install(1, 1), published(2, 1, 7, 2), published(3, 1, 7, 3), published(4, 1, 7, 1)}, "applied 4 limit 2"},
		// A replica rebuilt from a snapshot point at 3: entry 2 is gone.
		{replica(3), ""},
		{apply{published(3, 1, 7, 3), published(4, 1, 7, 1)}, "applied 4 limit 2"},
		{lead{Leader: true, Epoch: 2, InstallSeq: 5}, ""},
		{apply{install(5, 2)}, "applied 5 limit 2"},
		{pub{7, 2, "a"}, "TooOld"}, // sealed at its highest: seq 2 may have landed before the kept log
		{pub{7, 1, "b"}, "Duplicate 4@1"},
		{pub{7, 3, "c"}, "Duplicate 3@1"},
		{pub{7, 4, "d"}, "Propose 7/4"},
	}},
	{"a carry leaves out a producer with a publish in flight", 1, []step{
		{leader1, ""},
		{apply{install(1, 1), published(2, 1, 7, 1), published(3, 1, 9, 1)}, "applied 3 limit 1"},
		{pub{7, 2, "a"}, "Propose 7/2"},
		// 7/2 may commit between the carry's base and the carry: a carry
		// naming 7 would make every replica take the carry as 7's latest
		// mention, and compaction could drop 7/2 (CarryHoldsWhatItNames).
		{carry(3), "carry 9[{1 3 1}]"},
		{apply{published(4, 1, 7, 2)}, "applied 4 limit 2"},
		{done{7, 2, 4, 1, nil}, "Committed 4@1 [a]"},
		{carry(4), "carry 7[{1 2 1} {2 4 1}] 9[{1 3 1}]"},
	}},
	{"degraded answers QUORUM_LOST and keeps the entry in flight", 1, []step{
		{leader1, ""},
		{apply{install(1, 1)}, "applied 1 limit 1"},
		{pub{7, 1, "a"}, "Propose 7/1"},
		{pub{0, 0, "x"}, "Propose 0/1"}, // not idempotent: a key of the kernel's
		{degrade{}, "[x a]"},
		{lead{Leader: true, ReadOnly: true, Epoch: 1, InstallSeq: 1}, ""},
		{pub{7, 1, "b"}, "Refuse QuorumLost"},
		{leader1, ""}, // the quorum is back
		{pub{7, 1, "c"}, "Wait"},
		{apply{published(2, 1, 7, 1)}, "applied 2 limit 1"},
		{done{7, 1, 2, 1, nil}, "Committed 2@1 [c]"}, // a was answered once
	}},
	{"a log that starts past 1 is sealed before the first publish", 10, []step{
		{lead{Leader: true, Epoch: 3, InstallSeq: 10}, ""},
		{apply{install(10, 3), published(11, 3, 7, 5), published(12, 3, 7, 6)}, "applied 12 limit 11"},
		{pub{7, 3, "a"}, "TooOld"}, // appended before the kept log, perhaps
		{pub{7, 5, "b"}, "Duplicate 11@3"},
		{pub{7, 7, "c"}, "Propose 7/7"},
		{pub{9, 1, "d"}, "Propose 9/1"}, // a producer it never saw is new
	}},
	{"the seal after a start move", 1, []step{
		{apply{install(1, 1), published(2, 1, 7, 1), published(3, 1, 7, 2)}, "applied 3 limit 2"},
		{start(1), "kept"},
		{start(20), "moved"}, // rebuilt from the leader's snapshot point
		{apply{published(20, 4, 7, 9), install(21, 5)}, "applied 21 limit 19"},
		{lead{Leader: true, Epoch: 5, InstallSeq: 21}, ""},
		{pub{7, 2, "a"}, "TooOld"},
		{pub{7, 9, "b"}, "Duplicate 20@4"},
	}},
	{"a carry keeps a compacted producer known", 1, []step{
		{apply{install(1, 1), published(2, 1, 7, 1), published(3, 1, 7, 2), published(4, 1, 9, 1)}, "applied 4 limit 2"},
		{carry(2), "none"}, // nothing to carry below 7's latest entry
		{carry(3), "carry 7[{1 2 1} {2 3 1}]"},
		{carried(5), "applied 5 limit 3"}, // 7 mentioned at 5: 9 (at 4) holds the log now
		{carry(5), "carry 7[{1 2 1} {2 3 1}] 9[{1 4 1}]"},
		{carried(6), "applied 6 limit 5"},
		// A replica rebuilt from a snapshot point at 5: only the carry is left.
		{replica(6), ""},
		{carried(6), "applied 6 limit 5"},
		{lead{Leader: true, Epoch: 2, InstallSeq: 7}, ""},
		{apply{install(7, 2)}, "applied 7 limit 5"},
		{pub{7, 2, "a"}, "Duplicate 3@1"}, // a retry of an entry compacted away
		{pub{9, 1, "b"}, "Duplicate 4@1"},
		{pub{7, 3, "c"}, "Propose 7/3"},
		{pub{5, 1, "d"}, "Propose 5/1"}, // one it never saw is new
	}},
	{"a carry restores the entries a rebuilt log lacks", 1, []step{
		{apply{install(1, 1), published(2, 1, 7, 1), published(3, 1, 9, 1)}, "applied 3 limit 1"},
		{carry(3), "carry 7[{1 2 1}] 9[{1 3 1}]"},
		{apply{published(4, 1, 9, 2)}, "applied 4 limit 1"},
		{carried(5), "applied 5 limit 4"}, // both mentioned at 5
		{replica(4), ""},                  // its log starts at 9's second entry
		{apply{published(4, 1, 9, 2)}, "applied 4 limit 3"},
		{carried(5), "applied 5 limit 4"},
		{lead{Leader: true, Epoch: 1, InstallSeq: 1}, ""},
		{pub{9, 1, "a"}, "Duplicate 3@1"}, // from the carry, below the kept entry
		{pub{9, 2, "b"}, "Duplicate 4@1"},
		{pub{7, 1, "c"}, "Duplicate 2@1"},
	}},
	{"checkpoint then compaction limit", 1, []step{
		{apply{install(1, 1), groupRec(2, "g1", acklog.KindAck), published(3, 1, 7, 1)}, "applied 3 limit 1"},
		{apply{groupRec(4, "g2", acklog.KindAck), groupRec(5, "g1", acklog.KindAck)}, "applied 5 limit 1"},
		{apply{groupRec(6, "g1", acklog.KindCheckpoint), published(7, 1, 7, 2)}, "applied 7 limit 3"},
		{apply{groupRec(8, "g2", acklog.KindCheckpoint)}, "applied 8 limit 5"},
		{apply{groupRec(2, "g1", acklog.KindCheckpoint)}, "applied 8 limit 5"}, // applied already: ignored
		{start(9), "kept"},
		{start(12), "moved"}, // the groups' records are applied again from the new start
		{apply{install(12, 2)}, "applied 12 limit 12"},
	}},
}

func TestMemberScenarios(t *testing.T) {
	for _, sc := range memberScenarios {
		t.Run(sc.name, func(t *testing.T) {
			if err := runMember(sc.startSeq, Mutations{}, sc.steps); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Each mutation breaks a guard; the named scenarios must then fail.
func TestMemberMutationsAreCaught(t *testing.T) {
	cases := []struct {
		mutation  Mutations
		scenarios []string
		at        string // the event that must fail
	}{
		{Mutations{SkipInstallGate: true}, []string{"a retry after failover gets the original PUB_OK",
			"a leader whose install seq is unknown takes no publish"}, "pub"},
		{Mutations{SkipDedupSeal: true}, []string{"a log that starts past 1 is sealed before the first publish",
			"the seal after a start move"}, "pub"},
		{Mutations{CompactForgetsProducers: true}, []string{"a carry keeps a compacted producer known"}, "apply"},
		{Mutations{NotAppliedForgetsInflight: true}, []string{"a commit not applied yet is not answered OK"}, "pub"},
		{Mutations{CarryIgnoresInflight: true}, []string{"a carry leaves out a producer with a publish in flight"}, "carry"},
		{Mutations{OutOfOrderMovesMention: true}, []string{"a rebuilt replica keeps a higher seq that landed before a lower one"}, "apply"},
		{Mutations{SealAtLowest: true}, []string{"a rebuilt replica keeps a higher seq that landed before a lower one"}, "pub"},
	}
	for _, c := range cases {
		for _, name := range c.scenarios {
			found := false
			for _, sc := range memberScenarios {
				if sc.name != name {
					continue
				}
				found = true
				err := runMember(sc.startSeq, c.mutation, sc.steps)
				if err == nil {
					t.Errorf("%+v: scenario %q passed", c.mutation, name)
				} else if !strings.Contains(err.Error(), "partition."+c.at) {
					t.Errorf("%+v: scenario %q failed elsewhere than at a %s: %v", c.mutation, name, c.at, err)
				}
			}
			if !found {
				t.Fatalf("no scenario %q", name)
			}
		}
	}
}

func TestNewMemberRefusesSeqZero(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a log starting at seq 0 must panic")
		}
	}()
	NewMember[string](DefaultConfig, 0, Mutations{})
}

// PublishRetryOnly decides a known identity as Publish does — a duplicate
// of an applied record, a wait on one in flight — and a new one as
// NotARetry, keeping nothing: the same identity published afterwards is
// proposed as any new one.
func TestPublishRetryOnlyKeepsNothingNew(t *testing.T) {
	m := NewMember[string](DefaultConfig, 1, Mutations{})
	m.Apply(Entry{Seq: 1, Epoch: 1}) // the install entry
	view := View{Leader: true, Epoch: 1, InstallSeq: 1}
	if d := m.PublishRetryOnly(view, 7, 1, "retry"); d.Action != NotARetry {
		t.Fatalf("an unknown identity: %v, want NotARetry", d.Action)
	}
	d := m.Publish(view, 7, 1, "first")
	if d.Action != Propose {
		t.Fatalf("the identity published after a NotARetry: %v, want Propose", d.Action)
	}
	if r := m.PublishRetryOnly(view, 7, 1, "retry"); r.Action != Wait {
		t.Fatalf("a retry of one in flight: %v, want Wait", r.Action)
	}
	m.Apply(Entry{Seq: 2, Epoch: 1, ProducerID: 7, ProducerSeq: 1})
	if a, ok := m.Completed(d.Key, 2, 1, nil); !ok || len(a.Replies) != 2 {
		t.Fatalf("answer %+v %v, want the first and the retry answered", a, ok)
	}
	if r := m.PublishRetryOnly(view, 7, 1, "retry"); r.Action != AnswerDuplicate || r.Seq != 2 {
		t.Fatalf("a retry of an applied one: %+v, want a duplicate of seq 2", r)
	}
	if r := m.PublishRetryOnly(View{Epoch: 1}, 7, 1, "retry"); r.Action != Refuse || r.Refusal != RefusedNotLeader {
		t.Fatalf("at a follower: %+v, want NOT_LEADER", r)
	}
	st := NewState(DefaultConfig, 1, 1)
	if d := st.Lookup(7, 1); d.Verdict != VerdictNew {
		t.Fatalf("Lookup of an unknown identity: %+v", d)
	}
	if d := st.Publish(7, 1); d.Verdict != VerdictNew || d.Seq != 1 {
		t.Fatalf("Publish after a Lookup: %+v, want seq 1", d)
	}
	if d := st.Lookup(7, 1); d.Verdict != VerdictDuplicate || d.Seq != 1 {
		t.Fatalf("Lookup of a known identity: %+v, want a duplicate of seq 1", d)
	}
}

// One idempotent publish through the kernel as a leader sees it: decided,
// applied once committed, answered.
func BenchmarkPublishApplyComplete(b *testing.B) {
	m := NewMember[func()](DefaultConfig, 1, Mutations{})
	m.Apply(Entry{Seq: 1, Epoch: 1}) // the install entry
	view := View{Leader: true, Epoch: 1, InstallSeq: 1}
	reply := func() {}
	seq := uint64(1)
	b.ReportAllocs()
	for b.Loop() {
		seq++
		d := m.Publish(view, 7, seq, reply)
		if d.Action != Propose {
			b.Fatalf("decision %v", d.Action)
		}
		m.Apply(Entry{Seq: seq, Epoch: 1, ProducerID: 7, ProducerSeq: seq})
		if a, ok := m.Completed(d.Key, seq, 1, nil); !ok || a.Outcome != Committed || len(a.Replies) != 1 {
			b.Fatalf("answer %+v %v", a, ok)
		}
	}
}

// DeletedGroupPinsNothing: once the shell says a group incarnation is
// deleted, what it needed bounds no compaction — its records applied
// before, its records applied after (a checkpoint in flight when it was
// deleted), and its needs restored from a snapshot — while the next
// incarnation's records (another key) bound it as any group's.
func TestDeletedGroupPinsNothing(t *testing.T) {
	cfg := Config{DedupWindowMax: 4, ProducersMax: 4}
	gone := func(group string) bool { return group == "g" }
	m := NewMember[int](cfg, 1, Mutations{})
	m.Apply(groupRec(1, "g", acklog.KindAck))
	m.Apply(groupRec(2, "h", acklog.KindAck))
	snap, err := m.AppendSnapshot(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	m.Apply(install(3, 1))
	if got := m.CompactLimit(); got != 0 {
		t.Fatalf("limit %d before the delete, want 0 (g needs 1)", got)
	}
	v := m.GroupsVersion()
	m.GroupsDeleted(gone)
	if got, from := m.CompactLimit(), m.GroupsFrom(); got != 1 || len(from) != 1 || from["h"] != 2 {
		t.Fatalf("after g's delete: limit %d, needs %v; want 1 (h needs 2) and only h", got, from)
	}
	if m.GroupsVersion() == v {
		t.Fatal("the needs changed and their version did not")
	}
	m.Apply(groupRec(4, "g", acklog.KindCheckpoint))
	m.Apply(groupRec(5, "g@2", acklog.KindAck))
	if from := m.GroupsFrom(); len(from) != 2 || from["g@2"] != 5 || from["h"] != 2 {
		t.Fatalf("after a late record of g and one of g@2: needs %v", from)
	}
	r := NewMember[int](cfg, 1, Mutations{})
	r.GroupsDeleted(gone)
	s, err := DecodeSnapshot(snap, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Restore(s) {
		t.Fatal("restore refused")
	}
	if from := r.GroupsFrom(); len(from) != 1 || from["h"] != 2 {
		t.Fatalf("restored from a snapshot taken before the delete: needs %v, want h's only", from)
	}
}
