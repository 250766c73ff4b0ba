package cluster

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/memberlist"
)

// Member states as `sluice status` prints them.
const (
	StateAlive   = "alive"
	StateSuspect = "suspect"
	StateDead    = "dead"
	StateLeft    = "left"
)

// maxAddrLen bounds the gRPC address carried in the metadata; memberlist
// allows 512 bytes of metadata.
const maxAddrLen = 255

// metaVersion is the first byte of this node's memberlist metadata.
const metaVersion = 1

// metaLeaving is the flag a node sets in its metadata just before it leaves
// gracefully, so that the others can tell "left" from "dead": memberlist's
// leave notification does not carry the difference.
const metaLeaving = 1

// meta is what a node gossips about itself.
type meta struct {
	grpcAddr string
	leaving  bool
}

// encodeMeta returns the metadata a node gossips: version, flags, then its
// gRPC address as a length-prefixed string.
func encodeMeta(m meta) []byte {
	b := make([]byte, 0, 3+len(m.grpcAddr))
	var flags byte
	if m.leaving {
		flags |= metaLeaving
	}
	b = append(b, metaVersion, flags, byte(len(m.grpcAddr)))
	return append(b, m.grpcAddr...)
}

// decodeMeta decodes a peer's metadata, refusing anything else.
func decodeMeta(b []byte) (meta, error) {
	switch {
	case len(b) < 3:
		return meta{}, fmt.Errorf("metadata is %d bytes, want at least 3", len(b))
	case b[0] != metaVersion:
		return meta{}, fmt.Errorf("metadata version %d, want %d", b[0], metaVersion)
	case b[1]&^metaLeaving != 0:
		return meta{}, fmt.Errorf("metadata has unknown flags %#x", b[1])
	case int(b[2]) != len(b)-3:
		return meta{}, fmt.Errorf("metadata address length %d, but %d bytes follow", b[2], len(b)-3)
	case b[2] == 0:
		return meta{}, errors.New("metadata has an empty gRPC address")
	}
	return meta{grpcAddr: string(b[3:]), leaving: b[1]&metaLeaving != 0}, nil
}

// MemberStatus is one member as this node sees it.
type MemberStatus struct {
	Name     string
	GRPCAddr string
	State    string  // alive, suspect, dead or left
	Share    float64 // fraction of the ring's partitions it owns
}

// roster remembers members that are gone (dead or left), which memberlist's
// Members no longer lists, so status can show them.
type roster struct {
	mu   sync.Mutex
	gone map[string]MemberStatus
}

// joined forgets name's departure and reports whether it had been declared
// dead (not left): a partition healed, or the node restarted.
func (r *roster) joined(name string) (wasDead bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	wasDead = r.gone[name].State == StateDead
	delete(r.gone, name)
	return wasDead
}

func (r *roster) departed(n *memberlist.Node) {
	st := MemberStatus{Name: n.Name, State: StateDead}
	if m, err := decodeMeta(n.Meta); err == nil {
		st.GRPCAddr = m.grpcAddr
		if m.leaving {
			st.State = StateLeft
		}
	}
	r.mu.Lock()
	if r.gone == nil {
		r.gone = make(map[string]MemberStatus)
	}
	r.gone[n.Name] = st
	r.mu.Unlock()
}

// merge returns live (from memberlist) followed by the gone members not
// listed there, sorted by name.
func (r *roster) merge(live []MemberStatus) []MemberStatus {
	seen := make(map[string]bool, len(live))
	for _, m := range live {
		seen[m.Name] = true
	}
	r.mu.Lock()
	for name, m := range r.gone {
		if !seen[name] {
			live = append(live, m)
		}
	}
	r.mu.Unlock()
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
	return live
}

func stateName(s memberlist.NodeStateType) string {
	switch s {
	case memberlist.StateAlive:
		return StateAlive
	case memberlist.StateSuspect:
		return StateSuspect
	case memberlist.StateLeft:
		return StateLeft
	}
	return StateDead
}

// delegate is the node's memberlist.Delegate and EventDelegate. Its methods
// never block: they record and signal the node's rebuild goroutine.
type delegate struct {
	meta     atomic.Pointer[[]byte]
	roster   *roster
	changed  chan struct{}     // capacity 1: a pending rebuild
	onRejoin func(name string) // a member declared dead is alive again
}

var (
	_ memberlist.Delegate      = (*delegate)(nil)
	_ memberlist.EventDelegate = (*delegate)(nil)
)

func (d *delegate) NodeMeta(limit int) []byte {
	m := *d.meta.Load()
	if len(m) > limit {
		return nil
	}
	return m
}

func (d *delegate) setMeta(m meta) {
	b := encodeMeta(m)
	d.meta.Store(&b)
}
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

func (d *delegate) NotifyJoin(n *memberlist.Node) {
	if d.roster.joined(n.Name) && d.onRejoin != nil {
		d.onRejoin(n.Name)
	}
	d.signal()
}

func (d *delegate) NotifyLeave(n *memberlist.Node) {
	d.roster.departed(n)
	d.signal()
}

func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.signal() }

func (d *delegate) signal() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}
