package layering

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/quiverstorage/quiver/"

// pkg is what `go list -deps -json` says of one package.
type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
	Module     *struct{ Path string }
}

// listPackages runs `go list -deps -json` over the module and returns its
// own packages (tests excluded: they may import test support freely).
func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json", "github.com/quiverstorage/quiver/...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		if strings.HasPrefix(p.ImportPath, module) {
			pkgs[p.ImportPath] = p
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	return pkgs
}

var ruleLine = regexp.MustCompile(`(?s)Imports from quiver: ([^.]*)\.`)

// statedRule reads the "Imports from quiver: a, b." sentence of the package
// comment, as short names (the path below internal/ or cmd/).
func statedRule(t *testing.T, p pkg) ([]string, bool) {
	t.Helper()
	fset := token.NewFileSet()
	for _, f := range p.GoFiles {
		file, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		if file.Doc == nil {
			continue
		}
		all := ruleLine.FindAllStringSubmatch(file.Doc.Text(), -1)
		if all == nil {
			continue
		}
		m := all[len(all)-1] // the rule closes the comment; earlier mentions are prose
		list := strings.TrimSpace(strings.Join(strings.Fields(m[1]), " "))
		if list == "nothing" {
			return nil, true
		}
		var names []string
		for _, n := range strings.Split(list, ",") {
			names = append(names, strings.TrimSpace(n))
		}
		return names, true
	}
	return nil, false
}

func short(path string) string {
	s := strings.TrimPrefix(path, module)
	return strings.TrimPrefix(s, "internal/")
}

// TestStatedImportRules checks every package of the module against the rule
// in its package comment: each quiver package it imports, directly or
// through others (go list -deps), must be one it names or one of theirs.
func TestStatedImportRules(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go tool is needed to list packages")
	}
	pkgs := listPackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d quiver packages", len(pkgs))
	}
	rules := map[string][]string{}
	for path, p := range pkgs {
		if slices.Equal(p.GoFiles, []string{"doc.go"}) && strings.HasPrefix(short(path), "test/") {
			continue // a test suite: its code is all in _test.go files
		}
		names, ok := statedRule(t, p)
		if !ok {
			t.Errorf("%s: the package comment states no import rule (\"Imports from quiver: a, b.\" or \"nothing.\")", short(path))
			continue
		}
		rules[path] = names
	}
	for path, names := range rules {
		allowed := map[string]bool{}
		for _, n := range names {
			allowed[n] = true
			dep, ok := pkgs[module+"internal/"+n]
			if !ok {
				dep, ok = pkgs[module+n]
			}
			if !ok {
				t.Errorf("%s: the rule names %q, which is not a quiver package", short(path), n)
				continue
			}
			for _, d := range dep.Deps {
				if strings.HasPrefix(d, module) {
					allowed[short(d)] = true
				}
			}
		}
		var direct, bad []string
		for _, imp := range pkgs[path].Imports {
			if strings.HasPrefix(imp, module) {
				direct = append(direct, short(imp))
			}
		}
		for _, d := range pkgs[path].Deps {
			if strings.HasPrefix(d, module) && !allowed[short(d)] {
				bad = append(bad, short(d))
			}
		}
		sort.Strings(bad)
		if len(bad) > 0 {
			t.Errorf("%s states it imports %v but depends on %v", short(path), names, bad)
		}
		// A rule that names a package the code no longer imports is stale too.
		for _, n := range names {
			if !slices.Contains(direct, n) {
				t.Errorf("%s: the rule names %q, which it does not import: update its package comment", short(path), n)
			}
		}
	}
}
