package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/luaop/luaop/imagebuild"
)

// PauseTag is the name the local node's containerd knows its sandbox image by.
const PauseTag = "luaop.local/pause:latest"

type tags []string

func (t *tags) String() string     { return strings.Join(*t, ",") }
func (t *tags) Set(v string) error { *t = append(*t, v); return nil }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "luaop-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "pause" {
		return runPause(ctx, args[1:])
	}
	fs := flag.NewFlagSet("luaop-image", flag.ContinueOnError)
	out := fs.String("o", "luaop-image.tar", "the image archive to write")
	var names tags
	fs.Var(&names, "t", "a name of the image (repeatable; default luaop:latest)")
	version := fs.String("version", "devel", "the version `luaop version` prints and the image's label")
	handlers := fs.String("handlers", "", "a folder whose *.lua are baked into /scripts (default: none; deploy/ mounts the scripts' ConfigMap there)")
	binary := fs.String("binary", "", "a static luaop binary already built (default: compile ./cmd/luaop)")
	goarch := fs.String("arch", "", "the image's architecture (default: this machine's)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: luaop-image [flags]        build luaop's image as an image archive\n       luaop-image pause -o FILE  build the local node's pause image")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see -h)", fs.Arg(0))
	}
	if len(names) == 0 {
		names = tags{"luaop:latest"}
	}
	progress := func(s string) { fmt.Fprintln(os.Stderr, "[luaop-image]", s) }
	img, err := imagebuild.Build(ctx, imagebuild.Options{Binary: *binary, Version: *version, Handlers: *handlers, GOARCH: *goarch, Progress: progress})
	if err != nil {
		return err
	}
	if err := imagebuild.WriteArchive(*out, img, names...); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	progress(fmt.Sprintf("wrote %s (%s, %s)", *out, names.String(), digest))
	return nil
}

func runPause(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("luaop-image pause", flag.ContinueOnError)
	out := fs.String("o", "pause.tar", "the image archive to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	img, err := imagebuild.BuildPause(ctx, imagebuild.PauseOptions{})
	if err != nil {
		return err
	}
	return imagebuild.WriteArchive(*out, img, PauseTag)
}
