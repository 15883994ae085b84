package wire

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// Name bounds shared by topics and groups.
const (
	NameBytesMax       = 200
	PartitionsMax      = 4096
	TokenBytesMax      = 4096
	HeadersMax         = 64
	HeaderKeyBytesMax  = 1024
	ClientNameBytesMax = 256
)

// Name prefixes with a meaning to Nereus.
const (
	// ReservedPrefix starts the names Nereus keeps for itself (the
	// metadata log is `__meta`): no client may send one.
	ReservedPrefix = "__"
	// DeadLetterPrefix starts the name of a dead-letter topic,
	// `dlq.<group>.<topic>`. Only the group machinery declares one and
	// publishes into it; clients may read it (METADATA, PULL, ACK, NACK).
	DeadLetterPrefix = "dlq."
)

// ValidateName checks a topic or group name a client sends: 1–200 bytes
// of [A-Za-z0-9._-], not `.` or `..` (a name is a directory of the data
// directory), and not starting with `__` (ReservedPrefix).
func ValidateName(kind, name string) error {
	if len(name) == 0 || len(name) > NameBytesMax {
		return Errorf(CodeInvalidArgument, "%s name must be 1-%d bytes, got %d", kind, NameBytesMax, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return Errorf(CodeInvalidArgument, "%s name %q: character %q not allowed (use A-Z a-z 0-9 . _ -)", kind, name, c)
		}
	}
	if name == "." || name == ".." {
		return Errorf(CodeInvalidArgument, "%s name %q is not allowed", kind, name)
	}
	if strings.HasPrefix(name, ReservedPrefix) {
		return Errorf(CodeInvalidArgument, "%s name %q: names starting with %q are reserved for Nereus", kind, name, ReservedPrefix)
	}
	return nil
}

// ValidateTopicOrInternal is ValidateName for topics, except that it
// accepts the internal topics Nereus itself declares and replicates like
// any other (the schedule shards, SchedTopic). Clients still may not
// declare, publish to or consume them.
func ValidateTopicOrInternal(name string) error {
	if name == SchedTopic {
		return nil
	}
	if IsKVTopic(name) {
		return validateKVTopic(name) // a bucket's log (kv.go)
	}
	return ValidateName("topic", name)
}

// IsDeadLetter reports whether topic is in the dead-letter namespace.
func IsDeadLetter(topic string) bool { return strings.HasPrefix(topic, DeadLetterPrefix) }

// ValidateWritableTopic checks the name of a topic a client declares or
// publishes to: a valid name outside the dead-letter namespace.
func ValidateWritableTopic(name string) error {
	if err := ValidateName("topic", name); err != nil {
		return err
	}
	if IsDeadLetter(name) {
		return Errorf(CodeInvalidArgument, "topic %q: names starting with %q are dead-letter topics, which only their consumer group declares and writes (clients may consume them)", name, DeadLetterPrefix)
	}
	return nil
}

// PartitionForKey maps a record key to a partition. Brokers and clients must
// agree on it, so it is part of the protocol: FNV-1a 32-bit modulo n.
func PartitionForKey(key []byte, n uint32) uint32 {
	if n == 0 {
		panic(fmt.Sprintf("wire: PartitionForKey with %d partitions", n))
	}
	h := fnv.New32a()
	h.Write(key)
	return h.Sum32() % n
}

// PartitionForProducer maps an idempotent, unkeyed publish to a partition
// deterministically, so a replay of (producerID, producerSeq) lands where the
// original did.
func PartitionForProducer(producerID, producerSeq uint64, n uint32) uint32 {
	if n == 0 {
		panic(fmt.Sprintf("wire: PartitionForProducer with %d partitions", n))
	}
	// SplitMix64's finalizer over both fields: every input bit reaches the
	// low bits, so consecutive seqs spread over the partitions.
	x := producerID ^ producerSeq*0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	x ^= x >> 31
	return uint32(x % uint64(n))
}
