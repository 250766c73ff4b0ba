package cluster

// memberlist's log lines as slog records, and what they tell about
// suspicion and gossip key mismatches.

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
)

// slogWriter turns memberlist's log lines into slog records, or passes
// them to next when the configuration gave memberlist a log of its own, and
// reports the members this node's failure detector suspects.
type slogWriter struct {
	l         *slog.Logger
	next      io.Writer
	onSuspect func(name string)
	quiet     *repeatFilter
}

// repeatFilter lets a line of a kind through once per repeatEvery.
type repeatFilter struct {
	now  func() time.Time
	mu   sync.Mutex
	last map[string]time.Time
}

const repeatEvery = time.Minute

func (f *repeatFilter) allow(key string) bool {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil || len(f.last) > 1024 {
		f.last = map[string]time.Time{}
	}
	if t, ok := f.last[key]; ok && now.Sub(t) < repeatEvery {
		return false
	}
	f.last[key] = now
	return true
}

// fromHost is the host of memberlist's "from=host:port" in a log line, or "".
func fromHost(msg string) string {
	i := strings.LastIndex(msg, "from=")
	if i < 0 {
		return ""
	}
	addr := strings.Fields(msg[i+len("from="):])
	if len(addr) == 0 {
		return ""
	}
	if h, _, err := net.SplitHostPort(addr[0]); err == nil {
		return h
	}
	return addr[0]
}

// suspectLine is how memberlist (v0.7) logs a failed probe: "Suspect
// <name> has failed, no acks received". TestStatusShowsSuspect fails if a
// new version words it otherwise.
const (
	suspectPrefix = "memberlist: Suspect "
	suspectSuffix = " has failed, no acks received"
)

func (w slogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if i := strings.Index(msg, suspectPrefix); i >= 0 && strings.HasSuffix(msg, suspectSuffix) && w.onSuspect != nil {
		w.onSuspect(msg[i+len(suspectPrefix) : len(msg)-len(suspectSuffix)])
	}
	if w.next != nil {
		return w.next.Write(p)
	}
	level := slog.LevelDebug
	switch {
	case strings.Contains(msg, "[ERR]"):
		level = slog.LevelError
	case strings.Contains(msg, "[WARN]"):
		level = slog.LevelWarn
	case strings.Contains(msg, "[INFO]"):
		level = slog.LevelInfo
	}
	if level > slog.LevelDebug && gossipKeyMismatch(msg) && w.quiet != nil {
		// A node with the wrong gossip key retries every second: say so
		// once a minute per host, the rest at debug level.
		if !w.quiet.allow("key " + fromHost(msg)) {
			level = slog.LevelDebug
		} else {
			msg += " (gossip from a node without this cluster's gossip key: refused; repeats from this host are logged at debug level for a minute)"
		}
	}
	w.l.Log(context.Background(), level, msg, "component", "memberlist")
	return len(p), nil
}
