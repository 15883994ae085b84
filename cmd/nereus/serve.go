package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/nereus-broker/nereus/internal/admin"
	"github.com/nereus-broker/nereus/internal/node"
	"github.com/nereus-broker/nereus/internal/server"
)

func init() {
	extraCommands = append(extraCommands, newServeCmd, newDevCmd)
}

// nodeOptions are the settings shared by `serve` and `dev`.
type nodeOptions struct {
	nodeID         string
	dataDir        string
	listen         string
	httpListen     string
	tokenFile      string
	insecureNoAuth bool
	tlsCert        string
	tlsKey         string
	logLevel       string
}

func newServeCmd() *cobra.Command {
	var o nodeOptions
	var configFile string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a production Nereus node",
		Long: `Run a Nereus node. Clients must authenticate with a token from --token-file
(one token per line) unless --insecure-no-auth is given.

--config FILE reads the same settings from a JSON object whose keys are the
flag names (node-id, data, listen, http, token-file, insecure-no-auth,
tls-cert, tls-key, log-level); flags given on the command line win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				if err := applyConfigFile(cmd, configFile); err != nil {
					return err
				}
			}
			if o.tokenFile == "" && !o.insecureNoAuth {
				return errors.New("serve: --token-file is required (or pass --insecure-no-auth to run without authentication)")
			}
			return runNode(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "JSON file with the settings below (flags override it)")
	f.StringVar(&o.nodeID, "node-id", "n1", "node id")
	f.StringVar(&o.dataDir, "data", "./nereus-data", "data directory")
	f.StringVar(&o.listen, "listen", "127.0.0.1:4850", "client listen address")
	f.StringVar(&o.httpListen, "http", "127.0.0.1:8850", "HTTP listen address (metrics, health, admin); empty disables")
	f.StringVar(&o.tokenFile, "token-file", "", "file with one client token per line")
	f.BoolVar(&o.insecureNoAuth, "insecure-no-auth", false, "accept clients without a token")
	f.StringVar(&o.tlsCert, "tls-cert", "", "TLS certificate file (PEM); enables TLS with --tls-key")
	f.StringVar(&o.tlsKey, "tls-key", "", "TLS private key file (PEM)")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

func newDevCmd() *cobra.Command {
	o := nodeOptions{nodeID: "dev", listen: "127.0.0.1:4850", httpListen: "127.0.0.1:8850",
		insecureNoAuth: true, logLevel: "info"}
	var nodes int
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a development node on loopback with no configuration",
		Long: `Run a single Nereus node for development: data in ./nereus-data, clients on
127.0.0.1:4850, HTTP on 127.0.0.1:8850, no authentication. It listens on
loopback only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodes != 1 {
				return fmt.Errorf("dev: --nodes %d needs replication, which this build does not have yet; use --nodes 1", nodes)
			}
			for _, addr := range []string{o.listen, o.httpListen} {
				if err := requireLoopback(addr); err != nil {
					return err
				}
			}
			return runNode(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data", "./nereus-data", "data directory")
	f.StringVar(&o.listen, "listen", o.listen, "client listen address (loopback only)")
	f.StringVar(&o.httpListen, "http", o.httpListen, "HTTP listen address (loopback only)")
	f.IntVar(&nodes, "nodes", 1, "number of nodes")
	f.StringVar(&o.logLevel, "log-level", o.logLevel, "log level: debug, info, warn, error")
	return cmd
}

func requireLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("dev: bad address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("dev: %s is not a loopback address; dev mode listens on loopback only", addr)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("bad --log-level %q", s)
	}
	return l, nil
}

// runNode runs a node until SIGINT/SIGTERM or ctx ends. When it is ready it
// prints one line to stdout: "nereus ready client=ADDR http=ADDR".
func runNode(ctx context.Context, o nodeOptions) error {
	level, err := parseLevel(o.logLevel)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	scfg := server.Config{Logger: logger, AllowNoAuth: o.insecureNoAuth}
	if o.tokenFile != "" {
		if scfg.Tokens, err = server.LoadTokens(o.tokenFile); err != nil {
			return err
		}
	}
	if o.tlsCert != "" || o.tlsKey != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return fmt.Errorf("load TLS key pair: %w", err)
		}
		scfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	n, err := node.Open(node.Config{NodeID: o.nodeID, DataDir: o.dataDir, Logger: logger})
	if err != nil {
		return err
	}
	defer n.Close()
	srv, err := server.New(scfg, n)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.listen, err)
	}
	var ready atomic.Bool
	var httpSrv *http.Server
	httpAddr := ""
	if o.httpListen != "" {
		hl, err := net.Listen("tcp", o.httpListen)
		if err != nil {
			lis.Close()
			return fmt.Errorf("listen %s: %w", o.httpListen, err)
		}
		httpAddr = hl.Addr().String()
		httpSrv = &http.Server{Handler: admin.Handler(n, &ready), ReadHeaderTimeout: 10 * time.Second}
		go httpSrv.Serve(hl)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	ready.Store(true)
	logger.Info("nereus ready", "node", o.nodeID, "client", lis.Addr().String(), "http", httpAddr,
		"data", o.dataDir, "auth", !o.insecureNoAuth, "tls", scfg.TLS != nil)
	fmt.Printf("nereus ready client=%s http=%s\n", lis.Addr(), httpAddr)
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	ready.Store(false)
	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Close(sctx)
	if httpSrv != nil {
		httpSrv.Shutdown(sctx)
	}
	if err != nil && !strings.Contains(err.Error(), "use of closed") {
		return err
	}
	return nil
}

// applyConfigFile sets every flag the command line did not set from a JSON
// object keyed by flag name. Unknown keys are errors, so a typo cannot
// silently leave a setting at its default.
func applyConfigFile(cmd *cobra.Command, file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var settings map[string]any
	if err := json.Unmarshal(b, &settings); err != nil {
		return fmt.Errorf("config %s: %w", file, err)
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		f := cmd.Flags().Lookup(key)
		if f == nil || key == "config" {
			return fmt.Errorf("config %s: unknown setting %q", file, key)
		}
		if f.Changed {
			continue // the command line wins
		}
		var value string
		switch v := settings[key].(type) {
		case string:
			value = v
		case bool:
			value = strconv.FormatBool(v)
		case float64:
			value = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			return fmt.Errorf("config %s: %q must be a string, number or boolean", file, key)
		}
		if err := f.Value.Set(value); err != nil {
			return fmt.Errorf("config %s: %q: %w", file, key, err)
		}
	}
	return nil
}
