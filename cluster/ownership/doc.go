// Package ownership is the key-ownership protocol of a Sluice node, as
// docs/ownership.md writes it down: the records a node keeps about keys
// that change hands (Book: the moves a ring change brought here with the
// keys settled since, and where released keys went), the reading of a
// membership change (TableChanged, Paused, ReplicasGained), whom to pull a
// moved key from (Moves.Plan), the settle of a batch of moved keys
// (Settle: its rounds of pulls, what each answer tells, and which keys end
// settled or stay unsettled), and Step, a pure function from a key's facts
// and an event to the effects the node carries out.
//
// The package does no I/O, starts no goroutine and reads no clock, and
// depends on no storage or network package (its records are kept by
// writeback/key's Key, a leaf): every
// function takes the time as now (Unix ns), and the node (package cluster)
// carries out the effects — pulls, pushes, redirects, decisions — over the
// network and in its write-back cache. The one piece of ownership that
// stays in the cache is the decision fence (writeback.Cache.Fence,
// Unfence): a release must stop decisions under the same lock that
// serialises them, in the step that reads the record handed over, which
// is the invariant's hand-over step.
package ownership
