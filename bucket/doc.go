// Package bucket holds Sluice's rate-limit algorithms as pure functions over
// small fixed-size State values, and their binary encoding.
//
// Nothing here has a clock, a goroutine, a lock or I/O: [Decide] takes the
// time as an argument (Unix nanoseconds) and updates the State it is given.
// A State is a plain value; the caller serialises access to it (the
// writeback cache holds one lock per shard). Windows and waits in limits
// and decisions are milliseconds; times in State are nanoseconds.
//
// Only the sliding-window counter exists so far; [Limit.Validate] refuses
// the other algorithms. docs/algorithms.md gives its semantics, bound and
// measured accuracy.
package bucket
