package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/luaop/luaop/luabind"
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
	client := "unknown (no build information)"
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "k8s.io/client-go" {
				client = d.Version
				if d.Replace != nil {
					client = d.Replace.Version
				}
			}
		}
	}
	return append(out,
		[2]string{"gopher-lua", luabind.LuaVMVersion + " (Lua 5.1)"},
		[2]string{"client-go", client})
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
