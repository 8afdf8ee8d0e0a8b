package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "luaop-release:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: luaop-release sbom|provenance [flags] (make release runs it)")
	}
	switch args[0] {
	case "sbom":
		fs := flag.NewFlagSet("luaop-release sbom", flag.ContinueOnError)
		in := fs.String("in", "", "the CycloneDX JSON SBOM of cyclonedx-gomod")
		out := fs.String("out", "", "where to write the completed SBOM (default: -in)")
		gopherLua := fs.String("gopher-lua", "third_party/gopher-lua", "the folder of the patched gopher-lua")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *out == "" {
			*out = *in
		}
		return completeSBOMFile(*in, *out, *gopherLua)
	case "provenance":
		fs := flag.NewFlagSet("luaop-release provenance", flag.ContinueOnError)
		dist := fs.String("dist", "dist", "the folder of the artifacts")
		version := fs.String("version", "", "the release's version")
		platforms := fs.String("platforms", "", "the platforms built, space-separated")
		out := fs.String("out", "", "where to write the statement (default: DIST/provenance.intoto.json)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *out == "" {
			*out = *dist + "/provenance.intoto.json"
		}
		return writeProvenance(ctx, *dist, *version, *platforms, *out)
	}
	return fmt.Errorf("unknown command %q: sbom or provenance", args[0])
}
