package wire

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeGroupUpdateFrames feeds arbitrary bodies to the decoders of
// GROUP_UPDATE and GROUP_UPDATE_OK: no panic, and whatever is accepted
// re-encodes to the same bytes.
func FuzzDecodeGroupUpdateFrames(f *testing.F) {
	for _, fr := range []Frame{&GroupUpdate{GroupRef: GroupRef{Group: "g", Incarnation: 2}, Set: SetMaxDeliver, MaxDeliver: 3},
		&GroupUpdateOK{GroupRef: GroupRef{Group: "g", Incarnation: 1}, AckWaitMs: 1000, MaxDeliver: 5}} {
		f.Add(uint8(fr.Type()), fr.appendBody(nil))
	}
	f.Fuzz(func(t *testing.T, typ uint8, body []byte) {
		types := []FrameType{TypeGroupUpdate, TypeGroupUpdateOK}
		fr := newGroupUpdateFrame(types[int(typ)%len(types)])
		if decodeBody(fr, body) != nil {
			return
		}
		if again := fr.appendBody(nil); !bytes.Equal(again, body) {
			t.Fatalf("%s: accepted %x, re-encodes to %x", fr.Type(), body, again)
		}
	})
}

// A GROUP_UPDATE that sets nothing, sets unknown bits or gives a zero
// setting is refused as an invalid argument; one that gives only some
// settings is fine.
func TestGroupUpdateValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    GroupUpdate
		ok   bool
	}{
		{"nothing", GroupUpdate{GroupRef: GroupRef{Group: "g"}}, false},
		{"unknown bit", GroupUpdate{GroupRef: GroupRef{Group: "g"}, Set: SetAckWaitMs | 4, AckWaitMs: 1}, false},
		{"zero ack wait", GroupUpdate{GroupRef: GroupRef{Group: "g"}, Set: SetAckWaitMs}, false},
		{"zero max deliver", GroupUpdate{GroupRef: GroupRef{Group: "g"}, Set: SetMaxDeliver}, false},
		{"ack wait alone", GroupUpdate{GroupRef: GroupRef{Group: "g"}, Set: SetAckWaitMs, AckWaitMs: 1}, true},
		{"max deliver alone", GroupUpdate{GroupRef: GroupRef{Group: "g"}, Set: SetMaxDeliver, MaxDeliver: 1}, true},
		{"both, an unset field ignored", GroupUpdate{GroupRef: GroupRef{Group: "g"}, Set: SetMaxDeliver, MaxDeliver: 2, AckWaitMs: 0}, true},
	} {
		err := tc.f.Validate()
		var we *Error
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && (!errors.As(err, &we) || we.Code != CodeInvalidArgument):
			t.Errorf("%s: %v, want INVALID_ARGUMENT", tc.name, err)
		}
	}
}
