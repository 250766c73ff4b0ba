// Package transport is the public face of a Sluice node on the wire: the
// gRPC server (sluice.v1.RateLimiter and Admin, with grpc.health.v1 and
// server reflection), the HTTP/JSON API with forward-auth and the status
// page, Envoy's rate limit service, and what they report (Observer) and
// trace (Tracing). The Go client of applications is package client, which
// imports none of this package.
//
// Three packages share the wire. transport composes a node's one
// grpc.Server and HTTP mux (NewServer): it registers on that grpc.Server the
// internal sluice.v1.Peer service of transport/peer, the peer protocol
// (the Server that answers other nodes and the PeerClient that calls them),
// and guards the internal RPCs and the operator pages with
// transport/security (TLS material, the proofs of gossip-key holders, who
// may call what). transport imports both, peer imports security, security
// imports neither; the wire conversions the public API shares with the
// peer protocol (peer.RequestFromProto, …) are peer's.
//
// It imports the generated sluicev1 package and bucket's value types, never
// cluster: it declares what it calls — Handler (decides checks; cluster.Node
// implements it, and its peer.ForwardHandler part decides the checks other
// nodes forward), StatusSource and OwnerSource, as peer declares
// PeerHandler and the other handlers of the Peer service — and cmd/sluice
// connects the two.
//
// # Server
//
// NewServer starts nothing; Start listens and serves in goroutines; Shutdown
// marks the server not serving, stops gracefully until its context ends, then
// forcibly, and waits for those goroutines. The server starts not ready:
// SetReady(true) turns grpc.health.v1 ("" and "sluice.v1.RateLimiter") to
// SERVING and GET /readyz to 200.
//
// Limits (docs/architecture.md §5): a message or HTTP body over 4 MiB (MaxRecvMsgSize) is
// refused (gRPC ResourceExhausted, HTTP 413); a call with more than
// check.MaxBatchSize (1000) items is refused whole (InvalidArgument, HTTP
// 400) before the Handler sees it; an empty call answers empty. One invalid
// item is the Handler's to answer with its own error. An algorithm number
// outside 0..255 becomes 255, which bucket refuses, so it never wraps into a
// valid algorithm. Handler panics become codes.Internal (HTTP 500) and a log
// line.
//
// HTTP: POST /v1/check (CheckRequest as protojson in, proto or lowerCamel
// field names, unknown fields refused, enum fields also by their
// command-line names (jsonenum.go); CheckResponse out with proto field
// names and every field present; the status fails closed: 200 only when
// every item is allowed, 429 when any is over its limit (with Retry-After),
// 400 when any is invalid (then none is decided: a Handler that is a
// CheckValidator says which are), 503 when some item could not be decided;
// allowed and over-limit answers carry the IETF RateLimit-Policy and
// RateLimit headers of the first over-limit item or the allowed item with
// the fewest remaining, with w= the window of the limit named, from the
// request or, for rules-based limits, from ServerConfig.Rules), GET|POST /v1/forward-auth (one check for a reverse
// proxy's forward-auth hook: name from the query, key from a named header;
// 2xx or ServerConfig.ForwardAuthDenyStatus; see serveForwardAuth),
// GET /healthz, GET /readyz, GET / (the status page, statuspage.go: HTML
// for a browser, plain text for curl or ?format=text; it asks
// ServerConfig.Members for the alive members' own figures), GET /metrics when ServerConfig.Metrics is set, /debug/pprof/ on
// the server's own mux when ServerConfig.Pprof is set. A wrong method on a known path answers 405.
//
// # Security
//
// ServerConfig.TLS and ServerConfig.Prover secure the server as package
// transport/security describes: the internal RPCs (Peer, Admin), the status
// page and pprof are for members of the cluster only, a security.Guard
// decides, and refusals are counted (Server.AuthRefused) and logged once
// per caller host.
//
// # Envoy
//
// Every server also serves envoy.service.ratelimit.v3.RateLimitService
// (ShouldRateLimit, types from go-control-plane), listed by reflection and
// health-checked as EnvoyService, so an Envoy configured for
// envoyproxy/ratelimit works against Sluice unchanged. The rules come
// through EnvoyRules, which transport declares and cmd/sluice fills from
// the rules watcher (transport/rules reads envoyproxy/ratelimit's YAML, and
// its EnvoyRule is the rule the service answers with): the
// rules are resolved here, on the node Envoy called, and each descriptor
// with a limit becomes one check with that limit inline, all of a call's
// checks handed to Handler.Check at once, so they are routed to their
// owners, batched and failed over like native checks, and the owner needs
// no rules (as for a native check resolved from the rules).
//
// A descriptor's counter is named by EnvoyMatch.Name ("envoy:" + domain)
// and keyed by its entries, key=value joined by '&' with '%', '&', '=' and
// '*' percent-escaped (envoyKey), so two different descriptors never share
// a counter; a share_threshold level writes the rule's pattern instead of
// the value, so every value it matches shares one. A key over 1024 bytes is
// its SHA-256. The semantics, point by point against envoyproxy/ratelimit,
// are in docs/envoy.md: matching is the rules' (unknown domain or no match
// answers OK with no limit); unlimited, replaces, shadow_mode, quota_mode,
// hits_addend (the request's, 0 meaning 1, or the descriptor's, 0 peeking),
// Envoy's per-descriptor limit override (with unit_multiplier, for a domain
// the rules know); a limit of 0 refuses without a counter; refused hits
// count unless EnvoyConfig.StopCountingRefused or the rule says otherwise.
// A request without a domain or descriptors, with an empty descriptor or
// entry key, more than 1000 descriptors, a hits_addend over 2^40,
// is_negative_hits or an override without a valid unit is refused
// (InvalidArgument) before anything counts. A check the Handler could not
// decide (owner and replica unreachable, node not in a cluster) fails the
// call with Unavailable, so Envoy's failure_mode_deny decides.
//
// # Metrics
//
// The server tells an Observer (ServerConfig.Observer) about every call to
// a public check API: its checks by Result, its duration, and the result of
// each check whose limits come from a rule (by rule name, or by domain and
// descriptor path for envoy-format rules). The package declares that small
// interface rather than importing a metrics library, so that transport stays
// free of client_golang and of a registry: cmd/sluice implements Observer
// with Prometheus handles it resolves once (no label lookup per call), and
// tests and other programs can pass their own or none (NoObserver). Calls
// to peers are timed by the caller of cluster.Peers the same way, and the
// counters the node keeps anyway are read at scrape time.
//
// # Concurrency
//
// Handler, StatusSource, OwnerSource, MemberStatus and Observer methods are
// called concurrently. The slices given to a Handler belong to the call: it
// must fill every out element before returning, and may not keep a slice.
// Server is safe for concurrent use. (transport/peer says the same of its
// handlers and of PeerClient.)
package transport
