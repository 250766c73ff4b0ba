package bucket

// Counter is one key's counter state as it travels between nodes:
// replication to replicas, handoff to a new owner, pulls. Version grows with
// every change (it follows the owner's clock in nanoseconds); of two copies
// of a key the one with the greater Version is the newer.
type Counter struct {
	Name    string
	Key     string
	State   State
	Version uint64
	// MovedTo, in a pull's answer only, is the gRPC address of the node the
	// answering node had already released the key to.
	MovedTo string
}
