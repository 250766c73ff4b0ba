// Package ring maps rate-limit keys to the nodes that own them.
//
// It owns one thing: members → partitions → owner and replicas. A key
// (name, key) hashes once with Hash (xxhash64 of name + "\x00" + key); the
// partition is that hash modulo Config.Partitions; each partition has an
// owner and R-1 replicas chosen with bounded-load consistent hashing
// (github.com/buraksezer/consistent). Other packages may derive cache shards
// from the same hash.
//
// # Tables
//
// BuildTable places every partition with consistent, from nothing, and
// stores the result in an immutable Table: per
// partition, the owner and its replicas as indexes into the members sorted by
// name. Members are sorted by name before they reach consistent, so every node
// that sees the same member names builds the identical Table, whatever order
// gossip delivered them in. Replicas follow consistent.GetClosestNForPartition:
// the members after the owner in the order of the hashes of their names.
// Ownership agrees with consistent.LocateKey on the key bytes
// name+"\x00"+key.
//
// A Ring computes the same tables from the last one it built (place.go):
// it keeps the hash circle of its last member set and changes only the
// points of the members that joined or left, so a membership event costs
// what changed plus a linear pass, not consistent's rebuild (for one
// member joining or leaving, microbenchmark BenchmarkMembershipEvent:
// about 0.06 ms at 10 members, 0.11 ms at 100, 0.43 ms at 1,000, where
// BuildTable takes 2 ms, 45 ms and 5.7 s; docs/scaling.md). TestPlacerAgreesWithConsistent
// holds the two to the same tables.
//
// # Concurrency
//
// A Ring is safe for concurrent use. It holds the current Table in an
// atomic.Pointer: Owner, Replicas and Table take no lock and never block;
// SetMembers builds a new Table and swaps it in; SetMembers and Build are
// serialised with each other. A Table never
// changes after it is built, so callers that need several lookups to agree
// take one Table and use it throughout. Owner, Replicas and Partition allocate
// nothing; Replicas appends to a caller-owned slice. New starts no
// goroutines; the package has no global state.
//
// # Units and defaults
//
// DefaultConfig: 7919 partitions, ReplicationFactor 2 (owner + one replica),
// Load 1.05 (no member owns more than ceil(floor(partitions/members) × 1.05)
// partitions), 100 virtual nodes per member. With 3–16 members the busiest
// member owns at most 1.051 × the mean share, and adding or removing one member
// moves on average 1.1 × the ideal 1/N of the partitions (worst seen 1.46 ×).
// docs/ring.md has the measurements and the commands that produced them.
package ring
