package rules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// logs records what a Watcher logs.
type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}

func (l *logs) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

func newWatcher(t *testing.T, path string) (*Watcher, *logs) {
	t.Helper()
	l := &logs{}
	w, err := NewWatcher(path, slog.New(l), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w, l
}

// limitOf returns the first limit of rule name, -1 if there is none.
func limitOf(w *Watcher, name string) int64 {
	l, ok := w.Lookup(name)
	if !ok {
		return -1
	}
	return l[0].Limit
}

func ruleText(name string, limit int) string {
	return fmt.Sprintf("rules:\n- name: %s\n  limits: [{limit: %d, window: 1s}]\n", name, limit)
}

// atomicWrite writes content to a temporary file and renames it over path,
// as editors and config-management tools do.
func atomicWrite(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestNewWatcherFails(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r.yaml")
	if _, err := NewWatcher(path, nil, 0); err == nil {
		t.Fatal("NewWatcher on a missing file succeeded")
	}
	writeFile(t, path, "rules: [")
	if _, err := NewWatcher(path, nil, 0); err == nil {
		t.Fatal("NewWatcher on a bad file succeeded")
	}
}

func TestReloadInPlaceEdit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r.yaml")
	writeFile(t, path, ruleText("a", 1))
	w, l := newWatcher(t, path)
	h1 := w.Hash()

	// Nothing changed: nothing happens.
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := l.take(); len(got) != 0 || w.Stats().Reloads != 0 {
		t.Fatalf("unchanged reload logged %q, stats %+v", got, w.Stats())
	}

	writeFile(t, path, ruleText("a", 2)+"- name: b\n  limits: [{limit: 5, window: 1m}]\n")
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if limitOf(w, "a") != 2 || limitOf(w, "b") != 5 || w.Len() != 2 || w.Hash() == h1 {
		t.Fatalf("after the edit: a=%d b=%d len=%d hash=%s", limitOf(w, "a"), limitOf(w, "b"), w.Len(), w.Hash())
	}
	got := l.take()
	want := fmt.Sprintf("INFO rules reloaded path=%s hash=%s rules=2", path, w.Hash())
	if len(got) != 1 || got[0] != want {
		t.Fatalf("logged %q, want %q", got, want)
	}
	if st := w.Stats(); st.Reloads != 1 || st.Failures != 0 || st.Hash != w.Hash() || st.Rules != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReloadRenameOver(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "r.yaml")
	writeFile(t, path, ruleText("a", 1))
	w, _ := newWatcher(t, path)
	atomicWrite(t, path, ruleText("a", 3))
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if limitOf(w, "a") != 3 {
		t.Fatalf("a = %d after rename-over of the file", limitOf(w, "a"))
	}

	// The same in a watched directory (the temporary file is hidden).
	wd, _ := newWatcher(t, dir)
	atomicWrite(t, path, ruleText("a", 4))
	if err := wd.Reload(); err != nil {
		t.Fatal(err)
	}
	if limitOf(wd, "a") != 4 {
		t.Fatalf("a = %d after rename-over in the directory", limitOf(wd, "a"))
	}
}

// kubeDir builds a directory as the kubelet mounts a ConfigMap:
// dir/..2026_1/<files>, dir/..data -> ..2026_1, dir/<file> -> ..data/<file>.
func kubeDir(t *testing.T, dir, version string, files map[string]string) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		writeFile(t, filepath.Join(dir, version, name), content)
	}
}

// kubeSwap points ..data at version as the kubelet does: a new symlink
// renamed over the old one, then links for new files, then removal of the
// old version and of links to files that went away.
func kubeSwap(t *testing.T, dir, version string, files map[string]string, removed ...string) {
	t.Helper()
	kubeDir(t, dir, version, files)
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := os.Symlink(version, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range removed {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReloadKubernetesSymlinkSwap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	kubeSwap(t, dir, "..2026_1", map[string]string{"a.yaml": ruleText("a", 1), "b.yaml": ruleText("b", 1)})
	w, _ := newWatcher(t, dir)
	if w.Len() != 2 || limitOf(w, "a") != 1 {
		t.Fatalf("initial load: %v", w.Rules().Names())
	}

	// New content for a.yaml, b.yaml unchanged, c.yaml added.
	kubeSwap(t, dir, "..2026_2", map[string]string{"a.yaml": ruleText("a", 2), "b.yaml": ruleText("b", 1), "c.yaml": ruleText("c", 7)})
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if limitOf(w, "a") != 2 || limitOf(w, "b") != 1 || limitOf(w, "c") != 7 || w.Len() != 3 {
		t.Fatalf("after the swap: %v a=%d c=%d", w.Rules().Names(), limitOf(w, "a"), limitOf(w, "c"))
	}

	// b.yaml removed from the ConfigMap. Between the swap and the removal
	// of its link, the link dangles: it is skipped.
	kubeSwap(t, dir, "..2026_3", map[string]string{"a.yaml": ruleText("a", 2), "c.yaml": ruleText("c", 7)})
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if w.Len() != 2 || limitOf(w, "b") != -1 {
		t.Fatalf("after removing b.yaml: %v", w.Rules().Names())
	}
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.Reloads != 2 || st.Failures != 0 {
		t.Fatalf("stats %+v", st)
	}

	// The mounted single file (subPath-less mount of one key) is a
	// symlink through ..data too.
	wf, _ := newWatcher(t, filepath.Join(dir, "a.yaml"))
	kubeSwap(t, dir, "..2026_4", map[string]string{"a.yaml": ruleText("a", 9), "c.yaml": ruleText("c", 7)})
	if err := wf.Reload(); err != nil {
		t.Fatal(err)
	}
	if limitOf(wf, "a") != 9 || wf.Len() != 1 {
		t.Fatalf("file through ..data: a=%d", limitOf(wf, "a"))
	}
}

func TestReloadBadEditKeepsPrevious(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "r.yaml")
	writeFile(t, path, ruleText("a", 1))
	writeFile(t, filepath.Join(dir, "s.yaml"), ruleText("s", 1))
	w, l := newWatcher(t, dir)
	h := w.Hash()

	bad := "rules:\n- name: a\n  limits: [{limit: 2, window: 1s}]\n- name: b\n  limits: [{limit: 2, window: 1x}]\n"
	writeFile(t, path, bad)
	err := w.Reload()
	var e *Error
	if !errors.As(err, &e) || e.File != path || e.Line != 5 || e.Field != "rules[1].limits[0].window" {
		t.Fatalf("Reload = %v", err)
	}
	if limitOf(w, "a") != 1 || limitOf(w, "b") != -1 || limitOf(w, "s") != 1 || w.Hash() != h {
		t.Fatal("a bad file changed the rules in force")
	}
	got := l.take()
	want := fmt.Sprintf("WARN rules reload refused; keeping the previous rules path=%s error=%s hash=%s", dir, err, h)
	if len(got) != 1 || got[0] != want {
		t.Fatalf("logged %q\nwant %q", got, want)
	}
	if st := w.Stats(); st.Failures != 1 || st.Reloads != 0 || st.LastError != err.Error() {
		t.Fatalf("stats %+v", st)
	}

	// Polling the same bad content again neither logs nor counts again.
	if err2 := w.Reload(); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("second Reload = %v", err2)
	}
	if got := l.take(); len(got) != 0 || w.Stats().Failures != 1 {
		t.Fatalf("second Reload logged %q, stats %+v", got, w.Stats())
	}

	// Another bad content is another failure.
	writeFile(t, path, "rules: [")
	if err := w.Reload(); err == nil {
		t.Fatal("accepted a syntax error")
	}
	if st := w.Stats(); st.Failures != 2 || len(l.take()) != 1 {
		t.Fatalf("stats %+v", st)
	}

	// An unreadable path keeps the rules too.
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err == nil {
		t.Fatal("Reload of a missing directory succeeded")
	}
	if st := w.Stats(); st.Failures != 3 || limitOf(w, "a") != 1 {
		t.Fatalf("stats %+v", st)
	}
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}

	// Fixing the file loads it.
	writeFile(t, path, strings.Replace(bad, "1x", "1h", 1))
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); limitOf(w, "a") != 2 || limitOf(w, "b") != 2 || st.Reloads != 1 || st.Failures != 3 || st.LastError != "" {
		t.Fatalf("after the fix: a=%d b=%d stats %+v", limitOf(w, "a"), limitOf(w, "b"), st)
	}
}

// TestWatcherLoop runs the polling loop in a synctest bubble: time is
// virtual, so the test waits exactly one interval.
func TestWatcherLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "r.yaml")
		writeFile(t, path, ruleText("a", 1))
		l := &logs{}
		w, err := NewWatcher(path, slog.New(l), 0)
		if err != nil {
			t.Fatal(err)
		}
		w.Start(t.Context())
		w.Start(t.Context()) // a second Start does nothing

		writeFile(t, path, ruleText("a", 2))
		time.Sleep(DefaultInterval / 2)
		synctest.Wait()
		if limitOf(w, "a") != 1 {
			t.Fatal("reloaded before the interval")
		}
		time.Sleep(DefaultInterval / 2)
		synctest.Wait()
		if limitOf(w, "a") != 2 {
			t.Fatal("not reloaded after one interval")
		}

		// A bad edit: one warning however many polls see it.
		writeFile(t, path, "rules:\n- name: a\n  limits: [{limit: 2}]\n")
		time.Sleep(10 * DefaultInterval)
		synctest.Wait()
		if st := w.Stats(); limitOf(w, "a") != 2 || st.Failures != 1 || st.Reloads != 1 {
			t.Fatalf("after a bad edit: stats %+v", st)
		}
		if got := l.take(); len(got) != 2 || !strings.HasPrefix(got[0], "INFO") || !strings.HasPrefix(got[1], "WARN") {
			t.Fatalf("logged %q", got)
		}

		w.Close()
		w.Close()
		writeFile(t, path, ruleText("a", 3))
		time.Sleep(10 * DefaultInterval)
		synctest.Wait()
		if limitOf(w, "a") != 2 {
			t.Fatal("reloaded after Close")
		}
		w.Start(t.Context()) // Start after Close does nothing
		time.Sleep(10 * DefaultInterval)
		synctest.Wait()
		if limitOf(w, "a") != 2 {
			t.Fatal("restarted after Close")
		}
	})
}

// TestWatcherLoopContext checks that cancelling Start's context stops the
// loop, with an interval of its own.
func TestWatcherLoopContext(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "r.yaml")
		writeFile(t, path, ruleText("a", 1))
		w, err := NewWatcher(path, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		w.Start(ctx)
		writeFile(t, path, ruleText("a", 2))
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if limitOf(w, "a") != 1 {
			t.Fatal("reloaded before the interval")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if limitOf(w, "a") != 2 {
			t.Fatal("not reloaded after the interval")
		}
		cancel()
		synctest.Wait() // the loop has returned: no goroutine is left to block the bubble's end
		writeFile(t, path, ruleText("a", 3))
		time.Sleep(time.Minute)
		if limitOf(w, "a") != 2 {
			t.Fatal("reloaded after cancel")
		}
		w.Close()
	})
}

// TestWatcherConcurrent reads while reloading, for the race detector.
func TestWatcherConcurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r.yaml")
	writeFile(t, path, ruleText("a", 1))
	w, _ := newWatcher(t, path)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if l, ok := w.Lookup("a"); !ok || len(l) != 1 || l[0].Limit < 1 {
					t.Error("lookup during reload failed")
					return
				}
				_ = w.Hash()
				_ = w.Stats()
			}
		})
	}
	for i := 2; i < 50; i++ {
		atomicWrite(t, path, ruleText("a", i))
		if err := w.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if limitOf(w, "a") != 49 {
		t.Fatalf("a = %d", limitOf(w, "a"))
	}
}
