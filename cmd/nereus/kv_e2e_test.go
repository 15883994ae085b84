package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The kv verbs against a real `nereus serve` process: bucket create and
// list, put/get/cas/del, history, keys, a watch from revision 1 (--json,
// --count), a CAS mismatch exiting 3 and naming the current revision, a
// missing bucket and a bad name failing, and everything surviving a
// restart of the server.
func TestCLIKVAgainstRealServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	addr, srv := startServeWithToken(t, "kv-secret")
	run := func(args ...string) (string, error) {
		cmd := exec.Command(nereusBinary(t), args...)
		cmd.Env = append(os.Environ(), "NEREUS_SERVER="+addr, "NEREUS_TOKEN=kv-secret")
		out, err := cmd.Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out) + string(exit.Stderr), err
		}
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("nereus %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	if out := must("kv", "bucket", "create", "cfg", "--history", "3", "--ttl", "1h"); !strings.Contains(out, "created") {
		t.Fatalf("bucket create: %s", out)
	}
	if out, err := run("kv", "bucket", "create", "cfg", "--history", "5"); err == nil || !strings.Contains(out, "TOPIC_CONFLICT") {
		t.Fatalf("conflicting create: %v\n%s", err, out)
	}
	if out := must("kv", "bucket", "list", "--json"); !strings.Contains(out, `"bucket":"cfg","history":3,"tombstone_ttl_ms":3600000`) {
		t.Fatalf("bucket list: %s", out)
	}
	put := must("kv", "put", "cfg", "color", "red", "--json")
	if !strings.HasPrefix(put, `{"key":"color","revision":`) {
		t.Fatalf("put: %s", put)
	}
	rev := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(put), `{"key":"color","revision":`), "}")
	if out := must("kv", "cas", "cfg", "color", "blue", "--revision", rev); !strings.Contains(out, "color revision") {
		t.Fatalf("cas: %s", out)
	}
	out, err := run("kv", "cas", "cfg", "color", "green", "--revision", rev)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != kvMismatchExit || !strings.Contains(out, "current revision is") {
		t.Fatalf("stale cas: %v\n%s", err, out)
	}
	if out, err := run("kv", "cas", "cfg", "color", "x", "--revision", "0"); err == nil || !strings.Contains(out, "revision mismatch") {
		t.Fatalf("create-only cas of a live key: %v\n%s", err, out)
	}
	must("kv", "cas", "cfg", "shape", "round", "--revision", "0")
	must("kv", "del", "cfg", "shape")
	if out := must("kv", "get", "cfg", "color"); out != "blue\n" {
		t.Fatalf("get: %q", out)
	}
	if out := must("kv", "get", "cfg", "color", "--revision", rev, "--json"); !strings.Contains(out, `"value":"red"`) {
		t.Fatalf("get --revision: %s", out)
	}
	if out, err := run("kv", "get", "cfg", "shape"); err == nil || !strings.Contains(out, "key not found") {
		t.Fatalf("get of a deleted key: %v\n%s", err, out)
	}
	if out := must("kv", "history", "cfg", "shape", "--json"); strings.Count(out, "\n") != 2 || !strings.Contains(out, `"op":"del"`) {
		t.Fatalf("history: %s", out)
	}
	if out := must("kv", "keys", "cfg"); out != "color\n" {
		t.Fatalf("keys: %q", out)
	}
	if out := must("kv", "keys", "cfg", "--prefix", "sh", "--json"); out != "" {
		t.Fatalf("keys --prefix sh: %q", out)
	}
	// A watch from revision 1 prints the four writes in order.
	watch := func() []string {
		t.Helper()
		out := must("kv", "watch", "cfg", "--from-revision", "1", "--count", "4", "--json")
		var lines []string
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		return lines
	}
	lines := watch()
	if len(lines) != 4 || !strings.Contains(lines[0], `"value":"red"`) || !strings.Contains(lines[3], `"key":"shape","revision"`) || !strings.Contains(lines[3], `"op":"del"`) {
		t.Fatalf("watch:\n%s", strings.Join(lines, "\n"))
	}
	if out, err := run("kv", "get", "nope", "k"); err == nil || !strings.Contains(out, "NOT_FOUND") {
		t.Fatalf("get in a missing bucket: %v\n%s", err, out)
	}
	if out, err := run("kv", "bucket", "create", "__x"); err == nil || !strings.Contains(out, "INVALID_ARGUMENT") {
		t.Fatalf("reserved bucket name: %v\n%s", err, out)
	}
	// The bucket and its history survive a restart (rebuilt from its log).
	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := run("kv", "get", "cfg", "color")
		if err == nil && out == "blue\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after restart: %v\n%s", err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if again := watch(); strings.Join(again, "\n") != strings.Join(lines, "\n") {
		t.Fatalf("watch after restart:\n%s\nbefore:\n%s", strings.Join(again, "\n"), strings.Join(lines, "\n"))
	}
	must("kv", "bucket", "delete", "cfg")
	if out := must("kv", "bucket", "list"); strings.Contains(out, "cfg") {
		t.Fatalf("deleted bucket listed: %s", out)
	}
}
