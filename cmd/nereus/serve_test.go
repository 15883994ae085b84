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
	cmd = newServeCmd()
	cmd.SetArgs([]string{"--insecure-no-auth", "--sched-window", "1"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--sched-window 1") {
		t.Fatalf("a window of 1 must be refused, got %v", err)
	}
	cmd = newServeCmd()
	cmd.SetArgs([]string{"--insecure-no-auth", "--max-connections", "0"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--max-connections 0") {
		t.Fatalf("a maximum of 0 connections must be refused, got %v", err)
	}
	cmd = newServeCmd()
	cmd.SetArgs([]string{"--insecure-no-auth", "--max-unanswered-mib", "0"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--max-unanswered-mib 0") {
		t.Fatalf("a bound of 0 MiB of unanswered requests must be refused, got %v", err)
	}
	os.WriteFile(file, []byte(`{"max-unanswered-mib": 256}`), 0o600)
	cmd = newServeCmd()
	if err := applyConfigFile(cmd, file); err != nil || get("max-unanswered-mib") != "256" {
		t.Fatalf("max-unanswered-mib=%s: %v", get("max-unanswered-mib"), err)
	}
	cmd = newServeCmd()
	cmd.SetArgs([]string{"--insecure-no-auth", "--scrub-mib-per-second", "-1"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--scrub-mib-per-second -1") {
		t.Fatalf("a negative scrub rate must be refused, got %v", err)
	}
	os.WriteFile(file, []byte(`{"scrub-mib-per-second": 0}`), 0o600)
	cmd = newServeCmd()
	if err := applyConfigFile(cmd, file); err != nil || get("scrub-mib-per-second") != "0" {
		t.Fatalf("scrub-mib-per-second=%s: %v", get("scrub-mib-per-second"), err)
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
