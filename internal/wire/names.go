package wire

import (
	"fmt"
	"hash/fnv"
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

// ValidateName checks a topic or group name: 1–200 bytes of [A-Za-z0-9._-].
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
