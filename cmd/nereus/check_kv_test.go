package main

import (
	"bytes"
	"strings"
	"testing"
)

// `check kv` explores the KV applied loop's three models; each mutation
// fails with a counterexample in the model that catches it.
func TestCheckKV(t *testing.T) {
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		addExtraCommands(root)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append([]string{"check", "kv", "--restarts", "0"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	out, err := run()
	if err != nil || strings.Count(out, "complete=true") != 3 || strings.Contains(out, "VIOLATION") {
		t.Fatalf("check kv: %v\n%s", err, out)
	}
	for mutation, want := range map[string]string{
		"DropFailedBatch":      "VIOLATION KVStoreMatchesCursor",
		"ResumeFromMemApplied": "VIOLATION KVStoreMatchesCursor",
		"NoAckBarrier":         "VIOLATION KVFoldConverges",
		"UnguardedLiveWatch":   "VIOLATION KVFoldConverges",
	} {
		args := []string{"--mutation", mutation}
		if mutation == "ResumeFromMemApplied" {
			args = append(args, "--restarts", "1")
		}
		out, err := run(args...)
		if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "trace:\n  ") {
			t.Errorf("--mutation %s passed or printed no trace: %v\n%s", mutation, err, out)
		}
	}
	if out, err := run("--model", "resync"); err != nil || strings.Count(out, "model ") != 1 {
		t.Fatalf("--model resync: %v\n%s", err, out)
	}
	if _, err := run("--mutation", "nonsense"); err == nil {
		t.Fatal("an unknown mutation was accepted")
	}
	if _, err := run("--model", "nonsense"); err == nil {
		t.Fatal("an unknown model was accepted")
	}
}
