package cluster

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// FilterTransport wraps a memberlist transport with a failure control for
// tests: gossip sent to a blocked address is dropped (packets vanish,
// stream dials fail), as on a cut network. Blocking both directions of a
// pair of nodes partitions them. Safe for concurrent use.
type FilterTransport struct {
	memberlist.Transport
	mu      sync.Mutex
	blocked map[string]bool // gossip host:port
}

var _ memberlist.Transport = (*FilterTransport)(nil)

// ErrBlocked is returned by dials to a blocked address.
var ErrBlocked = errors.New("cluster: gossip to this address is blocked")

// NewFilterTransport wraps t.
func NewFilterTransport(t memberlist.Transport) *FilterTransport {
	return &FilterTransport{Transport: t, blocked: make(map[string]bool)}
}

// Block drops everything sent to addrs from now on.
func (f *FilterTransport) Block(addrs ...string) {
	f.mu.Lock()
	for _, a := range addrs {
		f.blocked[a] = true
	}
	f.mu.Unlock()
}

// UnblockAll lets everything through again.
func (f *FilterTransport) UnblockAll() {
	f.mu.Lock()
	clear(f.blocked)
	f.mu.Unlock()
}

func (f *FilterTransport) isBlocked(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked[addr]
}

// WriteTo drops packets to blocked addresses as if the network lost them.
func (f *FilterTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if f.isBlocked(addr) {
		return time.Now(), nil
	}
	return f.Transport.WriteTo(b, addr)
}

// DialTimeout fails at once for blocked addresses.
func (f *FilterTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if f.isBlocked(addr) {
		return nil, ErrBlocked
	}
	return f.Transport.DialTimeout(addr, timeout)
}
