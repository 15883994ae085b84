package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
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
	// Cluster membership (empty peers = a single node).
	advertise         string
	peerListen        string
	peers             string
	clusterSecretFile string
	clusterSecret     []byte // dev: generated in-process
	noLeaderRebalance bool
	schedWindow       int // node.Config.SchedWindow (0: its default)
	maxConnections    int // server.Config.ConnectionsMax (0: its default)
	maxUnansweredMiB  int // server.Config.UnansweredBytesTotalMax in MiB (0: its default)
	scrubMiBPerSecond int // the scrubber's read rate (0: no scrubber)
}

// scrubBytesPerSecond is node.Config.ScrubBytesPerSecond for o.
func (o nodeOptions) scrubBytesPerSecond() int64 {
	if o.scrubMiBPerSecond == 0 {
		return -1 // no scrubber
	}
	return int64(o.scrubMiBPerSecond) << 20
}

func newServeCmd() *cobra.Command {
	var o nodeOptions
	var configFile string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a production Nereus node",
		Long: `Run a Nereus node. Clients must authenticate with a token from --token-file
(one token per line) unless --insecure-no-auth is given.

A cluster member also takes --peer-listen, --peers (every member of the
initial cluster by peer address, itself included, like etcd's initial
cluster: n1=10.0.0.1:5850,n2=10.0.0.2:5850,n3=10.0.0.3:5850) and
--cluster-secret-file (a secret of at least 16 bytes shared by all members).

--config FILE reads the same settings from a JSON object whose keys are the
flag names (node-id, data, listen, advertise, http, token-file,
insecure-no-auth, tls-cert, tls-key, log-level, peer-listen, peers,
cluster-secret-file, no-leader-rebalance, sched-window, max-connections,
max-unanswered-mib, scrub-mib-per-second);
flags given on the command line win.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				if err := applyConfigFile(cmd, configFile); err != nil {
					return err
				}
			}
			if o.schedWindow < 2 {
				return fmt.Errorf("serve: --sched-window %d: it must be at least 2", o.schedWindow)
			}
			if o.maxConnections < 1 {
				return fmt.Errorf("serve: --max-connections %d: it must be at least 1", o.maxConnections)
			}
			if o.maxUnansweredMiB < 1 || o.maxUnansweredMiB > 1<<20 {
				return fmt.Errorf("serve: --max-unanswered-mib %d: it must be 1 to 1048576", o.maxUnansweredMiB)
			}
			if o.scrubMiBPerSecond < 0 || o.scrubMiBPerSecond > 1<<10 {
				return fmt.Errorf("serve: --scrub-mib-per-second %d: it must be 0 (off) to 1024", o.scrubMiBPerSecond)
			}
			if o.tokenFile == "" && !o.insecureNoAuth {
				return errors.New("serve: --token-file is required (or pass --insecure-no-auth to run without authentication)")
			}
			return runNodes(cmd.Context(), []nodeOptions{o})
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
	f.StringVar(&o.advertise, "advertise", "", "client address other nodes give clients for this node (default: the bound --listen address)")
	f.StringVar(&o.peerListen, "peer-listen", "", "peer (node-to-node) listen address; default: this node's address in --peers")
	f.StringVar(&o.peers, "peers", "", "initial cluster: id=host:port,... by peer address, this node included; empty runs a single node")
	f.StringVar(&o.clusterSecretFile, "cluster-secret-file", "", "file holding the cluster secret (at least 16 bytes)")
	f.BoolVar(&o.noLeaderRebalance, "no-leader-rebalance", false, "leave partitions led where failovers put them (by default a partition's leader hands it back to its preferred leader once that node is back and caught up)")
	f.IntVar(&o.schedWindow, "sched-window", node.SchedWindowDefault, "pending schedules of each destination topic a scheduler shard keeps in memory (up to twice this; the rest wait on disk)")
	f.IntVar(&o.maxConnections, "max-connections", server.ConnectionsMaxDefault, "open client connections; one more is answered UNAVAILABLE and closed")
	f.IntVar(&o.scrubMiBPerSecond, "scrub-mib-per-second", node.ScrubBytesPerSecondDefault>>20, "MiB per second the background scrubber re-reads of sealed segments to find damage (0: no scrubber)")
	f.IntVar(&o.maxUnansweredMiB, "max-unanswered-mib", server.UnansweredBytesTotalMaxDefault>>20, "MiB of client requests read and not yet answered, all connections together (a publish waits for its quorum); past it the node reads no more from clients until answers free room")
	return cmd
}

func newDevCmd() *cobra.Command {
	o := nodeOptions{nodeID: "dev", listen: "127.0.0.1:4850", httpListen: "127.0.0.1:8850",
		insecureNoAuth: true, logLevel: "info", scrubMiBPerSecond: node.ScrubBytesPerSecondDefault >> 20}
	var nodes int
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a development node on loopback with no configuration",
		Long: `Run a Nereus node for development: data in ./nereus-data, clients on
127.0.0.1:4850, HTTP on 127.0.0.1:8850, no authentication. It listens on
loopback only.

With --nodes 3 (or 5) it runs a cluster in one process over real loopback
TCP: node nI keeps its data in ./nereus-data/nI, serves clients on port
4850+I-1, HTTP on 8850+I-1 and peers on 5850+I-1 (client port + 1000).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, addr := range []string{o.listen, o.httpListen} {
				if err := requireLoopback(addr); addr != "" && err != nil {
					return err
				}
			}
			switch nodes {
			case 1:
				return runNodes(cmd.Context(), []nodeOptions{o})
			case 3, 5:
				return runNodes(cmd.Context(), devCluster(o, nodes))
			}
			return fmt.Errorf("dev: --nodes must be 1, 3 or 5, got %d", nodes)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data", "./nereus-data", "data directory")
	f.StringVar(&o.listen, "listen", o.listen, "client listen address (loopback only)")
	f.StringVar(&o.httpListen, "http", o.httpListen, "HTTP listen address (loopback only); empty disables")
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

// devCluster derives the options of an n-node loopback cluster from the
// dev defaults.
func devCluster(o nodeOptions, n int) []nodeOptions {
	secret := make([]byte, 32)
	rand.Read(secret)
	host, cport, _ := net.SplitHostPort(o.listen)
	hhost, hport, _ := net.SplitHostPort(o.httpListen)
	cp, _ := strconv.Atoi(cport)
	hp, _ := strconv.Atoi(hport)
	var peers []string
	for i := 1; i <= n; i++ {
		peers = append(peers, fmt.Sprintf("n%d=%s", i, net.JoinHostPort(host, strconv.Itoa(cp+1000+i-1))))
	}
	var out []nodeOptions
	for i := 1; i <= n; i++ {
		m := o
		m.nodeID = fmt.Sprintf("n%d", i)
		m.dataDir = filepath.Join(o.dataDir, m.nodeID)
		m.listen = net.JoinHostPort(host, strconv.Itoa(cp+i-1))
		if o.httpListen != "" {
			m.httpListen = net.JoinHostPort(hhost, strconv.Itoa(hp+i-1))
		}
		m.peers, m.clusterSecret = strings.Join(peers, ","), secret
		out = append(out, m)
	}
	return out
}

// parsePeers parses --peers: id=host:port,...
func parsePeers(s string) ([]node.Member, error) {
	var out []node.Member
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, addr, ok := strings.Cut(item, "=")
		if !ok || id == "" {
			return nil, fmt.Errorf("--peers: %q is not id=host:port", item)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("--peers: %s: %w", id, err)
		}
		out = append(out, node.Member{ID: id, PeerAddr: addr})
	}
	return out, nil
}

// clusterConfig builds the node's cluster settings (nil = single node).
func clusterConfig(o nodeOptions) (*node.ClusterConfig, error) {
	if o.peers == "" {
		if o.peerListen != "" || o.clusterSecretFile != "" {
			return nil, errors.New("--peer-listen and --cluster-secret-file need --peers")
		}
		return nil, nil
	}
	members, err := parsePeers(o.peers)
	if err != nil {
		return nil, err
	}
	secret := o.clusterSecret
	if secret == nil {
		if o.clusterSecretFile == "" {
			return nil, errors.New("a cluster member needs --cluster-secret-file")
		}
		b, err := os.ReadFile(o.clusterSecretFile)
		if err != nil {
			return nil, fmt.Errorf("cluster secret: %w", err)
		}
		secret = []byte(strings.TrimSpace(string(b)))
	}
	if len(secret) < 16 {
		return nil, errors.New("the cluster secret must be at least 16 bytes")
	}
	cc := &node.ClusterConfig{Members: members, Secret: secret, NoLeaderRebalance: o.noLeaderRebalance}
	if o.peerListen != "" {
		l, err := net.Listen("tcp", o.peerListen)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", o.peerListen, err)
		}
		cc.PeerListener = l
	}
	return cc, nil
}

// runningNode is one node started by runNodes.
type runningNode struct {
	o        nodeOptions
	logger   *slog.Logger
	n        *node.Node
	srv      *server.Server
	lis      net.Listener
	httpSrv  *http.Server
	httpAddr string
	ready    atomic.Bool
	serveErr chan error
}

// startNode opens a node and starts serving clients and HTTP.
func startNode(o nodeOptions) (*runningNode, error) {
	level, err := parseLevel(o.logLevel)
	if err != nil {
		return nil, err
	}
	r := &runningNode{o: o, serveErr: make(chan error, 1)}
	r.logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if o.peers != "" {
		r.logger = r.logger.With("node", o.nodeID)
	}
	scfg := server.Config{Logger: r.logger, AllowNoAuth: o.insecureNoAuth, ConnectionsMax: o.maxConnections,
		UnansweredBytesTotalMax: int64(o.maxUnansweredMiB) << 20}
	if o.tokenFile != "" {
		if scfg.Tokens, err = server.LoadTokens(o.tokenFile); err != nil {
			return nil, err
		}
	}
	if o.tlsCert != "" || o.tlsKey != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("load TLS key pair: %w", err)
		}
		scfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	cc, err := clusterConfig(o)
	if err != nil {
		return nil, err
	}
	if r.lis, err = net.Listen("tcp", o.listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", o.listen, err)
	}
	advertise := o.advertise
	if advertise == "" {
		advertise = r.lis.Addr().String()
	}
	r.n, err = node.Open(node.Config{NodeID: o.nodeID, DataDir: o.dataDir, Logger: r.logger, ClientAddr: advertise, Cluster: cc,
		SchedWindow: o.schedWindow, ScrubBytesPerSecond: o.scrubBytesPerSecond()})
	if err != nil {
		r.lis.Close()
		return nil, err
	}
	if r.srv, err = server.New(scfg, r.n); err != nil {
		r.stop()
		return nil, err
	}
	if o.httpListen != "" {
		hl, err := net.Listen("tcp", o.httpListen)
		if err != nil {
			r.stop()
			return nil, fmt.Errorf("listen %s: %w", o.httpListen, err)
		}
		r.httpAddr = hl.Addr().String()
		r.httpSrv = &http.Server{Handler: admin.Handler(r.n, &r.ready), ReadHeaderTimeout: 10 * time.Second}
		go r.httpSrv.Serve(hl)
	}
	go func() { r.serveErr <- r.srv.Serve(r.lis) }()
	r.ready.Store(true)
	r.logger.Info("nereus ready", "node", o.nodeID, "client", r.lis.Addr().String(), "http", r.httpAddr,
		"data", o.dataDir, "auth", !o.insecureNoAuth, "tls", scfg.TLS != nil, "cluster", o.peers != "")
	return r, nil
}

func (r *runningNode) stop() {
	r.ready.Store(false)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.srv != nil {
		r.srv.Close(sctx)
	} else {
		r.lis.Close()
	}
	if r.httpSrv != nil {
		r.httpSrv.Shutdown(sctx)
	}
	r.n.Close()
}

// runNodes runs nodes until SIGINT/SIGTERM or ctx ends. When each is ready
// it prints one line to stdout: "nereus ready client=ADDR http=ADDR".
func runNodes(ctx context.Context, opts []nodeOptions) error {
	var running []*runningNode
	defer func() {
		for _, r := range running {
			r.logger.Info("shutting down")
			r.stop()
		}
	}()
	for _, o := range opts {
		r, err := startNode(o)
		if err != nil {
			return err
		}
		running = append(running, r)
		fmt.Printf("nereus ready client=%s http=%s\n", r.lis.Addr(), r.httpAddr)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	errs := make(chan error, len(running))
	for _, r := range running {
		go func() { errs <- <-r.serveErr }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
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
