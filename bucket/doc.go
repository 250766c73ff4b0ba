// Package bucket holds Sluice's rate-limit algorithms as pure functions over
// small fixed-size State values, and their binary encoding.
//
// Nothing here has a clock, a goroutine, a lock or I/O: [Decide] takes the
// time as an argument (Unix nanoseconds) and updates the State it is given.
// A State is a plain value; the caller serialises access to it (the
// writeback cache holds one lock per shard). Windows and waits in limits
// and decisions are milliseconds; times in State are nanoseconds.
//
// Every algorithm of [Algorithm] is here: the sliding-window counter (with
// [Limit.SubWindows], the sub-window counter), the sliding log, the token
// bucket, the leaky bucket (meter, or shaping with [Limit.Shaping]), the
// fixed window (epoch-aligned or [Limit.Calendar]) and GCRA; the modes of
// [Limit.Mode]; [DecideAll] for several limits at once. Every algorithm
// but the sliding log and the sub-window counter keeps a fixed-size State
// and decides without allocating. docs/algorithms.md gives each one's
// semantics, answer, bytes per key, bound and measured accuracy.
package bucket
