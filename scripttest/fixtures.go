package scripttest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/luaop/luaop/yaml12"
)

// Test files are YAML 1.2 (yaml12: `n:` and `NO` stay strings, 014 is 14). Every key
// of the format is checked where it is written, so that a misspelled one is reported
// with its file:line and the keys allowed there, instead of failing the whole file
// without a line.

// keysOf are the keys of a struct of the format: its fields' JSON names.
func keysOf(v any) []string {
	t := reflect.TypeOf(v)
	var keys []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	slices.Sort(keys)
	return keys
}

var (
	fileKeys   = keysOf(File{})
	caseKeys   = keysOf(Case{})
	expectKeys = keysOf(Expect{})
	errorKeys  = keysOf(ExpectError{})
)

// located is a case of a file and the line it starts at.
type located struct {
	Case
	Line  int
	Index int // in the file, from 0
}

// decodeFile reads a test file: its cases, each with its line.
func decodeFile(path string, data []byte) ([]located, error) {
	root, err := yaml12.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if root == nil {
		return nil, nil
	}
	at := func(n *yaml12.Node, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", path, n.Line, fmt.Sprintf(format, args...))
	}
	if root.Kind != mappingKind {
		return nil, at(root, "a test file is a mapping with the key cases: (a list of cases)")
	}
	if err := checkKeys(root, fileKeys, "a test file", at); err != nil {
		return nil, err
	}
	fileCRDs, err := decodeFileCRDs(root, at)
	if err != nil {
		return nil, err
	}
	cases := field(root, "cases")
	if cases == nil {
		return nil, nil
	}
	if cases.Kind != sequenceKind {
		return nil, at(cases, "cases: must be a list of cases (- name: ...)")
	}
	var out []located
	var errs []error
	for i, cn := range cases.Content {
		if cn.Kind != mappingKind {
			errs = append(errs, at(cn, "case %d: a case is a mapping (name:, handler: or cause:, object:, expect:)", i+1))
			continue
		}
		if err := checkCase(cn, at); err != nil {
			errs = append(errs, err)
			continue
		}
		v, err := yaml12.Value(cn, yaml12.DefaultMaxValues)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%w", path, err))
			continue
		}
		raw, err := json.Marshal(v)
		if err != nil {
			errs = append(errs, at(cn, "case %d: %v", i+1, err))
			continue
		}
		var c Case
		if err := json.Unmarshal(raw, &c); err != nil {
			where := cn
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				if n := lookup(cn, strings.Split(te.Field, ".")); n != nil {
					where = n
				}
				err = fmt.Errorf("%s: %s where %s is expected", te.Field, describeYAMLValue(te.Value), te.Type)
			}
			errs = append(errs, at(where, "case %d: %v", i+1, err))
			continue
		}
		c.CRDs = append(slices.Clone(fileCRDs), c.CRDs...)
		out = append(out, located{Case: c, Line: cn.Line, Index: i})
	}
	return out, errors.Join(errs...)
}

// decodeFileCRDs reads the file-level crds: (a list of paths), which every case
// of the file serves.
func decodeFileCRDs(root *yaml12.Node, at func(*yaml12.Node, string, ...any) error) ([]string, error) {
	n := field(root, "crds")
	if n == nil {
		return nil, nil
	}
	wrong := at(n, "crds: must be a list of CustomResourceDefinition files (crds: [../crds/widgets.yaml])")
	if n.Kind != sequenceKind {
		return nil, wrong
	}
	var paths []string
	for _, p := range n.Content {
		if p.Kind != scalarKind {
			return nil, wrong
		}
		paths = append(paths, p.Value)
	}
	return paths, nil
}

func describeYAMLValue(v string) string {
	switch v {
	case "string":
		return "a string"
	case "number":
		return "a number"
	case "bool":
		return "a boolean"
	case "array":
		return "a list"
	case "object":
		return "a mapping"
	}
	return v
}

// checkCase checks the keys of a case, of its expect: and of expect.error:.
func checkCase(cn *yaml12.Node, at func(*yaml12.Node, string, ...any) error) error {
	if err := checkKeys(cn, caseKeys, "a case", at); err != nil {
		return err
	}
	if rel := field(cn, "related"); rel != nil && rel.Kind == sequenceKind {
		for _, item := range rel.Content {
			if item.Kind != mappingKind {
				return at(item, "related: each item is a mapping {type, object, old, resource}")
			}
			if err := checkKeys(item, relatedKeys, "related:", at); err != nil {
				return err
			}
		}
	}
	expect := field(cn, "expect")
	if expect == nil || expect.Kind != mappingKind {
		return nil
	}
	if err := checkKeys(expect, expectKeys, "expect:", at); err != nil {
		return err
	}
	if e := field(expect, "error"); e != nil && e.Kind == mappingKind {
		return checkKeys(e, errorKeys, "expect.error:", at)
	}
	return nil
}

// checkKeys reports the keys of a mapping that the format does not have there.
func checkKeys(m *yaml12.Node, known []string, where string, at func(*yaml12.Node, string, ...any) error) error {
	var errs []error
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		if !slices.Contains(known, k.Value) {
			errs = append(errs, at(k, "unknown key %q in %s; the keys of %s are %s", k.Value, where, where, strings.Join(known, ", ")))
		}
	}
	return errors.Join(errs...)
}

const (
	mappingKind  = yaml12.MappingNode
	sequenceKind = yaml12.SequenceNode
	scalarKind   = yaml12.ScalarNode
)

// field is the value of key in a mapping node, or nil.
func field(m *yaml12.Node, key string) *yaml12.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// lookup follows a dotted path of keys (and list indexes) from a node.
func lookup(n *yaml12.Node, path []string) *yaml12.Node {
	for _, p := range path {
		switch n.Kind {
		case mappingKind:
			n = field(n, p)
		case sequenceKind:
			var i int
			if _, err := fmt.Sscan(p, &i); err != nil || i < 0 || i >= len(n.Content) {
				return nil
			}
			n = n.Content[i]
		default:
			return nil
		}
		if n == nil {
			return nil
		}
	}
	return n
}

// CaseNames are the "FILE/NAME" of the cases of a test file's data, as --run
// matches them (file is the file's base name); nothing for a file that does not
// parse.
func CaseNames(file string, data []byte) []string {
	cases, _ := decodeFile(file, data)
	var names []string
	for _, c := range cases {
		names = append(names, file+"/"+caseName(c.Case, c.Index))
	}
	return names
}

func caseName(c Case, i int) string {
	if c.Name != "" {
		return c.Name
	}
	return fmt.Sprintf("case%d", i+1)
}
