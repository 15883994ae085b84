// Package archtest enforces the architecture rules that code review alone
// would let slip: kernels stay pure (DESIGN §3).
package archtest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// kernels may not import the clock, the network, the file system, global
// randomness or goroutine/lock machinery, nor any project package that is
// not itself a kernel. (Standard packages such as fmt import os internally;
// only direct imports are what a kernel can misuse.)
var kernels = []string{
	"github.com/nereus-broker/nereus/internal/partition",
	"github.com/nereus-broker/nereus/internal/delivery",
	"github.com/nereus-broker/nereus/internal/acklog",
	"github.com/nereus-broker/nereus/internal/invariant",
	"github.com/nereus-broker/nereus/internal/replica",
	"github.com/nereus-broker/nereus/internal/meta",
	"github.com/nereus-broker/nereus/internal/group",
	"github.com/nereus-broker/nereus/internal/sched",
	"github.com/nereus-broker/nereus/internal/kv",
	"github.com/nereus-broker/nereus/internal/kvfold",
}

// vocabulary may be imported by kernels: the protocol's types, codes and
// codecs (no goroutines, clock or I/O of its own; checked below).
const vocabulary = "github.com/nereus-broker/nereus/internal/wire"

var forbidden = []string{"os", "net", "time", "math/rand", "math/rand/v2", "sync", "log/slog", "io/fs"}

func TestKernelsArePure(t *testing.T) {
	for _, pkg := range append(slices.Clone(kernels), vocabulary) {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		deps := map[string]bool{}
		for _, d := range strings.Fields(string(out)) {
			deps[d] = true
		}
		for _, f := range forbidden {
			if deps[f] {
				t.Errorf("kernel %s imports %s", pkg, f)
			}
		}
		for d := range deps {
			if strings.HasPrefix(d, "github.com/nereus-broker/nereus/") && !isKernel(d) && d != vocabulary {
				t.Errorf("kernel %s imports non-kernel %s", pkg, d)
			}
		}
	}
}

func isKernel(pkg string) bool {
	for _, k := range kernels {
		if k == pkg {
			return true
		}
	}
	return false
}
