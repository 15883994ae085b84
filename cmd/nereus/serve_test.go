package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestServeConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "nereus.json")
	os.WriteFile(file, []byte(`{"node-id": "n7", "data": "/var/lib/x", "insecure-no-auth": true, "listen": "127.0.0.1:5999"}`), 0o600)
	cmd := newServeCmd()
	if err := cmd.ParseFlags([]string{"--listen", "127.0.0.1:6000"}); err != nil {
		t.Fatal(err)
	}
	if err := applyConfigFile(cmd, file); err != nil {
		t.Fatal(err)
	}
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	if get("node-id") != "n7" || get("data") != "/var/lib/x" || get("insecure-no-auth") != "true" {
		t.Fatalf("config not applied: node-id=%s data=%s auth=%s", get("node-id"), get("data"), get("insecure-no-auth"))
	}
	if get("listen") != "127.0.0.1:6000" {
		t.Fatalf("the command line should win over the file: listen=%s", get("listen"))
	}
	os.WriteFile(file, []byte(`{"sched-window": 16, "no-leader-rebalance": true}`), 0o600)
	cmd = newServeCmd()
	if err := applyConfigFile(cmd, file); err != nil || get("sched-window") != "16" || get("no-leader-rebalance") != "true" {
		t.Fatalf("sched-window=%s no-leader-rebalance=%s: %v", get("sched-window"), get("no-leader-rebalance"), err)
	}
	for _, bad := range [][2]string{
		{"--sched-window", "1"}, {"--max-connections", "0"}, {"--max-unanswered-mib", "0"}, {"--scrub-mib-per-second", "-1"},
	} {
		cmd = newServeCmd()
		cmd.SetArgs([]string{"--insecure-no-auth", bad[0], bad[1]})
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), bad[0]+" "+bad[1]) {
			t.Fatalf("%s %s must be refused, got %v", bad[0], bad[1], err)
		}
	}
	for key, value := range map[string]string{"max-unanswered-mib": "256", "scrub-mib-per-second": "0"} {
		os.WriteFile(file, []byte(`{"`+key+`": `+value+`}`), 0o600)
		cmd = newServeCmd()
		if err := applyConfigFile(cmd, file); err != nil || get(key) != value {
			t.Fatalf("%s=%s from the file: %v", key, get(key), err)
		}
	}
	for mib, want := range map[int]int64{0: -1, 8: 8 << 20, 64: 64 << 20} {
		if got := (nodeOptions{scrubMiBPerSecond: mib}).scrubBytesPerSecond(); got != want {
			t.Errorf("--scrub-mib-per-second %d gives the node %d B/s, want %d", mib, got, want)
		}
	}
	if get := newServeCmd().Flags().Lookup("scrub-mib-per-second").DefValue; get != "8" {
		t.Errorf("serve's scrub rate defaults to %s MiB/s, want node's default (8)", get)
	}
	os.WriteFile(file, []byte(`{"node_id": "typo"}`), 0o600)
	if err := applyConfigFile(newServeCmd(), file); err == nil || !strings.Contains(err.Error(), "unknown setting") {
		t.Fatalf("a misspelled key must be an error, got %v", err)
	}
	os.WriteFile(file, []byte(`{"listen": ["a"]}`), 0o600)
	if err := applyConfigFile(newServeCmd(), file); err == nil {
		t.Fatal("a list value must be an error")
	}
}
