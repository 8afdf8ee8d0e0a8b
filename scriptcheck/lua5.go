package scriptcheck

import (
	"regexp"
	"strings"
)

// lua5Hints are constructs of Lua 5.2 and later that gopher-lua (Lua 5.1) rejects,
// looked for on the line of a syntax error.
var lua5Hints = []struct {
	re   *regexp.Regexp
	hint string
}{
	{regexp.MustCompile(`//`), "'//' (floor division, Lua 5.3) is not Lua 5.1: write math.floor(a / b)"},
	{regexp.MustCompile(`<<|>>`), "bit shifts (Lua 5.3) are not Lua 5.1, and luaop's sandbox has no bit library: use arithmetic (a * 2^n, math.floor(a / 2^n))"},
	{regexp.MustCompile(`<\s*(const|close)\s*>`), "local attributes <const>/<close> (Lua 5.4) are not Lua 5.1: drop them"},
	{regexp.MustCompile(`[^~=<>]~[^=]|&|\|`), "bitwise operators (&, |, ~: Lua 5.3) are not Lua 5.1, and luaop's sandbox has no bit library"},
}

// codeOfLine is the line without strings and comments (good enough for hints).
var stringsAndComments = regexp.MustCompile(`--.*$|"(\\.|[^"\\])*"|'(\\.|[^'\\])*'`)

func lua5Hint(src []byte, line int) string {
	lines := strings.Split(string(src), "\n")
	if line <= 0 || line > len(lines) {
		return ""
	}
	code := stringsAndComments.ReplaceAllString(lines[line-1], `""`)
	for _, h := range lua5Hints {
		if h.re.MatchString(code) {
			return h.hint
		}
	}
	return ""
}
