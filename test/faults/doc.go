// Package faults runs Sluice on real hosts under real network and process
// faults: every node is a `sluice serve` process in a network
// namespace of its own, wired by a veth pair to a bridge in one more
// namespace, with an address in a private 10.213.x.0/24 subnet that exists
// only inside those namespaces. Faults are iptables rules inside the node
// namespaces (partitions of any split, one-way loss, a random share of
// dropped packets), tc's token bucket filter on both ends of a host's veth
// (bandwidth: Cluster.Throttle) and signals to the processes (SIGSTOP/SIGCONT, SIGKILL,
// restart on the same data directory).
//
// Latency comes from a relay, because this kernel has no netem: the
// Delayer (proxy.go) listens on the bridge's address in the bridge's
// namespace and holds every piece of TCP stream and every UDP datagram it
// relays for base ± jitter (uniform). Cluster.SlowLinks puts one relay on
// each direction of each link between one node and the others, for gRPC
// (TCP) and gossip (TCP and UDP): a DNAT rule in the sending node's
// namespace sends its packets for that peer's port to the relay, which
// passes them to the peer and carries the replies back (conntrack undoes
// the DNAT, so the sender sees its peer's address). Nodes keep their own
// addresses, advertise them and bind them, so the cluster is configured as
// always; the rules are in place before the nodes start, since DNAT applies
// to new connections and flows only. Each exchange between the slow node
// and a peer crosses the delay twice, once each way; test clients reach
// every node directly.
//
// Disk faults (disk_test.go): a host's data dir goes on a filesystem of
// its own, a tmpfs (Host.TmpfsDisk) or ext4 on a loop device
// (Host.LoopDisk), made before the process starts; FillDisk grows a filler
// file beside the data dir until no block is left, FreeDisk removes it.
// This kernel has no device-mapper, so there is no dm-delay: SlowStore
// puts the node's process in a cgroup v1 blkio group throttled to one I/O
// per given delay on its loop device, each way (a run of synchronous
// writes waits for the rate; a lone I/O that comes later than the delay
// after the last one passes at once). TestDiskHelpers checks each helper.
//
// The test process reaches the nodes
// from the bridge's namespace, so nothing is added to the host's own
// network: no route, no address, no rule.
//
// The tests need root and a kernel with network namespaces, veth and
// bridges, and they run minutes of real time, so they build only with the
// `faults` tag and `go test ./...` leaves them out:
//
//	make faults                                  # every scenario
//	go test -tags faults ./test/faults/ -v -run TestPartition
//
// Without root, or where `ip netns add` fails, every test skips with the
// reason. Everything a test creates (namespaces, and with them the veths,
// the bridge and the rules; the processes, by PID; mounts, loop devices
// and blkio cgroups) is removed in its cleanup, also when it fails; each test's names carry the test process's
// PID and a random part, so tests run in parallel, and a run that was
// killed leaves namespaces that the next run removes.
package faults
