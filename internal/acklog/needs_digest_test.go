package acklog

import (
	"bytes"
	"testing"
)

// A clone of what the groups need encodes like the original and changes
// apart from it; the encoding does not depend on the maps' order.
func TestNeedsCloneAndDigest(t *testing.T) {
	var a, b Needs
	a.Applied("g1", 3, KindAck, 0)
	a.Applied("g2", 5, KindAck, 0)
	b.Applied("g2", 5, KindAck, 0)
	b.Applied("g1", 3, KindAck, 0)
	if !bytes.Equal(a.AppendDigest(nil), b.AppendDigest(nil)) {
		t.Fatal("equal needs encode differently")
	}
	c := a.Clone()
	c.Applied("g1", 9, KindCheckpoint, 0)
	if a.Limit(100) != 2 || c.Limit(100) != 4 {
		t.Fatalf("limits %d and %d, want 2 (the original) and 4 (the clone)", a.Limit(100), c.Limit(100))
	}
	if bytes.Equal(a.AppendDigest(nil), c.AppendDigest(nil)) {
		t.Fatal("different needs encode alike")
	}
}
