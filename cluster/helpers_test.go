package cluster

// Helpers the pull and placement tests share. (The handoff tests run on the
// simulated cluster: cluster/clustertest's handoff_test.go, leave_test.go
// and membership_test.go.)

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/sluicehq/sluice/ring"
)

// keysOwnedBy returns k keys of name "api" whose owner (in n's ring) is
// owner.
func keysOwnedBy(n *Node, owner string, k int) []string {
	var keys []string
	for i := 0; len(keys) < k; i++ {
		key := fmt.Sprint("user:", i)
		if o, _ := n.Ring().Owner(ring.Hash("api", key)); o.Name == owner {
			keys = append(keys, key)
		}
	}
	return keys
}

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}

// attrs returns the attributes of every record logged at level or above.
func (l *logRecorder) attrs(level slog.Level) []map[string]slog.Value {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range l.recs {
		if r.Level < level {
			continue
		}
		m := map[string]slog.Value{"msg": slog.StringValue(r.Message)}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.Resolve()
			return true
		})
		out = append(out, m)
	}
	return out
}
