package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/server"
)

// inprocNereus is a Nereus node and server in the harness process, as
// JetStream runs: the same code as `nereus serve`, without the process
// boundary.
type inprocNereus struct {
	n   *node.Node
	srv *server.Server
}

func startNereusInProcess(ctx context.Context, env *environment, dataDir string) (system, error) {
	n, srv, addr, err := serveInProcess(filepath.Join(dataDir, "n1"), 0)
	if err != nil {
		return nil, err
	}
	ip := &inprocNereus{n: n, srv: srv}
	return newNereusSystemAt(ctx, 1, []string{addr}, ip)
}

// serveInProcess opens a node in dataDir (with schedWindow, 0 for the
// default) and serves it on a free loopback port, without auth; it
// returns the client address.
func serveInProcess(dataDir string, schedWindow int) (*node.Node, *server.Server, string, error) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Open(node.Config{NodeID: "n1", DataDir: dataDir, Logger: logger, SchedWindow: schedWindow})
	if err != nil {
		return nil, nil, "", err
	}
	srv, err := server.New(server.Config{AllowNoAuth: true, Logger: logger}, n)
	if err != nil {
		n.Close()
		return nil, nil, "", err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		n.Close()
		return nil, nil, "", err
	}
	go srv.Serve(lis)
	return n, srv, lis.Addr().String(), nil
}

func (ip *inprocNereus) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), nereusStopTimeout)
	defer cancel()
	err := ip.srv.Close(ctx)
	ip.n.Close()
	return err
}
