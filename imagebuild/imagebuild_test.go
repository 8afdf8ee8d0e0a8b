package imagebuild

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

var (
	standInOnce sync.Once
	standInPath string
	standInErr  error
)

// standIn is a small static binary standing for luaop (the pause program): the
// tests check the recipe, not luaop's compilation, which the node suite does.
func standIn(t *testing.T) string {
	t.Helper()
	standInOnce.Do(func() {
		dir, err := os.MkdirTemp("", "imagebuild-test-")
		if err != nil {
			standInErr = err
			return
		}
		standInPath = filepath.Join(dir, "luaop")
		standInErr = GoBuild(context.Background(), repoRoot(t), "./imagebuild/pause", standInPath, "", "")
	})
	if standInErr != nil {
		t.Fatal(standInErr)
	}
	return standInPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if standInPath != "" {
		os.RemoveAll(filepath.Dir(standInPath))
	}
	os.Exit(code)
}

// dockerfile is what the test reads of the Dockerfile: its stages' instructions.
type dockerfile struct {
	stages []stage
}

type stage struct {
	from   string
	instrs []instr
}

type instr struct {
	op, args string
}

// parseDockerfile reads instructions (continuation lines joined, comments dropped).
func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var df dockerfile
	var line strings.Builder
	sc := bufio.NewScanner(f)
	flush := func() {
		text := strings.TrimSpace(line.String())
		line.Reset()
		if text == "" {
			return
		}
		op, args, _ := strings.Cut(text, " ")
		op = strings.ToUpper(op)
		args = strings.TrimSpace(args)
		if op == "FROM" {
			df.stages = append(df.stages, stage{from: args})
			return
		}
		if len(df.stages) == 0 {
			t.Fatalf("Dockerfile: %s before FROM", op)
		}
		s := &df.stages[len(df.stages)-1]
		s.instrs = append(s.instrs, instr{op, args})
	}
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			line.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		line.WriteString(l)
		flush()
	}
	flush()
	if len(df.stages) < 2 {
		t.Fatalf("Dockerfile: want a build stage and a final stage, found %d stage(s)", len(df.stages))
	}
	return df
}

func (s stage) all(op string) []string {
	var out []string
	for _, in := range s.instrs {
		if in.op == op {
			out = append(out, in.args)
		}
	}
	return out
}

func (s stage) one(t *testing.T, op string) string {
	t.Helper()
	all := s.all(op)
	if len(all) != 1 {
		t.Fatalf("Dockerfile stage %q: want one %s, found %d", s.from, op, len(all))
	}
	return all[0]
}

func jsonList(t *testing.T, op, args string) []string {
	t.Helper()
	var l []string
	if err := json.Unmarshal([]byte(args), &l); err != nil {
		t.Fatalf("Dockerfile %s %s: want the JSON (exec) form: %v", op, args, err)
	}
	return l
}

// layerFiles lists the image's files, each path with its tar header, later layers
// winning.
func layerFiles(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files["/"+strings.TrimSuffix(hdr.Name, "/")] = hdr
		}
		rc.Close()
	}
	return files
}

func fileContent(t *testing.T, img v1.Image, path string) string {
	t.Helper()
	layers, _ := img.Layers()
	var content string
	for _, l := range layers {
		rc, _ := l.Uncompressed()
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if err != nil {
				break
			}
			if "/"+hdr.Name == path {
				data, _ := io.ReadAll(tr)
				content = string(data)
			}
		}
		rc.Close()
	}
	return content
}

func scriptsIn(files map[string]*tar.Header) []string {
	var out []string
	for p, h := range files {
		if strings.HasPrefix(p, Recipe.ScriptsDir+"/") && h.Typeflag == tar.TypeReg {
			out = append(out, filepath.Base(p))
		}
	}
	sort.Strings(out)
	return out
}

// TestDockerfileAgrees reads the Dockerfile and checks that Build makes the image it
// describes: the same base user, entrypoint, command, paths, build flags, and
// handlers only when asked (HANDLERS).
func TestDockerfileAgrees(t *testing.T) {
	root := repoRoot(t)
	df := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	build, final := df.stages[0], df.stages[len(df.stages)-1]

	// The base: imagebuild's base layer reproduces what luaop uses of it.
	if final.from != "gcr.io/distroless/static:nonroot" {
		t.Errorf("the Dockerfile's base is %q: imagebuild's baseFiles mirror gcr.io/distroless/static:nonroot; make them match the new base", final.from)
	}
	if got := final.one(t, "USER"); got != Recipe.User {
		t.Errorf("Dockerfile USER %s, imagebuild %s", got, Recipe.User)
	}
	if got := jsonList(t, "ENTRYPOINT", final.one(t, "ENTRYPOINT")); !reflect.DeepEqual(got, Recipe.Entrypoint) {
		t.Errorf("Dockerfile ENTRYPOINT %q, imagebuild %q", got, Recipe.Entrypoint)
	}
	if got := jsonList(t, "CMD", final.one(t, "CMD")); !reflect.DeepEqual(got, Recipe.Cmd) {
		t.Errorf("Dockerfile CMD %q, imagebuild %q", got, Recipe.Cmd)
	}
	// The paths: what the final stage copies in.
	var dests []string
	for _, c := range final.all("COPY") {
		fields := strings.Fields(c)
		dests = append(dests, strings.TrimSuffix(fields[len(fields)-1], "/"))
	}
	sort.Strings(dests)
	if want := []string{Recipe.Binary, Recipe.ScriptsDir}; !reflect.DeepEqual(dests, want) {
		t.Errorf("the Dockerfile's final stage copies to %q, imagebuild writes %q", dests, want)
	}
	// The build: the same flags, static.
	var goBuild string
	for _, r := range build.all("RUN") {
		if strings.Contains(r, "go build") && strings.Contains(r, "./cmd/luaop") {
			goBuild = r
		}
	}
	wantFlags := `-trimpath -ldflags "` + Recipe.BuildFlags[2] + `$VERSION"`
	if Recipe.BuildFlags[0] != "-trimpath" || !strings.Contains(goBuild, wantFlags) {
		t.Errorf("the Dockerfile's go build (%q) does not use imagebuild's flags %s", goBuild, wantFlags)
	}
	if env := strings.Join(build.all("ENV"), " "); !strings.Contains(env, "CGO_ENABLED=0") {
		t.Errorf("the Dockerfile's build stage does not set CGO_ENABLED=0 (ENV %s): the binary would not be static", env)
	}
	// Handlers: none unless HANDLERS names a folder, whose *.lua are copied.
	handlersArg := ""
	for _, a := range build.all("ARG") {
		if name, def, _ := strings.Cut(a, "="); name == "HANDLERS" {
			handlersArg = "HANDLERS=" + def
		}
	}
	if handlersArg != "HANDLERS=" {
		t.Errorf("the Dockerfile's build stage must declare ARG HANDLERS= (no handlers by default), found %q", handlersArg)
	}
	copiesGlob := false
	for _, r := range build.all("RUN") {
		if regexp.MustCompile(`cp "\$HANDLERS"/\*\.lua /out/scripts/`).MatchString(r) {
			copiesGlob = true
		}
	}
	if !copiesGlob || !slices.Contains(final.all("COPY"), "--from=build /out/scripts /scripts") {
		t.Error(`the Dockerfile must copy "$HANDLERS"/*.lua to /out/scripts and that folder to /scripts, as imagebuild's Handlers does`)
	}

	// The image Build makes, without and with handlers.
	img, err := Build(t.Context(), Options{ModuleDir: root, Binary: standIn(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != Recipe.User || !reflect.DeepEqual(cf.Config.Entrypoint, Recipe.Entrypoint) || !reflect.DeepEqual(cf.Config.Cmd, Recipe.Cmd) {
		t.Errorf("the image's config: user %q, entrypoint %q, cmd %q; want %q, %q, %q",
			cf.Config.User, cf.Config.Entrypoint, cf.Config.Cmd, Recipe.User, Recipe.Entrypoint, Recipe.Cmd)
	}
	if cf.OS != "linux" || cf.Config.Labels["org.opencontainers.image.version"] != "test" {
		t.Errorf("the image's OS %q and version label %q", cf.OS, cf.Config.Labels["org.opencontainers.image.version"])
	}
	files := layerFiles(t, img)
	bin, ok := files[Recipe.Binary]
	if !ok || bin.Typeflag != tar.TypeReg || bin.Mode&0o111 == 0 {
		t.Errorf("the image has no executable %s: %+v", Recipe.Binary, bin)
	}
	if d, ok := files[Recipe.ScriptsDir]; !ok || d.Typeflag != tar.TypeDir {
		t.Errorf("the image has no folder %s", Recipe.ScriptsDir)
	}
	if s := scriptsIn(files); len(s) != 0 {
		t.Errorf("handlers baked in without being asked: %v", s)
	}
	if tmp, ok := files["/tmp"]; !ok || tmp.Mode&0o1777 != 0o1777 {
		t.Errorf("the image's /tmp is not a sticky, world-writable folder as distroless's: %+v", tmp)
	}
	if passwd := fileContent(t, img, "/etc/passwd"); !strings.Contains(passwd, "nonroot:x:65532:65532:") {
		t.Errorf("the image's /etc/passwd does not name 65532 nonroot as distroless's does:\n%s", passwd)
	}

	withHandlers, err := Build(t.Context(), Options{ModuleDir: root, Binary: standIn(t), Handlers: filepath.Join(root, "scripts", "examples")})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Glob(filepath.Join(root, "scripts", "examples", "*.lua"))
	for i := range want {
		want[i] = filepath.Base(want[i])
	}
	sort.Strings(want)
	if got := scriptsIn(layerFiles(t, withHandlers)); !reflect.DeepEqual(got, want) {
		t.Errorf("Handlers=scripts/examples baked %v, want the folder's *.lua %v", got, want)
	}
}

// TestArchiveRoundTrip writes the image as an archive, reads it back as a runtime
// would, and checks it is the same image, built the same way twice (reproducible).
func TestArchiveRoundTrip(t *testing.T) {
	root := repoRoot(t)
	img, err := Build(t.Context(), Options{ModuleDir: root, Binary: standIn(t), Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(t.Context(), Options{ModuleDir: root, Binary: standIn(t), Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("the same inputs built two images: %s and %s", d1, d2)
	}
	path := filepath.Join(t.TempDir(), "luaop.tar")
	if err := WriteArchive(path, img, "luaop:latest", "registry.example/luaop:v9"); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"luaop:latest", "registry.example/luaop:v9"} {
		read, err := tarball.ImageFromPath(path, mustTag(t, tag))
		if err != nil {
			t.Fatalf("reading %s back: %v", tag, err)
		}
		if d, _ := read.Digest(); d != d1 {
			t.Errorf("%s read back as %s, written as %s", tag, d, d1)
		}
	}
	if err := WriteArchive(path, img); err == nil {
		t.Error("an archive without a tag was written")
	}
}

// TestRefusesDynamicBinary: a binary needing a C library would not start in an
// image that has none.
func TestRefusesDynamicBinary(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to stand for a dynamic binary")
	}
	sh, _ = filepath.EvalSymlinks(sh)
	if err := checkStatic(sh); err == nil {
		t.Skipf("%s is static here", sh)
	}
	_, err = Build(t.Context(), Options{ModuleDir: repoRoot(t), Binary: sh})
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("a dynamic binary: %v, want a refusal saying how to build it", err)
	}
}

func TestPauseImage(t *testing.T) {
	img, err := BuildPause(t.Context(), PauseOptions{ModuleDir: repoRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/pause"}) {
		t.Errorf("pause entrypoint %q", cf.Config.Entrypoint)
	}
	if h, ok := layerFiles(t, img)["/pause"]; !ok || h.Mode&0o111 == 0 {
		t.Error("the pause image has no executable /pause")
	}
}

func mustTag(t *testing.T, s string) *name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return &tag
}
