package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// METADATA_OK keeps v1's layout: a topic's incarnation changes none of
// its bytes (a v1 client decodes it); DESCRIBE_OK carries it.
func TestMetadataOKLayoutIgnoresIncarnation(t *testing.T) {
	topics := []TopicInfo{{Config: TopicConfig{Name: "a", Partitions: 1}, Partitions: []PartitionInfo{{Partition: 0, CommitSeq: 3}}}}
	v1 := AppendFrame(nil, 1, &MetadataOK{Topics: topics})
	topics[0].Incarnation = 7
	if again := AppendFrame(nil, 1, &MetadataOK{Topics: topics}); !bytes.Equal(v1, again) {
		t.Fatal("METADATA_OK's bytes depend on the incarnation")
	}
	_, f, err := ReadFrame(bytes.NewReader(AppendFrame(nil, 1, &DescribeOK{Topics: topics})), DefaultFrameBytesMax)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.(*DescribeOK).Topics; !reflect.DeepEqual(got, topics) {
		t.Fatalf("DESCRIBE_OK round trip: %+v", got)
	}
}

// FuzzDecodeTopicFrames feeds arbitrary bodies to the decoders of
// TOPIC_DELETE, TOPIC_DELETE_OK, DESCRIBE, DESCRIBE_OK, TOPIC_UPDATE and
// TOPIC_UPDATE_OK: no panic, a
// list bounded by the bytes it arrives in, and whatever is accepted
// re-encodes to the same bytes.
func FuzzDecodeTopicFrames(f *testing.F) {
	for _, fr := range []Frame{&TopicDelete{TopicRef: TopicRef{Topic: "orders", Incarnation: 2}}, &TopicDeleteOK{TopicRef: TopicRef{Topic: "o"}},
		&Describe{Metadata{Topics: []string{"a", "b"}}}, &DescribeOK{Topics: []TopicInfo{{Config: TopicConfig{Name: "a", Partitions: 1}, Incarnation: 2,
			Partitions: []PartitionInfo{{Partition: 0, Leader: "n1", Replicas: []ReplicaInfo{{Node: "n1"}}}}}}},
		&TopicUpdate{TopicRef: TopicRef{Topic: "o"}, Set: SetRetentionBytes, RetentionBytes: 7}, &TopicUpdateOK{Topic: TopicConfig{Name: "o", Partitions: 1}, Incarnation: 1}} {
		f.Add(uint8(fr.Type()), fr.appendBody(nil))
	}
	f.Add(uint8(TypeDescribeOK), []byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, typ uint8, body []byte) {
		types := []FrameType{TypeTopicDelete, TypeTopicDeleteOK, TypeDescribe, TypeDescribeOK, TypeTopicUpdate, TypeTopicUpdateOK}
		fr := newTopicFrame(types[int(typ)%len(types)])
		if decodeBody(fr, body) != nil {
			return
		}
		if again := fr.appendBody(nil); !bytes.Equal(again, body) {
			t.Fatalf("%s: accepted %x, re-encodes to %x", fr.Type(), body, again)
		}
	})
}
