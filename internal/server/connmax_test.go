package server

import (
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/vfs"
	"github.com/nereus-broker/nereus/internal/wire"
)

// A connection past ConnectionsMax is told UNAVAILABLE in place of
// HELLO_OK and closed; once one closes, the next is served.
func TestConnectionsBeyondTheMaximumAreRefused(t *testing.T) {
	s, addr := startServerOn(t, Config{AllowNoAuth: true, ConnectionsMax: 2}, vfs.NewMem())
	first := dialRaw(t, addr)
	first.hello("")
	dialRaw(t, addr).hello("")
	third := dialRaw(t, addr)
	third.write(1, &wire.Hello{VersionMin: 1, VersionMax: 1})
	if _, f := third.read(); f.Type() != wire.TypeErr || f.(*wire.Err).Code != wire.CodeUnavailable {
		t.Fatalf("the third of two allowed connections got %#v, want ERR UNAVAILABLE", f)
	}
	third.expectClosed()
	if n := metricValue(t, s, "nereus_client_connections_refused_total"); n != 1 {
		t.Fatalf("%v refusals counted, want 1", n)
	}
	first.conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := dialRaw(t, addr)
		c.write(1, &wire.Hello{VersionMin: 1, VersionMax: 1})
		_, f := c.read()
		if f.Type() == wire.TypeHelloOK {
			return
		}
		c.conn.Close()
		if time.Now().After(deadline) {
			t.Fatalf("a connection after one of two closed still got %#v", f)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metricValue reads a counter or a gauge of the server's node.
func metricValue(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	mfs, err := s.node.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			if g := mf.GetMetric()[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
