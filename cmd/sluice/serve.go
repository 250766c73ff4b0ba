package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/hitters"
	"github.com/sluicehq/sluice/cluster/overrides"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/peer"
	"github.com/sluicehq/sluice/transport/rules"
	"github.com/sluicehq/sluice/writeback"
)

// serveFlags are the flags of `sluice serve`; each also reads SLUICE_<NAME>
// (upper case, dashes as underscores) when not given on the command line.
type serveFlags struct {
	nodeName, clusterName                                  string
	grpcAddr, httpAddr, gossipAddr, advertiseAddr          string
	join, dataDir, onOwnerUnavailable, logLevel, logFormat string
	rulesPath                                              string
	rulesInterval                                          time.Duration
	cacheSize, cacheCopies, replicas                       int
	flushInterval, forwardTimeout, shutdownTimeout         time.Duration
	replicationInterval, moveWindow, heartbeatIdle         time.Duration
	gcMinHeap                                              byteSize
	tlsCert, tlsKey, tlsCA, clientCA, gossipKeyFile        string
	secretsInterval, joinRetry                             time.Duration
	pprof                                                  bool
	envoyCountRefused, envoyResponseHeaders                bool
	forwardStreams                                         bool
	hotKeyThreshold                                        float64
	region, regionJoin                                     string
	regionFallbackShare                                    float64
	regionCutAfter                                         time.Duration
	forwardAuthDenyStatus                                  int
	ringPartitions                                         int
	failureDetection                                       string
	ringLoad                                               float64
	configPath                                             string
}

// parseRegionJoin reads --region-join: REGION@host:port, comma-separated.
func parseRegionJoin(s string) (map[string][]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	m := map[string][]string{}
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		r, addr, ok := strings.Cut(e, "@")
		if !ok || r == "" {
			return nil, fmt.Errorf("%q: want REGION@host:port", e)
		}
		if _, _, err := splitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%q: want REGION@host:port: %v", e, err)
		}
		m[r] = append(m[r], addr)
	}
	return m, nil
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&f.configPath, configFlag, "", "YAML file of settings keyed by flag name (grpc-addr: :8081); flags and SLUICE_* variables win over it")
	fs.StringVar(&f.nodeName, "node-name", host, "unique name of this node in the cluster")
	fs.StringVar(&f.clusterName, "cluster-name", cluster.DefaultClusterName, "name of the cluster; nodes with another name are refused (gossip and peer calls)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":8081", "gRPC listen address (public API and peer traffic); without TLS or a gossip key, the default is 127.0.0.1:8081")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "HTTP listen address (JSON API, health, status page); empty disables; without TLS or a gossip key, the default is 127.0.0.1:8080")
	fs.StringVar(&f.gossipAddr, "gossip-addr", ":7946", "gossip (memberlist) listen address, TCP and UDP; without TLS or a gossip key, the default is 127.0.0.1:7946")
	fs.StringVar(&f.advertiseAddr, "advertise-addr", "", "host other nodes use to reach this one (default: the listen host, or this machine's first private address)")
	fs.StringVar(&f.join, "join", "", "comma-separated gossip addresses (host:port) of nodes to join")
	fs.DurationVar(&f.joinRetry, "join-retry", time.Second, "how often a node that has not joined yet tries its seeds again")
	fs.StringVar(&f.dataDir, "data-dir", "./sluice-data", "directory of the durable counter store")
	fs.StringVar(&f.rulesPath, "rules", "", "rules file or directory (YAML, docs/rules.md); watched and reloaded on change")
	fs.DurationVar(&f.rulesInterval, "rules-interval", time.Second, "how often the rules files are checked for changes")
	fs.IntVar(&f.cacheSize, "cache-size", 1_000_000, "live counters kept in memory")
	fs.IntVar(&f.cacheCopies, "cache-copies", writeback.DefaultCopies, "replica copies of other nodes' counters kept in memory after their write, apart from --cache-size: a copy in memory takes the owner's next copy without a disk read; 0 keeps none")
	fs.DurationVar(&f.flushInterval, "flush-interval", time.Second, "how often changed counters are written to disk")
	fs.IntVar(&f.replicas, "replicas", 2, "copies of each counter: the owner and replicas-1 backups")
	fs.IntVar(&f.ringPartitions, "ring-partitions", ring.DefaultConfig().Partitions, "partitions keys are hashed into; ownership moves whole partitions. Every node of a cluster must agree (a node that differs stays out of the others' rings); past about 500 nodes 65521 moves close to 1/N of the keys per join (docs/scaling.md)")
	fs.Float64Var(&f.ringLoad, "ring-load", ring.DefaultConfig().Load, "bounded-load factor of the ring: no node owns more than this × its fair share of partitions; higher moves fewer keys per membership change. Every node must agree, as with --ring-partitions")
	fs.DurationVar(&f.replicationInterval, "replication-interval", 100*time.Millisecond, "how often an owner sends changed counters to its replicas")
	fs.DurationVar(&f.moveWindow, "move-window", 30*time.Second, "after a membership change, how long a new owner pulls moved keys on first touch")
	fs.DurationVar(&f.heartbeatIdle, "heartbeat-idle", 30*time.Second, "after this long without a check the pause heartbeat stops (no wake-ups while idle); the next check's keys are pulled first, as after a pause; 0 beats always")
	fs.StringVar(&f.failureDetection, "failure-detection", "lan", "memberlist timings: lan (memberlist's LAN defaults: probe every 1 s, suspicion 4 × log10(N) probe intervals; steady under load, and what clusters past a few tens of nodes need) or fast (probe every 400 ms, suspicion 3 × log10(N) × 400 ms: a crash agreed on within about 3 s, for small clusters on machines with room; docs/scaling.md)")
	fs.StringVar(&f.onOwnerUnavailable, "on-owner-unavailable", "serve", "when a key's owner cannot be reached: serve (decide here) or deny")
	fs.DurationVar(&f.forwardTimeout, "forward-timeout", 250*time.Millisecond, "deadline of a check forwarded to its owner")
	fs.BoolVar(&f.forwardStreams, "forward-streams", true, "carry forwarded checks on one long-lived gRPC stream per peer (false: one unary call each, as before)")
	fs.Float64Var(&f.hotKeyThreshold, "hot-key-threshold", cluster.DefaultHotKeyThreshold, "hits per second of one key from one other node from which this node, as the key's owner, grants that node quota leases to decide the key itself (docs/leases.md); 0 grants none")
	fs.StringVar(&f.region, "region", "", "this node's region (docs/regions.md): the nodes of one region form one ring; global limits are shared between regions. Empty: no regions")
	fs.StringVar(&f.regionJoin, "region-join", "", "comma-separated REGION@host:port gRPC addresses of nodes of the other regions (any node of a region answers for it); needs --region")
	fs.Float64Var(&f.regionFallbackShare, "region-fallback-share", 0, "share of a global limit this region decides alone, per window, while cut off from the key's home region, past the slices it holds; 0: 1 / the number of regions")
	fs.DurationVar(&f.regionCutAfter, "region-cut-after", time.Second, "how long after a home region's last answer, with a failed call since, it counts as cut off")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 20*time.Second, "how long a graceful stop may take")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "the node's certificate (PEM): served on gRPC and HTTP, presented on calls to peers; needs --tls-key and --tls-ca")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key of --tls-cert (PEM)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA certificate(s) of node certificates (PEM): Peer and Admin calls need a client certificate it signed")
	fs.StringVar(&f.clientCA, "client-ca", "", "CA certificate(s) of API clients (PEM): when set, every caller must present a certificate it (or --tls-ca) signed")
	fs.StringVar(&f.gossipKeyFile, "gossip-key-file", "", "base64 AES keys (16, 24 or 32 bytes), one per line, the first encrypts: gossip is encrypted, and without TLS peer calls carry proofs signed with it")
	fs.DurationVar(&f.secretsInterval, "secrets-interval", time.Second, "how often the TLS and gossip key files are checked for changes")
	fs.BoolVar(&f.pprof, "pprof", false, "serve /debug/pprof/ on the HTTP port (with TLS, only to node certificates)")
	fs.BoolVar(&f.envoyCountRefused, "envoy-count-refused", true, "envoy-format limits count refused hits too, as envoyproxy/ratelimit does (false: as with its STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); a rule's sluice.count_refused wins")
	fs.BoolVar(&f.envoyResponseHeaders, "envoy-response-headers", false, "Envoy rate limit answers carry RateLimit-Policy, RateLimit and Retry-After in response_headers_to_add")
	fs.IntVar(&f.forwardAuthDenyStatus, "forward-auth-deny-status", transport.DefaultForwardAuthDenyStatus, "HTTP status of a refusal on /v1/forward-auth, 400..499 (nginx auth_request passes only 401 and 403 on)")
	f.gcMinHeap = DefaultGCMinHeap
	fs.Var(&f.gcMinHeap, "gc-min-heap", "the most the garbage collector's heap floor lets a small heap grow before it collects: room for about one second of allocation, at most this (bytes, or with KiB, MiB, GiB); a live heap above it keeps a quarter of itself to GOGC's share as headroom, as allocation needs; 0 leaves GOGC alone")
}

// newServeFlagSet returns the flag set of `sluice serve` bound to f.
func newServeFlagSet(f *serveFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice serve", flag.ContinueOnError)
	f.register(fs)
	return fs
}

// parseWithEnv parses args, then gives every flag that was not on the
// command line the value of its SLUICE_ environment variable, if set. Every
// subcommand parses its flags with it (serve through parseLayered, which
// adds --config).
func parseWithEnv(fs *flag.FlagSet, args []string) error {
	_, err := parseLayered(fs, args, os.LookupEnv, os.ReadFile)
	return err
}

// parseCommand is parseWithEnv for a command that answers with an exit
// code: it reports help's code (help) or exitError when parsing failed,
// and ok when the command goes on. The flag package has printed its own
// errors to the flag set's output; the others (an environment variable's
// value, an argument after the flags) are printed here, after the
// command's name (fs.Name()).
func parseCommand(fs *flag.FlagSet, args []string, help int) (code int, ok bool) {
	err := parseWithEnv(fs, args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return help, false
	}
	if msg := err.Error(); strings.HasPrefix(msg, "SLUICE_") || strings.HasPrefix(msg, "unexpected argument") {
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
	}
	return exitError, false
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	return serveWith(ctx, args, stderr, tracingFromEnv(os.LookupEnv))
}

// serveWith is serve with the tracing setup given (tests pass an in-memory
// one).
func serveWith(ctx context.Context, args []string, stderr io.Writer, tracing tracingSetup) error {
	f, cfg, lg, err := serveConfig(args, stderr)
	if err != nil {
		return err
	}
	tr, stopTracing, err := tracing(ctx, f.nodeName, lg)
	if err != nil {
		return err
	}
	if stopTracing != nil {
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stopTracing(sctx); err != nil {
				lg.Warn("tracing: flushing spans at stop", "err", err)
			}
		}()
	}

	sec, err := loadSecrets(f, lg)
	if err != nil {
		return err
	}
	cfg.Config.Keyring = sec.keyring
	if sec.tls != nil {
		cfg.Security = cluster.Security{TLS: true, ClientAuth: sec.tls.ClientAuthRequired()}
	}
	go sec.watch(ctx, f.secretsInterval)
	defer startGCFloor(uint64(f.gcMinHeap))()
	defer startSubCoreProcs(lg)()
	if f.rulesPath != "" {
		w, err := rules.NewWatcher(f.rulesPath, lg, f.rulesInterval)
		if err != nil {
			return fmt.Errorf("--rules: %w", err)
		}
		w.Start(ctx)
		defer w.Close()
		cfg.Rules = w
		lg.Info("rules loaded", "path", f.rulesPath, "rules", w.Len(), "hash", w.Hash())
	}

	node, srv, peers, err := newServing(f, &cfg, sec, lg, tr)
	if err != nil {
		return err
	}
	defer peers.Close()
	if err := srv.Start(); err != nil {
		node.Shutdown(context.Background())
		return err
	}
	if err := node.Start(ctx); err != nil {
		srv.Shutdown(context.Background())
		node.Shutdown(context.Background())
		return err
	}
	lg.Info("sluice serving", "node", cfg.Name, "grpc", srv.GRPCAddr(), "http", srv.HTTPAddr(),
		"gossip", node.GossipAddr(), "advertised_grpc", cfg.GRPCAddr, "data_dir", cfg.DataDir)
	go markReady(ctx, node, srv)
	return stopServing(ctx, f, lg, node, srv)
}

// loopbackUnlessSecured moves the listen addresses that nobody set (on the
// command line, in the environment or in the config file) to loopback when
// the node has neither TLS nor a gossip key: such a node trusts every caller
// that reaches its ports, so by default only this machine does. Addresses
// set explicitly are kept, whatever they are. It returns the flags it
// moved.
func (f *serveFlags) loopbackUnlessSecured(src sources) []string {
	if f.tlsCert != "" || f.gossipKeyFile != "" {
		return nil
	}
	var moved []string
	for _, a := range []struct {
		name string
		v    *string
	}{{"grpc-addr", &f.grpcAddr}, {"http-addr", &f.httpAddr}, {"gossip-addr", &f.gossipAddr}} {
		if src[a.name] != "" || !strings.HasPrefix(*a.v, ":") {
			continue
		}
		*a.v = "127.0.0.1" + *a.v
		moved = append(moved, a.name)
	}
	return moved
}

// serveConfig parses serve's flags (over the environment and the config
// file) and returns them with the logger and the node's config they give.
func serveConfig(args []string, stderr io.Writer) (*serveFlags, cluster.Config, *slog.Logger, error) {
	var f serveFlags
	fs := newServeFlagSet(&f)
	fs.SetOutput(stderr)
	src, err := parseLayered(fs, args, os.LookupEnv, os.ReadFile)
	if err != nil {
		return nil, cluster.Config{}, nil, err
	}
	loopback := f.loopbackUnlessSecured(src)
	if name, err := f.validate(); err != nil {
		return nil, cluster.Config{}, nil, fmt.Errorf("%s: %w", src.describe(name), err)
	}
	lg, err := newLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		return nil, cluster.Config{}, nil, err
	}
	if len(loopback) > 0 {
		lg.Warn("no --tls-cert and no --gossip-key-file: listening on loopback only; "+
			"set the addresses to listen elsewhere (docs/security.md)", "defaults_moved_to_loopback", strings.Join(loopback, ","))
	}
	cfg, err := f.clusterConfig(lg)
	if err != nil {
		return nil, cluster.Config{}, nil, err
	}
	if cfg.Now, err = testClock(os.LookupEnv, lg); err != nil {
		return nil, cluster.Config{}, nil, err
	}
	return &f, cfg, lg, nil
}

// newServing builds, without starting them, the node of cfg and its
// server: it listens on --grpc-addr and makes the peer client (the
// caller closes it) and the metrics. On an error it closes what it made.
func newServing(f *serveFlags, cfg *cluster.Config, sec *secrets, lg *slog.Logger, tr *transport.Tracing) (*cluster.Node, *transport.Server, *peer.PeerClient, error) {
	grpcLn, err := net.Listen("tcp", f.grpcAddr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--grpc-addr: %w", err)
	}
	cfg.GRPCAddr, err = advertised(grpcLn.Addr().String(), f.grpcAddr, f.advertiseAddr)
	if err != nil {
		grpcLn.Close()
		return nil, nil, nil, err
	}
	peers := peer.NewPeerClient(peer.PeerConfig{NodeName: cfg.Name, NodeAddr: cfg.GRPCAddr, ClusterName: cfg.ClusterName, Timeout: f.forwardTimeout,
		UnaryForwards: !f.forwardStreams, TLS: sec.tls, Prover: sec.proverForPeers(), Tracing: tr})
	metrics := newNodeMetrics(watcher(cfg.Rules))
	cfg.Cache.OnFlush = metrics.observeFlush
	node, err := cluster.New(*cfg, observedPeers{next: peers, m: metrics.peers})
	if err != nil {
		grpcLn.Close()
		peers.Close()
		return nil, nil, nil, err
	}
	envoy := transport.EnvoyConfig{StopCountingRefused: !f.envoyCountRefused, ResponseHeaders: f.envoyResponseHeaders}
	if w := watcher(cfg.Rules); w != nil {
		envoy.Rules = envoyRules{w}
	}
	nodeStats := &statusCollector{node: node, rules: watcher(cfg.Rules), dataDir: cfg.DataDir}
	metrics.registerNode(nodeStats)
	var ruleLimits transport.RuleLimits
	if w := watcher(cfg.Rules); w != nil {
		ruleLimits = w
	}
	srv, err := transport.NewServer(transport.ServerConfig{
		Envoy:                 envoy,
		ForwardAuthDenyStatus: f.forwardAuthDenyStatus,
		GRPCListener:          grpcLn,
		HTTPAddr:              f.httpAddr,
		Handler:               node,
		Peer:                  node,
		ClusterName:           cfg.ClusterName,
		Status:                statusSource{node: node, rules: watcher(cfg.Rules)},
		TopKeys:               topKeysSource{node},
		Keys:                  keysSource{node},
		Overrides:             overridesSource{node},
		Owners:                &ownerSource{node: node},
		Members:               peers,
		Metrics:               metrics.handler(lg),
		Observer:              metrics,
		Degraded:              degraded(node),
		Rules:                 ruleLimits,
		TLS:                   sec.tls,
		Prover:                sec.proverForPeers(),
		Pprof:                 f.pprof,
		Logger:                lg,
		Tracing:               tr,
	})
	if err != nil {
		grpcLn.Close()
		node.Shutdown(context.Background())
		peers.Close()
		return nil, nil, nil, err
	}
	nodeStats.srv = srv
	return node, srv, peers, nil
}

// stopServing waits until ctx ends or the node fails, then stops
// gracefully within --shutdown-timeout: not ready, leave the cluster,
// drain the server, flush the node. It returns the node's failure, if any.
func stopServing(ctx context.Context, f *serveFlags, lg *slog.Logger, node *cluster.Node, srv *transport.Server) error {
	var fatal error
	select {
	case <-ctx.Done():
		lg.Info("stopping: leaving the cluster, draining, flushing")
	case fatal = <-node.Fatal():
		lg.Error("stopping", "err", fatal)
	}
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	srv.SetReady(false)
	errs := []error{node.Leave(sctx), srv.Shutdown(sctx), node.Shutdown(sctx)}
	if err := errors.Join(errs...); err != nil {
		return errors.Join(fatal, fmt.Errorf("graceful stop: %w", err))
	}
	lg.Info("stopped")
	return fatal
}

func watcher(r cluster.Rules) *rules.Watcher {
	w, _ := r.(*rules.Watcher)
	return w
}

// markReady reports ready once the node has joined.
func markReady(ctx context.Context, node *cluster.Node, srv *transport.Server) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !node.Ready() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	srv.SetReady(true)
}

func (f *serveFlags) clusterConfig(lg *slog.Logger) (cluster.Config, error) {
	cfg := cluster.DefaultConfig()
	ml := cluster.MemberlistConfig(f.failureDetection == "fast")
	ml.Name = f.nodeName
	host, port, err := splitHostPort(f.gossipAddr)
	if err != nil {
		return cfg, fmt.Errorf("--gossip-addr: %w", err)
	}
	ml.BindAddr, ml.BindPort = host, port
	if ml.BindAddr == "" {
		ml.BindAddr = "0.0.0.0"
	}
	if f.advertiseAddr != "" {
		ml.AdvertiseAddr, ml.AdvertisePort = f.advertiseAddr, port
	}
	cfg.Config = ml
	cfg.ClusterName = f.clusterName
	if f.join != "" {
		for _, s := range strings.Split(f.join, ",") {
			if s = strings.TrimSpace(s); s != "" {
				cfg.Join = append(cfg.Join, s)
			}
		}
	}
	cfg.DataDir = f.dataDir
	cfg.JoinRetry = f.joinRetry
	cfg.Cache.Size = f.cacheSize
	cfg.Cache.Copies = f.cacheCopies
	cfg.Cache.FlushInterval = f.flushInterval
	cfg.Ring.ReplicationFactor = f.replicas
	cfg.Ring.Partitions = f.ringPartitions
	cfg.Ring.Load = f.ringLoad
	cfg.ForwardTimeout = f.forwardTimeout
	cfg.ReplicationInterval = f.replicationInterval
	cfg.MoveWindow = f.moveWindow
	cfg.HeartbeatIdle = f.heartbeatIdle
	cfg.HotKeyThreshold = f.hotKeyThreshold
	cfg.Region = f.region
	if cfg.RegionPeers, err = parseRegionJoin(f.regionJoin); err != nil {
		return cfg, fmt.Errorf("--region-join: %w", err)
	}
	cfg.RegionFallbackShare = f.regionFallbackShare
	cfg.RegionCutAfter = f.regionCutAfter
	cfg.Log = lg
	if cfg.OwnerUnavailable, err = cluster.ParseOwnerUnavailable(f.onOwnerUnavailable); err != nil {
		return cfg, fmt.Errorf("--on-owner-unavailable: %w", err)
	}
	return cfg, nil
}

func splitHostPort(s string) (string, int, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", ps)
	}
	return host, port, nil
}

// advertised returns the gRPC address peers should dial: the advertise host
// if given, else the listen host, else this machine's first private address,
// with the port actually bound.
func advertised(bound, flagAddr, advertiseHost string) (string, error) {
	_, port, err := net.SplitHostPort(bound)
	if err != nil {
		return "", err
	}
	if advertiseHost != "" {
		return net.JoinHostPort(advertiseHost, port), nil
	}
	host, _, err := net.SplitHostPort(flagAddr)
	if err != nil {
		return "", fmt.Errorf("--grpc-addr: %w", err)
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return net.JoinHostPort(host, port), nil
	}
	ip, err := privateIP()
	if err != nil {
		return "", fmt.Errorf("--grpc-addr %s listens on every interface: give --advertise-addr (%v)", flagAddr, err)
	}
	return net.JoinHostPort(ip, port), nil
}

// privateIP returns the first non-loopback IPv4 address of an interface that
// is up.
func privateIP() (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", errors.New("no non-loopback IPv4 address")
}

// statusSource answers Admin.Status from the node.
type statusSource struct {
	node  *cluster.Node
	rules *rules.Watcher // nil without --rules
}

func (s statusSource) Status(context.Context) (*sluicev1.StatusResponse, error) {
	st := s.node.Status()
	resp := &sluicev1.StatusResponse{
		Node:                 st.Node,
		Keys:                 int64(st.Keys),
		ChecksPerSecond:      st.ChecksPerSecond,
		ReplicationFactor:    int64(st.ReplicationFactor),
		Partitions:           int64(st.Partitions),
		Unreplicated:         int64(st.Unreplicated),
		Unflushed:            int64(st.Unflushed),
		Failovers:            int64(st.Failovers),
		Rejoins:              int64(st.Rejoins),
		RulesHash:            st.RulesHash,
		LeasedKeys:           int64(st.LeasedKeys),
		LeaseGrants:          int64(st.LeaseGrants),
		LeaseDecisions:       int64(st.LeaseDecisions),
		LeaseUnused:          int64(st.LeaseUnused),
		LeaseGrantedHits:     int64(st.LeaseGrantTokens),
		LeaseSpentHits:       int64(st.LeaseSpent),
		LeaseRefused:         int64(st.LeaseRefused),
		LeaseReturnedHits:    int64(st.LeaseTookBack),
		LeaseGaveBackHits:    int64(st.LeaseGaveBack),
		Region:               st.Region,
		RegionLentHits:       int64(st.RegionLent),
		RegionFallbackChecks: int64(st.RegionFallback),
		Version:              version,
	}
	if s.rules != nil {
		resp.Rules = int64(s.rules.Len())
	}
	for _, l := range st.RegionLinks {
		var last int64
		if !l.LastAnswer.IsZero() {
			last = l.LastAnswer.UnixMilli()
		}
		resp.RegionLinks = append(resp.RegionLinks, &sluicev1.RegionLink{Region: l.Region, Cut: l.Cut, LastAnswerUnixMs: last,
			RttMicros: l.RTT.Microseconds(), Asks: int64(l.Asks), LentHits: int64(l.Lent), FailedCalls: int64(l.Failed)})
	}
	for _, m := range st.Members {
		mm := &sluicev1.Member{
			Name: m.Name, GrpcAddr: m.GRPCAddr, State: m.State, Share: m.Share, Keys: -1,
			Tls: m.Security.TLS, ClientAuth: m.Security.ClientAuth, GossipEncrypted: m.Security.GossipEncrypted,
		}
		if m.Name == st.Node {
			mm.Keys, mm.RulesHash, mm.LeasedKeys = int64(st.Keys), st.RulesHash, int64(st.LeasedKeys)
			mm.ChecksPerSecond, mm.Unreplicated = st.ChecksPerSecond, int64(st.Unreplicated)
			mm.Version = version
		}
		resp.Members = append(resp.Members, mm)
	}
	for _, e := range st.RecentEvents {
		resp.Events = append(resp.Events, &sluicev1.MemberEvent{UnixMs: e.Time.UnixMilli(), Member: e.Member, Kind: e.Kind})
	}
	return resp, nil
}

// topKeysSource answers Admin.TopKeys from the node.
type topKeysSource struct{ node *cluster.Node }

func (s topKeysSource) TopKeys(_ context.Context, by sluicev1.TopBy, limit int) (*sluicev1.TopKeysResponse, error) {
	b := hitters.ByAdmitted
	if by == sluicev1.TopBy_TOP_BY_REFUSED {
		b = hitters.ByRefused
	}
	resp := &sluicev1.TopKeysResponse{Node: s.node.Name()}
	for _, h := range s.node.TopKeys(b, limit) {
		resp.Keys = append(resp.Keys, &sluicev1.TopKey{Name: h.Name, Key: h.Key, Admitted: h.Admitted, Refused: h.Refused,
			AdmittedError: h.AdmittedError, RefusedError: h.RefusedError})
	}
	return resp, nil
}

// keysSource answers Admin.InspectKey, DrainKey and ResetKey from the node.
type keysSource struct{ node *cluster.Node }

func (s keysSource) InspectKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error) {
	ks, err := s.node.InspectKey(ctx, r)
	return inspection(r, ks), err
}

func (s keysSource) DrainKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error) {
	ks, err := s.node.DrainKey(ctx, r)
	return inspection(r, ks), err
}

func (s keysSource) ResetKey(ctx context.Context, r check.Request) (*sluicev1.KeyInspection, error) {
	ks, err := s.node.ResetKey(ctx, r)
	return inspection(r, ks), err
}

// overridesSource answers the Admin override calls from the node,
// converting between the wire and package overrides.
type overridesSource struct{ node *cluster.Node }

func (s overridesSource) SetOverride(m *sluicev1.Override, setBy string) (*sluicev1.Override, error) {
	stored, err := s.node.SetOverride(overrideFromProto(m, setBy))
	if errors.Is(err, overrides.ErrFull) {
		err = fmt.Errorf("%w: %w", transport.ErrOverridesFull, err)
	}
	if err != nil {
		return nil, err
	}
	return overrideToProto(stored), nil
}

func (s overridesSource) DeleteOverride(name, key string, prefix bool, setBy string) (bool, error) {
	return s.node.DeleteOverride(overrides.Target{Name: name, Key: key, Prefix: prefix}, setBy)
}

func (s overridesSource) Overrides(name string) ([]*sluicev1.Override, int) {
	var out []*sluicev1.Override
	for _, o := range s.node.Overrides(name) {
		out = append(out, overrideToProto(o))
	}
	return out, overrides.MaxOverrides
}

// overrideFromProto converts an Override as a client sends it; the node's
// fields (version, origin, set_at) are not read.
func overrideFromProto(m *sluicev1.Override, setBy string) overrides.Override {
	o := overrides.Override{Target: overrides.Target{Name: m.GetName(), Key: m.GetKey(), Prefix: m.GetPrefix()}, Note: m.GetNote(), SetBy: setBy}
	for _, l := range m.GetLimits() {
		o.Limits = append(o.Limits, peer.LimitFromProto(l))
	}
	return o
}

func overrideToProto(o overrides.Override) *sluicev1.Override {
	m := &sluicev1.Override{Name: o.Name, Key: o.Key, Prefix: o.Prefix, Note: o.Note, Version: o.Version, Origin: o.Origin,
		SetBy: o.SetBy, SetAtUnixMs: o.SetAt / 1e6}
	for _, l := range o.Limits {
		m.Limits = append(m.Limits, peer.LimitToProto(l))
	}
	return m
}

func limitsToProto(ls []bucket.Limit) []*sluicev1.Limit {
	var out []*sluicev1.Limit
	for _, l := range ls {
		out = append(out, peer.LimitToProto(l))
	}
	return out
}

func inspection(r check.Request, ks cluster.KeyState) *sluicev1.KeyInspection {
	return &sluicev1.KeyInspection{Name: r.Name, Key: r.Key, Peek: peer.ResponseToProto(ks.Peek), Owner: ks.Owner,
		Replicas: ks.Replicas, Versions: ks.Versions, Drained: ks.Drained, Limits: limitsToProto(ks.Limits)}
}

var (
	_ transport.Handler        = (*cluster.Node)(nil)
	_ transport.CheckValidator = (*cluster.Node)(nil)
	_ peer.PeerHandler         = (*cluster.Node)(nil)
	_ cluster.Peers            = (*peer.PeerClient)(nil)
)
