package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// The HTTP/2 flow-control windows of every connection the client makes,
// in bytes, the same as the nodes'. Fixed windows turn off
// gRPC's bandwidth-delay probe, which otherwise answers nearly every
// message with a PING; a megabyte per stream is far above what a check of
// at most 1000 items needs.
const (
	streamWindowSize = 1 << 20
	connWindowSize   = 8 << 20
)

// Node is a connection to one node, speaking the wire messages: for the
// CLI, load tools and programs that build sluicev1 messages themselves.
// Applications want Client. A Node is safe for concurrent use; make one
// per node address and share it.
type Node struct {
	conn  *grpc.ClientConn
	rl    sluicev1.RateLimiterClient
	admin sluicev1.AdminClient
}

// Dial returns a Node for the node at addr ("host:port"). It connects
// lazily, on the first call. opts come after the defaults (insecure
// transport credentials, the client's flow-control windows), so
// grpc.WithTransportCredentials in opts selects TLS.
func Dial(addr string, opts ...grpc.DialOption) (*Node, error) {
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(streamWindowSize),
		grpc.WithInitialConnWindowSize(connWindowSize),
	}, opts...)
	conn, err := grpc.NewClient(addr, all...)
	if err != nil {
		return nil, fmt.Errorf("sluice client: dial %s: %w", addr, err)
	}
	return &Node{conn: conn, rl: sluicev1.NewRateLimiterClient(conn), admin: sluicev1.NewAdminClient(conn)}, nil
}

// Check asks the node to decide req; the responses come in request order.
// The error is a gRPC status error (InvalidArgument for more than 1000
// items, ResourceExhausted for a message over 4 MiB, Unavailable,
// DeadlineExceeded).
func (n *Node) Check(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	return n.rl.Check(ctx, req)
}

// Acquire, Renew and Release are the concurrency limit calls
// (RateLimiter/Acquire, Renew, Release) on this node; Client.Acquire
// wraps them in a Lease.
func (n *Node) Acquire(ctx context.Context, req *sluicev1.AcquireRequest) (*sluicev1.LeaseResponse, error) {
	return n.rl.Acquire(ctx, req)
}

// Renew: see Acquire.
func (n *Node) Renew(ctx context.Context, req *sluicev1.RenewRequest) (*sluicev1.LeaseResponse, error) {
	return n.rl.Renew(ctx, req)
}

// Release: see Acquire.
func (n *Node) Release(ctx context.Context, req *sluicev1.ReleaseRequest) (*sluicev1.ReleaseResponse, error) {
	return n.rl.Release(ctx, req)
}

// Owners asks the node for its owner table (see WithOwnerRouting).
func (n *Node) Owners(ctx context.Context) (*sluicev1.OwnersResponse, error) {
	return n.rl.Owners(ctx, &sluicev1.OwnersRequest{})
}

// Status asks the node for its view of the cluster.
func (n *Node) Status(ctx context.Context) (*sluicev1.StatusResponse, error) {
	return n.admin.Status(ctx, &sluicev1.StatusRequest{})
}

// TopKeys asks the node for the keys it decided with the most admitted
// (or refused) hits in the last 30 to 60 seconds (an Admin call, as
// Status is).
func (n *Node) TopKeys(ctx context.Context, req *sluicev1.TopKeysRequest) (*sluicev1.TopKeysResponse, error) {
	return n.admin.TopKeys(ctx, req)
}

// InspectKey asks the node what a check of a key would see now, where the
// key lives and its record versions (an Admin call).
func (n *Node) InspectKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return n.admin.InspectKey(ctx, req)
}

// DrainKey asks the node to consume what remains of a key's quota (an
// Admin call, logged by the node as an audit line).
func (n *Node) DrainKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return n.admin.DrainKey(ctx, req)
}

// ResetKey asks the node to forget a key's counts, so that it has its full
// quota again (an Admin call, logged by the node as an audit line).
func (n *Node) ResetKey(ctx context.Context, req *sluicev1.KeyRequest) (*sluicev1.KeyInspection, error) {
	return n.admin.ResetKey(ctx, req)
}

// SetOverride puts limits in force for a key, or every key with a prefix,
// on every node (an Admin call, logged by the node as an audit line).
func (n *Node) SetOverride(ctx context.Context, req *sluicev1.SetOverrideRequest) (*sluicev1.Override, error) {
	return n.admin.SetOverride(ctx, req)
}

// DeleteOverride ends an override on every node (an Admin call).
func (n *Node) DeleteOverride(ctx context.Context, req *sluicev1.DeleteOverrideRequest) (*sluicev1.DeleteOverrideResponse, error) {
	return n.admin.DeleteOverride(ctx, req)
}

// ListOverrides lists the overrides in force (an Admin call).
func (n *Node) ListOverrides(ctx context.Context, req *sluicev1.ListOverridesRequest) (*sluicev1.ListOverridesResponse, error) {
	return n.admin.ListOverrides(ctx, req)
}

// Conn is the underlying connection, for other services on the same node
// (health, reflection).
func (n *Node) Conn() *grpc.ClientConn { return n.conn }

// Close closes the connection; calls in progress fail.
func (n *Node) Close() error { return n.conn.Close() }
