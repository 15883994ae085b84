package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// envUsers reach the clock, timers and randomness only through an
// env.Env (DESIGN §3: one environment, so the simulator can run them).
var envUsers = []string{
	"github.com/nereus-broker/nereus/internal/node",
	"github.com/nereus-broker/nereus/internal/replog",
}

// wallClock are the package time functions that read the wall clock or
// start real timers; time.Duration and the constants stay allowed.
var wallClock = []string{"Now", "Since", "Until", "After", "AfterFunc", "NewTimer", "NewTicker", "Tick", "Sleep"}

var globalRandomness = []string{"math/rand", "math/rand/v2"}

// pendingEnvAllowlist lists violations known and scheduled to go: "file
// (relative to the module root): enclosing function: offending use".
// Each entry must still match a violation (a fixed one must be removed).
var pendingEnvAllowlist = []string{}

// envViolation is one use of the wall clock or global randomness.
type envViolation struct {
	pos  token.Position
	fn   string // enclosing function ("" at package level)
	what string // "time.Now", `import "math/rand"`
}

func (v envViolation) key(root string) string {
	rel, err := filepath.Rel(root, v.pos.Filename)
	if err != nil {
		rel = v.pos.Filename
	}
	return fmt.Sprintf("%s: %s: %s", filepath.ToSlash(rel), v.fn, v.what)
}

func TestEnvUsersUseNoWallClockNorGlobalRandomness(t *testing.T) {
	root := moduleRoot(t)
	allowed := map[string]bool{}
	for _, a := range pendingEnvAllowlist {
		allowed[a] = false
	}
	fset := token.NewFileSet()
	for _, pkg := range envUsers {
		for _, file := range goFiles(t, pkg) {
			f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range envViolations(fset, f) {
				key := v.key(root)
				if _, ok := allowed[key]; ok {
					allowed[key] = true
					continue
				}
				where := ""
				if v.fn != "" {
					where = " in " + v.fn
				}
				t.Errorf("%s: %s%s: reach the clock, timers and randomness through an env.Env", v.pos, v.what, where)
			}
		}
	}
	for _, a := range pendingEnvAllowlist {
		if !allowed[a] {
			t.Errorf("pendingEnvAllowlist entry %q matches nothing any more: remove it", a)
		}
	}
}

// TestEnvViolationsFindsEveryForm proves the checker on a file with each
// kind of violation, including a renamed import.
func TestEnvViolationsFindsEveryForm(t *testing.T) {
	src := `package p

import (
	clock "time"
	"math/rand/v2"
)

var start = clock.Now()

func (s *server) loop(d clock.Duration) {
	t := clock.NewTicker(d)
	defer t.Stop()
	f := clock.AfterFunc // a reference counts as much as a call
	_ = f
	_ = rand.Int()
	var since = clock.Duration(5) * clock.Millisecond // allowed
	_ = since
}

func sleepy() { clock.Sleep(clock.Second) }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range envViolations(fset, f) {
		got = append(got, fmt.Sprintf("%d %s %s", v.pos.Line, v.fn, v.what))
	}
	want := []string{
		`5  import "math/rand/v2"`,
		"8  time.Now",
		"11 (*server).loop time.NewTicker",
		"13 (*server).loop time.AfterFunc",
		"20 sleepy time.Sleep",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// envViolations lists f's imports of global randomness and its uses of the
// package time functions in wallClock, under whatever name f imports time.
func envViolations(fset *token.FileSet, f *ast.File) []envViolation {
	var out []envViolation
	timeNames := map[string]bool{}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if slices.Contains(globalRandomness, p) {
			out = append(out, envViolation{pos: fset.Position(imp.Pos()), what: fmt.Sprintf("import %q", p)})
		}
		if p == "time" {
			name := "time"
			if imp.Name != nil {
				name = imp.Name.Name
			}
			timeNames[name] = true
		}
	}
	inspect := func(fn string, n ast.Node) {
		ast.Inspect(n, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && timeNames[id.Name] && slices.Contains(wallClock, sel.Sel.Name) {
				out = append(out, envViolation{pos: fset.Position(sel.Pos()), fn: fn, what: "time." + sel.Sel.Name})
			}
			return true
		})
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			inspect(funcName(fd), fd)
		} else {
			inspect("", d)
		}
	}
	return out
}

// funcName is "F" for a function and "T.M" or "(*T).M" for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	recv := fd.Recv.List[0].Type
	if idx, ok := recv.(*ast.IndexExpr); ok { // generic receiver
		recv = idx.X
	}
	switch r := recv.(type) {
	case *ast.StarExpr:
		x := r.X
		if idx, ok := x.(*ast.IndexExpr); ok {
			x = idx.X
		}
		if id, ok := x.(*ast.Ident); ok {
			return "(*" + id.Name + ")." + fd.Name.Name
		}
	case *ast.Ident:
		return r.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// goFiles lists the absolute paths of pkg's non-test Go files for this
// platform.
func goFiles(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}} {{end}}`, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}
