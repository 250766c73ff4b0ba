// Package transport is everything of Sluice on the wire: the gRPC server
// (sluice.v1.RateLimiter, Admin and the internal Peer service, with
// grpc.health.v1 and server reflection), the HTTP/JSON API, and the
// PeerClient that forwards checks to the node owning their keys. The Go
// client of applications is package client, which imports none of this
// package.
//
// It imports the generated sluicev1 package, bucket's value types and the
// words of a moving key of cluster/keymove (Holder, PullAnswer), never
// cluster: it declares what it calls — Handler (decides checks; cluster.Node
// implements it), PeerHandler (installs and hands out counters; cluster.Node
// too) and StatusSource — and cmd/sluice connects the two.
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
// bucket.MaxBatchSize (1000) items is refused whole (InvalidArgument, HTTP
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
// # Replication
//
// Peer/Replicate carries counters (bucket.Counter: name, key, encoded
// bucket.State, version) to a replica, or to a key's new owner (handoff);
// Peer/Pull fetches them, and with release makes the receiver redirect those
// keys to the puller for a TTL (clamped to 0..MaxReleaseTTL, 10 min). Both
// answer Unimplemented without ServerConfig.Peer. On the wire a counter of
// version 0 means "none held" and has no state bytes (CounterToProto,
// CounterFromProto).
//
// The server refuses a Replicate or Pull of more than MaxCounters (100 000)
// items whole (InvalidArgument). In a Replicate, each malformed counter (name
// or key outside docs/architecture.md §5, a state bucket.State.UnmarshalBinary refuses,
// state bytes with version 0) is counted in refused and left out, with one
// log line per call naming the sender and the first bad index and why; the
// others go to the PeerHandler. In a Pull, one invalid key refuses the call
// (InvalidArgument naming its index).
//
// PeerClient.Replicate and Pull use the peer's connection but not the
// Forward batcher (their callers batch). Replicate sends RPCs of at most
// PeerConfig.MaxCounters (default 5000) counters and about 2 MiB, one after another,
// and sums the answers; a refused counter is an error. Pull sends at most
// PeerConfig.MaxCounters keys per RPC, halving an RPC whose answer exceeds the 4 MiB
// message limit, and fills keys (and the answers' moved_to and holders, as
// keymove.PullAnswer) only when every answer is well formed. Both
// end by ctx's deadline, or when ctx has none, after BulkTimeout (default
// 10 s) for Replicate and Timeout for Pull.
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
// Handler, PeerHandler, StatusSource and Observer methods are called concurrently. The
// slices given to a Handler or PeerHandler belong to the call: a Handler
// must fill every out element before returning, and neither may keep a
// slice. Server and PeerClient are safe for concurrent use.
//
// # Forwarding
//
// PeerClient keeps one lazily made grpc.ClientConn per peer address. Forwards
// to one peer are batched without a timer: if fewer than MaxInFlight
// (default 1) batches are on the wire to that peer, a Forward goes at once on
// the caller's goroutine; otherwise it queues, and whichever batch finishes
// next sends the whole queue (up to MaxBatch, default 1000 items) as one RPC.
// A lone caller pays one round trip; under load the number of RPCs follows the
// round-trip time, not the number of callers. Every Forward ends by
// min(ctx deadline, now+Timeout) (default 250 ms) — with the peer's answers,
// the RPC's error, or ctx.Err() — and a caller that gives up while queued
// returns at once. An item whose key the receiver has handed to another node
// comes back undecided with that node's address in its movedTo entry
// (ForwardResponse.moved_to, sent only when some item moved, then one entry
// per item); a moved_to whose length does not match fails the call. RPCs
// fail fast (no wait-for-ready) when the peer's connection is down;
// reconnect backoff is capped at 1 s. A
// connection whose sent data goes unacknowledged for PeerAckTimeout (or 4
// forward timeouts) is dropped and redialled (TCP_USER_TIMEOUT, through
// gRPC's keepalive), so a link that lost packets for a while is usable
// again as soon as it is back, not after TCP's retransmission backoff.
package transport
