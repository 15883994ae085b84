package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// `nereus topic update` against a real process: the retention given
// changes, what is not given keeps its value, the topic lists with it —
// across a kill -9 too — and bad requests fail with a clear message.
func TestCLITopicUpdate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	_, srv, run := startInsecureServe(t)
	must := mustRunner(t, run)
	listed := func() (ms, bytes int64) {
		t.Helper()
		var topic struct {
			RetentionMs    int64 `json:"retention_ms"`
			RetentionBytes int64 `json:"retention_bytes"`
		}
		if err := json.Unmarshal([]byte(must("topic", "list", "orders", "--json")), &topic); err != nil {
			t.Fatal(err)
		}
		return topic.RetentionMs, topic.RetentionBytes
	}
	must("topic", "create", "orders", "--retention", "1h")
	out := must("topic", "update", "orders", "--retention-bytes", "1048576")
	if !strings.Contains(out, "updated topic orders (incarnation 1): retention 1h0m0s, retention-bytes 1048576") {
		t.Fatalf("topic update printed %q", out)
	}
	if ms, bytes := listed(); ms != 3_600_000 || bytes != 1<<20 {
		t.Fatalf("listed retention %d ms, %d bytes; want 3600000 and 1048576", ms, bytes)
	}
	if out := must("topic", "update", "orders", "--retention", "0"); !strings.Contains(out, "retention unlimited, retention-bytes 1048576") {
		t.Fatalf("topic update printed %q", out)
	}
	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	if ms, bytes := listed(); ms != 0 || bytes != 1<<20 {
		t.Fatalf("after kill -9: retention %d ms, %d bytes; want 0 and 1048576", ms, bytes)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"topic", "update", "orders"}, "give --retention, --retention-bytes or both"},
		{[]string{"topic", "update", "nope", "--retention", "1h"}, `topic "nope" does not exist`},
		{[]string{"topic", "update", "orders", "--retention-bytes", "-1"}, "must not be negative"},
		{[]string{"topic", "update", "orders", "--retention", "1500us"}, "not a whole number of milliseconds"},
		{[]string{"topic", "update", "__sched", "--retention", "1h"}, "reserved for Nereus"},
		{[]string{"topic", "update", "orders", "--incarnation", "2", "--retention", "1h"}, "incarnation 2 does not exist"},
	} {
		if out, stderr, err := run(c.args...); err == nil || !strings.Contains(stderr, c.want) {
			t.Fatalf("nereus %v: exit %v, want a failure saying %q\n%s%s", c.args, err, c.want, out, stderr)
		}
	}
}
