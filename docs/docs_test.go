// Package docs holds gpupool's user documentation; its test keeps the
// Markdown of the whole repository self-contained.
package docs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var (
	// relativeLink is a Markdown link to a file of the repository, with an
	// optional #anchor.
	relativeLink = regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`)
	// outsideReference is a path that leaves the repository, as a link
	// target or in a code span.
	outsideReference = regexp.MustCompile("(^|[\\s`(\"'])\\.\\./(\\.\\./)*shared/")
	// trackerReference is a mention of the project's issue tracker, which a
	// reader of the repository cannot see.
	trackerReference = regexp.MustCompile(`(?i)\bissues? #?[0-9]+\b`)
)

// TestDocsStayInsideTheRepository reads every tracked Markdown file: each
// relative link must name a file of the repository, and no text may send
// the reader outside it (a sibling checkout, an issue number).
func TestDocsStayInsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "--", "*.md").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	files := strings.Fields(string(out))
	if len(files) == 0 {
		t.Fatal("git ls-files found no Markdown files")
	}
	for _, name := range files {
		if strings.HasPrefix(name, "tools/") {
			continue
		}
		text, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, problem := range markdownProblems(root, name, string(text)) {
			t.Errorf("%s: %s", name, problem)
		}
	}
}

// markdownProblems lists what in one Markdown file points outside the
// repository at root; name is the file's path relative to root.
func markdownProblems(root, name, text string) []string {
	var problems []string
	for i, line := range strings.Split(text, "\n") {
		if outsideReference.MatchString(line) {
			problems = append(problems, lineProblem(i, "points outside the repository: "+strings.TrimSpace(line)))
		}
		if m := trackerReference.FindString(line); m != "" {
			problems = append(problems, lineProblem(i, "names an issue ("+m+"); say what it is instead"))
		}
		for _, link := range relativeLink.FindAllStringSubmatch(line, -1) {
			target := filepath.Join(root, filepath.Dir(name), link[1])
			if rel, err := filepath.Rel(root, target); err != nil || strings.HasPrefix(rel, "..") {
				problems = append(problems, lineProblem(i, "links outside the repository: "+link[1]))
				continue
			}
			if _, err := os.Stat(target); err != nil {
				problems = append(problems, lineProblem(i, "links to a missing file: "+link[1]))
			}
		}
	}
	return problems
}

func lineProblem(index int, what string) string {
	return fmt.Sprintf("line %d: %s", index+1, what)
}

func TestMarkdownProblems(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "here.md"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text string
		want int
	}{
		{"see [the design](here.md#why) and [Prometheus](https://prometheus.io)", 0},
		{"a [missing](gone.md) file", 1},
		{"a [sibling](../other/README.md)", 1},
		{"read `../shared/ARCHITECTURE.md` first", 1},
		{"fixed in issue 12", 1},
		{"the shared `servers.tokens` and a seed", 0},
	} {
		if got := markdownProblems(root, "README.md", tc.text); len(got) != tc.want {
			t.Errorf("%q: %d problems %q, want %d", tc.text, len(got), got, tc.want)
		}
	}
}

// TestREADMEShowsTheArchitecture: the README's picture is
// docs/architecture.md's, so that the two never drift apart.
func TestREADMEShowsTheArchitecture(t *testing.T) {
	diagram := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, rest, ok := strings.Cut(string(b), "```mermaid\n")
		block, _, closed := strings.Cut(rest, "```")
		if !ok || !closed {
			t.Fatalf("%s has no Mermaid block", path)
		}
		return block
	}
	if readme, arch := diagram("../README.md"), diagram("architecture.md"); readme != arch {
		t.Errorf("the README's diagram is not docs/architecture.md's:\n%s\nwant\n%s", readme, arch)
	}
}

// TestKubernetesListsEveryRefusal: docs/kubernetes.md shows each refusal of
// the admission webhook with its message, as the webhook's tests pin them.
func TestKubernetesListsEveryRefusal(t *testing.T) {
	doc, err := os.ReadFile("kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../kube/admission/testdata/refusals.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var refusals []struct{ Name, Denied string }
	if err := yaml.Unmarshal(b, &refusals); err != nil {
		t.Fatal(err)
	}
	if len(refusals) == 0 {
		t.Fatal("kube/admission/testdata/refusals.yaml lists no refusal")
	}
	for _, r := range refusals {
		if !strings.Contains(string(doc), "`"+r.Denied+"`") {
			t.Errorf("docs/kubernetes.md does not show the refusal %q: `%s`", r.Name, r.Denied)
		}
	}
}
