package invariant

import "testing"

func TestTookOffice(t *testing.T) {
	g := NewGroup(3, false)
	if v := g.TookOffice(1, 1, 2); v != nil {
		t.Fatalf("a majority of promises: %v", v)
	}
	if v := g.TookOffice(1, 1, 2); v != nil {
		t.Fatalf("the same leader seen again: %v", v)
	}
	if v := g.TookOffice(2, 1, 3); v == nil || v.Invariant != OneLeaderPerEpoch {
		t.Fatalf("a second leader of epoch 1: %v", v)
	}
	if v := g.TookOffice(3, 2, 1); v == nil || v.Invariant != InstallNeedsQuorumPromise {
		t.Fatalf("one promise of three: %v", v)
	}
	if g.LastLedEpoch() != 2 || NewGroup(3, false).LastLedEpoch() != 0 {
		t.Fatalf("last led epoch %d", g.LastLedEpoch())
	}
	if g.Leader(1) != 1 || g.Leader(2) != 3 || g.Leader(9) != 0 || g.Elections() != 2 {
		t.Fatalf("leaders: %d %d %d, elections %d", g.Leader(1), g.Leader(2), g.Leader(9), g.Elections())
	}
}

func TestVisible(t *testing.T) {
	for _, c := range []struct {
		name    string
		syncAll bool
		holders int
		want    string
	}{
		{"quorum held", false, 2, ""},
		{"minority held", false, 1, VisibleImpliesQuorumFlushed},
		{"sync_all, two of three", true, 2, VisibleImpliesQuorumFlushed},
		{"sync_all, all three", true, 3, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewGroup(3, c.syncAll)
			v := g.Visible(1, 1, Entry{1, "a"}, c.holders)
			if got := ""; v != nil {
				got = v.Invariant
				if got != c.want {
					t.Fatalf("got %v, want %q", v, c.want)
				}
			} else if c.want != "" {
				t.Fatalf("no violation, want %s", c.want)
			}
		})
	}
	g := NewGroup(3, false)
	if v := g.Visible(1, 2, Entry{1, "b"}, 2); v != nil {
		t.Fatal(v)
	}
	if _, ok := g.Committed(1); ok {
		t.Fatal("seq 1 was never made visible")
	}
	if e, ok := g.Committed(2); !ok || e != (Entry{1, "b"}) || g.CommittedLen() != 2 {
		t.Fatalf("seq 2: %v %v, len %d", e, ok, g.CommittedLen())
	}
	if v := g.Visible(2, 2, Entry{1, "b"}, 3); v != nil {
		t.Fatalf("the same entry on another replica: %v", v)
	}
	for _, other := range []Entry{{2, "b"}, {1, "c"}} {
		if v := g.Visible(3, 2, other, 3); v == nil || v.Invariant != CommittedPrefixAgreement {
			t.Fatalf("%v at a committed seq: %v", other, v)
		}
	}
}

func TestCloneAndKey(t *testing.T) {
	g := NewGroup(3, false)
	g.TookOffice(1, 1, 2)
	g.Visible(1, 1, Entry{1, ""}, 2)
	c := g.Clone()
	if string(c.AppendKey(nil)) != string(g.AppendKey(nil)) {
		t.Fatal("a clone encodes differently")
	}
	c.Visible(1, 2, Entry{1, "x"}, 2)
	c.TookOffice(2, 2, 2)
	if _, ok := g.Committed(2); ok || g.Leader(2) != 0 {
		t.Fatal("changing the clone changed the original")
	}
	if string(c.AppendKey(nil)) == string(g.AppendKey(nil)) {
		t.Fatal("different states encode alike")
	}
	// Values are length-prefixed: ("ab","") and ("a","b") differ.
	a, b := NewGroup(3, false), NewGroup(3, false)
	a.Visible(1, 1, Entry{1, "ab"}, 2)
	a.Visible(1, 2, Entry{1, ""}, 2)
	b.Visible(1, 1, Entry{1, "a"}, 2)
	b.Visible(1, 2, Entry{1, "b"}, 2)
	if string(a.AppendKey(nil)) == string(b.AppendKey(nil)) {
		t.Fatal("ambiguous encoding")
	}
}
