// Package peer is the peer protocol of Sluice, both sides of the internal
// sluice.v1.Peer service: the PeerClient a node calls its peers with
// (forwarding checks to the owners of their keys, batched, on one stream
// per peer; replicating, handing off and pulling counters; returning
// leases; asking home regions for slices of global limits and members for
// the keys they decided during a pause; a member's own status), and the
// Server that answers those calls, with the validation of what arrives.
// Package transport registers the Server on the node's one grpc.Server,
// behind the checks of transport/security, which the PeerClient uses too.
//
// It imports bucket's value types, the words of a moving key of
// cluster/keymove (Holder, PullAnswer, DecidedAnswer), the generated
// sluicev1 package and transport/security, never transport nor cluster: it
// declares what it calls — ForwardHandler (decides forwarded checks;
// transport.Handler embeds it), LeasingHandler, PeerHandler (installs and
// hands out counters), DecidedLedger, LeaseReturner and RegionGranter, all
// of which cluster.Node implements, and ClientTracing, which
// transport.Tracing implements — and cmd/sluice connects them. The wire
// conversions (RequestFromProto, CounterToProto, …) are here, and the
// public API shares them.
//
// # Replication
//
// Peer/Replicate carries counters (bucket.Counter: name, key, encoded
// bucket.State, version) to a replica, or to a key's new owner (handoff);
// Peer/Pull fetches them, and with release makes the receiver redirect those
// keys to the puller for a TTL (clamped to 0..MaxReleaseTTL, 10 min). Both
// answer Unimplemented without a PeerHandler (ServerConfig.Peer, which
// transport.ServerConfig.Peer fills). On the wire a counter of
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
// # Concurrency
//
// The handlers' methods are called concurrently. The slices given to them
// belong to the call: a ForwardHandler must fill every out element before
// returning, and none may keep a slice. Server and PeerClient are safe for
// concurrent use.
//
// # Forwarding
//
// PeerClient keeps one lazily made grpc.ClientConn per peer address. Forwards
// to one peer are batched without a timer: if fewer than MaxInFlight
// (default 4) batches are on the wire to that peer, a Forward goes at once on
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
package peer
