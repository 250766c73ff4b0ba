package transport

import (
	"context"
	"time"

	"google.golang.org/grpc"
)

// wakeWindow is how long after ResetBackoff the calls to a peer wait for
// its connection to be ready, within their own deadline, instead of
// failing at once. gRPC's pick_first keeps the picker of a failed
// connection until the new one is READY (gRFC A62), so a call made just
// after a restarted peer came back would fail with the old process's
// "connection refused" and its check would go to a stand-in, whose
// decision the owner never sees (docs/guarantees.md, "Restart after a
// crash"). Outside the window a call to a peer that cannot be reached
// fails at once, as before, so that the check fails over quickly.
const wakeWindow = 2 * time.Second

// wake marks the peer as just back: its calls wait for the connection for
// wakeWindow from now.
func (p *peer) wake(now time.Time) { p.wokeAt.Store(now.UnixNano()) }

// waking reports whether now is within wakeWindow of the last wake.
func (p *peer) waking(now time.Time) bool {
	w := p.wokeAt.Load()
	return w != 0 && now.UnixNano()-w < int64(wakeWindow)
}

// waitWhileWaking is the peer connection's unary interceptor: within the
// wake window a call waits for the connection to be ready (bounded by
// its context's deadline, which every peer call has).
func (p *peer) waitWhileWaking(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if p.waking(time.Now()) {
		opts = append(opts, grpc.WaitForReady(true))
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}
