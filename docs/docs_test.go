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
	root, files := trackedFiles(t, "*.md")
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

// TestTheDiagramHasOneSource: the architecture diagram lives in
// docs/architecture.md alone, so that no copy drifts from it. No other
// tracked Markdown file holds most of its lines, and the README links to
// it instead.
func TestTheDiagramHasOneSource(t *testing.T) {
	arch, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(arch), "```mermaid\n")
	block, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("docs/architecture.md has no Mermaid block")
	}
	root, files := trackedFiles(t, "*.md")
	for _, name := range files {
		if name == "docs/architecture.md" || strings.HasPrefix(name, "tools/") {
			continue
		}
		text, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if copiesDiagram(string(text), block) {
			t.Errorf("%s copies docs/architecture.md's diagram: link to it instead", name)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "](docs/architecture.md)") {
		t.Error("README.md does not link to docs/architecture.md, where the diagram is")
	}
}

// copiesDiagram tells whether text holds more than half of diagram's
// lines that say something (edges, nodes), so that a copy is found
// even after it has drifted a little.
func copiesDiagram(text, diagram string) bool {
	have := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		have[strings.TrimSpace(line)] = true
	}
	lines, found := 0, 0
	for _, line := range strings.Split(diagram, "\n") {
		line = strings.TrimSpace(line)
		if len(line) < 10 || line == "end" {
			continue
		}
		lines++
		if have[line] {
			found++
		}
	}
	return lines > 0 && 2*found > lines
}

func TestCopiesDiagram(t *testing.T) {
	diagram := "flowchart LR\n  user([kubectl apply])\n  user -->|1 create| api\n  api -->|2 AdmissionReview| webhook\n  end\n"
	for _, tc := range []struct {
		text string
		want bool
	}{
		{"see [the picture](docs/architecture.md)", false},
		{"```mermaid\n" + diagram + "```\n", true},
		{"```mermaid\nflowchart LR\n  user([kubectl apply])\n  user -->|1 create| api\n  api -->|2 review| webhook\n```\n", true},
		{"flowchart LR, as a word in prose", false},
	} {
		if got := copiesDiagram(tc.text, diagram); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.text, got, tc.want)
		}
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

var (
	// codeSpan is a Markdown code span.
	codeSpan = regexp.MustCompile("`([^`]+)`")
	// flagDefinition is a flag registered through the standard library's
	// flag or spf13/pflag, on a FlagSet or the package:
	// fs.StringVar(&o.Listen, "listen", ...), fs.Duration("duration", ...),
	// fs.StringP("namespace", "n", ...).
	flagDefinition = regexp.MustCompile(`\.(?:Bool|BoolFunc|Duration|Float64|Func|Int|Int64|String|StringArray|StringSlice|StringToString|Text|Uint|Uint64|Var)(?:Var)?P?\(\s*(?:[^,"()]+,\s*)?"([a-z0-9][a-z0-9.-]*)"`)
	// headingMark is what starts a Markdown heading.
	headingMark = regexp.MustCompile(`^#{1,6} `)
	// anchorDropped is what GitHub leaves out of a heading's anchor.
	anchorDropped = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// TestDesignNamesExist: docs/design.md records why the code is as it is,
// so every name it cites must still be there. A repository path in a
// code span (`kube/scheduler`, `allocator/service/idle.go`) must be
// tracked; a flag in a code span of its own (`--keda-scaler-listen`,
// `--backend=direct`) must be defined by some flag.FlagSet or pflag call
// in the Go sources; a relative link must reach a file, and its #anchor a
// heading there. Another program's flag is written with the program
// (`kube-proxy --cleanup`), which this test leaves alone.
func TestDesignNamesExist(t *testing.T) {
	root, files := trackedFiles(t)
	tracked := trackedPaths(files)
	flags := map[string]bool{}
	for _, name := range files {
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagDefinition.FindAllStringSubmatch(string(src), -1) {
			flags[m[1]] = true
		}
	}
	if !flags["keda-scaler-listen"] {
		t.Fatal("no flag definition found for --keda-scaler-listen: flagDefinition no longer matches how flags are defined")
	}
	design, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, problem := range designProblems(root, "docs/design.md", string(design), tracked, flags) {
		t.Errorf("docs/design.md: %s", problem)
	}
}

// trackedPaths is every tracked file and every folder above one.
func trackedPaths(files []string) map[string]bool {
	paths := map[string]bool{}
	for _, f := range files {
		for p := f; p != "." && p != "/" && !paths[p]; p = filepath.Dir(p) {
			paths[p] = true
		}
	}
	return paths
}

// designProblems lists the names in the Markdown file name (relative to
// root) that are gone: repository paths not in tracked, flags not in
// flags, links to missing files or headings.
func designProblems(root, name, text string, tracked, flags map[string]bool) []string {
	// Fenced blocks are examples, not citations: blank them, keeping
	// the line numbers.
	lines := strings.Split(text, "\n")
	fence := false
	for i, line := range lines {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			lines[i] = ""
		} else if fence {
			lines[i] = ""
		}
	}
	body := strings.Join(lines, "\n")
	var problems []string
	// A code span may wrap onto the next line.
	for _, m := range codeSpan.FindAllStringSubmatchIndex(body, -1) {
		s := strings.Join(strings.Fields(body[m[2]:m[3]]), " ")
		i := strings.Count(body[:m[0]], "\n")
		switch {
		case strings.HasPrefix(s, "--"):
			flag, _, _ := strings.Cut(strings.TrimPrefix(s, "--"), "=")
			flag, _, _ = strings.Cut(flag, " ")
			if !flags[flag] {
				problems = append(problems, lineProblem(i, "names a flag no Go source defines: "+s))
			}
		case isRepositoryPath(s, tracked) && !tracked[strings.TrimSuffix(s, "/")]:
			problems = append(problems, lineProblem(i, "names a path the repository does not have: "+s))
		}
	}
	for i, line := range lines {
		for _, link := range relativeLink.FindAllStringSubmatch(line, -1) {
			target := filepath.Join(root, filepath.Dir(name), link[1])
			if _, err := os.Stat(target); err != nil {
				problems = append(problems, lineProblem(i, "links to a missing file: "+link[1]))
				continue
			}
			if anchor := strings.TrimPrefix(link[2], "#"); anchor != "" && strings.HasSuffix(target, ".md") {
				b, err := os.ReadFile(target)
				if err != nil || !headingAnchors(string(b))[anchor] {
					problems = append(problems, lineProblem(i, "links to a heading "+link[1]+" does not have: #"+anchor))
				}
			}
		}
	}
	return problems
}

// isRepositoryPath tells a code span that names a path of this
// repository (`kube/scheduler`, `simulate/`, `.ci/run`) from one that
// names something else (`k8s.io/api`, `/proc/<pid>/fd`, `gpupool/gpupool`,
// the image): no spaces or placeholders, a slash, and a first element
// that is one of the repository's top-level folders.
func isRepositoryPath(s string, tracked map[string]bool) bool {
	if strings.ContainsAny(s, " <>*{}$=:@") || !strings.Contains(s, "/") || strings.HasPrefix(s, "/") {
		return false
	}
	first, _, _ := strings.Cut(s, "/")
	return tracked[first]
}

// headingAnchors is the set of #anchors GitHub gives the headings of a
// Markdown text: lower case, punctuation dropped, spaces as hyphens, a
// repeated anchor numbered.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !headingMark.MatchString(line) {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ReplaceAll(anchorDropped.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

func TestDesignProblems(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "docs", "measurements"), 0o700); err != nil {
		t.Fatal(err)
	}
	run := "# Runs\n\n## 2026-11-28: the pool's pods, at 40 pods/s\n"
	if err := os.WriteFile(filepath.Join(root, "docs", "measurements", "runs.md"), []byte(run), 0o600); err != nil {
		t.Fatal(err)
	}
	tracked := trackedPaths([]string{"kube/scheduler/plugin.go", "docs/measurements/runs.md", ".ci/run", "main.go"})
	flags := map[string]bool{"listen": true, "backend": true}
	for _, tc := range []struct {
		text string
		want int
	}{
		{"`kube/scheduler` and `kube/scheduler/plugin.go`, `kube/` and `.ci/run`", 0},
		{"`kube/schedular`", 1},
		{"`kube/scheduler/extender.go`", 1},
		{"`k8s.io/kube-scheduler/extender/v1`, `/proc/<pid>/fd`, `cmd/<binary>/app`, `gpupool/gpupool`", 0},
		{"`--listen`, `--backend=direct`, `--listen 127.0.0.1:0`", 0},
		{"`--listne`", 1},
		{"`kube-proxy --cleanup`", 0},
		{"a span that wraps, `gpupool\n  run`, then `kube/schedular`", 1},
		{"[runs](measurements/runs.md#2026-11-28-the-pools-pods-at-40-podss)", 0},
		{"[runs](measurements/runs.md#2026-11-27-the-pools-pods)", 1},
		{"[gone](measurements/gone.md)", 1},
		{"```sh\n`kube/schedular`\n```", 0},
	} {
		if got := designProblems(root, "docs/design.md", tc.text, tracked, flags); len(got) != tc.want {
			t.Errorf("%q: %d problems %q, want %d", tc.text, len(got), got, tc.want)
		}
	}
}

// TestDesignStaysDecisions: docs/design.md holds decisions, one short
// section each, not the runs behind them (those go to measurements/): at
// most 600 lines in all, none of its sections over 40.
func TestDesignStaysDecisions(t *testing.T) {
	const maxLines, maxSection = 600, 40
	b, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > maxLines {
		t.Errorf("design.md has %d lines, over %d: move runs and tables to measurements/", len(lines), maxLines)
	}
	heading, start := "", 0
	check := func(end int) {
		if heading != "" && end-start > maxSection {
			t.Errorf("design.md line %d: %q is %d lines, over %d: one decision, its number, a link to the run", start+1, heading, end-start, maxSection)
		}
	}
	for i, line := range lines {
		if headingMark.MatchString(line) {
			check(i)
			heading, start = line, i
		}
	}
	check(len(lines))
}

// trackedFiles returns the repository's root and the files git tracks
// there that match patterns (all when none), and skips the test outside a
// git checkout.
func trackedFiles(t *testing.T, patterns ...string) (root string, files []string) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", append([]string{"-C", root, "ls-files", "--"}, patterns...)...).Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	return root, strings.Fields(string(out))
}
