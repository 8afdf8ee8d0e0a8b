package scriptsource_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptsource"
)

// A ConfigMap mounted as a folder (keys as links into ..data, as the kubelet makes
// it) with modules as lib__x.lua keys: require finds them by their folder names, and
// errors name the mapped path.
func TestReadDirMapsFlatKeysToModules(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_11_30_16_00_00.1")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"widgets.lua":        "local luaop = require('luaop')\nlocal util = require('lib.util')\nluaop.on.create('example.com/v1/widgets', function(ctx) return util.twice(2) end, {id = util.name})\n",
		"lib__util.lua":      "local http = require('lib.net.http')\nreturn { twice = function(x) return 2 * x end, name = http.id }\n",
		"lib__net__http.lua": "return { id = 'from-module' }\n",
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(data, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	scripts, err := scriptsource.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range scripts {
		names = append(names, s.Name)
	}
	if got := strings.Join(names, " "); got != "lib/net/http.lua lib/util.lua widgets.lua" {
		t.Fatalf("ReadDir names: %s", got)
	}
	rt := luabind.New(luabind.Options{Shards: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer rt.Close()
	rep, err := rt.Load(t.Context(), scripts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(rep.Handlers) != 1 || rep.Handlers[0].ID != "from-module" {
		t.Errorf("handlers: %+v; want one with the id the module lib.net.http gave", rep.Handlers)
	}

	// An error in a module names its path as require knows it.
	if err := os.WriteFile(filepath.Join(data, "lib__util.lua"), []byte("return {\n  twice = error('boom'),\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	scripts, err = scriptsource.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Load(t.Context(), scripts); err == nil || !strings.Contains(err.Error(), "lib/util.lua:2") {
		t.Errorf("Load of a broken module: %v; want an error at lib/util.lua:2", err)
	}

	// Both spellings of one module: refused.
	if err := os.MkdirAll(filepath.Join(dir, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lib", "util.lua"), []byte("return {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := scriptsource.ReadDir(dir); err == nil || !strings.Contains(err.Error(), "both stand for lib/util.lua") {
		t.Errorf("ReadDir with lib/util.lua and lib__util.lua: %v", err)
	}
}
