package luavalue

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"unicode/utf8"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
)

// The one bounded path from a Lua value to Go (issue 46).
//
// Every conversion of a Lua value into Go bytes or values goes through a Budget:
// results and ctx.patch (FromLua), luaop.json.encode (EncodeJSON), print and
// ctx.logger's messages (Join) and fields (FromLua against the same Budget),
// tostring and string.format's %s (Text), error values and other messages that are
// cut rather than refused (Describe, Cut), metrics labels and Events (Text). A
// Budget counts, as it goes, the values it reached (each time it reached them: a
// table referenced from several places counts once per place) and their size as JSON
// (strings with their escapes), and stops at the first limit, before building what
// is over it; tables being visited are remembered, so a cycle is an error naming
// where it closes ("cycle at ctx.patch.x: ..."); nesting deeper than maxDepth is an
// error too. The Go entry points raise these errors in Lua, so the script sees them
// at its own line.

// Limits bound what a Budget may convert. A table referenced from several places
// is converted (and counted) once per place: 41 tables each holding the previous one
// twice are 2^40 values, so the conversion counts as it goes and stops at the limit
// rather than at the end of the operator's memory.
type Limits struct {
	// MaxValues bounds the values (tables, strings, numbers, booleans, nulls).
	// Default DefaultMaxValues.
	MaxValues int
	// MaxBytes bounds the size of the value as JSON: strings and keys with their
	// quotes and escapes, numbers as written, each separator; a value counts every
	// time it is reached. Text and Join count the bytes of the text. Default
	// DefaultMaxBytes.
	MaxBytes int
	// Why, when given, explains MaxBytes in the error ("the API server stores at
	// most 1.5 MiB in an object").
	Why string
	// Root names the value converted in errors' paths: with "ctx.patch", a cycle is
	// "cycle at ctx.patch.x"; without, paths are relative ("spec.items[3]").
	Root string
	// Vivified is the metatable of tables made on first read (ctx.patch's
	// auto-vivified tables): such a table that converts to an empty object is left
	// out of its parent object, as if it had never been read.
	Vivified *lua.LTable
}

const (
	// DefaultMaxValues is 2^20 values: about a hundred MB of Go values, far more
	// than any Kubernetes object (etcd takes 1.5 MiB).
	DefaultMaxValues = 1 << 20
	// DefaultMaxBytes is 16 MiB, the strings' own bound (sandbox MaxStringSize).
	DefaultMaxBytes = 16 << 20
)

// ErrTooLarge is wrapped by the error of a conversion that passed its Limits.
var ErrTooLarge = errors.New("value too large")

// Budget is one set of Limits shared by the conversions of one call or one value
// built in parts (an index function's entries, a log message and its fields).
type Budget struct{ count *counter }

// NewBudget starts a Budget of limits (zero fields: the defaults).
func NewBudget(limits Limits) *Budget {
	if limits.MaxValues <= 0 {
		limits.MaxValues = DefaultMaxValues
	}
	if limits.MaxBytes <= 0 {
		limits.MaxBytes = DefaultMaxBytes
	}
	return &Budget{count: &counter{limits: limits}}
}

// FromLua converts a Lua value into a Go JSON value (a deep copy), within the default
// Limits. Errors name the path of the offending value, e.g. `spec.items[3]: cannot
// convert a function to JSON`.
func FromLua(lv lua.LValue) (any, error) {
	return FromLuaLimited(lv, Limits{})
}

// FromLuaLimited is FromLua within limits (zero fields: the defaults).
func FromLuaLimited(lv lua.LValue, limits Limits) (any, error) {
	return NewBudget(limits).FromLua(lv)
}

// FromLua is FromLua counting against the budget what earlier conversions left.
func (b *Budget) FromLua(lv lua.LValue) (any, error) {
	w := walker{count: b.count, root: b.count.limits.Root, vivified: b.count.limits.Vivified}
	return w.from(lv, 0)
}

// Used is what the budget counted so far: values and bytes.
func (b *Budget) Used() (values, bytes int) { return b.count.values, b.count.bytes }

// EncodeJSON encodes lv as JSON (luaop.json.encode): its size is counted while it
// is converted (FromLua), so nothing over MaxBytes is ever built.
func (b *Budget) EncodeJSON(lv lua.LValue) ([]byte, error) {
	v, err := b.FromLua(lv)
	if err != nil {
		return nil, err
	}
	// The count bounds the encoding from above (strings with their escapes as
	// encoding/json writes them, numbers at most as long as counted).
	return json.Marshal(v)
}

// Text is tostring(v), counted against the budget: a string or number as Lua
// writes it, a value with a __tostring metamethod as that returns (a string or a
// number, else "'__tostring' must return a string", as Lua 5.2 says), anything
// else as "table: 0x...". L is the calling state, which runs the metamethod.
func (b *Budget) Text(L *lua.LState, v lua.LValue) (string, error) {
	s, err := ToString(L, v)
	if err != nil {
		return "", err
	}
	if err := b.count.addText(len(s)); err != nil {
		return "", err
	}
	return s, nil
}

// Join is the texts of values (Text) separated by sep, as print and ctx.logger
// write them, built only once every part was counted: a message over the budget
// is refused before it is built.
func (b *Budget) Join(L *lua.LState, values []lua.LValue, sep string) (string, error) {
	parts := make([]string, len(values))
	n := 0
	for i, v := range values {
		s, err := b.Text(L, v)
		if err != nil {
			return "", err
		}
		if i > 0 {
			if err := b.count.addText(len(sep)); err != nil {
				return "", err
			}
		}
		parts[i] = s
		n += len(s) + len(sep)
	}
	buf := make([]byte, 0, n)
	for i, s := range parts {
		if i > 0 {
			buf = append(buf, sep...)
		}
		buf = append(buf, s...)
	}
	return string(buf), nil
}

// ToString is tostring(v) (Budget.Text without a budget: its result is a string
// the script already holds, or a short one).
func ToString(L *lua.LState, v lua.LValue) (string, error) {
	switch x := v.(type) {
	case lua.LString:
		return string(x), nil
	case lua.LNumber, *lua.LNilType, lua.LBool:
		return v.String(), nil
	}
	if L != nil {
		if mm := L.GetMetaField(v, "__tostring"); mm != lua.LNil {
			L.Push(mm)
			L.Push(v)
			L.Call(1, 1)
			r := L.Get(-1)
			L.Pop(1)
			switch r.(type) {
			case lua.LString, lua.LNumber:
				return r.String(), nil
			}
			return "", errors.New("'__tostring' must return a string")
		}
	}
	return v.String(), nil
}

// counter counts what a Budget's conversions reached against its limits.
type counter struct {
	limits        Limits
	values, bytes int
}

// add counts one value of n bytes; the error says which limit it passed.
func (c *counter) add(n int) error {
	if c == nil {
		return nil
	}
	c.values++
	c.bytes += n
	switch {
	case c.values > c.limits.MaxValues:
		return fmt.Errorf("%w: more than %d values (a table referenced from several places counts each time)", ErrTooLarge, c.limits.MaxValues)
	case c.bytes > c.limits.MaxBytes:
		return c.overBytes("as JSON (a string or table referenced from several places counts each time)")
	}
	return nil
}

// addText counts n bytes of text.
func (c *counter) addText(n int) error {
	c.bytes += n
	if c.bytes > c.limits.MaxBytes {
		return c.overBytes("of text")
	}
	return nil
}

func (c *counter) overBytes(what string) error {
	why := ""
	if c.limits.Why != "" {
		why = ": " + c.limits.Why
	}
	return fmt.Errorf("%w: more than %d bytes %s%s", ErrTooLarge, c.limits.MaxBytes, what, why)
}

// addBytes counts n more bytes of the value being converted (a key, a separator).
func (c *counter) addBytes(n int) {
	if c != nil {
		c.bytes += n
	}
}

// jsonEscapeCost is what an ASCII byte adds to a JSON string beyond itself, as
// encoding/json escapes it (HTML-safe: <, > and & as \u003c).
var jsonEscapeCost = func() (t [utf8.RuneSelf]int) {
	for c := range utf8.RuneSelf {
		switch {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			t[c] = 1
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			t[c] = 5
		}
	}
	return t
}()

// jsonStringSize is the size of s as a JSON string, quotes included, as
// encoding/json writes it (invalid UTF-8 as \ufffd, U+2028 and U+2029 escaped), or
// more (\b and \f count as \u0008).
func jsonStringSize(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			n += jsonEscapeCost[c]
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 5 // one byte becomes \ufffd
		case r == '\u2028' || r == '\u2029':
			n += 3
		}
		i += size
	}
	return n
}

// jsonNumberSize is the size of f as encoding/json writes it, or more.
func jsonNumberSize(f float64) int {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		n := 1
		if f < 0 {
			n, f = 2, -f
		}
		for f >= 10 {
			f /= 10
			n++
		}
		return n
	}
	return 24 // -1.2345678901234567e-308
}

// Describe renders v for a message, at most max bytes (then "…"): a string
// quoted, a table as a compact Lua-like dump with sorted keys, three levels deep, a
// proxy as the JSON of its value. Nothing larger than max is built: a 16 MiB
// string in the value costs what max lets through of it. error(t) uses it.
func Describe(v lua.LValue, max int) string {
	w := &cutWriter{max: max}
	if gv, ok := ProxyValue(v); ok {
		describeGo(w, gv, 0)
	} else {
		describe(w, v, 0)
	}
	return w.String()
}

// Cut returns s when it has at most max bytes, else its first max bytes (on a
// character boundary) and "…".
func Cut(s string, max int) string {
	w := &cutWriter{max: max}
	w.WriteString(s)
	return w.String()
}

// cutWriter keeps the first max bytes written to it; full once more came.
type cutWriter struct {
	buf  []byte
	max  int
	full bool
}

func (w *cutWriter) WriteString(s string) {
	if w.full {
		return
	}
	room := w.max - len(w.buf)
	if len(s) > room {
		for room > 0 && !utf8.RuneStart(s[room]) {
			room--
		}
		w.buf = append(w.buf, s[:room]...)
		w.full = true
		return
	}
	w.buf = append(w.buf, s...)
}

// quote writes s quoted, as strconv.Quote would, quoting no more of s than room
// left for it.
func (w *cutWriter) quote(s string) {
	if room := w.max - len(w.buf); len(s) > room {
		s = s[:max(room, 0)]
		w.WriteString(strconv.Quote(s))
		w.full = true
		return
	}
	w.WriteString(strconv.Quote(s))
}

func (w *cutWriter) String() string {
	if w.full {
		return string(w.buf) + "…"
	}
	return string(w.buf)
}

// describeDepth is how deep Describe renders tables.
const describeDepth = 3

func describe(w *cutWriter, v lua.LValue, depth int) {
	switch x := v.(type) {
	case lua.LString:
		w.quote(string(x))
	case *lua.LTable:
		if gv, ok := ProxyValue(x); ok {
			describeGo(w, gv, depth)
			return
		}
		if depth >= describeDepth || w.full {
			w.WriteString("{…}")
			return
		}
		type kv struct {
			k   string
			n   float64 // a number key's value, for the order: numbers first
			num bool
			v   lua.LValue
		}
		var items []kv
		x.ForEach(func(k, v lua.LValue) {
			if len(items) > w.max { // each item writes a byte at least
				return
			}
			ks, n, num := "", 0.0, false
			switch kk := k.(type) {
			case lua.LNumber:
				ks, n, num = "["+kk.String()+"]", float64(kk), true
			case lua.LString:
				ks = string(kk)
				if !IsIdent(ks) {
					ks = "[" + strconv.Quote(Cut(ks, w.max)) + "]"
				}
			default:
				ks = "[" + k.String() + "]"
			}
			items = append(items, kv{ks, n, num, v})
		})
		sort.Slice(items, func(i, j int) bool {
			a, b := items[i], items[j]
			if a.num != b.num {
				return a.num
			}
			if a.num {
				return a.n < b.n
			}
			return a.k < b.k
		})
		w.WriteString("{")
		for i, it := range items {
			if w.full {
				break
			}
			if i > 0 {
				w.WriteString(", ")
			}
			w.WriteString(it.k)
			w.WriteString(" = ")
			describe(w, it.v, depth+1)
		}
		w.WriteString("}")
	case *lua.LUserData:
		if IsNull(x) {
			w.WriteString("null")
			return
		}
		w.WriteString("userdata")
	case *lua.LFunction:
		w.WriteString("function")
	default:
		w.WriteString(v.String())
	}
}

// describeGo renders a Go JSON value (a proxy's) as JSON, cut as describe is.
func describeGo(w *cutWriter, v any, depth int) {
	switch x := v.(type) {
	case string:
		w.quote(x)
	case map[string]any:
		if depth >= describeDepth || w.full {
			w.WriteString("{…}")
			return
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		w.WriteString("{")
		for i, k := range keys {
			if w.full {
				break
			}
			if i > 0 {
				w.WriteString(",")
			}
			w.quote(k)
			w.WriteString(":")
			describeGo(w, x[k], depth+1)
		}
		w.WriteString("}")
	case []any:
		if depth >= describeDepth || w.full {
			w.WriteString("[…]")
			return
		}
		w.WriteString("[")
		for i, e := range x {
			if w.full {
				break
			}
			if i > 0 {
				w.WriteString(",")
			}
			describeGo(w, e, depth+1)
		}
		w.WriteString("]")
	case nil:
		w.WriteString("null")
	default:
		w.WriteString(fmt.Sprint(x))
	}
}
