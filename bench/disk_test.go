package main

import (
	"bytes"
	"os"
	"testing"
)

func TestDiskAnchorWritesInsideItsPreallocatedFile(t *testing.T) {
	sys, err := startDisk(t.Context(), nil, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := sys.NewPublisher(t.Context(), "s", 1)
	if err != nil {
		t.Fatal(err)
	}
	p := pub.(*diskPublisher)
	a, b := bytes.Repeat([]byte("a"), 1024), bytes.Repeat([]byte("b"), 1024)
	if err := p.Publish(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	// The next write would pass the end: it wraps to the start.
	p.off = diskFileBytes - 100
	if err := p.Publish(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p.f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != diskFileBytes || !bytes.Equal(got[:1024], b) || p.off != 1024 {
		t.Fatalf("file of %d bytes starting %q, next offset %d", len(got), got[:4], p.off)
	}
	if err := pub.PublishAsync(t.Context(), a, func(error) {}); err == nil {
		t.Error("the disk anchor accepted an async publish")
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.f.Name()); !os.IsNotExist(err) {
		t.Errorf("file left behind: %v", err)
	}
}
