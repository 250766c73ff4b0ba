package transport

// The Server: its config, construction, Start, readiness and Shutdown.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
	"github.com/sluicehq/sluice/transport/security"
)

// DefaultMaxRecvMsgSize is the largest message the server accepts (docs/architecture.md §5),
// on gRPC and as an HTTP body: the peer protocol's, whose client sizes its
// calls by it.
const DefaultMaxRecvMsgSize = peer.DefaultMaxRecvMsgSize

// DefaultStreamWorkers is how many goroutines a Server keeps to run gRPC
// calls on (ServerConfig.StreamWorkers). A call that finds them all busy
// runs on a new goroutine, as without workers.
const DefaultStreamWorkers = 128

// RateLimiterService is the health-checked service name of the public API.
const RateLimiterService = "sluice.v1.RateLimiter"

// ServerConfig configures a Server.
type ServerConfig struct {
	// GRPCAddr and HTTPAddr are the listen addresses ("host:port"). HTTPAddr ""
	// (and no HTTPListener) means no HTTP server.
	GRPCAddr, HTTPAddr string
	// GRPCListener and HTTPListener, when set, are used instead of the
	// addresses. The Server closes them on Shutdown.
	GRPCListener, HTTPListener net.Listener
	// Handler decides checks. Required.
	Handler Handler
	// Status answers Admin.Status and the status page; nil answers
	// Unimplemented.
	Status StatusSource
	// TopKeys answers Admin.TopKeys; nil answers Unimplemented.
	TopKeys TopKeysSource
	// Overrides answers Admin.SetOverride, DeleteOverride and
	// ListOverrides; nil answers Unimplemented.
	Overrides OverridesSource
	// Keys answers Admin.InspectKey and Admin.DrainKey; nil answers
	// Unimplemented.
	Keys KeysSource
	// Owners answers RateLimiter.Owners; nil answers Unimplemented (and
	// owner-routing clients then send every check to any node).
	Owners OwnerSource
	// Members, when set, is asked by the status page for the alive members'
	// own figures (statusPageMemberTimeout each, concurrently); nil shows
	// only what this node knows of them.
	Members MemberStatus
	// Peer answers Peer/Replicate and Peer/Pull; nil answers Unimplemented.
	Peer peer.PeerHandler
	// ClusterName is this node's cluster. Peer calls that carry another
	// cluster name are refused with FAILED_PRECONDITION and change nothing.
	ClusterName string
	// MaxRecvMsgSize is the largest gRPC message and HTTP body in bytes;
	// 0 means DefaultMaxRecvMsgSize (4 MiB).
	MaxRecvMsgSize int
	// Metrics, when set, is served at GET /metrics (e.g. promhttp.Handler()).
	Metrics http.Handler
	// Observer is told about every call to the public check APIs (their
	// results and durations, observe.go); nil means NoObserver.
	Observer Observer
	// Degraded, when set, is asked by GET /readyz: a non-empty answer says
	// why the ready node serves degraded (200 with the reason in the body).
	Degraded func() string
	// StreamWorkers is how many long-lived goroutines run gRPC calls; 0 means
	// DefaultStreamWorkers (128), a negative value none (a new goroutine per
	// call, gRPC's default). A new goroutine grows its stack on every call
	// (14% of the entry node's CPU under the single-check load test); a
	// worker's stack stays grown. Each idle worker holds its stack, a few
	// KiB to a few tens of KiB.
	StreamWorkers int
	// GRPCOptions are added after the gRPC server's defaults (MaxRecvMsgSize,
	// the panic-recovering interceptor, peer.StreamWindowSize and
	// peer.ConnWindowSize, StreamWorkers), so they override them (e.g. TLS
	// credentials, keepalive).
	GRPCOptions []grpc.ServerOption
	// TLS, when set, serves gRPC and HTTP over TLS with its material
	// (reloaded by whoever calls TLS.Reload) and makes the internal RPCs
	// (Peer, Admin) and the operator pages (GET /, /debug/pprof/) require a
	// client certificate of its node CA; API callers need a certificate
	// only when its ClientCA is set.
	TLS *security.TLS
	// Prover, when set and TLS is not, makes the internal RPCs require a
	// proof signed with the cluster's gossip key (security.ProofHeader).
	Prover *security.Prover
	// Rules, when set, gives the windows of rules-based limits for the
	// RateLimit-Policy header of HTTP answers; nil leaves out w= there.
	Rules RuleLimits
	// Pprof serves /debug/pprof/ on the HTTP server (operator-only with TLS).
	Pprof bool
	// Now is the clock proofs are checked against, and the status page's;
	// nil means time.Now.
	Now func() time.Time
	// Logger receives serve errors and recovered panics; nil discards.
	Logger *slog.Logger
	// Envoy configures envoy.service.ratelimit.v3.RateLimitService
	// (envoy.go); the zero value serves it with no rules.
	Envoy EnvoyConfig
	// ForwardAuthDenyStatus is the HTTP status of a refusal on
	// /v1/forward-auth (forwardauth.go), 400..499; 0 means
	// DefaultForwardAuthDenyStatus (429).
	ForwardAuthDenyStatus int
	// Tracing, when set, starts OpenTelemetry spans for API calls and
	// traced internal calls (tracing.go); nil installs nothing.
	Tracing *Tracing
}

// Validate reports a configuration NewServer cannot use.
func (c *ServerConfig) Validate() error {
	switch {
	case c.Handler == nil:
		return errors.New("transport: ServerConfig.Handler is nil")
	case c.GRPCAddr == "" && c.GRPCListener == nil:
		return errors.New("transport: ServerConfig needs GRPCAddr or GRPCListener")
	case c.MaxRecvMsgSize < 0:
		return fmt.Errorf("transport: ServerConfig.MaxRecvMsgSize is %d, must be >= 0", c.MaxRecvMsgSize)
	case c.ForwardAuthDenyStatus != 0 && (c.ForwardAuthDenyStatus < 400 || c.ForwardAuthDenyStatus > 499):
		return fmt.Errorf("transport: ServerConfig.ForwardAuthDenyStatus is %d, want 400..499", c.ForwardAuthDenyStatus)
	case c.Tracing != nil && c.Tracing.Provider == nil:
		return errors.New("transport: ServerConfig.Tracing has no Provider")
	}
	return nil
}

// Server serves the gRPC services (RateLimiter, Admin, health, reflection,
// and package peer's Peer) and the HTTP API of one node. NewServer starts
// nothing; Start starts serving; Shutdown stops and waits for every
// goroutine Start started.
type Server struct {
	cfg     ServerConfig
	log     *slog.Logger
	obs     Observer
	maxRecv int
	now     func() time.Time // ServerConfig.Now, or time.Now

	grpc   *grpc.Server
	health *health.Server
	http   *http.Server // nil without HTTP

	guard *security.Guard // who may call the internal RPCs and operator pages

	bufs   sync.Pool // *checkBuf
	bodies sync.Pool // *bytes.Buffer for HTTP bodies

	ready    atomic.Bool
	stopping atomic.Bool
	drain    chan struct{} // closed when Shutdown begins: Forwards streams end

	envoyStats envoyCounters
	keyAdmin   keyAdminCounters
	overrideN  overrideCounters

	mu       sync.Mutex
	started  bool
	grpcLis  net.Listener
	httpLis  net.Listener
	wg       sync.WaitGroup
	shutOnce sync.Once
}

// NewServer builds a Server from cfg. It starts nothing and listens nowhere.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, obs: cfg.Observer, maxRecv: cfg.MaxRecvMsgSize, drain: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.obs == nil {
		s.obs = NoObserver{}
	}
	if s.maxRecv == 0 {
		s.maxRecv = DefaultMaxRecvMsgSize
	}
	s.bufs.New = func() any { return new(checkBuf) }
	s.now = cfg.Now
	if s.now == nil {
		s.now = time.Now
	}
	s.guard = security.NewGuard(cfg.TLS, cfg.Prover, s.now, s.log)

	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.maxRecv),
		grpc.ChainUnaryInterceptor(s.recoverUnary, s.authorizeUnary),
		grpc.ChainStreamInterceptor(s.authorizeStream),
		grpc.InitialWindowSize(peer.StreamWindowSize),
		grpc.InitialConnWindowSize(peer.ConnWindowSize),
		// Peers ping an idle connection with calls pending every
		// peer.PeerKeepaliveTime; gRPC's default policy (5 min) would
		// answer them with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: peer.PeerKeepaliveTime / 2}),
	}
	switch workers := cfg.StreamWorkers; {
	case workers == 0:
		opts = append(opts, grpc.NumStreamWorkers(DefaultStreamWorkers))
	case workers > 0:
		opts = append(opts, grpc.NumStreamWorkers(uint32(min(workers, 1<<16))))
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS.ServerConfig("h2"))))
	}
	if cfg.Tracing != nil {
		opts = append(opts, grpc.StatsHandler(cfg.Tracing.serverHandler()))
	}
	opts = append(opts, cfg.GRPCOptions...)
	s.grpc = grpc.NewServer(opts...)
	sluicev1.RegisterRateLimiterServer(s.grpc, rateLimiterServer{s: s})
	sluicev1.RegisterAdminServer(s.grpc, adminServer{s: s})
	sluicev1.RegisterPeerServer(s.grpc, peer.NewServer(peer.ServerConfig{
		Handler: cfg.Handler, Peer: cfg.Peer, ClusterName: cfg.ClusterName,
		Guard: s.guard, Logger: s.log, Draining: s.drain, Stopping: s.stopping.Load,
	}))
	rlsv3.RegisterRateLimitServiceServer(s.grpc, envoyServer{s: s})
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.setHealth(false)

	if cfg.HTTPAddr != "" || cfg.HTTPListener != nil {
		s.http = &http.Server{
			Addr:              cfg.HTTPAddr,
			Handler:           s.httpHandler(),
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}
		if cfg.TLS != nil {
			s.http.TLSConfig = cfg.TLS.ServerConfig("h2", "http/1.1")
		}
	}
	return s, nil
}

// Start listens (unless listeners were given) and serves gRPC, and HTTP when
// configured, each in a goroutine. The server starts not ready: call
// SetReady(true) once the node can answer.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("transport: Server already started")
	}
	if s.stopping.Load() {
		return errors.New("transport: Server is shut down")
	}
	gl := s.cfg.GRPCListener
	if gl == nil {
		var err error
		if gl, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
			return fmt.Errorf("transport: gRPC listen: %w", err)
		}
	}
	var hl net.Listener
	if s.http != nil {
		hl = s.cfg.HTTPListener
		if hl == nil {
			var err error
			if hl, err = net.Listen("tcp", s.cfg.HTTPAddr); err != nil {
				gl.Close()
				return fmt.Errorf("transport: HTTP listen: %w", err)
			}
		}
	}
	s.started, s.grpcLis, s.httpLis = true, gl, hl
	s.wg.Go(func() {
		if err := s.grpc.Serve(gl); err != nil {
			s.log.Error("gRPC server stopped", "addr", gl.Addr().String(), "err", err)
		}
	})
	if hl != nil {
		s.wg.Go(func() {
			serve := s.http.Serve
			if s.http.TLSConfig != nil {
				serve = func(l net.Listener) error { return s.http.ServeTLS(l, "", "") }
			}
			if err := serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("HTTP server stopped", "addr", hl.Addr().String(), "err", err)
			}
		})
	}
	return nil
}

// GRPCAddr is the address the gRPC server is bound to ("" before Start).
func (s *Server) GRPCAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpcLis == nil {
		return ""
	}
	return s.grpcLis.Addr().String()
}

// HTTPAddr is the address the HTTP server is bound to ("" before Start or
// without HTTP).
func (s *Server) HTTPAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.httpLis == nil {
		return ""
	}
	return s.httpLis.Addr().String()
}

// SetReady sets what health checks report: grpc.health.v1 SERVING or
// NOT_SERVING for "" and "sluice.v1.RateLimiter", and /readyz 200 or 503.
// After Shutdown has begun the server stays not ready.
func (s *Server) SetReady(ready bool) {
	if s.stopping.Load() {
		return
	}
	s.ready.Store(ready)
	s.setHealth(ready)
}

func (s *Server) setHealth(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(RateLimiterService, st)
	s.health.SetServingStatus(EnvoyService, st)
}

// Shutdown marks the server not serving, stops accepting, lets calls in
// progress finish until ctx ends (then cuts them off), and waits for the
// goroutines Start started. It returns ctx.Err() when it had to cut calls off.
// A load balancer needs time between SetReady(false) and Shutdown to notice;
// that wait is the caller's.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.shutOnce.Do(func() { err = s.shutdown(ctx) })
	return err
}

func (s *Server) shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.stopping.Store(true)
	s.mu.Unlock()
	s.ready.Store(false)
	s.health.Shutdown() // NOT_SERVING for every service, and stays so
	close(s.drain)      // GracefulStop waits for streams: Forwards ends its own

	var cut error
	var hwg sync.WaitGroup
	if s.http != nil {
		hwg.Go(func() {
			if err := s.http.Shutdown(ctx); err != nil {
				s.http.Close()
				cut = err
			}
		})
	}
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.grpc.Stop()
		<-stopped
		cut = ctx.Err()
	}
	hwg.Wait()
	s.wg.Wait()
	return cut
}

// recoverUnary turns a panic in a handler into codes.Internal and a log line.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic in gRPC handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			resp, err = nil, status.Error(codes.Internal, "internal error")
		}
	}()
	return next(ctx, req)
}
