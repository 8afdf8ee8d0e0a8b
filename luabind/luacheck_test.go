package luabind

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The .luacheckrc lists exactly the sandbox's globals.
func TestLuacheckrc(t *testing.T) {
	rc := Luacheckrc()
	for _, want := range []string{`os = { fields = { "clock", "date", "time" } }`, `"require"`, `std = "luaop"`, `"pairs"`} {
		if !strings.Contains(rc, want) {
			t.Errorf(".luacheckrc lacks %s:\n%s", want, rc)
		}
	}
	for _, absent := range []string{`"io"`, `"coroutine"`, `"dofile"`, `"getenv"`, `"debug"`} {
		if strings.Contains(rc, absent) {
			t.Errorf(".luacheckrc has %s", absent)
		}
	}
}

// With the generated .luacheckrc, luacheck (Debian's lua-check, when installed) flags
// what the sandbox lacks and accepts the example scripts.
func TestLuacheckAgrees(t *testing.T) {
	bin, err := exec.LookPath("luacheck")
	if err != nil {
		t.Skip("luacheck is not installed (Debian: apt-get install lua-check)")
	}
	dir := t.TempDir()
	files := map[string]string{
		".luacheckrc": Luacheckrc(),
		"good.lua":    "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx)\n  return { t = os.time(), s = string.format('%d', 1) }\nend)\n",
		"bad.lua":     "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx)\n  return { home = os.getenv('HOME'), f = io.open('x') }\nend)\n",
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "--no-color", "--codes", ".")
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	for _, want := range []string{"bad.lua:3:19: (W143) accessing undefined field getenv of global os", "bad.lua:3:42: (W113) accessing undefined variable io"} {
		if !strings.Contains(strings.ReplaceAll(string(out), "'", ""), want) {
			t.Errorf("luacheck output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "good.lua:") {
		t.Errorf("luacheck flags good.lua:\n%s", out)
	}
}
