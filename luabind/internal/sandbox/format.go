package sandbox

import (
	"errors"
	"fmt"
	"math"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luavalue"
)

// format is Lua 5.1's string.format (lstrlib.c, str_format), building a result of
// at most limit bytes. gopher-lua's handed the format to Go's fmt.Sprintf with the
// Lua values as arguments: Go's verbs were accepted (%v, %#v, %[1]s), so
// string.format("%#v", t) rendered a whole table, reference after reference, before
// any bound; widths went up to a million. Here, as in Lua 5.1: the conversions are
// c d i o u x X e E f g G q s and %%, a width and a precision have at most two digits
// each, every other option is an error, and each conversion is counted against
// limit before it is appended. %s takes any value through tostring (luavalue.Text:
// __tostring honoured), as Lua 5.2 does; Lua 5.1 took strings and numbers only.
func format(L *lua.LState, limit int) int {
	f := L.CheckString(1)
	top := L.GetTop()
	arg := 1
	out := make([]byte, 0, min(len(f)+16, limit))
	appendOut := func(s string) {
		if len(out)+len(s) > limit {
			L.RaiseError("string.format: result too large (more than %d bytes)", limit)
		}
		out = append(out, s...)
	}
	for i := 0; i < len(f); {
		if f[i] != '%' {
			j := i + 1
			for j < len(f) && f[j] != '%' {
				j++
			}
			appendOut(f[i:j])
			i = j
			continue
		}
		i++
		if i < len(f) && f[i] == '%' {
			appendOut("%")
			i++
			continue
		}
		arg++
		if arg > top {
			formatArgError(L, arg, "no value")
		}
		spec, next := scanFormat(L, f, i)
		i = next + 1
		appendOut(formatOne(L, spec, f[next], arg, limit-len(out), limit))
	}
	L.Push(lua.LString(out))
	return 1
}

// scanFormat reads the flags, width and precision of a conversion starting at i,
// as Lua 5.1's scanformat: at most five flags, two digits of width, two of
// precision. It returns them and the index of the conversion character.
func scanFormat(L *lua.LState, f string, i int) (string, int) {
	start := i
	for i < len(f) && strings.IndexByte("-+ #0", f[i]) >= 0 {
		i++
	}
	if i-start > 5 {
		L.RaiseError("invalid format (repeated flags)")
	}
	digits := func() {
		for n := 0; n < 2 && i < len(f) && isDigit(f[i]); n++ {
			i++
		}
	}
	digits()
	if i < len(f) && f[i] == '.' {
		i++
		digits()
	}
	if i < len(f) && isDigit(f[i]) {
		L.RaiseError("invalid format (width or precision too long)")
	}
	if i >= len(f) {
		L.RaiseError("%s", "invalid option '%' to 'format'")
	}
	return f[start:i], i
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// formatOne formats argument arg by one conversion (flags and sizes in spec).
// room is what the result may still take: only %s and %q can be longer than 100
// bytes, and they are measured before they are built.
func formatOne(L *lua.LState, spec string, conv byte, arg int, room, limit int) string {
	switch conv {
	case 'c':
		return pad(spec, string([]byte{byte(formatInt(L, arg))}))
	case 'd', 'i':
		return fmt.Sprintf("%"+spec+"d", formatInt(L, arg))
	case 'o', 'u', 'x', 'X':
		verb := conv
		if conv == 'u' {
			verb = 'd'
		}
		return fmt.Sprintf("%"+spec+string(verb), uint64(formatInt(L, arg)))
	case 'e', 'E', 'f', 'g', 'G':
		return formatFloat(spec, conv, float64(L.CheckNumber(arg)))
	case 'q':
		s := L.CheckString(arg)
		if quotedSize(s) > room {
			L.RaiseError("string.format: result too large (more than %d bytes)", limit)
		}
		return quoteLua51(s)
	case 's':
		s, err := luavalue.NewBudget(luavalue.Limits{MaxBytes: max(room, 1)}).Text(L, L.Get(arg))
		if errors.Is(err, luavalue.ErrTooLarge) {
			L.RaiseError("string.format: result too large (more than %d bytes)", limit)
		}
		if err != nil {
			formatArgError(L, arg, err.Error())
		}
		if !strings.Contains(spec, ".") && len(s) >= 100 {
			return s // Lua 5.1: a long string is kept whole, its width ignored
		}
		return pad(spec, s)
	}
	L.RaiseError("invalid option '%%%c' to 'format'", conv)
	return ""
}

func formatArgError(L *lua.LState, arg int, msg string) {
	L.RaiseError("bad argument #%d to 'format' (%s)", arg, msg)
}

// formatInt is argument arg as an integer, truncated as C's cast does; a number with
// no integer representation (NaN, ±inf, beyond 2^63) is an error, as Lua 5.3 says.
func formatInt(L *lua.LState, arg int) int64 {
	n := math.Trunc(float64(L.CheckNumber(arg)))
	if !(n >= math.MinInt64 && n < math.MaxInt64) {
		formatArgError(L, arg, "number has no integer representation")
	}
	return int64(n)
}

// formatFloat is C's %e %f %g of n: Go's verbs, with C's default precision for %g
// (6; Go's is the shortest) and C's inf and nan.
func formatFloat(spec string, conv byte, n float64) string {
	if math.IsInf(n, 0) || math.IsNaN(n) {
		s := "inf"
		switch {
		case math.IsNaN(n):
			s = "nan"
		case n < 0:
			s = "-inf"
		case strings.Contains(spec, "+"):
			s = "+inf"
		case strings.Contains(spec, " "):
			s = " inf"
		}
		if conv == 'E' || conv == 'G' {
			s = strings.ToUpper(s)
		}
		if dot := strings.IndexByte(spec, '.'); dot >= 0 {
			spec = spec[:dot] // a precision cuts strings, not inf
		}
		return pad(spec, s)
	}
	if (conv == 'g' || conv == 'G') && !strings.Contains(spec, ".") {
		spec += ".6"
	}
	return fmt.Sprintf("%"+spec+string(conv), n)
}

// pad applies the width, precision (a string's bytes kept) and '-' flag of spec
// to s, as C's %s does.
func pad(spec, s string) string {
	left := strings.Contains(spec, "-")
	flags := strings.TrimLeft(spec, "-+ #0")
	width, prec := 0, -1
	if dot := strings.IndexByte(flags, '.'); dot >= 0 {
		prec = atoi(flags[dot+1:])
		flags = flags[:dot]
	}
	width = atoi(flags)
	if prec >= 0 && prec < len(s) {
		s = s[:prec]
	}
	if len(s) >= width {
		return s
	}
	fill := strings.Repeat(" ", width-len(s))
	if left {
		return s + fill
	}
	return fill + s
}

func atoi(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		n = n*10 + int(s[i]-'0')
	}
	return n
}

// quotedSize is the length of quoteLua51(s).
func quotedSize(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"', '\\', '\n', '\r':
			n++
		case 0:
			n += 3
		}
	}
	return n
}

// quoteLua51 is Lua 5.1's %q: between double quotes, with ", \ and a newline
// escaped by a backslash, \r as \r and a zero byte as \000; other bytes as they are.
func quoteLua51(s string) string {
	var b strings.Builder
	b.Grow(quotedSize(s))
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\', '\n':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\r':
			b.WriteString(`\r`)
		case 0:
			b.WriteString(`\000`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
