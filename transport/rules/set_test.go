package rules

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

const (
	ruleA = "rules:\n- name: a\n  limits: [{limit: 1, window: 1s}]\n"
	ruleB = "rules:\n- name: b\n  limits: [{limit: 2, window: 1m}, {limit: 20, window: 1h}]\n"
	ruleC = "rules:\n- name: c\n  mode: soft\n  soft_percent: 10\n  limits: [{limit: 3, window: 1d}]\n"
)

func TestLoadFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sluice.rules") // a file is read whatever its name
	writeFile(t, path, ruleA+"- name: b\n  limits: [{limit: 2, window: 1m}]\n")
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2 {
		t.Fatalf("Len = %d", s.Len())
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
}

func TestLoadDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), ruleA)
	writeFile(t, filepath.Join(dir, "b.yml"), ruleB)
	writeFile(t, filepath.Join(dir, "c.yaml"), ruleC)
	writeFile(t, filepath.Join(dir, "empty.yaml"), "")
	// Not read: other extensions, hidden files, subdirectories.
	writeFile(t, filepath.Join(dir, "notes.txt"), "not yaml")
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "broken: [")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "sub.yaml", "d.yaml"), "broken: [")
	// A dangling symlink (a file just removed from a ConfigMap) is skipped.
	if err := os.Symlink("nowhere.yaml", filepath.Join(dir, "gone.yaml")); err != nil {
		t.Fatal(err)
	}

	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Names(), ","); got != "a,b,c" {
		t.Fatalf("names = %s", got)
	}
	b, _ := s.Lookup("b")
	if len(b) != 2 || b[1].Limit != 20 {
		t.Errorf("b = %+v", b)
	}

	// One bad file refuses the whole directory, naming the file.
	writeFile(t, filepath.Join(dir, "z.yaml"), "rules:\n- name: z\n  limits: [{limit: 1, window: 0s}]\n")
	_, err = Load(dir)
	if err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dir, "z.yaml")+":3:") {
		t.Fatalf("Load with a bad file: %v", err)
	}
}

func TestLoadDirDuplicate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "1.yaml"), ruleA+ruleB[len("rules:\n"):])
	writeFile(t, filepath.Join(dir, "2.yaml"), "rules:\n- name: c\n  limits: [{limit: 1, window: 1s}]\n- name: b\n  limits: [{limit: 9, window: 1s}]\n")
	_, err := Load(dir)
	want := filepath.Join(dir, "2.yaml") + `:4:9: rules[1].name: "b" is already defined at ` + filepath.Join(dir, "1.yaml") + ":4:9"
	if err == nil || err.Error() != want {
		t.Fatalf("error\n %v\nwant\n %s", err, want)
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != 4 || e.Field != "rules[1].name" {
		t.Fatalf("error %#v", err)
	}
}

func TestHash(t *testing.T) {
	t.Parallel()
	// The same rules in one file, in three files, in another order and
	// another formatting hash the same.
	one := filepath.Join(t.TempDir(), "all.yaml")
	writeFile(t, one, ruleA+ruleB[len("rules:\n"):]+ruleC[len("rules:\n"):])
	three := t.TempDir()
	writeFile(t, filepath.Join(three, "x.yaml"), ruleC)
	writeFile(t, filepath.Join(three, "y.yaml"), ruleB)
	writeFile(t, filepath.Join(three, "z.yaml"), ruleA)
	reordered := filepath.Join(t.TempDir(), "r.yaml")
	writeFile(t, reordered, `# reformatted
rules:
  - name: c
    limits:
      - limit: 3
        window: 24h
    soft_percent: 10
    mode: soft
  - {name: a, limits: [{window: 1000ms, limit: 1, algorithm: sliding_window}]}
  - name: b
    limits: [{limit: 2, window: 60s}, {limit: 20, window: 60m, mode: hard}]
`)
	var hashes []string
	for _, p := range []string{one, three, reordered} {
		s, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, s.Hash())
	}
	if hashes[0] != hashes[1] || hashes[0] != hashes[2] {
		t.Fatalf("hashes differ: %v", hashes)
	}
	if len(hashes[0]) != 16 || strings.Trim(hashes[0], "0123456789abcdef") != "" {
		t.Fatalf("hash %q is not 16 hex digits", hashes[0])
	}

	// Any change of content changes it: a value, a name, the order of the
	// limits of a rule.
	for _, changed := range []string{
		strings.Replace(ruleA, "limit: 1,", "limit: 2,", 1),
		strings.Replace(ruleA, "name: a", "name: A", 1),
		"",
	} {
		writeFile(t, filepath.Join(three, "z.yaml"), changed)
		s, err := Load(three)
		if err != nil {
			t.Fatal(err)
		}
		if s.Hash() == hashes[0] {
			t.Errorf("hash unchanged with z.yaml = %q", changed)
		}
	}
	swapped := ruleA + "- name: b\n  limits: [{limit: 20, window: 1h}, {limit: 2, window: 1m}]\n" + ruleC[len("rules:\n"):]
	s, err := Parse("s.yaml", []byte(swapped))
	if err != nil {
		t.Fatal(err)
	}
	if s.Hash() == hashes[0] {
		t.Error("hash unchanged with the limits of b swapped")
	}
}

// TestHashCoversEveryField fails when bucket.Limit gains a field that
// hashRules does not hash.
func TestHashCoversEveryField(t *testing.T) {
	t.Parallel()
	base := bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 1000}
	seen := map[string]bool{hashRules(map[string][]bucket.Limit{"n": {base}}, nil): true}
	typ := reflect.TypeFor[bucket.Limit]()
	for i := range typ.NumField() {
		l := base
		f := reflect.ValueOf(&l).Elem().Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int64:
			f.SetInt(f.Int() + 7)
		case reflect.Uint8:
			f.SetUint(f.Uint() + 2)
		case reflect.String:
			f.SetString(f.String() + "Europe/Berlin")
		default:
			t.Fatalf("field %s of kind %s: teach hashRules and this test about it", typ.Field(i).Name, f.Kind())
		}
		h := hashRules(map[string][]bucket.Limit{"n": {l}}, nil)
		if seen[h] {
			t.Errorf("changing %s does not change the hash", typ.Field(i).Name)
		}
		seen[h] = true
	}
}

// TestLookupAllocs is not parallel: AllocsPerRun counts every goroutine's
// allocations.
func TestLookupAllocs(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "r.yaml"), ruleB)
	w, err := NewWatcher(dir, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := w.Rules()
	name := strings.Clone("b")
	var n int
	if a := testing.AllocsPerRun(1000, func() {
		l, _ := s.Lookup(name)
		m, _ := w.Lookup(name)
		n += len(l) + len(m)
	}); a != 0 {
		t.Errorf("Lookup allocates %.1f times", a)
	}
	if n == 0 {
		t.Fatal("no limits found")
	}
}

func TestNilSet(t *testing.T) {
	t.Parallel()
	var s *Set
	if _, ok := s.Lookup("a"); ok || s.Len() != 0 || s.Hash() != emptyHash || s.Names() != nil {
		t.Fatal("a nil Set is not empty")
	}
}

func BenchmarkLookup(b *testing.B) {
	s, err := Parse("b.yaml", []byte(goodFile))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Lookup("api.daily")
	}
}
