package clustertest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// GossipNetwork connects memberlist transports in one process, without
// sockets, with the faults of a real network: a link can drop everything
// sent over it (one way or both), and a crashed transport neither sends nor
// receives. Sends never block: a packet goes into the receiver's buffered
// queue or is lost (as UDP loses it), and a stream dial is handed over or
// fails at once. It works inside a testing/synctest bubble (no real time,
// no file descriptors). Safe for concurrent use.
type GossipNetwork struct {
	mu    sync.Mutex
	nodes map[string]*GossipTransport // by host:port
	cut   map[[2]string]bool          // (from, to) host:port: dropped
	deaf  map[string]bool             // host:port: everything sent there dropped
	next  int

	// Seeded delivery (SeedDelivery): each packet and each stream read
	// and write is held for a time of [0, spread) fixed by seed and by
	// what is sent.
	seed   uint64
	spread time.Duration
	// deliveries, when recording (RecordDeliveries), is every packet in
	// the order it reached its receiver.
	recording  bool
	deliveries []string
}

// SeedDelivery makes the times at which memberlist's packets and stream
// messages arrive a function of seed, as cluster.MemNetwork.SeedDelivery
// does for peer calls: each packet is held for a time in [0, spread) that
// hashes seed with the sender, the receiver, the packet's bytes and the
// clock; a stream's writes are held before and its reads after, by a time
// that hashes seed with the stream and the operation's number. In a
// testing/synctest bubble, packets sent at the same moment then arrive one
// after another in an order the seed fixes, and the two ends of a
// push-pull merge each other's state at different moments, not in the
// order their goroutines happened to run. spread 0 turns it off.
func (g *GossipNetwork) SeedDelivery(seed uint64, spread time.Duration) {
	g.mu.Lock()
	g.seed, g.spread = seed, spread
	g.mu.Unlock()
}

// RecordDeliveries starts recording every packet as it reaches its
// receiver's queue (Deliveries).
func (g *GossipNetwork) RecordDeliveries() {
	g.mu.Lock()
	g.recording = true
	g.mu.Unlock()
}

// Deliveries returns the packets recorded since RecordDeliveries, in the
// order they reached their receivers: the clock (Unix ns), sender,
// receiver, length and a digest of the bytes.
func (g *GossipNetwork) Deliveries() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.deliveries)
}

// Hold returns how long seeded delivery holds what parts name (sender,
// receiver, bytes: whatever tells one send from another), sent at now: a
// time in [0, spread) that hashes the seed, the clock and parts, or 0 when
// delivery is not seeded.
func (g *GossipNetwork) Hold(now time.Time, parts ...[]byte) time.Duration {
	g.mu.Lock()
	seed, spread := g.seed, g.spread
	g.mu.Unlock()
	if spread <= 0 {
		return 0
	}
	h := fnv.New64a()
	var w [8]byte
	for _, v := range []uint64{seed, uint64(now.UnixNano())} {
		binary.LittleEndian.PutUint64(w[:], v)
		h.Write(w[:])
	}
	for _, p := range parts {
		binary.LittleEndian.PutUint64(w[:], uint64(len(p)))
		h.Write(w[:])
		h.Write(p)
	}
	return time.Duration(h.Sum64() % uint64(spread))
}

// delivered records a packet from → to as it reaches its receiver.
func (g *GossipNetwork) delivered(from, to string, b []byte) {
	g.mu.Lock()
	if g.recording {
		h := fnv.New64a()
		h.Write(b)
		g.deliveries = append(g.deliveries, fmt.Sprintf("%d %s→%s %d %s %016x", time.Now().UnixNano(), from, to, len(b), packetKinds(b), h.Sum64()))
	}
	g.mu.Unlock()
}

// gossipKinds names memberlist's message types by number, as its net.go
// numbers them.
var gossipKinds = []string{"ping", "indirect-ping", "ack", "suspect", "alive", "dead", "push-pull",
	"compound", "user", "compress", "encrypt", "nack", "crc", "err"}

// packetKinds names the messages in a memberlist packet, for the record of
// deliveries: "ping", or "compound[alive,suspect]".
func packetKinds(b []byte) string {
	kind := func(t byte) string {
		if int(t) < len(gossipKinds) {
			return gossipKinds[t]
		}
		return fmt.Sprintf("type-%d", t)
	}
	if len(b) >= 2 && b[0] == 244 && len(b) >= 2+int(b[1]) { // a label header (Config.Label)
		b = b[2+int(b[1]):]
	}
	if len(b) > 5 && b[0] == 12 { // a CRC header: the type, then 4 bytes
		b = b[5:]
	}
	if len(b) == 0 {
		return "empty"
	}
	if b[0] != 7 || len(b) < 2 { // not a compound message
		return kind(b[0])
	}
	n := int(b[1])
	lens, rest := b[2:], b[2:]
	if len(lens) < 2*n {
		return "compound[truncated]"
	}
	rest = rest[2*n:]
	var names []string
	for i := range n {
		l := int(binary.BigEndian.Uint16(lens[2*i:]))
		if l == 0 || len(rest) < l {
			names = append(names, "truncated")
			break
		}
		names = append(names, kind(rest[0]))
		rest = rest[l:]
	}
	return "compound[" + strings.Join(names, ",") + "]"
}

// packetQueue is how many packets a transport holds before it drops; far
// more than a gossip round sends to one node.
const packetQueue = 1024

// streamQueue is how many stream dials a transport holds before it refuses.
const streamQueue = 64

// errGossipUnreachable is returned by dials over a cut link or to an
// address that is not (or no longer) on the network.
var errGossipUnreachable = errors.New("clustertest: gossip address unreachable")

// NewGossipNetwork returns an empty network.
func NewGossipNetwork() *GossipNetwork {
	return &GossipNetwork{nodes: make(map[string]*GossipTransport), cut: make(map[[2]string]bool), deaf: make(map[string]bool)}
}

// NewAddr returns a fresh address (10.0.x.y:7946) for a transport.
func (g *GossipNetwork) NewAddr() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	return net.JoinHostPort(fmt.Sprintf("10.0.%d.%d", g.next/250, g.next%250+1), "7946")
}

// Transport returns a transport reachable at addr, replacing the one that
// was there (a process restarted at the same address).
func (g *GossipNetwork) Transport(addr string) *GossipTransport {
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	t := &GossipTransport{
		g: g, addr: addr, ip: net.ParseIP(host), port: p,
		packets: make(chan *memberlist.Packet, packetQueue),
		streams: make(chan net.Conn, streamQueue),
	}
	g.mu.Lock()
	g.nodes[addr] = t
	g.mu.Unlock()
	return t
}

// Crash takes the transport at addr off the network at once: nothing it
// sends arrives and nothing reaches it, while its memberlist still runs.
func (g *GossipNetwork) Crash(addr string) {
	g.mu.Lock()
	if t := g.nodes[addr]; t != nil {
		t.crashed = true
		delete(g.nodes, addr)
	}
	g.mu.Unlock()
}

// Cut drops everything sent from → to (one way) until Heal.
func (g *GossipNetwork) Cut(from, to string) {
	g.mu.Lock()
	g.cut[[2]string{from, to}] = true
	g.mu.Unlock()
}

// Deafen drops everything sent to addr, from any node, until Heal: the
// node there learns of no membership change while the others do.
func (g *GossipNetwork) Deafen(addr string) {
	g.mu.Lock()
	g.deaf[addr] = true
	g.mu.Unlock()
}

// Heal removes every cut.
func (g *GossipNetwork) Heal() {
	g.mu.Lock()
	clear(g.cut)
	clear(g.deaf)
	g.mu.Unlock()
}

// route returns the transport a send from → to reaches, or nil.
func (g *GossipNetwork) route(from *GossipTransport, to string) *GossipTransport {
	g.mu.Lock()
	defer g.mu.Unlock()
	if from.crashed || g.cut[[2]string{from.addr, to}] || g.deaf[to] {
		return nil
	}
	return g.nodes[to]
}

// dialRoute is route for a stream, and says whether a dial that finds no
// receiver goes unanswered (silent) rather than refused: one to an
// address nobody holds (a crashed member's) or over a cut link is
// unanswered, as to a host that is gone or behind a firewall that drops;
// one to a deaf member (Deafen) is refused.
func (g *GossipNetwork) dialRoute(from *GossipTransport, to string) (dest *GossipTransport, silent bool) {
	if dest = g.route(from, to); dest != nil {
		return dest, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return nil, !from.crashed && !g.deaf[to]
}

// GossipTransport is one node's memberlist.NodeAwareTransport on a
// GossipNetwork.
type GossipTransport struct {
	g       *GossipNetwork
	addr    string
	ip      net.IP
	port    int
	crashed bool // guarded by g.mu
	packets chan *memberlist.Packet
	streams chan net.Conn
	once    sync.Once
}

var _ memberlist.NodeAwareTransport = (*GossipTransport)(nil)

// Addr returns the transport's host:port.
func (t *GossipTransport) Addr() string { return t.addr }

// FinalAdvertiseAddr returns the transport's own address whatever is asked.
func (t *GossipTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.ip, t.port, nil
}

// WriteTo sends a packet to addr, or loses it.
func (t *GossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress sends a packet to a.Addr, or loses it: over a cut link, to
// an address nobody holds, or when the receiver's queue is full.
func (t *GossipTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dest := t.g.route(t, a.Addr)
	if dest == nil {
		return now, nil
	}
	p := &memberlist.Packet{Buf: bytes.Clone(b), From: gossipAddr(t.addr), Timestamp: now}
	put := func() {
		t.g.delivered(t.addr, a.Addr, p.Buf)
		select {
		case dest.packets <- p:
		default:
		}
	}
	if d := t.g.Hold(now, []byte(t.addr), []byte(a.Addr), p.Buf); d > 0 {
		time.AfterFunc(d, put)
	} else {
		put()
	}
	return now, nil
}

// PacketCh returns the packets received.
func (t *GossipTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout opens a stream to addr.
func (t *GossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout opens a stream to a.Addr. A dial to an address nobody
// holds (a crashed member's) or over a cut link fails as one to a host
// that is gone does: once its timeout has passed, plus a hold that the
// seed, both ends and the clock fix (GossipNetwork.Hold); without seeded
// delivery, at once. A dial to a deaf member, or whose receiver's queue
// is full, fails at once.
//
// Were an unanswered dial to fail at once, runs of one seed would differ:
// memberlist's probe of a crashed or cut-off member would see its
// fallback dial fail before the probe's deadline, suspect the member at
// that deadline, which is the moment its next probe starts, and the
// suspicion's timer, a multiple of the probe interval, would run out at
// the moment of a later probe. The goroutines of the two, woken at one
// moment, run in no fixed order, and the probe carries the member's
// death or not.
func (t *GossipTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, silent := t.g.dialRoute(t, a.Addr)
	if dest == nil {
		if d := t.g.Hold(time.Now(), []byte(t.addr), []byte(a.Addr)); silent && d > 0 && timeout > 0 {
			time.Sleep(timeout + d)
		}
		return nil, fmt.Errorf("%w: %s → %s", errGossipUnreachable, t.addr, a.Addr)
	}
	mine, theirs := net.Pipe()
	id := fmt.Sprintf("%s>%s@%d", t.addr, a.Addr, time.Now().UnixNano())
	select {
	case dest.streams <- &gossipConn{Conn: theirs, remote: gossipAddr(t.addr), g: t.g, id: id + "<"}:
		return &gossipConn{Conn: mine, remote: gossipAddr(a.Addr), g: t.g, id: id + ">"}, nil
	default:
		mine.Close()
		theirs.Close()
		return nil, fmt.Errorf("%w: %s → %s (busy)", errGossipUnreachable, t.addr, a.Addr)
	}
}

// StreamCh returns the streams opened to this transport.
func (t *GossipTransport) StreamCh() <-chan net.Conn { return t.streams }

// IngestPacket reads one packet from conn into the packet queue.
func (t *GossipTransport) IngestPacket(conn net.Conn, addr net.Addr, now time.Time, shouldClose bool) error {
	if shouldClose {
		defer conn.Close()
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return fmt.Errorf("clustertest: read packet: %w", err)
	}
	if len(b) == 0 {
		return errors.New("clustertest: empty packet")
	}
	select {
	case t.packets <- &memberlist.Packet{Buf: b, From: addr, Timestamp: now}:
	default:
	}
	return nil
}

// IngestStream queues conn as a stream opened to this transport.
func (t *GossipTransport) IngestStream(conn net.Conn) error {
	select {
	case t.streams <- conn:
		return nil
	default:
		conn.Close()
		return errors.New("clustertest: stream queue full")
	}
}

// Shutdown takes the transport off the network (unless another took its
// address since) and closes the streams nobody accepted.
func (t *GossipTransport) Shutdown() error {
	t.once.Do(func() {
		t.g.mu.Lock()
		t.crashed = true
		if t.g.nodes[t.addr] == t {
			delete(t.g.nodes, t.addr)
		}
		t.g.mu.Unlock()
		for {
			select {
			case c := <-t.streams:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

// gossipAddr is a host:port as a net.Addr.
type gossipAddr string

func (a gossipAddr) Network() string { return "mem" }
func (a gossipAddr) String() string  { return string(a) }

// gossipConn is a pipe end that names its peer. Under seeded delivery
// each write waits before it starts and each read that brought bytes waits
// after them, for a time the seed, the stream (id) and the operation's
// number fix: a pipe hands bytes over at once, and the two ends of a
// push-pull would otherwise merge what they got at the same moment.
type gossipConn struct {
	net.Conn
	remote net.Addr
	g      *GossipNetwork
	id     string       // sender>receiver@clock, and which end
	ops    atomic.Int64 // reads and writes so far
}

// wait holds the next operation on c.
func (c *gossipConn) wait() {
	op := c.ops.Add(1)
	if d := c.g.Hold(time.Now(), []byte(c.id), []byte(strconv.FormatInt(op, 10))); d > 0 {
		time.Sleep(d)
	}
}

// Write sends b once its hold has passed.
func (c *gossipConn) Write(b []byte) (int, error) {
	c.wait()
	return c.Conn.Write(b)
}

// Read returns what arrived once its hold has passed.
func (c *gossipConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.wait()
	}
	return n, err
}

func (c *gossipConn) RemoteAddr() net.Addr { return c.remote }
