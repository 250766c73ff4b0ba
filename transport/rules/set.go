package rules

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/bucket"
)

// MaxFileSize is the largest rules file read, in bytes.
const MaxFileSize = 8 << 20

// Set is the set of limits by name loaded from a rules file or directory.
// A Set is immutable once built, so it is safe for concurrent use and
// Lookup never blocks; a [Watcher] swaps whole Sets.
type Set struct {
	limits map[string][]bucket.Limit
	// envoy holds the domains of envoyproxy/ratelimit-format files.
	envoy map[string]*envoyDomain
	hash  string
	// input is the digest of the raw files (names and contents) the Set
	// was built from; the Watcher compares it to detect changes.
	input [sha256.Size]byte
}

// Lookup returns the limits of the rule name (1 to MaxLimitsPerRule, in the
// order of the file) and whether there is such a rule. It does not
// allocate. The slice belongs to the Set: callers must not modify it. A nil
// Set has no rules.
func (s *Set) Lookup(name string) ([]bucket.Limit, bool) {
	if s == nil {
		return nil, false
	}
	l, ok := s.limits[name]
	return l, ok
}

// Hash returns a short hex hash (16 digits) of the effective rules: the
// same rules give the same hash whatever their order, files and formatting;
// the order of the limits within a rule counts. `sluice status` shows it
// so that nodes running different rules stand out.
func (s *Set) Hash() string {
	if s == nil {
		return emptyHash
	}
	return s.hash
}

// Len returns the number of rules: Sluice rules, and descriptors with a
// rate_limit in envoy-format files.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	n := len(s.limits)
	for _, d := range s.envoy {
		n += d.rules
	}
	return n
}

// Names returns the names of the rules, sorted.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	names := make([]string, 0, len(s.limits))
	for n := range s.limits {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

var emptyHash = hashRules(nil, nil)

// Load reads the rules at path: a file (whatever its name), or a directory
// whose *.yaml and *.yml entries are read (not recursively, in name order).
// In a directory, entries whose names start with "." are skipped (hidden
// files and the ..data and ..<timestamp> entries of a Kubernetes ConfigMap
// mount), symbolic links are followed (the ConfigMap's x.yaml ->
// ..data/x.yaml), and dangling links and entries that are not regular
// files are skipped. A name defined twice, in one file or across files, is
// an error, as is any invalid file: Load returns all the rules or none.
func Load(path string) (*Set, error) {
	files, err := readSource(path)
	if err != nil {
		return nil, err
	}
	return build(files)
}

// Parse parses the content of one rules file; name is used in errors.
func Parse(name string, data []byte) (*Set, error) {
	return build([]source{{path: name, data: data}})
}

// source is one file read.
type source struct {
	path string
	data []byte
}

// readSource reads the file at path, or the rules files of the directory at
// path. A file that disappears while the directory is read (a Kubernetes
// ConfigMap update) is skipped.
func readSource(path string) ([]source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	if !fi.IsDir() {
		data, err := readFile(path)
		if err != nil {
			return nil, err
		}
		return []source{{path: path, data: data}}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	var files []source
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		p := filepath.Join(path, name)
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("rules: %w", err)
		}
		if !st.Mode().IsRegular() {
			continue
		}
		data, err := readFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		files = append(files, source{path: p, data: data})
	}
	return files, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("rules: read %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("larger than %d bytes", MaxFileSize)}
	}
	return data, nil
}

// inputDigest hashes the names and contents of the files read.
func inputDigest(files []source) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, f := range files {
		for _, b := range [][]byte{[]byte(f.path), f.data} {
			binary.BigEndian.PutUint64(n[:], uint64(len(b)))
			h.Write(n[:])
			h.Write(b)
		}
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// build parses every file and merges their rules.
func build(files []source) (*Set, error) {
	s := &Set{limits: make(map[string][]bucket.Limit), input: inputDigest(files)}
	where := make(map[string]rule)
	for _, f := range files {
		content, err := parseFile(f.path, f.data)
		if err != nil {
			return nil, err
		}
		if d := content.envoy; d != nil {
			if prev, ok := s.envoy[d.domain]; ok {
				return nil, &Error{File: d.file, Line: d.line, Column: d.column, Field: "domain",
					Msg: fmt.Sprintf("domain %q is already defined at %s:%d:%d", d.domain, prev.file, prev.line, prev.column)}
			}
			if s.envoy == nil {
				s.envoy = make(map[string]*envoyDomain)
			}
			s.envoy[d.domain] = d
		}
		for _, r := range content.rules {
			if prev, ok := where[r.name]; ok {
				return nil, &Error{File: r.file, Line: r.line, Column: r.column, Field: r.field,
					Msg: fmt.Sprintf("%q is already defined at %s:%d:%d", r.name, prev.file, prev.line, prev.column)}
			}
			where[r.name] = r
			s.limits[r.name] = slices.Clip(r.limits)
		}
	}
	s.hash = hashRules(s.limits, s.envoy)
	return s, nil
}

// hashRules hashes the effective rules in name order: every field of every
// limit, so that any change in behaviour changes the hash; then the envoy
// domains, when there are any (so Sluice-only rules hash as before).
func hashRules(m map[string][]bucket.Limit, envoy map[string]*envoyDomain) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	h.Write([]byte("sluice-rules-v1\x00"))
	var b []byte
	for _, n := range names {
		b = binary.AppendUvarint(b[:0], uint64(len(n)))
		b = append(b, n...)
		b = binary.AppendUvarint(b, uint64(len(m[n])))
		for _, l := range m[n] {
			b = append(b, byte(l.Algorithm), byte(l.Mode), byte(l.Calendar), boolByte(l.Shaping), boolByte(l.CountRefused))
			if l.Global {
				b = append(b, 'G') // only when set: the hashes of files without it stay as they were
			}
			if l.CalendarTZ != "" {
				b = append(b, 'Z') // as with G
				b = binary.AppendUvarint(b, uint64(len(l.CalendarTZ)))
				b = append(b, l.CalendarTZ...)
			}
			for _, v := range []int64{l.Limit, l.WindowMS, l.Burst, l.SubWindows, l.SoftPercent, l.ElasticCeiling, l.ElasticLoadPercent} {
				b = binary.AppendVarint(b, v)
			}
		}
		h.Write(b)
	}
	if len(envoy) > 0 {
		hashEnvoy(h, envoy)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}
