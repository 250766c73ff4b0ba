// Package clustertest runs a Sluice cluster in one process, for tests: N
// cluster.Nodes over an in-memory gossip network (GossipNetwork, a
// memberlist transport whose sends never block), a cluster.MemNetwork for
// the peer calls and writeback.MemStores, inside a testing/synctest bubble,
// whose fake clock runs the nodes' real timers (failure detection, leave
// announcement, replication, flushes) in no wall-clock time.
//
// Faults are data: Crash (nothing the node sends arrives, its store keeps
// what it flushed, Restart brings it back on it), Leave, Partition, Drop
// (one way), Delay, Heal. Settle lets time run until membership has
// converged. Scenarios are text, one step per line (scenario.go,
// testdata/*.txt), run by a Runner that records every answer;
// model_test.go generates random runs and holds them to the bounds of
// docs/guarantees.md. docs/testing.md says how to write and run them.
//
// Concurrency: a Cluster and a Runner are used from the bubble's main
// goroutine only. The networks are safe for concurrent use.
package clustertest
