// Package client is the Go client of a Sluice cluster, for applications:
// Client (New: typed checks over several nodes, batching with CheckBatch,
// optional owner-aware routing with WithOwnerRouting, TLS with WithTLS),
// HTTPMiddleware for net/http, and UnaryServerInterceptor and
// StreamServerInterceptor for gRPC servers. Node (Dial) is one node's
// connection on the wire messages, for the CLI and load tools.
//
// It imports the standard library, grpc, protobuf and the generated
// sluicev1 package only, so a program that uses it links none of the
// node's dependencies (storage, gossip, metrics, tracing, Envoy).
//
// # Concurrency and lifetime
//
// Client and Node are safe for concurrent use; make one per application
// and share it. New and Dial start nothing and send nothing: connections
// are made on the first call to each node. With owner routing, tables are
// fetched in the background, at most one fetch at a time; Close stops
// them and waits for them.
//
// # Failures
//
// A check returns a decision, the node's refusal of the item (*ItemError),
// or the gRPC status error of the whole call: UNAVAILABLE is retried on the
// next node, each node at most once per call; other codes are returned as
// they are. Nothing waits past the caller's context, nor past
// WithCallTimeout when it is set. The middleware and interceptors turn a
// check that could not be decided into their FailurePolicy: FailOpen (the
// default) lets the request through, FailClosed refuses it.
//
// # Owner routing
//
// WithOwnerRouting sends each check straight to the node that owns its
// key, by the owner table any node serves (RateLimiter.Owners), hashing
// keys as the nodes do (OwnerKeyHash: XXH64 of name, a zero byte and
// key). A stale table costs a forward inside the cluster, never a wrong
// answer.
package client
