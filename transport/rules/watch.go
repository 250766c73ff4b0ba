package rules

import (
	"context"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// DefaultInterval is how often a Watcher polls when NewWatcher is given an
// interval ≤ 0.
const DefaultInterval = time.Second

// Watcher keeps the rules at a path current. It polls: every interval it
// reads the file (or the directory's rules files) and compares a hash of
// the names and contents with what is in force, so in-place edits, atomic
// renames and Kubernetes ConfigMap symlink swaps are all seen, whatever
// the modification times say. A changed, valid input replaces the Set in
// force; an invalid one is refused whole and the previous Set stays.
//
// The Watcher itself is what the node uses: Lookup, Hash and Len read the
// Set in force through an atomic pointer and never block, so they may be
// called concurrently with each other and with reloads. Rules returns that
// Set for callers that need several answers from one version.
type Watcher struct {
	path     string
	log      *slog.Logger
	interval time.Duration
	cur      atomic.Pointer[Set]
	reloads  atomic.Uint64
	failures atomic.Uint64

	mu       sync.Mutex // serialises reloads; guards lastFail and lastErr
	lastFail string     // what the last failure was about: the input digest or the read error
	lastErr  error      // the last failure; nil after a success

	life    sync.Mutex // guards started, closed, cancel, done
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewWatcher loads the rules at path (as [Load] does) and returns a Watcher
// for them; it fails if that first load fails. It starts nothing: Start
// starts polling every interval (DefaultInterval when interval ≤ 0). A nil
// logger discards.
func NewWatcher(path string, logger *slog.Logger, interval time.Duration) (*Watcher, error) {
	set, err := Load(path)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	w := &Watcher{path: path, log: logger, interval: interval}
	w.cur.Store(set)
	return w, nil
}

// Rules returns the Set in force.
func (w *Watcher) Rules() *Set { return w.cur.Load() }

// Lookup returns the limits of the rule name in the Set in force; see
// [Set.Lookup].
func (w *Watcher) Lookup(name string) ([]bucket.Limit, bool) { return w.cur.Load().Lookup(name) }

// Hash returns the hash of the Set in force; see [Set.Hash].
func (w *Watcher) Hash() string { return w.cur.Load().Hash() }

// Len returns the number of rules in force.
func (w *Watcher) Len() int { return w.cur.Load().Len() }

// Stats are a Watcher's counters.
type Stats struct {
	// Reloads counts the reloads that put a new Set in force (the first
	// load is not counted).
	Reloads uint64
	// Failures counts the reloads refused: invalid content, or files that
	// could not be read. A failure is counted (and logged) once, until the
	// input changes again, however many polls see it.
	Failures uint64
	// LastError is the last failure, "" when the last change was loaded.
	LastError string
	// Hash and Rules describe the Set in force.
	Hash  string
	Rules int
}

// Stats returns the Watcher's counters.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	var last string
	if w.lastErr != nil {
		last = w.lastErr.Error()
	}
	w.mu.Unlock()
	s := w.cur.Load()
	return Stats{Reloads: w.reloads.Load(), Failures: w.failures.Load(), LastError: last, Hash: s.Hash(), Rules: s.Len()}
}

// Reload reads the rules now, as one poll of the loop does: if the input
// changed and is valid it is put in force (logged at Info with the new hash
// and number of rules); if it is invalid or unreadable the previous Set
// stays, the failure is counted and logged at Warn with the path and the
// error, and Reload returns it. An input that has not changed since the
// last reload costs a read and a hash; the same failure seen again returns
// its error without counting or logging it again.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := w.cur.Load()
	files, err := readSource(w.path)
	var key string
	if err == nil {
		d := inputDigest(files)
		if d == cur.input {
			w.lastFail, w.lastErr = "", nil
			return nil
		}
		key = "input:" + hex.EncodeToString(d[:])
		if key == w.lastFail {
			return w.lastErr
		}
		var set *Set
		if set, err = build(files); err == nil {
			w.cur.Store(set)
			w.lastFail, w.lastErr = "", nil
			w.reloads.Add(1)
			w.log.Info("rules reloaded", "path", w.path, "hash", set.Hash(), "rules", set.Len())
			return nil
		}
	} else {
		key = "read:" + err.Error()
		if key == w.lastFail {
			return w.lastErr
		}
	}
	w.lastFail, w.lastErr = key, err
	w.failures.Add(1)
	w.log.Warn("rules reload refused; keeping the previous rules", "path", w.path, "error", err.Error(), "hash", cur.Hash())
	return err
}

// Start starts the polling loop, which runs until ctx is done or Close is
// called. Start after Start or Close does nothing.
func (w *Watcher) Start(ctx context.Context) {
	w.life.Lock()
	defer w.life.Unlock()
	if w.started || w.closed {
		return
	}
	w.started = true
	ctx, w.cancel = context.WithCancel(ctx)
	w.done = make(chan struct{})
	go w.loop(ctx)
}

func (w *Watcher) loop(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = w.Reload() // logged and counted by Reload
		}
	}
}

// Close stops the polling loop and waits for it to return. The Set in
// force stays readable. Close may be called more than once, and without
// Start.
func (w *Watcher) Close() {
	w.life.Lock()
	w.closed = true
	cancel, done := w.cancel, w.done
	w.life.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
