package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink finds the targets of Markdown links and images: [text](target)
// and ![alt](target), with an optional title after the target.
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// TestDocLinksResolve: every relative link of README.md, docs/ and the
// other Markdown files of the repository names a file or directory that
// exists, and a #fragment names a heading of the page it points into, as
// GitHub makes anchors. A moved or renamed page breaks this test, not the
// reader's click.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	files := markdownFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("only %d Markdown files found under %s", len(files), root)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a
	}
	checked := 0
	eachLine(t, root, files, stripCode, func(f, at, line string) {
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %s does not exist", at, target, path)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[frag] {
				t.Errorf("%s: link %q: no heading of %s has the anchor #%s", at, target, filepath.Base(dest), frag)
			}
		}
	})
	t.Logf("%d relative links in %d Markdown files resolve", checked, len(files))
}

// TestReadmeFitsOnAScreen: the README is the front door, at most 250
// lines, and links every page of docs/.
func TestReadmeFitsOnAScreen(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > 250 {
		t.Errorf("README.md has %d lines, more than 250: move detail into docs/", n)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if !strings.Contains(readme, "](docs/"+filepath.Base(p)+")") {
			t.Errorf("README.md does not link docs/%s", filepath.Base(p))
		}
	}
}

// repoRoot is the module's root directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod in %s", root)
	}
	return root
}

// markdownFiles lists the repository's Markdown files: git's list where
// git works (so build output and fetched stubs are left out), else a walk
// that skips hidden directories.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	if out, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.md").Output(); err == nil && len(out) > 0 {
		var files []string
		for _, l := range strings.Fields(string(out)) {
			if _, err := os.Stat(filepath.Join(root, l)); err == nil {
				files = append(files, filepath.Join(root, l))
			}
		}
		return files
	}
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// eachLine calls fn with every line of files, after strip (which keeps
// the line count), with the file's path and "rel:line" for messages.
func eachLine(t *testing.T, root string, files []string, strip func(string) string, fn func(path, at, line string)) {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for i, line := range strings.Split(strip(string(b)), "\n") {
			fn(f, fmt.Sprintf("%s:%d", rel, i+1), line)
		}
	}
}

// stripCode blanks fenced code blocks and inline code spans, keeping the
// line count, so that code that looks like a link is not checked.
func stripCode(s string) string {
	lines := strings.Split(stripFences(s), "\n")
	for i, l := range lines {
		lines[i] = inlineCode.ReplaceAllString(l, "``")
	}
	return strings.Join(lines, "\n")
}

// stripFences blanks fenced code blocks, keeping the line count.
func stripFences(s string) string {
	lines := strings.Split(s, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

var inlineCode = regexp.MustCompile("`[^`]*`")

// headingAnchors returns the anchors GitHub gives a page's headings:
// lower case, spaces to hyphens, punctuation but hyphens and underscores
// dropped, and -1, -2... on repeats.
func headingAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	in := false
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if in || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out[a] = true
	}
	return out
}
