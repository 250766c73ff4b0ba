package cluster

import (
	"errors"
	"fmt"
	"log/slog"
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

// Rules gives the limit of a name for checks that carry no limit (limit 0).
// Lookup is called concurrently on every such check and must not block.
type Rules interface {
	Lookup(name string) (bucket.Limit, bool)
}

// Config configures a Node. The embedded memberlist.Config carries the node
// name (Name, unique in the cluster), the gossip bind and advertise
// addresses and the failure detector's timing; its Delegate and Events are
// set by the node.
type Config struct {
	*memberlist.Config

	// GRPCAddr is the host:port at which peers reach this node's gRPC
	// server. It travels in the memberlist metadata. Required.
	GRPCAddr string
	// Join lists host:port gossip addresses of nodes to join at start.
	Join []string
	// JoinRetry is how often Start's background join retries while no seed
	// has answered. Default 1 s.
	JoinRetry time.Duration
	// DataDir is where the durable store lives. Required.
	DataDir string
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
	// Rules resolves checks with limit 0; nil means there are no rules.
	Rules Rules
	// Log receives the node's log lines. Default slog.Default().
	Log *slog.Logger
	// Now is the clock of every decision. Default time.Now.
	Now func() time.Time
}

// DefaultConfig returns a Config with memberlist's LAN defaults and the
// defaults documented on each field. Name, GRPCAddr and DataDir remain to be
// set.
func DefaultConfig() Config {
	ml := memberlist.DefaultLANConfig()
	ml.Name = ""
	return Config{
		Config:         ml,
		JoinRetry:      time.Second,
		Ring:           ring.DefaultConfig(),
		Cache:          writeback.DefaultConfig(),
		ForwardTimeout: 250 * time.Millisecond,
		LeaveTimeout:   2 * time.Second,
	}
}

// Validate reports the first missing or invalid setting.
func (c *Config) Validate() error {
	switch {
	case c.Config == nil:
		return errors.New("cluster: memberlist config is nil")
	case c.Name == "":
		return errors.New("cluster: node name is empty")
	case c.GRPCAddr == "":
		return errors.New("cluster: gRPC address is empty")
	case len(c.GRPCAddr) > maxAddrLen:
		return fmt.Errorf("cluster: gRPC address is %d bytes, more than %d", len(c.GRPCAddr), maxAddrLen)
	case c.DataDir == "":
		return errors.New("cluster: data dir is empty")
	case c.ForwardTimeout <= 0:
		return fmt.Errorf("cluster: forward timeout %v must be positive", c.ForwardTimeout)
	case c.JoinRetry <= 0:
		return fmt.Errorf("cluster: join retry %v must be positive", c.JoinRetry)
	case c.LeaveTimeout <= 0:
		return fmt.Errorf("cluster: leave timeout %v must be positive", c.LeaveTimeout)
	case c.OwnerUnavailable > OwnerUnavailableDeny:
		return fmt.Errorf("cluster: unknown owner-unavailable policy %d", c.OwnerUnavailable)
	}
	if err := c.Ring.Validate(); err != nil {
		return fmt.Errorf("cluster: ring: %w", err)
	}
	if err := c.Cache.Validate(); err != nil {
		return fmt.Errorf("cluster: cache: %w", err)
	}
	return nil
}
