package peer

// The HTTP/2 flow-control windows of every connection a node makes
// (PeerClient) or accepts (transport.Server, which serves this package's
// Server), in bytes. Setting them turns
// off gRPC's dynamic windows and with them its bandwidth-delay probe, which
// answers nearly every message with a PING and its ack: on an otherwise idle
// connection a one-check call cost 4 PING frames and 12 allocations more
// (BenchmarkCheckUnary, 158 → 146 allocs/op). A megabyte per stream is far
// above what a check or a forwarded batch (at most 1000 items, under 100
// KiB) needs; 8 MiB per connection lets eight 1 MiB messages be on the wire
// at once before the receiver must have read them.
const (
	StreamWindowSize = 1 << 20
	ConnWindowSize   = 8 << 20
)
