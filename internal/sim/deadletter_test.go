package sim

import "testing"

// TestDeadLettersUnderClusterFaults: the consumers NACK one message in
// eight until it is dead-lettered (max_deliver 3), under every cluster
// fault, with group members and without: every seed ends with each
// acknowledged message acked or dead-lettered (Liveness), each dead
// letter at one seq of the dead-letter topic, none of an acked message,
// each holding its message (DeadLetterOnce, NoDeadLetterOfAnAck,
// DeadLetterIsTheRecord). With dead-letter-not-idempotent (no producer
// identity) a copy published again is appended twice: DeadLetterOnce.
func TestDeadLettersUnderClusterFaults(t *testing.T) {
	for _, o := range []ClusterOptions{
		{Seed: 1, Faults: AllClusterFaults, DeadLetters: true},
		{Seed: 2, Faults: AllClusterFaults, DeadLetters: true, Members: true},
		{Seed: 3, Faults: AllClusterFaults, DeadLetters: true, Retention: RetentionPreset},
	} {
		r := RunCluster(o)
		if r.Violation != nil {
			t.Fatalf("%s: %v", ClusterReproduce(o), r.Violation)
		}
		// One in eight of 900 messages is poison; a few others die too.
		// With a retention most are deleted first (their dead letters end
		// without a copy: DeadLetterOfADeletedRecord).
		want := 900/8 - 2
		if o.Retention.Bytes > 0 {
			want = 1
		}
		if r.DeadLetters < want {
			t.Fatalf("%s: %d dead letters, want at least %d", ClusterReproduce(o), r.DeadLetters, want)
		}
		t.Logf("seed %d: %d dead letters, %d restarts", o.Seed, r.DeadLetters, r.Restarts)
	}
	firstSeedCatching(t, ClusterOptions{Faults: AllClusterFaults, DeadLetters: true}, "dead-letter-not-idempotent", DeadLetterOnce, 8)
}

// TestDeadLetterChecksCatchTheirMutations: the watch's other two checks
// are load-bearing. With dead-on-last-delivery a message is dead-lettered
// as its third delivery is sent, and a consumer's ACK of that delivery is
// answered all the same: NoDeadLetterOfAnAck (it needs a message that is
// not poison delivered three times, which a single node's faults did not
// make in 230 seeds). With dead-letter-of-next-record the copy holds the
// partition's next record: DeadLetterIsTheRecord.
func TestDeadLetterChecksCatchTheirMutations(t *testing.T) {
	o := ClusterOptions{Faults: AllClusterFaults, DeadLetters: true}
	firstSeedCatching(t, o, "dead-on-last-delivery", NoDeadLetterOfAnAck, 8)
	firstSeedCatching(t, o, "dead-letter-of-next-record", DeadLetterIsTheRecord, 8)
	single := Options{Seed: 1, Faults: AllFaults, DeadLetters: true, Mutations: NodeMutations["dead-letter-of-next-record"]}
	if v := Run(single).Violation; v == nil || v.Invariant != DeadLetterIsTheRecord {
		t.Fatalf("%s: %v, want %s", Reproduce(single), v, DeadLetterIsTheRecord)
	}
}

// TestDeadLettersOnASingleNode: the same on a single node under its
// faults (crashes, kill points, disk errors, bit flips); the mutation is
// caught by a restart between a copy made durable and the group hearing
// of it.
func TestDeadLettersOnASingleNode(t *testing.T) {
	dead := 0
	for seed := uint64(1); seed <= 20; seed++ {
		o := Options{Seed: seed, Faults: AllFaults, DeadLetters: true, Members: seed%2 == 0}
		r := Run(o)
		if r.Violation != nil {
			t.Fatalf("%s: %v", Reproduce(o), r.Violation)
		}
		dead += r.DeadLetters
	}
	if dead == 0 {
		t.Fatal("20 seeds dead-lettered nothing")
	}
	for seed := uint64(1); seed <= 60; seed++ {
		o := Options{Seed: seed, Faults: AllFaults, DeadLetters: true, Mutations: NodeMutations["dead-letter-not-idempotent"]}
		if v := Run(o).Violation; v != nil {
			if v.Invariant != DeadLetterOnce {
				t.Fatalf("%s: broke %s first", Reproduce(o), v.Invariant)
			}
			t.Logf("dead-letter-not-idempotent: seed %d breaks %s", seed, DeadLetterOnce)
			return
		}
	}
	t.Fatal("dead-letter-not-idempotent: no seed of 1-60 breaks DeadLetterOnce")
}
