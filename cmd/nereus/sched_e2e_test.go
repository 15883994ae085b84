package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestCLIScheduledDelivery: `pub --delay` stores a schedule that `sched
// list` shows; it survives a kill -9 and is published once, not before
// its deliver_at; a paused lane holds a due message until resumed.
func TestCLIScheduledDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	addr, srv := startServeWithToken(t, "sched-secret")
	run := func(args ...string) (string, error) {
		cmd := exec.Command(nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+addr, "NEREUS_TOKEN=sched-secret")
		out, err := cmd.Output()
		return string(out), err
	}
	if _, err := run("topic", "create", "later", "--partitions", "2"); err != nil {
		t.Fatalf("topic create: %v", err)
	}
	out, err := run("pub", "later", "--delay", "2s", "--json", "wake up")
	if err != nil {
		t.Fatalf("pub --delay: %v\n%s", err, out)
	}
	var s struct {
		Shard     uint32    `json:"shard"`
		ID        uint64    `json:"id"`
		DeliverAt time.Time `json:"deliver_at"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.ID == 0 || time.Until(s.DeliverAt) <= 0 {
		t.Fatalf("pub --delay printed %q (%v)", out, err)
	}
	out, err = run("sched", "list", "--json")
	if err != nil || !strings.Contains(out, `"state":"PENDING"`) || !strings.Contains(out, `"topic":"later"`) {
		t.Fatalf("sched list: %v\n%s", err, out)
	}
	if out, err := run("sub", "later", "--group", "g", "--count", "1", "--timeout", "300ms"); err == nil {
		t.Fatalf("the message was delivered before it was due: %s", out)
	}

	if err := srv.restart(); err != nil { // kill -9, then start again
		t.Fatal(err)
	}
	out, err = run("sub", "later", "--group", "g", "--count", "1", "--timeout", "10s", "--json")
	got := time.Now()
	if err != nil || !strings.Contains(out, `"value":"wake up"`) {
		t.Fatalf("sub after the restart: %v\n%s", err, out)
	}
	if got.Before(s.DeliverAt) {
		t.Fatalf("received at %v, before its deliver_at %v", got, s.DeliverAt)
	}
	if out, err := run("sub", "later", "--group", "g", "--count", "1", "--timeout", "500ms"); err == nil {
		t.Fatalf("the message was delivered twice: %s", out)
	}
	out, err = run("sched", "status")
	if err != nil || !strings.Contains(out, "fired=1") || !strings.Contains(out, "lane later") {
		t.Fatalf("sched status: %v\n%s", err, out)
	}

	// A paused lane holds its due message until resumed.
	if _, err := run("sched", "lane", "pause", "later"); err != nil {
		t.Fatalf("lane pause: %v", err)
	}
	if _, err := run("pub", "later", "--delay", "1ms", "held"); err != nil {
		t.Fatalf("pub into a paused lane: %v", err)
	}
	if out, err := run("sub", "later", "--group", "g", "--count", "1", "--timeout", "1s"); err == nil {
		t.Fatalf("a paused lane published: %s", out)
	}
	if _, err := run("sched", "lane", "resume", "later"); err != nil {
		t.Fatalf("lane resume: %v", err)
	}
	out, err = run("sub", "later", "--group", "g", "--count", "1", "--timeout", "10s", "--json")
	if err != nil || !strings.Contains(out, `"value":"held"`) {
		t.Fatalf("sub after resume: %v\n%s", err, out)
	}
	if _, err := run("sched", "lane", "pause", "nolane"); err == nil {
		t.Fatal("pausing a lane that does not exist exited 0")
	}
	if _, err := run("pub", "later", "--delay", "1s", "--at", "2030-01-01T00:00:00Z", "x"); err == nil {
		t.Fatal("--delay with --at exited 0")
	}
	if _, err := run("sched", "cancel", "nonsense"); err == nil {
		t.Fatal("cancel of a malformed id exited 0")
	}
}
