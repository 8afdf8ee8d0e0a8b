package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is stamped at build time (Makefile, Dockerfile):
//
//	go build -ldflags "-X main.version=$(git describe --tags --always --dirty)" ./cmd/luaop
//
// Without it, the version Go recorded from the module (or VCS) is used.
var version string

// luaopVersion is the version of this binary: the stamp, else the module version Go
// recorded, else "(devel)".
func luaopVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}

// components are the versions that matter when reporting a problem: luaop's, Go's,
// the Lua VM's and the Kubernetes client's.
func components() [][2]string {
	out := [][2]string{{"luaop", luaopVersion()}, {"go", runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}}
	deps := map[string]string{}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			v := d.Version
			if r := d.Replace; r != nil {
				v = r.Version
				if r.Version == "" || r.Version == "(devel)" { // a folder of the repository: a patched copy
					v = d.Version + " (patched: " + strings.TrimPrefix(r.Path, "./") + ")"
				}
			}
			deps[d.Path] = v
		}
	}
	for _, m := range []struct{ name, path, note string }{
		{"gopher-lua", "github.com/yuin/gopher-lua", " (Lua 5.1)"},
		{"client-go", "k8s.io/client-go", ""},
	} {
		v := deps[m.path]
		if v == "" {
			v = "unknown (no build information)"
		}
		out = append(out, [2]string{m.name, v + m.note})
	}
	return out
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the versions of luaop, Go, gopher-lua and client-go",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			for _, c := range components() {
				fmt.Fprintf(cmd.OutOrStdout(), "%-11s %s\n", c[0], c[1])
			}
		},
	}
}
