package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// OwnerUnavailable says what a node does with a check whose owner it cannot
// reach before the forward deadline.
type OwnerUnavailable uint8

const (
	// OwnerUnavailableServe decides the check in the local cache (default):
	// the client always gets an answer, and the limit is enforced by each
	// side of a failure on its own.
	OwnerUnavailableServe OwnerUnavailable = iota
	// OwnerUnavailableDeny answers OverLimit.
	OwnerUnavailableDeny
)

// ParseOwnerUnavailable parses "serve" or "deny".
func ParseOwnerUnavailable(s string) (OwnerUnavailable, error) {
	switch s {
	case "serve", "":
		return OwnerUnavailableServe, nil
	case "deny":
		return OwnerUnavailableDeny, nil
	}
	return 0, fmt.Errorf("unknown owner-unavailable policy %q (want serve or deny)", s)
}

func (o OwnerUnavailable) String() string {
	if o == OwnerUnavailableDeny {
		return "deny"
	}
	return "serve"
}

// Rules gives the limits of a name for checks that carry no limit (limit
// 0): one or more, decided atomically. Lookup is called concurrently on
// every such check, must not block, and the caller does not modify the
// slice. Hash identifies the rules in force, for status.
type Rules interface {
	Lookup(name string) ([]bucket.Limit, bool)
	Hash() string
}

// Config configures a Node. The embedded memberlist.Config carries the node
// name (Name, unique in the cluster), the gossip bind and advertise
// addresses and the failure detector's timing; its Delegate and Events are
// set by the node.
type Config struct {
	*memberlist.Config

	// ClusterName names the cluster. It becomes memberlist's Label
	// (replacing any Label set on the memberlist config): gossip from a
	// node with another name is dropped, so two clusters never merge, not
	// even when one's member reuses an address the other still tries to
	// reconnect to. The peer transport should carry it too
	// (peer.PeerConfig.ClusterName). Default DefaultClusterName; at
	// most 255 bytes.
	ClusterName string
	// GRPCAddr is the host:port at which peers reach this node's gRPC
	// server. It travels in the memberlist metadata. Required.
	GRPCAddr string
	// Join lists the gossip addresses of nodes to join at start, each
	// host:port (the port defaults to the gossip bind port). A host that is
	// a name stands for every address it resolves to (a Kubernetes headless
	// Service names every pod): the node resolves it again on every try,
	// contacts every address but its own, and has joined once one answers.
	// A list that resolves to this node alone makes it the first node of
	// its cluster.
	Join []string
	// Resolve returns the addresses (IPs) of a Join host that is a name. It
	// is called from the goroutine that joins, at most once per name per
	// try, and may block (bound it). Default: the system resolver
	// (net.DefaultResolver.LookupHost) with a 5 s deadline.
	Resolve func(host string) ([]string, error)
	// JoinRetry is how often Start's background join retries while no seed
	// has answered. Default 1 s.
	JoinRetry time.Duration
	// DataDir is where the durable store lives. Required unless Store is
	// set.
	DataDir string
	// OverridesFile is where the node keeps the runtime overrides
	// (package overrides); "" is DataDir/overrides, or nowhere without a
	// DataDir.
	OverridesFile string
	// Store, when set, is the node's durable store instead of the pebble
	// store under DataDir (tests: writeback.MemStore, which survives a
	// simulated crash and is handed to the restarted node). The node owns
	// it from New on and closes it at Shutdown.
	Store writeback.Store
	// Security says how the node's ports are secured, for status output
	// (it travels in gossip). GossipEncrypted is ignored: it is taken from
	// the memberlist configuration (Keyring or SecretKey).
	Security Security
	// Ring configures partitions and replication.
	Ring ring.Config
	// Cache configures the write-back cache.
	Cache writeback.Config
	// ForwardTimeout bounds every forward to an owner. Default 250 ms.
	ForwardTimeout time.Duration
	// OwnerUnavailable is the policy when an owner cannot be reached.
	OwnerUnavailable OwnerUnavailable
	// LeaveTimeout bounds how long Leave waits for the leave message to
	// reach a member. Default 2 s.
	LeaveTimeout time.Duration
	// ReplicationInterval is how often the owner sends changed counters to
	// its replicas, in one batch per replica. It bounds what a crash of the
	// owner can over-admit. Default 100 ms.
	ReplicationInterval time.Duration
	// MoveWindow is how long after a membership change a new owner pulls a
	// moved key from its previous holder on first touch, and how long the
	// previous holder redirects it. Default 30 s.
	MoveWindow time.Duration
	// PullTimeout bounds a pull on first touch. Default 100 ms.
	PullTimeout time.Duration
	// HandoffTimeout bounds the handoff of counters to new owners, on a
	// membership change and on graceful leave. Default 10 s.
	HandoffTimeout time.Duration
	// LeavePropagation is how long a leaving node keeps deciding after it
	// announced its leave, for the news to reach every member before it
	// redirects its keys. Default 1 s (several gossip rounds).
	LeavePropagation time.Duration
	// ReconnectInterval is how often the node tries to reach the members
	// declared dead, so that the sides of a healed partition find each
	// other again. Default 2 s.
	ReconnectInterval time.Duration
	// HeartbeatIdle is how long the pause heartbeat (pause.go) goes on
	// beating, every ForwardTimeout/4, once the node has answered no check
	// from a client or a peer: then it stops, so that an idle node costs no
	// wake-ups for it, until the next decision. That decision sees the gap
	// and treats it as a pause (a paused node cannot tell it from idleness):
	// each key the node owns is pulled once, on its first touch within
	// MoveWindow, before it is decided. 0 beats always. Default 30 s.
	HeartbeatIdle time.Duration
	// HotKeyThreshold is the rate, in hits per second of one key from one
	// other node, from which this node, as the key's owner, grants that
	// node quota leases for the key: slices of the limit it admits itself
	// (docs/leases.md). 0 grants none. Default DefaultHotKeyThreshold.
	HotKeyThreshold float64
	// LeaseTTL is the longest a lease lasts; a windowed limit's lease also
	// ends with its window. Default 100 ms, at most MaxLeaseTTL.
	LeaseTTL time.Duration
	// Regions (docs/regions.md). Region names this node's region; ""
	// means no regions: global limits are counted like the others.
	// RegionPeers gives, for every other region, the gRPC addresses of
	// some of its nodes (any node of a region answers for it); the
	// regions are this node's and those. RegionSync is how often a node
	// asks the home regions of the global keys it decides for slices
	// (default 100 ms); RegionLeaseTTL the longest a slice lasts (default
	// 1 s, at most peer.MaxRegionLeaseTTL, 10 s; a windowed limit's also
	// ends with its window); RegionCutAfter how long after its last
	// answer, with a failed call since, a home region counts as cut off
	// (default 1 s);
	// RegionFallbackShare the share of a global limit a region decides
	// alone while cut off from the key's home region, past what it holds
	// (0: 1 / the number of regions).
	Region              string
	RegionPeers         map[string][]string
	RegionSync          time.Duration
	RegionLeaseTTL      time.Duration
	RegionCutAfter      time.Duration
	RegionFallbackShare float64
	// Rules resolves checks with limit 0; nil means there are no rules.
	Rules Rules
	// Load, when set, replaces the measured CPU load that elastic limits
	// see (tests). It must be cheap and safe for concurrent use.
	Load func() float64
	// Log receives the node's log lines. Default slog.Default().
	Log *slog.Logger
	// Now is the clock of every decision. Default: the wall clock, read
	// cheaply (wallClock).
	Now func() time.Time
	// TableChanged, when set, is called by the node with a new owner
	// table right after it has become current (its moves registered, the
	// moved keys' leases revoked), before the handoffs and copies that
	// follow from it: a simulation's or test's look at the moment a change
	// takes effect. It must return soon.
	TableChanged func(*ring.Table)
	// BootID names this process to the others, who take a new one under
	// the same name as a restart (its unreplicated copies lost). Default:
	// random. A simulation sets it so that a seed fixes what the nodes
	// gossip.
	BootID uint64
}

// DefaultClusterName is the cluster name when none is given.
const DefaultClusterName = "sluice"

// DefaultConfig returns a Config with memberlist's LAN defaults tuned for
// fast failure detection (FastFailureDetection) and the defaults documented
// on each field. Name, GRPCAddr and DataDir remain to be set.
func DefaultConfig() Config {
	ml := MemberlistConfig(true)
	cache := writeback.DefaultConfig()
	cache.Logger = nil // New gives the cache the node's logger
	return Config{
		Config:              ml,
		ClusterName:         DefaultClusterName,
		JoinRetry:           time.Second,
		Ring:                ring.DefaultConfig(),
		Cache:               cache,
		ForwardTimeout:      250 * time.Millisecond,
		LeaveTimeout:        2 * time.Second,
		ReplicationInterval: 100 * time.Millisecond,
		MoveWindow:          30 * time.Second,
		PullTimeout:         100 * time.Millisecond,
		HandoffTimeout:      10 * time.Second,
		LeavePropagation:    time.Second,
		ReconnectInterval:   2 * time.Second,
		HeartbeatIdle:       30 * time.Second,
		HotKeyThreshold:     DefaultHotKeyThreshold,
		LeaseTTL:            100 * time.Millisecond,
		RegionSync:          100 * time.Millisecond,
		RegionLeaseTTL:      time.Second,
		RegionCutAfter:      time.Second,
	}
}

// DefaultHotKeyThreshold is Config.HotKeyThreshold's default, in hits per
// second of one key from one node (docs/performance.md, "Hot keys").
const DefaultHotKeyThreshold = 200

// MaxLeaseTTL is the longest Config.LeaseTTL, and the longest lease a
// node keeps.
const MaxLeaseTTL = 10 * time.Second

// Validate reports the first missing or invalid setting.
func (c *Config) Validate() error {
	switch {
	case c.Config == nil:
		return errors.New("cluster: memberlist config is nil")
	case c.Name == "":
		return errors.New("cluster: node name is empty")
	case len(c.ClusterName) > memberlist.LabelMaxSize:
		return fmt.Errorf("cluster: cluster name is %d bytes, more than %d", len(c.ClusterName), memberlist.LabelMaxSize)
	case c.GRPCAddr == "":
		return errors.New("cluster: gRPC address is empty")
	case len(c.GRPCAddr) > maxAddrLen:
		return fmt.Errorf("cluster: gRPC address is %d bytes, more than %d", len(c.GRPCAddr), maxAddrLen)
	case c.DataDir == "" && c.Store == nil:
		return errors.New("cluster: data dir is empty")
	case c.ForwardTimeout <= 0:
		return fmt.Errorf("cluster: forward timeout %v must be positive", c.ForwardTimeout)
	case c.JoinRetry <= 0:
		return fmt.Errorf("cluster: join retry %v must be positive", c.JoinRetry)
	case c.LeaveTimeout <= 0:
		return fmt.Errorf("cluster: leave timeout %v must be positive", c.LeaveTimeout)
	case c.ReplicationInterval <= 0 || c.MoveWindow <= 0 || c.PullTimeout <= 0 || c.HandoffTimeout <= 0 || c.LeavePropagation < 0 || c.ReconnectInterval <= 0:
		return fmt.Errorf("cluster: replication interval, move window, pull and handoff timeouts must be positive")
	case c.HeartbeatIdle < 0:
		return fmt.Errorf("cluster: heartbeat idle %v must not be negative (0 beats always)", c.HeartbeatIdle)
	case !(c.HotKeyThreshold >= 0) || math.IsInf(c.HotKeyThreshold, 1):
		return fmt.Errorf("cluster: hot-key threshold %v must be a finite number ≥ 0 (0 grants no leases)", c.HotKeyThreshold)
	case c.HotKeyThreshold > 0 && (c.LeaseTTL < time.Millisecond || c.LeaseTTL > MaxLeaseTTL):
		return fmt.Errorf("cluster: lease TTL %v must be between 1ms and %v", c.LeaseTTL, MaxLeaseTTL)
	case c.Region == "" && len(c.RegionPeers) > 0:
		return errors.New("cluster: region peers given without a region for this node")
	case c.Region != "" && (c.RegionSync <= 0 || c.RegionCutAfter <= 0 || c.RegionLeaseTTL < time.Millisecond || c.RegionLeaseTTL > MaxLeaseTTL):
		return fmt.Errorf("cluster: region sync and cut-off must be positive, region lease TTL between 1ms and %v", MaxLeaseTTL)
	case !(c.RegionFallbackShare >= 0 && c.RegionFallbackShare <= 1):
		return fmt.Errorf("cluster: region fallback share %v must be between 0 and 1 (0: 1 / the number of regions)", c.RegionFallbackShare)
	case c.OwnerUnavailable > OwnerUnavailableDeny:
		return fmt.Errorf("cluster: unknown owner-unavailable policy %d", c.OwnerUnavailable)
	}
	if err := validateRegions(c.Region, c.RegionPeers); err != nil {
		return err
	}
	if err := c.Ring.Validate(); err != nil {
		return fmt.Errorf("cluster: ring: %w", err)
	}
	if err := c.Cache.Validate(); err != nil {
		return fmt.Errorf("cluster: cache: %w", err)
	}
	return nil
}

// MemberlistConfig returns memberlist's LAN defaults as a node uses them:
// with FastFailureDetection when fast, and without compression. memberlist
// compresses every gossip packet and push/pull exchange with LZW by
// default, and a fresh LZW writer per packet was a fifth of an idle node's
// CPU (a profile of one of 30 idle nodes, docs/scaling.md) for packets of
// a few hundred bytes on a LAN. A node decodes a compressed message
// whatever its own setting, so nodes with and without compression talk to
// each other.
func MemberlistConfig(fast bool) *memberlist.Config {
	ml := memberlist.DefaultLANConfig()
	ml.Name = ""
	if fast {
		FastFailureDetection(ml)
	}
	ml.EnableCompression = false
	return ml
}

// FastFailureDetection tunes memberlist so that every node agrees on a crash
// within about 3 s on a LAN (docs/guarantees.md has the measurements):
// a probe every 400 ms with a 200 ms timeout, suspicion for 3 probe
// intervals (scaled by log10 of the cluster size), gossip every 100 ms to 4
// nodes. The price is more probe traffic (a few packets per node per
// second) and a higher chance of suspecting a node that is only slow (a GC
// pause or a busy core over 1 s); a suspected node that answers refutes it.
func FastFailureDetection(c *memberlist.Config) {
	c.ProbeInterval = 400 * time.Millisecond
	c.ProbeTimeout = 200 * time.Millisecond
	c.SuspicionMult = 3
	c.SuspicionMaxTimeoutMult = 4
	c.GossipInterval = 100 * time.Millisecond
	c.GossipNodes = 4
	c.RetransmitMult = 4
	c.PushPullInterval = 15 * time.Second
}
