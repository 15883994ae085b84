package wire

import (
	"bytes"
	"testing"
)

// FuzzDecodeGroupDeleteFrames feeds arbitrary bodies to the decoders of
// the group delete frames — GROUP_DELETE, GROUP_DELETE_FORCE,
// GROUP_INCARNATION, GROUP_INCARNATION_OK and GROUP_DELETE_INCARNATION:
// no panic, and whatever is accepted re-encodes to the same bytes (a
// force byte other than 0 or 1 is refused, not read as true).
func FuzzDecodeGroupDeleteFrames(f *testing.F) {
	frames := []func() Frame{
		func() Frame { return &GroupDelete{} },
		func() Frame { return &GroupDeleteForce{} },
		func() Frame { return &GroupIncarnation{} },
		func() Frame { return &GroupIncarnationOK{} },
		func() Frame { return &GroupDeleteIncarnation{} },
	}
	for i, fr := range []Frame{&GroupDelete{Group: "g"}, &GroupDeleteForce{Group: "g"}, &GroupIncarnation{Group: "billing"},
		&GroupIncarnationOK{GroupRef: GroupRef{Group: "billing", Incarnation: 2}},
		&GroupDeleteIncarnation{GroupRef: GroupRef{Group: "billing", Incarnation: 7}, Force: true}} {
		f.Add(uint8(i), fr.appendBody(nil))
	}
	f.Add(uint8(4), append((&GroupRef{Group: "g", Incarnation: 1}).appendBody(nil), 2))
	f.Fuzz(func(t *testing.T, typ uint8, body []byte) {
		fr := frames[int(typ)%len(frames)]()
		if decodeBody(fr, body) != nil {
			return
		}
		if again := fr.appendBody(nil); !bytes.Equal(again, body) {
			t.Fatalf("%s: accepted %x, re-encodes to %x", fr.Type(), body, again)
		}
	})
}

// A GROUP_DELETE_INCARNATION whose force byte is neither 0 nor 1 is a
// bad frame; one with the field cut is too.
func TestGroupDeleteIncarnationRefusesABadForceByte(t *testing.T) {
	ref := (&GroupRef{Group: "g", Incarnation: 1}).appendBody(nil)
	for _, body := range [][]byte{append(ref, 2), ref} {
		if err := decodeBody(&GroupDeleteIncarnation{}, body); err == nil {
			t.Fatalf("body %x accepted", body)
		}
	}
	var f GroupDeleteIncarnation
	if err := decodeBody(&f, append(ref, 1)); err != nil || !f.Force || f.Incarnation != 1 || f.Group != "g" {
		t.Fatalf("a valid body: %+v, %v", f, err)
	}
}
