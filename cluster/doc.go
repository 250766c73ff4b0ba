// Package cluster is the Sluice node: membership through hashicorp/memberlist,
// the ring view that follows it, and routing of each check to this node's
// write-back cache or to the key's owner.
//
// # Data flow
//
// Node.Check validates every request, hashes (name, key) once, looks the
// owner up in the ring's immutable table and either decides in the local
// writeback.Cache or forwards the requests owned by one peer in one call to
// Peers.Forward. A node answers a forwarded request itself
// (Node.CheckForwarded), whatever its own view of the ring: the hop limit is 1.
// When an owner cannot be reached before the forward deadline, the node
// serves the request from its own cache (OwnerUnavailableServe, the default)
// or denies it (OwnerUnavailableDeny); a check never hangs.
//
// # Membership
//
// Each node gossips its gRPC address in its memberlist metadata, so several
// nodes may share one IP. Every join, leave, failure and metadata update
// schedules a rebuild of the ring from memberlist's current member list; the
// rebuild runs on the node's own goroutine and never blocks gossip.
//
// # Lifecycle and concurrency
//
// New opens the store and builds the node but starts nothing. Start creates
// the memberlist (its goroutines), joins the seeds (retrying in the background
// until one answers) and starts the cache's flush and expiry loops. Leave
// leaves the gossip pool; Shutdown leaves if it has not, stops every goroutine
// the node started, flushes the cache and closes the store. Check and
// CheckForwarded are safe for concurrent use.
package cluster
