package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/ring"
)

// Member states as `sluice status` prints them. memberlist reports joins,
// updates and departures through its event delegate, but not suspicion: a
// member is suspect when this node's failure detector suspects it
// (memberlist logs "Suspect <name> has failed, no acks received", which
// slogWriter catches), until this node's next successful probe of it
// (memberlist's ping delegate), a new alive or update event, or its death.
// Suspicions raised only by other members are not seen here.
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
// Version 2 added the boot id.
const metaVersion = 2

// metaLeaving is the flag a node sets in its metadata just before it leaves
// gracefully, so that the others can tell "left" from "dead": memberlist's
// leave notification does not carry the difference.
const metaLeaving = 1

// metaReady is the flag a node sets once it knows the whole membership
// (right after its join): only then do the others, and the node itself,
// put it in the ring, so that the table it computes before taking its
// partitions is the cluster's real one, and it pulls moved keys from
// their real previous owners.
const metaReady = 2

// The flags that say how a node is secured (Security).
const (
	metaTLS             = 4
	metaClientAuth      = 8
	metaGossipEncrypted = 16
	metaFlags           = metaLeaving | metaReady | metaTLS | metaClientAuth | metaGossipEncrypted | metaPlacement
)

// metaPlacement is the flag of a node whose ring places partitions with
// other settings than ring.DefaultConfig's: its placement follows the boot
// id. A node with the defaults sends neither, so its metadata is what
// releases before the flag sent.
const metaPlacement = 32

// placementLen is the size of the placement that follows the boot id:
// partitions (4 bytes), load (8, IEEE 754 bits) and virtual nodes (2), all
// big-endian.
const placementLen = 4 + 8 + 2

// placement is what of a ring's settings decides who owns a partition. Two
// nodes whose placements differ compute different owners for the same
// members, so each leaves the other out of its ring (Node.rebuild). The
// zero placement stands for ring.DefaultConfig's.
type placement struct {
	partitions uint32
	load       float64
	vnodes     uint16
}

// placementOf returns cfg's placement, zero for the defaults'.
func placementOf(cfg ring.Config) placement {
	def := ring.DefaultConfig()
	if cfg.Partitions == def.Partitions && cfg.Load == def.Load && cfg.VirtualNodes == def.VirtualNodes {
		return placement{}
	}
	return placement{partitions: uint32(cfg.Partitions), load: cfg.Load, vnodes: uint16(cfg.VirtualNodes)}
}

// orDefault returns p with the zero placement spelled out.
func (p placement) orDefault() placement {
	if p == (placement{}) {
		def := ring.DefaultConfig()
		return placement{partitions: uint32(def.Partitions), load: def.Load, vnodes: uint16(def.VirtualNodes)}
	}
	return p
}

func (p placement) String() string {
	p = p.orDefault()
	return fmt.Sprintf("%d partitions, load %v, %d virtual nodes", p.partitions, p.load, p.vnodes)
}

// Security is how a node is secured, as it announces itself in gossip for
// status output; nothing is decided on it.
type Security struct {
	// TLS: its gRPC and HTTP ports serve TLS, and peer and admin calls need
	// a node certificate.
	TLS bool
	// ClientAuth: API callers need a client certificate too.
	ClientAuth bool
	// GossipEncrypted: its gossip is encrypted with the cluster's keys.
	GossipEncrypted bool
}

// meta is what a node gossips about itself.
type meta struct {
	grpcAddr string
	leaving  bool
	ready    bool
	sec      Security
	// boot is drawn at random when the process builds its node: a
	// member whose boot changes has restarted, and lost what it had not
	// flushed, even when nobody saw it die (rereplicate.go).
	boot uint64
	// place is how its ring places partitions; zero for the defaults.
	place placement
}

// encodeMeta returns the metadata a node gossips: version, flags, its
// gRPC address as a length-prefixed string, then its boot id (8 bytes,
// big-endian), and with metaPlacement its placement (placementLen bytes).
// This release sends no extension records (see decodeMeta): nodes of the
// release before it refuse metadata with bytes past the placement.
func encodeMeta(m meta) []byte {
	b := make([]byte, 0, 3+len(m.grpcAddr)+8+placementLen)
	var flags byte
	if m.leaving {
		flags |= metaLeaving
	}
	if m.ready {
		flags |= metaReady
	}
	if m.sec.TLS {
		flags |= metaTLS
	}
	if m.sec.ClientAuth {
		flags |= metaClientAuth
	}
	if m.sec.GossipEncrypted {
		flags |= metaGossipEncrypted
	}
	if m.place != (placement{}) {
		flags |= metaPlacement
	}
	b = append(b, metaVersion, flags, byte(len(m.grpcAddr)))
	b = append(b, m.grpcAddr...)
	b = binary.BigEndian.AppendUint64(b, m.boot)
	if m.place != (placement{}) {
		b = binary.BigEndian.AppendUint32(b, m.place.partitions)
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(m.place.load))
		b = binary.BigEndian.AppendUint16(b, m.place.vnodes)
	}
	return b
}

// decodeMeta decodes a peer's metadata, refusing anything else.
//
// After the boot id (and the placement, when flagged) may come an
// extension area: records of a tag byte, a length byte and that many
// bytes, up to the end. This release knows no tag and skips every record,
// so a later release can announce more about itself in records without
// this one leaving it out of its ring; a record that runs past the end is
// refused. New flags cannot be added that way: unknown flags are refused.
func decodeMeta(b []byte) (meta, error) {
	tail := 8 // the boot id, and the placement when flagged
	if len(b) > 1 && b[1]&metaPlacement != 0 {
		tail += placementLen
	}
	switch {
	case len(b) < 3+tail:
		return meta{}, fmt.Errorf("metadata is %d bytes, want at least %d", len(b), 3+tail)
	case b[0] != metaVersion:
		return meta{}, fmt.Errorf("metadata version %d, want %d (a release more than one apart: docs/upgrading.md)", b[0], metaVersion)
	case b[1]&^metaFlags != 0:
		return meta{}, fmt.Errorf("metadata has unknown flags %#x", b[1])
	case int(b[2]) > len(b)-3-tail:
		return meta{}, fmt.Errorf("metadata address length %d, but only %d bytes follow before the boot id", b[2], len(b)-3-tail)
	case b[2] == 0:
		return meta{}, errors.New("metadata has an empty gRPC address")
	}
	f, end := b[1], 3+int(b[2])
	if err := skipMetaExtensions(b[end+tail:]); err != nil {
		return meta{}, err
	}
	m := meta{grpcAddr: string(b[3:end]), leaving: f&metaLeaving != 0, ready: f&metaReady != 0,
		sec:  Security{TLS: f&metaTLS != 0, ClientAuth: f&metaClientAuth != 0, GossipEncrypted: f&metaGossipEncrypted != 0},
		boot: binary.BigEndian.Uint64(b[end:])}
	if f&metaPlacement != 0 {
		pb := b[end+8:]
		p := placement{partitions: binary.BigEndian.Uint32(pb), load: math.Float64frombits(binary.BigEndian.Uint64(pb[4:])),
			vnodes: binary.BigEndian.Uint16(pb[12:])}
		cfg := ring.Config{Partitions: int(p.partitions), ReplicationFactor: 1, Load: p.load, VirtualNodes: int(p.vnodes)}
		if err := cfg.Validate(); err != nil {
			return meta{}, fmt.Errorf("metadata placement: %w", err)
		}
		if placementOf(cfg) == (placement{}) {
			return meta{}, errors.New("metadata placement is flagged but holds the defaults")
		}
		m.place = p
	}
	return m, nil
}

// skipMetaExtensions checks the extension area of metadata (decodeMeta):
// whole records of tag, length and value. None is known to this release.
func skipMetaExtensions(ext []byte) error {
	for at := 0; at < len(ext); {
		if len(ext)-at < 2 {
			return fmt.Errorf("metadata extension at byte %d: %d byte(s) left, a record needs a tag and a length", at, len(ext)-at)
		}
		tag, n := ext[at], int(ext[at+1])
		if at+2+n > len(ext) {
			return fmt.Errorf("metadata extension %d at byte %d: %d bytes long, only %d left", tag, at, n, len(ext)-at-2)
		}
		at += 2 + n
	}
	return nil
}

// MemberStatus is one member as this node sees it.
type MemberStatus struct {
	Name     string
	GRPCAddr string
	State    string  // alive, suspect, dead or left
	Share    float64 // fraction of the ring's partitions it owns
	Security Security
}

// memberInfo is what the node knows of one member, copied from
// memberlist's event callbacks (memberlist's own node structures change
// under its lock, so they are never read outside a callback).
type memberInfo struct {
	name    string
	gossip  string // host:port
	meta    meta
	metaErr error // why the metadata did not decode
	state   string
}

// roster is the node's copy of the membership: every member memberlist
// told it about, with its last known state.
type roster struct {
	mu sync.Mutex
	m  map[string]memberInfo
	// events counts what memberlist reported, for metrics.
	events MemberEvents
	// now stamps recent; nil leaves the times zero.
	now func() time.Time
	// recent holds the last RecentEvents membership changes, oldest
	// overwritten first; next is where the next one goes.
	recent [RecentEvents]MemberEvent
	next   int
	seen   int // events recorded so far, to tell how many of recent are set
}

// RecentEvents is how many membership changes a node keeps for its status.
const RecentEvents = 32

// The kinds of MemberEvent.
const (
	EventJoined   = "joined"   // first seen, or back after leaving
	EventRejoined = "rejoined" // alive again after being declared dead
	EventLeft     = "left"     // left gracefully
	EventFailed   = "failed"   // declared dead
	EventSuspect  = "suspect"  // this node's failure detector suspects it
	EventAlive    = "alive"    // answered this node's probe after being suspect
)

// MemberEvent is one change of a member's state as this node saw it.
type MemberEvent struct {
	Time   time.Time
	Member string
	Kind   string // EventJoined, EventRejoined, EventLeft, EventFailed, EventSuspect or EventAlive
}

// recordLocked adds an event to recent; r.mu is held.
func (r *roster) recordLocked(member, kind string) {
	var t time.Time
	if r.now != nil {
		t = r.now()
	}
	r.recent[r.next] = MemberEvent{Time: t, Member: member, Kind: kind}
	r.next = (r.next + 1) % RecentEvents
	r.seen++
}

// recentEvents returns the kept events, newest first.
func (r *roster) recentEvents() []MemberEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(r.seen, RecentEvents)
	out := make([]MemberEvent, n)
	for i := range n {
		out[i] = r.recent[(r.next-1-i+RecentEvents)%RecentEvents]
	}
	return out
}

// MemberEvents counts the membership events a node has seen since it
// started, as memberlist reported them.
type MemberEvents struct {
	Joins    uint64 // members that joined, or came back after leaving or dying
	Leaves   uint64 // members that left gracefully
	Failures uint64 // members declared dead
	Updates  uint64 // members whose metadata changed (ready, leaving, address)
}

func infoOf(n *memberlist.Node, state string) memberInfo {
	md, err := decodeMeta(n.Meta)
	return memberInfo{name: n.Name, gossip: n.Address(), meta: md, metaErr: err, state: state}
}

// joined records n as alive and returns the state it had before ("" for
// a member never seen): StateDead means a partition healed or the node
// restarted after a crash, StateLeft that it came back after leaving.
func (r *roster) joined(n *memberlist.Node) (before string, restarted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]memberInfo)
	}
	prev := r.m[n.Name]
	before = prev.state
	r.m[n.Name] = infoOf(n, StateAlive)
	restarted = rebooted(prev, r.m[n.Name])
	r.events.Joins++
	if before == StateDead {
		r.recordLocked(n.Name, EventRejoined)
	} else {
		r.recordLocked(n.Name, EventJoined)
	}
	return before, restarted
}

// updated records n's new metadata and reports whether it shows that the
// member restarted (a new boot id).
func (r *roster) updated(n *memberlist.Node) (restarted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]memberInfo)
	}
	prev := r.m[n.Name]
	r.m[n.Name] = infoOf(n, StateAlive)
	r.events.Updates++
	return rebooted(prev, r.m[n.Name])
}

// rebooted reports whether cur, a member's new record, comes from another
// process than prev, its last one: both decoded and their boot ids differ.
func rebooted(prev, cur memberInfo) bool {
	return prev.name != "" && prev.metaErr == nil && cur.metaErr == nil && prev.meta.boot != cur.meta.boot
}

// suspected marks the alive member name as suspect.
func (r *roster) suspected(name string) { r.move(name, StateAlive, StateSuspect) }

// answered marks the suspect member name as alive again.
func (r *roster) answered(name string) { r.move(name, StateSuspect, StateAlive) }

// move sets member name's state to to when it is from.
func (r *roster) move(name, from, to string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.m[name]; ok && m.state == from {
		m.state = to
		r.m[name] = m
		kind := EventAlive
		if to == StateSuspect {
			kind = EventSuspect
		}
		r.recordLocked(name, kind)
	}
}

// departed records n as left (it announced a graceful leave) or dead, and
// returns which (StateLeft or StateDead).
func (r *roster) departed(n *memberlist.Node) string {
	info := infoOf(n, StateDead)
	if info.metaErr == nil && info.meta.leaving {
		info.state = StateLeft
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]memberInfo)
	}
	r.m[n.Name] = info
	if info.state == StateLeft {
		r.events.Leaves++
		r.recordLocked(n.Name, EventLeft)
	} else {
		r.events.Failures++
		r.recordLocked(n.Name, EventFailed)
	}
	return info.state
}

// counts returns the events seen so far.
func (r *roster) counts() MemberEvents {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events
}

// departing reports whether the member with the gRPC address addr is
// leaving, has left or died, as memberlist last reported it here.
func (r *roster) departing(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.m {
		if m.metaErr == nil && m.meta.grpcAddr == addr {
			return m.meta.leaving || m.state == StateLeft || m.state == StateDead
		}
	}
	return false
}

// all returns every member, sorted by name.
func (r *roster) all() []memberInfo {
	r.mu.Lock()
	out := make([]memberInfo, 0, len(r.m))
	for _, m := range r.m {
		out = append(out, m)
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// delegate is the node's memberlist.Delegate and EventDelegate. Its methods
// never block: they record and signal the node's rebuild goroutine.
type delegate struct {
	meta   atomic.Pointer[[]byte]
	self   string // this node's name
	roster *roster
	// nameTaken is the gossip address of another live member that uses
	// this node's name, as memberlist reported it (NotifyConflict).
	nameTaken atomic.Pointer[string]
	changed   chan struct{}         // capacity 1: a pending rebuild
	onRejoin  func(name string)     // a member declared dead is alive again
	onReturn  func(info memberInfo) // a member that was dead or had left is back
	onRestart func(name string)     // a member's boot id changed: another process runs under its name
	onDead    func()                // a member was declared dead (not left), after the roster says so
	overrides overrideHooks         // the runtime overrides' gossip
}

// overrideHooks carry the runtime overrides' gossip (overrides.go): user
// messages, broadcasts, and the push/pull state.
type overrideHooks struct {
	msg        func([]byte)
	broadcasts func(overhead, limit int) [][]byte
	local      func() []byte
	merge      func([]byte)
}

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.PingDelegate     = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
)

// NotifyConflict is called by memberlist when a member announces itself
// under a name a live member at another address already has (memberlist
// keeps the first and ignores the other). When the name is this node's,
// the first conflict's other address is kept: a joining node refuses to
// take partitions under a name another node is deciding for.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	if existing.Name != d.self {
		return
	}
	addr := other.Address()
	d.nameTaken.CompareAndSwap(nil, &addr)
}

// nameConflict returns the gossip address of another member using this
// node's name, or "".
func (d *delegate) nameConflict() string {
	if p := d.nameTaken.Load(); p != nil {
		return *p
	}
	return ""
}

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
func (d *delegate) NotifyMsg(b []byte) {
	if d.overrides.msg != nil {
		d.overrides.msg(b)
	}
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if d.overrides.broadcasts == nil {
		return nil
	}
	return d.overrides.broadcasts(overhead, limit)
}

func (d *delegate) LocalState(join bool) []byte {
	if d.overrides.local == nil {
		return nil
	}
	return d.overrides.local()
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if d.overrides.merge != nil {
		d.overrides.merge(buf)
	}
}

func (d *delegate) NotifyJoin(n *memberlist.Node) {
	before, restarted := d.roster.joined(n)
	if restarted && d.onRestart != nil {
		d.onRestart(n.Name)
	}
	if before == StateDead && d.onRejoin != nil {
		d.onRejoin(n.Name)
	}
	if (before == StateDead || before == StateLeft) && d.onReturn != nil {
		d.onReturn(infoOf(n, StateAlive))
	}
	d.signal()
}

func (d *delegate) NotifyLeave(n *memberlist.Node) {
	if d.roster.departed(n) == StateDead && d.onDead != nil {
		d.onDead()
	}
	d.signal()
}

func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	if d.roster.updated(n) && d.onRestart != nil {
		d.onRestart(n.Name)
	}
	d.signal()
}

// NotifyAlive: memberlist received an alive message about n (memberlist's
// AliveDelegate), under its node lock. A suspect member that refutes the
// suspicion says so in such a message, which memberlist takes without
// telling the event delegate (its metadata did not change), and this
// node's next probe of it may be a whole probe round away (about N probe
// intervals: 100 s at 100 members). So any alive message about a suspect
// member marks it alive again; gossip that still carries an older alive
// message can clear it before memberlist does, which only shortens what
// status shows. It refuses nothing.
func (d *delegate) NotifyAlive(n *memberlist.Node) error {
	d.roster.answered(n.Name)
	return nil
}

// AckPayload sends nothing with this node's acks.
func (d *delegate) AckPayload() []byte { return nil }

// NotifyPingComplete: this node's probe of other was answered.
func (d *delegate) NotifyPingComplete(other *memberlist.Node, _ time.Duration, _ []byte) {
	d.roster.answered(other.Name)
}

func (d *delegate) signal() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}
