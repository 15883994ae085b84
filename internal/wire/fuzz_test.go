package wire

import (
	"bytes"
	"path"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeFrame feeds arbitrary bytes to the decoder: it must never panic,
// and whatever it accepts must re-encode to a frame that decodes to the same
// value (the codec is a bijection on valid frames).
func FuzzDecodeFrame(f *testing.F) {
	for i, fr := range sampleFrames() {
		f.Add(AppendFrame(nil, uint64(i), fr))
	}
	for i, fr := range kvSampleFrames() {
		f.Add(AppendFrame(nil, uint64(i), fr))
	}
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		corr, fr, err := ReadFrame(bytes.NewReader(b), 1<<20)
		if err != nil {
			return
		}
		again := AppendFrame(nil, corr, fr)
		corr2, fr2, err := ReadFrame(bytes.NewReader(again), 1<<20)
		if err != nil || corr2 != corr || !reflect.DeepEqual(normalize(fr), normalize(fr2)) {
			t.Fatalf("re-encode mismatch: %#v vs %#v (%v)", fr, fr2, err)
		}
	})
}

// normalize maps empty byte slices to nil so DeepEqual compares content.
func normalize(f Frame) Frame {
	switch v := f.(type) {
	case *Pub:
		c := *v
		c.Key, c.Value = nilIfEmpty(c.Key), nilIfEmpty(c.Value)
		c.Headers = normalizeHeaders(c.Headers)
		return &c
	case *Msg:
		c := *v
		c.Key, c.Value = nilIfEmpty(c.Key), nilIfEmpty(c.Value)
		c.Headers = normalizeHeaders(c.Headers)
		return &c
	case *PeerPublish:
		c := *v
		c.Pub = *normalize(&v.Pub).(*Pub)
		return &c
	case *Schedule:
		c := *v
		c.Pub = *normalize(&v.Pub).(*Pub)
		return &c
	case *PubBatch:
		c := *v
		c.Records = nil
		for _, r := range v.Records {
			r.Key, r.Value, r.Headers = nilIfEmpty(r.Key), nilIfEmpty(r.Value), normalizeHeaders(r.Headers)
			c.Records = append(c.Records, r)
		}
		return &c
	case *Replicate:
		c := *v
		c.Entries = nil
		for _, e := range v.Entries {
			c.Entries = append(c.Entries, ReplicaEntry{Seq: e.Seq, Epoch: e.Epoch, Data: nilIfEmpty(e.Data)})
		}
		return &c
	case *PeerHello:
		c := *v
		c.Nonce = nilIfEmpty(c.Nonce)
		return &c
	case *PeerChallenge:
		c := *v
		c.Nonce, c.Proof = nilIfEmpty(c.Nonce), nilIfEmpty(c.Proof)
		return &c
	case *PeerAuth:
		c := *v
		c.Proof = nilIfEmpty(c.Proof)
		return &c
	}
	return normalizeKV(f)
}

func normalizeHeaders(hs []Header) []Header {
	out := make([]Header, len(hs))
	for i, h := range hs {
		out[i] = Header{Key: h.Key, Value: nilIfEmpty(h.Value)}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// FuzzValidateName: every accepted name is one path element that stays a
// child of the directory it is joined to (it can never reach the data
// directory's own files), and is outside the reserved namespace.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"orders", ".", "..", "...", "__meta", "_a", "a/b", "dlq.g.t", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateName("topic", name) != nil {
			return
		}
		joined := path.Join("data/topics", name)
		if path.Dir(joined) != "data/topics" || path.Base(joined) != name {
			t.Fatalf("accepted %q escapes its directory: %s", name, joined)
		}
		if strings.HasPrefix(name, ReservedPrefix) || len(name) > NameBytesMax {
			t.Fatalf("accepted %q", name)
		}
	})
}
