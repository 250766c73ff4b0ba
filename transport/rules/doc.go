// Package rules owns Sluice's rules files: the YAML that gives the limits
// of a name for checks that carry no limit of their own (`sluice serve
// --rules FILE|DIR`). It parses and validates them strictly, merges a
// directory of them into one [Set], and keeps that Set current with a
// [Watcher]. docs/rules.md is the format reference.
//
// # What it owns
//
//   - [Parse] and [Load]: YAML → validated [bucket.Limit]s by rule name.
//     Unknown or repeated fields, wrong types, values out of range and
//     limits that fail [bucket.Limit.Validate] are errors; every error
//     from the content of a file is an [*Error] with the file, line,
//     column and field path. A file, or a directory, is accepted whole or
//     not at all.
//   - [Set]: an immutable snapshot, the rules by name, with a short
//     [Set.Hash] of the effective rules (independent of file order and
//     formatting) for `sluice status`.
//   - [Watcher]: the rules in force at a path, reloaded by polling.
//   - envoyproxy/ratelimit's YAML format (envoy.go, envoyparse.go): a
//     file whose top level has a domain field is read as one domain of
//     descriptors, under the same strictness, whole-file refusal and hash.
//     [Set.MatchEnvoy] finds the [EnvoyRule] of a request's descriptor
//     with envoyproxy/ratelimit's lookup order; the Envoy RLS adapter in
//     transport calls it through cmd/sluice. docs/envoy.md is the format
//     reference.
//
// # Concurrency
//
// A Set is never modified after it is built: any number of goroutines may
// call its methods. Lookup and MatchEnvoy allocate nothing and never block. A Watcher
// holds the Set in force in an atomic pointer; its Lookup, Hash, Len and
// Rules load that pointer and never wait for a reload. Reloads (the loop's
// and [Watcher.Reload]'s) are serialised by a mutex that readers never
// take.
//
// # Lifecycle and defaults
//
// [NewWatcher] loads once and starts nothing; [Watcher.Start] starts one
// goroutine that polls every interval ([DefaultInterval], 1 s, when given
// 0); [Watcher.Close] stops it and waits. A poll reads every rules file
// (at most [MaxFileSize] bytes each) and hashes names and contents, so
// in-place edits, atomic renames and the Kubernetes ConfigMap symlink swap
// are all seen; an unchanged input costs one read. A rejected reload logs
// one Warn line and is counted in [Stats]; the previous Set stays in
// force. A rule has 1 to [MaxLimitsPerRule] (16) limits.
//
// The package imports [bucket] and the YAML library only; the node sees it
// through its own interface (Lookup), which both *Set and *Watcher
// implement.
package rules
