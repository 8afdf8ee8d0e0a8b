package yaml12

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Node is a parsed YAML node (yaml.v3's), with its line and column.
type Node = yaml.Node

// DefaultMaxValues bounds the values one document may expand to (aliases repeat
// what they name: a few lines can otherwise stand for billions of values).
const DefaultMaxValues = 1 << 20

// Parse parses the first document of data (nil for an empty input).
func Parse(data []byte) (*Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], nil
	}
	return &doc, nil
}

// ParseAll parses every document of data.
func ParseAll(data []byte) ([]*Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []*Node
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
			out = append(out, doc.Content[0])
		} else {
			out = append(out, &doc)
		}
	}
}

// Unmarshal decodes the first document of data into JSON values, with the 1.2
// core schema. An empty document is nil.
func Unmarshal(data []byte) (any, error) {
	n, err := Parse(data)
	if err != nil || n == nil {
		return nil, err
	}
	return Value(n, DefaultMaxValues)
}

// Error is a problem of a YAML document at a line.
type Error struct {
	Line, Column int
	Message      string
}

func (e *Error) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Message) }

// Value converts a node into JSON values, expanding at most maxValues values.
func Value(n *Node, maxValues int) (any, error) {
	c := converter{budget: maxValues}
	return c.value(n, 0)
}

type converter struct{ budget int }

// maxDepth bounds nesting (and alias cycles).
const maxDepth = 10000

func (c *converter) value(n *Node, depth int) (any, error) {
	if depth > maxDepth {
		return nil, &Error{Line: n.Line, Column: n.Column, Message: "nested too deeply (or an alias of itself)"}
	}
	c.budget--
	if c.budget < 0 {
		return nil, &Error{Line: n.Line, Column: n.Column, Message: "the document expands to too many values (aliases repeating aliases?)"}
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return c.value(n.Content[0], depth+1)
	case yaml.AliasNode:
		return c.value(n.Alias, depth+1)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			v, err := c.value(e, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.Style == 0 && k.Tag != "!!str" {
				// A merge key (a 1.1 type most tools still apply): the keys of the
				// mapping (or mappings) it names, unless given here.
				if err := c.merge(out, v, n, depth); err != nil {
					return nil, err
				}
				continue
			}
			key, err := c.key(k, depth)
			if err != nil {
				return nil, err
			}
			val, err := c.value(v, depth+1)
			if err != nil {
				return nil, err
			}
			out[key] = val
		}
		return out, nil
	case yaml.ScalarNode:
		return Scalar(n)
	}
	return nil, &Error{Line: n.Line, Column: n.Column, Message: "unknown node"}
}

// merge applies a merge key's mappings to out, keys given explicitly winning.
func (c *converter) merge(out map[string]any, v, parent *Node, depth int) error {
	var sources []*Node
	switch r := resolveAlias(v); r.Kind {
	case yaml.MappingNode:
		sources = []*Node{r}
	case yaml.SequenceNode:
		sources = r.Content
	default:
		return &Error{Line: v.Line, Column: v.Column, Message: "a merge key (<<) takes a mapping or a list of mappings"}
	}
	explicit := map[string]bool{}
	for i := 0; i+1 < len(parent.Content); i += 2 {
		if k := parent.Content[i]; k.Kind == yaml.ScalarNode && k.Value != "<<" {
			explicit[k.Value] = true
		}
	}
	for _, s := range sources {
		m, err := c.value(s, depth+1)
		if err != nil {
			return err
		}
		mm, ok := m.(map[string]any)
		if !ok {
			return &Error{Line: s.Line, Column: s.Column, Message: "a merge key (<<) takes a mapping or a list of mappings"}
		}
		for k, val := range mm {
			if _, set := out[k]; !set && !explicit[k] {
				out[k] = val
			}
		}
	}
	return nil
}

func resolveAlias(n *Node) *Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// key is a mapping key as a string: a scalar's text as the 1.2 core schema
// resolves it (1 -> "1", true -> "true", null -> "null"), as JSON needs strings.
func (c *converter) key(k *Node, depth int) (string, error) {
	k = resolveAlias(k)
	if k.Kind != yaml.ScalarNode {
		return "", &Error{Line: k.Line, Column: k.Column, Message: "a mapping key must be a scalar (a string, a number, a boolean)"}
	}
	v, err := Scalar(k)
	if err != nil {
		return "", err
	}
	switch x := v.(type) {
	case nil:
		return "null", nil
	case string:
		return x, nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	default:
		return fmt.Sprint(x), nil
	}
}

var (
	intDecimal = regexp.MustCompile(`^[-+]?[0-9]+$`)
	intOctal   = regexp.MustCompile(`^0o[0-7]+$`)
	intHex     = regexp.MustCompile(`^0x[0-9a-fA-F]+$`)
	floatNum   = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)
	floatInf   = regexp.MustCompile(`^[-+]?(\.inf|\.Inf|\.INF)$`)
	floatNaN   = regexp.MustCompile(`^(\.nan|\.NaN|\.NAN)$`)
)

// Scalar resolves a scalar node: a quoted or block scalar is a string; a plain one
// is resolved by the YAML 1.2 core schema (null, true/false in three spellings,
// decimal, 0o octal and 0x hexadecimal integers, floats, .inf, .nan), else a
// string. An explicit tag (!!str, !!int, !!float, !!bool, !!null) is honoured.
func Scalar(n *Node) (any, error) {
	tag := ""
	if n.Style&yaml.TaggedStyle != 0 || (n.Tag != "" && n.Tag != "!" && !strings.HasPrefix(n.Tag, "!!")) {
		tag = n.ShortTag()
	}
	plain := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0
	bad := func(what string) error {
		return &Error{Line: n.Line, Column: n.Column, Message: fmt.Sprintf("%q is not %s", n.Value, what)}
	}
	switch tag {
	case "!!str", "!!binary", "!!timestamp":
		return n.Value, nil
	case "!!null":
		return nil, nil
	case "!!bool":
		if b, ok := coreBool(n.Value); ok {
			return b, nil
		}
		return nil, bad("a boolean (true or false)")
	case "!!int":
		if v, ok := coreInt(n.Value); ok {
			return v, nil
		}
		return nil, bad("an integer")
	case "!!float":
		if v, ok := coreInt(n.Value); ok {
			return toFloat(v), nil
		}
		if f, ok := coreFloat(n.Value); ok {
			return f, nil
		}
		return nil, bad("a number")
	}
	if !plain {
		return n.Value, nil
	}
	return Resolve(n.Value), nil
}

// Resolve resolves the text of a plain scalar by the YAML 1.2 core schema.
func Resolve(s string) any {
	switch s {
	case "", "~", "null", "Null", "NULL":
		return nil
	}
	if b, ok := coreBool(s); ok {
		return b
	}
	if v, ok := coreInt(s); ok {
		return v
	}
	if f, ok := coreFloat(s); ok {
		return f
	}
	return s
}

func coreBool(s string) (bool, bool) {
	switch s {
	case "true", "True", "TRUE":
		return true, true
	case "false", "False", "FALSE":
		return false, true
	}
	return false, false
}

// coreInt is an int64, or a float64 for an integer beyond int64 (as JSON).
func coreInt(s string) (any, bool) {
	var base int
	digits := s
	switch {
	case intDecimal.MatchString(s):
		base = 10
	case intOctal.MatchString(s):
		base, digits = 8, s[2:]
	case intHex.MatchString(s):
		base, digits = 16, s[2:]
	default:
		return nil, false
	}
	if v, err := strconv.ParseInt(digits, base, 64); err == nil {
		return v, true
	}
	if base == 10 {
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	}
	u, err := strconv.ParseUint(digits, base, 64)
	return float64(u), err == nil
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case float64:
		return x
	}
	return 0
}

func coreFloat(s string) (float64, bool) {
	switch {
	case floatNum.MatchString(s):
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	case floatInf.MatchString(s):
		if strings.HasPrefix(s, "-") {
			return math.Inf(-1), true
		}
		return math.Inf(1), true
	case floatNaN.MatchString(s):
		return math.NaN(), true
	}
	return 0, false
}

// The kinds of nodes.
const (
	DocumentNode = yaml.DocumentNode
	SequenceNode = yaml.SequenceNode
	MappingNode  = yaml.MappingNode
	ScalarNode   = yaml.ScalarNode
	AliasNode    = yaml.AliasNode
)
