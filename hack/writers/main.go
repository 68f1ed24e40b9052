// Command writers lists, for each field of the named struct types of one package, the
// non-test files that write it: an assignment, an increment, or a call of an atomic's or a
// sync type's mutating method (Store, Add, Swap, CompareAndSwap, Lock's fields aside). It
// counts what "one writer per field" asks of a package (docs/design.md section 7).
//
//	go run ./hack/writers ./internal/watch feed sharedFeed member
package main

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: writers DIR TYPE...")
		os.Exit(2)
	}
	dir, names := os.Args[1], os.Args[2:]
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var files []*ast.File
	for _, e := range entries {
		if n := e.Name(); !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		files = append(files, f)
	}
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", nil), Error: func(error) {}}
	pkg, _ := conf.Check(dir, fset, files, info)
	want := map[*types.Struct]string{}
	for _, n := range names {
		obj := pkg.Scope().Lookup(n)
		if obj == nil {
			fmt.Fprintf(os.Stderr, "no type %s in %s\n", n, dir)
			os.Exit(1)
		}
		if st, ok := obj.Type().Underlying().(*types.Struct); ok {
			want[st] = n
		}
	}
	writers := map[string]map[string]bool{} // "Type.field" -> files
	owner := func(sel *ast.SelectorExpr) string {
		s := info.Selections[sel]
		if s == nil || s.Kind() != types.FieldVal {
			return ""
		}
		t := s.Recv()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		st, ok := t.Underlying().(*types.Struct)
		if !ok || len(s.Index()) != 1 {
			return ""
		}
		n, ok := want[st]
		if !ok {
			return ""
		}
		return n + "." + sel.Sel.Name
	}
	note := func(e ast.Expr, file string) {
		for {
			switch x := e.(type) {
			case *ast.IndexExpr:
				e = x.X
				continue
			case *ast.StarExpr:
				e = x.X
				continue
			case *ast.ParenExpr:
				e = x.X
				continue
			}
			break
		}
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return
		}
		if k := owner(sel); k != "" {
			if writers[k] == nil {
				writers[k] = map[string]bool{}
			}
			writers[k][file] = true
		}
	}
	mutating := map[string]bool{"Store": true, "Add": true, "Swap": true, "CompareAndSwap": true, "Set": true, "Reset": true, "Stop": true}
	for _, f := range files {
		file := filepath.Base(fset.Position(f.Pos()).Filename)
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.AssignStmt:
				if x.Tok != token.DEFINE {
					for _, l := range x.Lhs {
						note(l, file)
					}
				}
			case *ast.IncDecStmt:
				note(x.X, file)
			case *ast.CallExpr:
				if m, ok := x.Fun.(*ast.SelectorExpr); ok && mutating[m.Sel.Name] {
					note(m.X, file)
				}
				if id, ok := x.Fun.(*ast.Ident); ok && (id.Name == "delete" || id.Name == "clear") && len(x.Args) > 0 {
					note(x.Args[0], file)
				}
			}
			return true
		})
	}
	for st, n := range want {
		multi, total := 0, 0
		var lines []string
		for i := 0; i < st.NumFields(); i++ {
			k := n + "." + st.Field(i).Name()
			var fs []string
			for f := range writers[k] {
				fs = append(fs, f)
			}
			sort.Strings(fs)
			total++
			if len(fs) > 1 {
				multi++
			}
			lines = append(lines, fmt.Sprintf("  %-32s %s", st.Field(i).Name(), strings.Join(fs, " ")))
		}
		fmt.Printf("%s: %d fields, %d written from more than one file\n%s\n", n, total, multi, strings.Join(lines, "\n"))
	}
}
