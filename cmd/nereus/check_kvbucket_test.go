package main

import (
	"bytes"
	"strings"
	"testing"
)

// `check kv-bucket` explores the KV kernel on a bucket's replicas; a
// mutation fails with a counterexample, bad bounds are refused.
func TestCheckKVBucket(t *testing.T) {
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "kv-bucket", "--writes", "put a,create a"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	if out, err := run(); err != nil || !strings.Contains(out, "complete=true") || strings.Contains(out, "VIOLATION") {
		t.Fatalf("check kv-bucket: %v\n%s", err, out)
	}
	for mutation, want := range map[string][]string{
		"submit-before-reign-start": nil,
		"refuse-without-lease":      {"--writes", "put a,create a,cas a"},
		"watch-jumps-floor":         {"--writes", "del a,put b", "--inflight-max", "1", "--elections", "0", "--compactions", "1", "--watch"},
	} {
		out, err := run(append([]string{"--mutation", mutation}, want...)...)
		if err == nil || !strings.Contains(out, "VIOLATION KV") || !strings.Contains(out, "trace:\n  ") {
			t.Errorf("--mutation %s passed or printed no trace: %v\n%s", mutation, err, out)
		}
	}
	for _, bad := range [][]string{{"--mutation", "nonsense"}, {"--replicas", "1"}, {"--writes", "put c"}, {"--writes", "swap a"}, {"--inflight-max", "0"}, {"--history", "0"}} {
		if _, err := run(bad...); err == nil {
			t.Fatalf("%v was accepted", bad)
		}
	}
}
