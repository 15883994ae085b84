package main

import (
	"strings"
	"testing"
)

// `nereus group update` against a real process: the settings given
// change, what is not given keeps its value — across a kill -9 too, from
// the node's group state — and bad requests fail with a clear message.
func TestCLIGroupUpdate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	_, srv, run := startInsecureServe(t)
	must := mustRunner(t, run)
	must("topic", "create", "orders")
	must("pub", "orders", "one")
	must("sub", "orders", "--group", "g", "--count", "1")
	if out := must("group", "update", "g", "--ack-wait", "2s", "--max-deliver", "3"); !strings.Contains(out, "updated group g (incarnation 1): ack wait 2s, max deliveries 3") {
		t.Fatalf("group update printed %q", out)
	}
	if out := must("group", "update", "g", "--max-deliver", "4"); !strings.Contains(out, "ack wait 2s, max deliveries 4") {
		t.Fatalf("group update printed %q", out)
	}
	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	if out := must("group", "update", "g", "--max-deliver", "4"); !strings.Contains(out, "updated group g (incarnation 1): ack wait 2s, max deliveries 4") {
		t.Fatalf("after kill -9, group update printed %q", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "update", "g"}, "give --ack-wait, --max-deliver or both"},
		{[]string{"group", "update", "g", "--ack-wait", "0"}, "from 1 ms"},
		{[]string{"group", "update", "g", "--ack-wait", "1500us"}, "whole number of milliseconds"},
		{[]string{"group", "update", "g", "--max-deliver", "0"}, "at least 1"},
		{[]string{"group", "update", "a/b", "--max-deliver", "1"}, "not allowed"},
		{[]string{"group", "update", "g", "--incarnation", "2", "--max-deliver", "1"}, "incarnation 2 does not exist"},
	} {
		if out, stderr, err := run(c.args...); err == nil || !strings.Contains(stderr, c.want) {
			t.Fatalf("nereus %v: exit %v, want a failure saying %q\n%s%s", c.args, err, c.want, out, stderr)
		}
	}
}
