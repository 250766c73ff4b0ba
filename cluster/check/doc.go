// Package check holds the words of a check as it travels between the
// public API, the peer protocol and the node: a check (Request) and its
// answer (Outcome: bucket's Decision, the node that decided, an error),
// a quota lease an owner grants the node that forwarded a check (Lease)
// and its unspent part given back (LeaseReturn), and a region's request
// for a slice of a global limit (RegionQuery, RegionAsk, RegionAnswer).
// transport, transport/peer and cluster, which may not import each other,
// share them from here; bucket keeps the algorithms and their state. It
// imports bucket only.
package check
