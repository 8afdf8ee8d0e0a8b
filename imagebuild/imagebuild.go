package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Recipe is what the Dockerfile's final stage and Build both produce. The
// Dockerfile cannot import it: TestDockerfileAgrees reads the Dockerfile and
// compares.
var Recipe = struct {
	// User runs the entrypoint: distroless's "nonroot", which deploy/ also names
	// (runAsUser, runAsGroup).
	User string
	// Entrypoint and Cmd: `docker run IMAGE` runs `luaop run /scripts`.
	Entrypoint, Cmd []string
	// Binary is where the static luaop binary lies; ScriptsDir the folder of the
	// handlers (deploy/ mounts the scripts' ConfigMap there).
	Binary, ScriptsDir string
	// BuildFlags are `go build`'s flags (with CGO_ENABLED=0) before the version's -X.
	BuildFlags []string
	// VersionFlag is the -X that stamps `luaop version`.
	VersionFlag string
}{
	User:        "65532:65532",
	Entrypoint:  []string{"/luaop"},
	Cmd:         []string{"run", "/scripts"},
	Binary:      "/luaop",
	ScriptsDir:  "/scripts",
	BuildFlags:  []string{"-trimpath", "-ldflags", "-s -w -X main.version="},
	VersionFlag: "main.version",
}

// Options configure Build. The zero value builds luaop:latest of the module in the
// working directory for this machine's architecture, without handlers.
type Options struct {
	// ModuleDir is the root of luaop's module (go.mod). Defaults to the working
	// directory.
	ModuleDir string
	// Binary is a luaop binary already built (static, for Linux); empty: Build
	// compiles ./cmd/luaop of ModuleDir as the Dockerfile does.
	Binary string
	// Version is stamped into the binary (`luaop version`) and the image's labels.
	// Defaults to "devel", as the Dockerfile's VERSION build argument.
	Version string
	// Handlers is a folder whose *.lua files are baked into /scripts (the
	// Dockerfile's HANDLERS build argument); empty: /scripts is an empty folder.
	Handlers string
	// GOARCH of the image. Defaults to runtime.GOARCH.
	GOARCH string
	// CACertificates is a PEM bundle copied to /etc/ssl/certs/ca-certificates.crt,
	// as distroless carries one (for scripts or plugins that reach HTTPS servers
	// outside the cluster; the API server's CA comes from the service account).
	// Defaults to the build machine's /etc/ssl/certs/ca-certificates.crt when it
	// exists; "none" leaves it out.
	CACertificates string
	// Created is the image's creation time. Defaults to the Unix epoch, so that the
	// same inputs give the same image (the same digest).
	Created time.Time
	// Progress receives one line per step. Defaults to none.
	Progress func(string)
}

func (o Options) withDefaults() (Options, error) {
	if o.ModuleDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return o, err
		}
		o.ModuleDir = wd
	}
	if _, err := os.Stat(filepath.Join(o.ModuleDir, "go.mod")); err != nil && o.Binary == "" {
		return o, fmt.Errorf("%s is not luaop's module root (no go.mod): give the module's folder or a built binary", o.ModuleDir)
	}
	if o.Version == "" {
		o.Version = "devel"
	}
	if o.GOARCH == "" {
		o.GOARCH = runtime.GOARCH
	}
	if o.CACertificates == "" {
		const host = "/etc/ssl/certs/ca-certificates.crt"
		if _, err := os.Stat(host); err == nil {
			o.CACertificates = host
		} else {
			o.CACertificates = "none"
		}
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0)
	}
	return o, nil
}

// Build makes luaop's image. It compiles the binary unless Options.Binary names
// one, and refuses a binary that is not static (the image has no C library).
func Build(ctx context.Context, opts Options) (v1.Image, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	binary := opts.Binary
	if binary == "" {
		dir, err := os.MkdirTemp("", "luaop-image-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "luaop")
		opts.Progress("compiling ./cmd/luaop (static, linux/" + opts.GOARCH + ", version " + opts.Version + ")")
		if err := GoBuild(ctx, opts.ModuleDir, "./cmd/luaop", binary, opts.GOARCH, Recipe.VersionFlag+"="+opts.Version); err != nil {
			return nil, err
		}
	}
	if err := checkStatic(binary); err != nil {
		return nil, err
	}
	files := []file{dir(Recipe.ScriptsDir, 0o755, 0)}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	files = append(files, file{path: Recipe.Binary, mode: 0o755, data: bin})
	if opts.Handlers != "" {
		handlers, err := handlerFiles(opts.Handlers)
		if err != nil {
			return nil, err
		}
		opts.Progress(fmt.Sprintf("baking %d handler file(s) of %s into %s", len(handlers), opts.Handlers, Recipe.ScriptsDir))
		files = append(files, handlers...)
	}
	base, err := baseFiles(opts.CACertificates)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		"org.opencontainers.image.title":   "luaop",
		"org.opencontainers.image.version": opts.Version,
		"org.opencontainers.image.source":  "https://github.com/luaop/luaop",
	}
	return assemble(opts.GOARCH, opts.Created, v1.Config{
		User:       Recipe.User,
		Entrypoint: Recipe.Entrypoint,
		Cmd:        Recipe.Cmd,
		WorkingDir: "/home/nonroot",
		Env:        distrolessEnv,
		Labels:     labels,
	}, base, files)
}

// PauseOptions configure BuildPause.
type PauseOptions struct {
	// ModuleDir is the root of luaop's module; defaults to the working directory.
	ModuleDir string
	// GOARCH of the image. Defaults to runtime.GOARCH.
	GOARCH string
}

// BuildPause makes the pod sandbox image of the local node: the static program of
// imagebuild/pause as /pause, which waits for SIGTERM or SIGINT and reaps the
// children it adopts, like Kubernetes' pause image.
func BuildPause(ctx context.Context, opts PauseOptions) (v1.Image, error) {
	if opts.ModuleDir == "" {
		opts.ModuleDir, _ = os.Getwd()
	}
	if opts.GOARCH == "" {
		opts.GOARCH = runtime.GOARCH
	}
	d, err := os.MkdirTemp("", "luaop-pause-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(d)
	bin := filepath.Join(d, "pause")
	if err := GoBuild(ctx, opts.ModuleDir, "./imagebuild/pause", bin, opts.GOARCH, ""); err != nil {
		return nil, err
	}
	if err := checkStatic(bin); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return assemble(opts.GOARCH, time.Unix(0, 0), v1.Config{
		User:       "65535:65535",
		Entrypoint: []string{"/pause"},
	}, nil, []file{{path: "/pause", mode: 0o755, data: data}})
}

// GoBuild compiles pkg of the module in moduleDir into out as the Dockerfile does:
// CGO_ENABLED=0, GOOS=linux, -trimpath, stripped, with version (NAME=VALUE) as -X
// when given.
func GoBuild(ctx context.Context, moduleDir, pkg, out, goarch, version string) error {
	ldflags := "-s -w"
	if version != "" {
		ldflags += " -X " + version
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// checkStatic refuses a binary that needs a dynamic loader: the image has none.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not a Linux binary: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically: the image has no C library; build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// handlerFiles are the *.lua files of dir, under /scripts (the Dockerfile copies
// the same glob).
func handlerFiles(dir string) ([]file, error) {
	matches, err := filepath.Glob(filepath.Join(dir, "*.lua"))
	if err != nil {
		return nil, err
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("no *.lua in %s: give the folder of the handlers to bake in", dir)
	}
	sort.Strings(matches)
	var files []file
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err != nil {
			return nil, err
		}
		files = append(files, file{path: Recipe.ScriptsDir + "/" + filepath.Base(m), mode: 0o644, data: data})
	}
	return files, nil
}

// distrolessEnv is the environment distroless/static sets.
var distrolessEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
}

// baseFiles are what luaop uses of distroless/static:nonroot, the Dockerfile's
// base: the users and groups (nonroot is 65532), a writable /tmp, the home of
// nonroot, and the CA bundle.
func baseFiles(caBundle string) ([]file, error) {
	files := []file{
		{path: "/etc/passwd", mode: 0o644, data: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
				"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "/etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{path: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		dir("/tmp", os.ModeSticky|0o777, 0),
		dir("/home/nonroot", 0o700, 65532),
	}
	if caBundle != "none" {
		data, err := os.ReadFile(caBundle)
		if err != nil {
			return nil, fmt.Errorf("the CA bundle: %w (\"none\" leaves it out)", err)
		}
		files = append(files, file{path: "/etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: data})
	}
	return files, nil
}

// file is one entry of a layer.
type file struct {
	path  string
	mode  os.FileMode // permission bits, os.ModeDir for a folder, os.ModeSticky
	data  []byte
	owner int // uid and gid
}

func dir(path string, perm os.FileMode, owner int) file {
	return file{path: path, mode: os.ModeDir | perm, owner: owner}
}

// assemble stacks a base layer (when files are given) and the application layer
// on an empty image, with cfg.
func assemble(goarch string, created time.Time, cfg v1.Config, base, app []file) (v1.Image, error) {
	img := empty.Image
	var layers []v1.Layer
	for _, files := range [][]file{base, app} {
		if len(files) == 0 {
			continue
		}
		data, err := layerTar(files)
		if err != nil {
			return nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		})
		if err != nil {
			return nil, err
		}
		layers = append(layers, layer)
	}
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch
	cf.Config = cfg
	cf.Created = v1.Time{Time: created.UTC()}
	for i := range cf.History {
		cf.History[i].Created = cf.Created
	}
	return mutate.ConfigFile(img, cf)
}

// layerTar writes files as a tar, with the folders above each path, sorted and
// with fixed times: the same files give the same digest.
func layerTar(files []file) ([]byte, error) {
	entries := map[string]file{}
	for _, f := range files {
		p := strings.TrimPrefix(f.path, "/")
		for d := filepath.Dir(p); d != "." && d != "/"; d = filepath.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = dir(d, 0o755, 0)
			}
		}
		entries[p] = f
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := entries[p]
		hdr := &tar.Header{Name: p, Mode: int64(f.mode.Perm()), Uid: f.owner, Gid: f.owner,
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if f.mode&os.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		if f.mode.IsDir() {
			hdr.Typeflag, hdr.Name = tar.TypeDir, p+"/"
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteArchive writes img to path as an image archive naming it by every tag
// ("luaop:latest", "registry.example/luaop:v1"); `ctr images import`, `docker
// load` and `kind load image-archive` read it. The folder of path is created
// when missing.
func WriteArchive(path string, img v1.Image, tags ...string) error {
	if len(tags) == 0 {
		return errors.New("an image archive needs at least one tag")
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range tags {
		tag, err := name.NewTag(t)
		if err != nil {
			return fmt.Errorf("tag %q: %w", t, err)
		}
		refs[tag] = img
	}
	// The folder may not exist yet (bin/ of a fresh clone: make image-archive).
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := tarball.MultiRefWrite(refs, f); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
