package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nereus-broker/nereus/internal/env"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/server"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// startFullBroker serves a node that takes at most max client connections.
func startFullBroker(t *testing.T, max int) string {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Open(node.Config{DataDir: "/d", Env: env.Env{FS: vfs.NewMem()}, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Config{AllowNoAuth: true, Logger: logger, ConnectionsMax: max}, n)
	if err != nil {
		t.Fatal(err)
	}
	lis := listen(t)
	go s.Serve(lis)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
		n.Close()
	})
	return lis.Addr().String()
}

// A node with its maximum of connections refuses the SDK with an error
// that says so and is retryable; Dial then goes on to the next server.
func TestDialPastAFullNode(t *testing.T) {
	full := startFullBroker(t, 1)
	held, err := Dial(testCtx(t), Options{Servers: []string{full}})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, err = Dial(testCtx(t), Options{Servers: []string{full}})
	if !errors.Is(err, ErrUnavailable) || !IsRetryable(err) || !strings.Contains(err.Error(), "maximum of 1 client connections") {
		t.Fatalf("dial to a full node: %v, want a retryable UNAVAILABLE", err)
	}
	c, err := Dial(testCtx(t), Options{Servers: []string{full, startFullBroker(t, 1)}})
	if err != nil {
		t.Fatalf("dial to a full node, then a free one: %v", err)
	}
	c.Close()
}
