package client

import (
	"errors"
	"strings"
	"testing"

	"github.com/nereus-broker/nereus/internal/server"
	"github.com/nereus-broker/nereus/internal/vfs"
)

// startFullBroker serves a node that takes at most max client connections.
func startFullBroker(t *testing.T, max int) string {
	t.Helper()
	b := startBrokerWith(t, vfs.NewMem(), "/d", listen(t), nil, server.Config{ConnectionsMax: max})
	t.Cleanup(b.stop)
	return b.addr
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
