package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/storage"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// A data directory takes one node or one repair at a time: a second
// node, or a repair, on a directory a node has open is refused with an
// error that says so (two processes writing one log damage it: each
// takes the other's segments for its own), and nothing is written. Once
// the node is closed (or killed, which every kill test covers) both work.
func TestDataDirTakesOneNodeAtATime(t *testing.T) {
	h := newHarness(t)
	h.declare("t", 1)
	h.publishSpread("t", 1, 3)
	before := treeOf(t, h.fs, "/data")
	second := Config{DataDir: "/data", Env: h.node.cfg.Env, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if n, err := Open(second); err == nil || !errors.Is(err, vfs.ErrLocked) || !strings.Contains(err.Error(), "data directory /data is in use") {
		if n != nil {
			n.Close()
		}
		t.Fatalf("a second node on an open data directory: %v", err)
	}
	if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); !errors.Is(err, vfs.ErrLocked) || !strings.Contains(err.Error(), "stop the node first") {
		t.Fatalf("repair of an open data directory: %v", err)
	}
	if after := treeOf(t, h.fs, "/data"); after != before {
		t.Fatalf("the refused open and repair changed the directory:\n%s\nthen\n%s", before, after)
	}
	if _, err := Repair(h.fs, "/nowhere", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err == nil || !strings.Contains(err.Error(), "data directory /nowhere does not exist") {
		t.Fatalf("repair of a missing directory: %v", err)
	}
	h.node.Close()
	if _, err := Repair(h.fs, "/data", RepairOptions{Partition: -1, Mode: storage.RepairSalvage}); err != nil {
		t.Fatalf("repair once the node is closed: %v", err)
	}
	h.open()
	if got := h.node.Metadata([]string{"t"})[0].Partitions[0].CommitSeq; got != 3 {
		t.Fatalf("after the refusals the log ends at %d, want 3", got)
	}
}

// On the operating system's file system the lock is a flock, which a
// kill -9 drops with the process; here two nodes of one process.
func TestDataDirLockOnDisk(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	first, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := Open(cfg); !errors.Is(err, vfs.ErrLocked) {
		if n != nil {
			n.Close()
		}
		first.Close()
		t.Fatalf("a second node on %s: %v", dir, err)
	}
	first.Close()
	again, err := Open(cfg)
	if err != nil {
		t.Fatalf("open after the first closed: %v", err)
	}
	again.Close()
}

// treeOf lists every file under dir with its size, one a line.
func treeOf(t *testing.T, fsys *vfs.MemFS, dir string) string {
	t.Helper()
	names, err := fsys.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, name := range names {
		p := path.Join(dir, name)
		if _, err := fsys.List(p); err == nil {
			b.WriteString(treeOf(t, fsys, p))
			continue
		}
		size, err := fsys.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %d\n", p, size)
	}
	return b.String()
}
