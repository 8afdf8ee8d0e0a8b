package sandbox

import (
	"strings"
	"testing"

	"github.com/luaop/luaop/luabind/internal/luatest"
)

// string.format is Lua 5.1's (issue 46): its conversions give what Lua 5.1 gives,
// and what Lua 5.1 refuses (Go's verbs among them: %v, %#v) is refused with Lua's
// words at the script's line.
func TestFormatIsLua51s(t *testing.T) {
	L := newTestState(t)
	for _, tc := range []struct{ lua, want string }{
		{`string.format("%5.1f|%s|%d", 2.25, "x", 7)`, "  2.2|x|7"},
		{`string.format("%d %i %5d %-5d| %05d %+d", 3.7, -3.7, 42, 42, 42, 42)`, "3 -3    42 42   | 00042 +42"},
		{`string.format("%x %X %o %#x %u", 255, 255, 8, 255, 3)`, "ff FF 10 0xff 3"},
		{`string.format("%c%c%c", 76, 117, 97)`, "Lua"},
		{`string.format("%e %E %.3f %g %g %g", 12345.678, 0.5, 1/3, 1234567, 0.1, 1e20)`, "1.234568e+04 5.000000E-01 0.333 1.23457e+06 0.1 1e+20"},
		{`string.format("%f %5.1f %g %G", 1/0, -1/0, 0/0, 1/0)`, "inf  -inf nan INF"},
		{`string.format("%q", 'a "quoted"\n\0 \\ \r')`, "\"a \\\"quoted\\\"\\\n\\000 \\\\ \\r\""},
		{`string.format("%s %s %s %s", nil, true, 12, 1.5)`, "nil true 12 1.5"},
		{`string.format("%s", setmetatable({}, {__tostring = function() return "T" end}))`, "T"},
		{`string.format("%5s|%-5s|%.2s", "ab", "ab", "abc")`, "   ab|ab   |ab"},
		{`string.format("%5s", string.rep("x", 100)) == string.rep("x", 100)`, "true"},
		{`string.format("%%|%5.2s|", "abc")`, "%|   ab|"},
		{`("%d-%s"):format(1, "a")`, "1-a"},
	} {
		got, err := luatest.Call(t, L, "return "+tc.lua)
		if err != nil {
			t.Errorf("%s: %v", tc.lua, err)
			continue
		}
		if got.String() != tc.want {
			t.Errorf("%s = %q, want %q", tc.lua, got.String(), tc.want)
		}
	}
	for _, tc := range []struct{ lua, want string }{
		{`string.format("%#v", {})`, "handler.lua:1: invalid option '%v' to 'format'"},
		{`string.format("%v", 1)`, "invalid option '%v' to 'format'"},
		{`string.format("%[1]s", "x")`, "invalid option '%[' to 'format'"},
		{`string.format("%100d", 1)`, "invalid format (width or precision too long)"},
		{`string.format("%.100f", 1)`, "invalid format (width or precision too long)"},
		{`string.format("%------d", 1)`, "invalid format (repeated flags)"},
		{`string.format("%d")`, "bad argument #2 to 'format' (no value)"},
		{`string.format("%d", "x")`, "number expected, got string"},
		{`string.format("%d", 0/0)`, "bad argument #2 to 'format' (number has no integer representation)"},
		{`string.format("%d", 1e300)`, "number has no integer representation"},
		{`string.format("%s", setmetatable({}, {__tostring = function() return {} end}))`, "'__tostring' must return a string"},
		{`string.format("abc%")`, "bad argument #2 to 'format' (no value)"},
		{`string.format("abc%", 1)`, "invalid option '%' to 'format'"},
	} {
		_, err := luatest.Call(t, L, "local x = 1 return "+tc.lua)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.lua, err, tc.want)
		}
	}
}
