package luaop_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function may be outside tests, bench/ and
// third_party/, from its func keyword to its closing brace.
const maxFuncLines = 100

// longFunctionsAllowed are the functions over maxFuncLines that may stay for now, as
// "path Receiver.Name" (or "path Name"). The list must end empty: an entry that is
// no longer over the limit fails the test too, so that it is removed.
var longFunctionsAllowed = map[string]string{}

// docMissingAllowed are the packages that may lack a doc.go for now. The list must
// end empty, like longFunctionsAllowed.
var docMissingAllowed = map[string]string{}

// goDirs are the folders of the module holding Go files (its packages, tests-only
// ones included), relative and slash-separated, "." for the root; third_party/,
// testdata, hidden folders and nested modules (tools/) are not the module's own.
func goDirs(t *testing.T) map[string][]string {
	t.Helper()
	dirs := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (name == "third_party" || name == "testdata" || name == "vendor" ||
				strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if path != "." {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // a module of its own
				}
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			dir := filepath.ToSlash(filepath.Dir(path))
			dirs[dir] = append(dirs[dir], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// Every package has a doc.go with the package comment.
func TestEveryPackageHasADocGo(t *testing.T) {
	for dir := range goDirs(t) {
		doc := filepath.Join(dir, "doc.go")
		f, err := parser.ParseFile(token.NewFileSet(), doc, nil, parser.ParseComments|parser.PackageClauseOnly)
		switch {
		case os.IsNotExist(err) && docMissingAllowed[dir] != "":
		case os.IsNotExist(err):
			t.Errorf("%s has no doc.go: write one whose package comment says what the package owns and what it must not call", dir)
		case err != nil:
			t.Errorf("%s: %v", doc, err)
		case f.Doc == nil:
			t.Errorf("%s has no package comment", doc)
		case docMissingAllowed[dir] != "":
			t.Errorf("%s has its doc.go now: remove it from docMissingAllowed", dir)
		default:
			text := f.Doc.Text()
			if !strings.HasPrefix(text, "Package "+f.Name.Name+" ") && !strings.HasPrefix(text, "Command ") {
				t.Errorf("%s: the package comment starts %q; want \"Package %s ...\" (or \"Command ...\" for a main package)", doc, firstLine(text), f.Name.Name)
			}
		}
	}
	for dir := range docMissingAllowed {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("docMissingAllowed names %s, which is not a folder of the module: remove it", dir)
		}
	}
}

// No function outside tests, bench/ and third_party/ is over maxFuncLines lines.
func TestNoFunctionIsOverAHundredLines(t *testing.T) {
	long := map[string]int{}
	fset := token.NewFileSet()
	for dir, files := range goDirs(t) {
		if dir == "bench" || strings.HasPrefix(dir, "bench/") {
			continue
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
					long[filepath.ToSlash(path)+" "+funcName(fd)] = n
				}
			}
		}
	}
	var problems []string
	for name, n := range long {
		if longFunctionsAllowed[name] == "" {
			problems = append(problems, fmt.Sprintf("%s is %d lines, over %d: split it into named steps", name, n, maxFuncLines))
		}
	}
	for name := range longFunctionsAllowed {
		if _, ok := long[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s is no longer over %d lines (or is gone): remove it from longFunctionsAllowed", name, maxFuncLines))
		}
	}
	slices.Sort(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// funcName is Name, or Receiver.Name for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	switch r := typ.(type) {
	case *ast.IndexExpr: // a generic receiver, T[P]
		typ = r.X
	case *ast.IndexListExpr:
		typ = r.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// Every test or benchmark that third_party/gopher-lua/README.md's patch table names
// as failing without a patch exists, so that the table keeps saying what guards
// each patch (two rows once named tests that were never written).
func TestGopherLuaPatchTableNamesRealTests(t *testing.T) {
	table, err := os.ReadFile("third_party/gopher-lua/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var sources strings.Builder
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		text, err := os.ReadFile(path)
		sources.Write(text)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexpTestName.FindAllString(string(table), -1)
	if len(named) == 0 {
		t.Fatal("the patch table names no test")
	}
	for _, name := range named {
		if !strings.Contains(sources.String(), "func "+name+"(") {
			t.Errorf("third_party/gopher-lua/README.md names %s, which no _test.go file defines: name the test that guards the patch", name)
		}
	}
}

var regexpTestName = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*`)
