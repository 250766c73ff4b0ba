// Package transport is everything of Sluice on the wire: the gRPC server
// (sluice.v1.RateLimiter, Admin and the internal Peer service, with
// grpc.health.v1 and server reflection), the HTTP/JSON API, the PeerClient
// that forwards checks to the node owning their keys, and the Go Client.
//
// It imports the generated sluicev1 package and bucket's value types, never
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
// Limits (DESIGN §5): a message or HTTP body over 4 MiB (MaxRecvMsgSize) is
// refused (gRPC ResourceExhausted, HTTP 413); a call with more than
// bucket.MaxBatchSize (1000) items is refused whole (InvalidArgument, HTTP
// 400) before the Handler sees it; an empty call answers empty. One invalid
// item is the Handler's to answer with its own error. An algorithm number
// outside 0..255 becomes 255, which bucket refuses, so it never wraps into a
// valid algorithm. Handler panics become codes.Internal (HTTP 500) and a log
// line.
//
// HTTP: POST /v1/check (CheckRequest as protojson in, proto or lowerCamel
// field names, unknown fields refused; CheckResponse out with proto field
// names and every field present; 200, or 429 when any item is over its limit,
// with Retry-After and the IETF RateLimit-Policy and RateLimit headers of the
// first over-limit item), GET /healthz, GET /readyz, GET / (plain-text
// status), GET /metrics when ServerConfig.Metrics is set, /debug/pprof/ on
// the server's own mux. A wrong method on a known path answers 405.
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
// or key outside DESIGN §5, a state bucket.State.UnmarshalBinary refuses,
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
// message limit, and fills keys only when every answer is well formed. Both
// end by ctx's deadline, or when ctx has none, after BulkTimeout (default
// 10 s) for Replicate and Timeout for Pull.
//
// # Concurrency
//
// Handler, PeerHandler and StatusSource methods are called concurrently. The
// slices given to a Handler or PeerHandler belong to the call: a Handler
// must fill every out element before returning, and neither may keep a
// slice. Server, PeerClient and Client are safe for concurrent use.
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
// comes back undecided with Outcome.MovedTo set (ForwardResponse.moved_to,
// sent only when some item moved, then one entry per item); a moved_to whose
// length does not match fails the call. RPCs fail fast (no wait-for-ready)
// when the peer's connection is down; reconnect backoff is capped at 1 s.
package transport
