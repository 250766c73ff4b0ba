// Package cluster is the Sluice node: membership through hashicorp/memberlist,
// the ring view that follows it, and routing of each check to this node's
// write-back cache or to the key's owner.
//
// # Data flow
//
// Node.Check validates every request, hashes (name, key) once, looks the
// owner up in the ring's immutable table and either decides in the local
// writeback.Cache or forwards the requests owned by one peer in one call to
// Peers.Forward. A node that receives a forwarded request never forwards it
// again (Node.CheckForwarded): it decides it, or, when it sees another owner
// or has handed the key on, answers that node's address instead (movedTo).
// The sender follows one such redirect; pointed on again, it sends the
// request there as a stand-in (Peers.ForwardStandIn, with pullFrom the first
// receiver), which decides it; when the two point at each other, the one
// with the lower address stands in, so that every sender picks the same
// one. docs/ownership.md has the key-ownership protocol as a state machine;
// package cluster/ownership holds its records and its step function, whose
// effects the node carries out.
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
// # Pauses
//
// A node that stops running (SIGSTOP, a long GC pause, a VM freeze) is
// routed around by its peers — forwards fail over to the key's replica
// after the forward deadline, and once the node is declared dead its keys
// move to their next owner — but it notices nothing itself. Invariant: a
// node never decides a key it owns from a state older than one another
// node decided it from while this node was not running. A heartbeat
// stamps the node's clock every ForwardTimeout/4 and every decision first
// compares its time with the stamp; a gap longer than ForwardTimeout (the
// earliest a peer can have given up on this node) registers, before any
// decision goes on, a move for the keys it owns, so each is pulled from
// whoever held it meanwhile before it is decided, and the newest version
// wins (pause.go). An idle node stops the heartbeat after HeartbeatIdle
// without a decision (heartbeat.go); its next decision finds the gap and
// handles it as a pause. A check whose context is already done is not decided.
//
// # Lifecycle and concurrency
//
// A node's phase (lifecycle.go) is starting, joining, ready, leaving,
// draining, left or refused, changed only by lifecycle.to. New opens the
// store and builds the node but starts nothing (starting). Start creates
// the memberlist (its goroutines), joins the seeds (joining; retrying in
// the background until one answers), enters the ring (ready) and starts the
// cache's flush and expiry loops. Leave announces the leave (leaving),
// stops deciding and hands every counter to its next owner (draining) and
// leaves the gossip pool (left); a handoff cut short (HandoffTimeout or the
// caller's context) is logged and returned as an error, the counters left
// in the store and on their replicas. A node whose name another member has
// gives up joining (refused). Shutdown leaves if it has not, stops every
// goroutine the node started, flushes the cache and closes the store. Check
// and CheckForwarded are safe for concurrent use.
package cluster
