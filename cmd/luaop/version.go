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
// Without it, the version Go recorded is used: the module's (go install
// github.com/luaop/luaop/cmd/luaop@v0.1.0 records v0.1.0), else the VCS revision of
// the checkout go build ran in.
var version string

// luaopVersion is the version of this binary: the stamp, else the module version Go
// recorded, else the VCS revision, else "(devel)".
func luaopVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	return buildVersion(info)
}

// buildVersion is the version of a build without a stamp: the main module's version
// when Go knows it (go install ...@version), else "devel-<revision>" (12 hex digits,
// "-dirty" with uncommitted changes) from the VCS information go build records in a
// checkout, else "(devel)".
func buildVersion(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var revision string
	var modified bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision == "" {
		return "(devel)"
	}
	if len(revision) > 12 {
		revision = revision[:12]
	}
	if modified {
		revision += "-dirty"
	}
	return "devel-" + revision
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
		Args:  usageArgs(cobra.NoArgs),
		Run: func(cmd *cobra.Command, _ []string) {
			for _, c := range components() {
				fmt.Fprintf(cmd.OutOrStdout(), "%-11s %s\n", c[0], c[1])
			}
		},
	}
}
