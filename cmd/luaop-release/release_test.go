package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The SBOM gains the patched gopher-lua under upstream's package URL (what a scanner
// matches advisories on) with a pedigree, once, and the main component depends on it.
func TestSBOMNamesThePatchedGopherLua(t *testing.T) {
	in := filepath.Join(t.TempDir(), "sbom.json")
	sbom := `{"bomFormat":"CycloneDX","specVersion":"1.6","metadata":{"component":{"bom-ref":"pkg:golang/github.com/luaop/luaop@v1","name":"github.com/luaop/luaop"}},
		"components":[{"bom-ref":"pkg:golang/k8s.io/client-go@v0.35.0","name":"k8s.io/client-go"}],
		"dependencies":[{"ref":"pkg:golang/github.com/luaop/luaop@v1","dependsOn":["pkg:golang/k8s.io/client-go@v0.35.0"]}]}`
	if err := os.WriteFile(in, []byte(sbom), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // completing twice changes nothing more
		if err := completeSBOMFile(in, in, "../../third_party/gopher-lua"); err != nil {
			t.Fatal(err)
		}
	}
	bom := readJSON(t, in)
	var patched []map[string]any
	for _, c := range bom["components"].([]any) {
		if c := c.(map[string]any); c["name"] == gopherLuaModule {
			patched = append(patched, c)
		}
	}
	if len(patched) != 1 || patched[0]["purl"] != "pkg:golang/github.com/yuin/gopher-lua@v1.1.2?type=module" || patched[0]["pedigree"] == nil {
		t.Fatalf("gopher-lua in the SBOM: %v", patched)
	}
	deps := bom["dependencies"].([]any)[0].(map[string]any)["dependsOn"].([]any)
	if !slices.Contains(deps, patched[0]["bom-ref"]) || len(deps) != 2 {
		t.Errorf("the main component's dependencies: %v", deps)
	}
	if err := os.WriteFile(in, []byte(`{"bomFormat":"SPDX"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := completeSBOMFile(in, in, "../../third_party/gopher-lua"); err == nil || !strings.Contains(err.Error(), "not a CycloneDX SBOM") {
		t.Errorf("an SPDX document: %v", err)
	}
}

// make release, for one platform as a release makes each: the binary, its SBOM, the
// image archive, SHA256SUMS that check, and a provenance naming every artifact with
// its digest and this checkout's commit.
func TestMakeReleaseMakesEveryArtifact(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release")
	}
	dist := t.TempDir()
	const version = "v0.0.0-releasetest"
	cmd := exec.CommandContext(t.Context(), "make", "-s", "release", "VERSION="+version, "RELEASE_PLATFORMS=linux/amd64", "DIST="+dist)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	want := []string{"luaop-" + version + "-linux-amd64", "luaop-" + version + "-linux-amd64.cdx.json", "luaop-image-" + version + "-linux-amd64.tar"}
	sums := map[string]string{}
	f, err := os.Open(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for s := bufio.NewScanner(f); s.Scan(); {
		sum, name, _ := strings.Cut(s.Text(), "  ")
		sums[name] = sum
	}
	for _, name := range want {
		data, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatalf("make release did not make %s: %v", name, err)
		}
		digest := sha256.Sum256(data)
		if sums[name] != hex.EncodeToString(digest[:]) {
			t.Errorf("SHA256SUMS has %q for %s, want its digest", sums[name], name)
		}
	}
	sbom, err := os.ReadFile(filepath.Join(dist, want[1]))
	if err != nil || !strings.Contains(string(sbom), `"purl": "pkg:golang/github.com/yuin/gopher-lua@v1.1.2?type=module"`) ||
		!strings.Contains(string(sbom), "k8s.io/client-go") {
		t.Errorf("the SBOM lacks gopher-lua or client-go (%v)", err)
	}
	provenance := readJSON(t, filepath.Join(dist, "provenance.intoto.json"))
	subjects := map[string]string{}
	for _, s := range provenance["subject"].([]any) {
		s := s.(map[string]any)
		subjects[s["name"].(string)] = s["digest"].(map[string]any)["sha256"].(string)
	}
	for _, name := range append(want, "SHA256SUMS") {
		if subjects[name] == "" || (sums[name] != "" && subjects[name] != sums[name]) {
			t.Errorf("the provenance's subject %s: %q", name, subjects[name])
		}
	}
	commit, _ := exec.Command("git", "rev-parse", "HEAD").Output()
	if raw, _ := json.Marshal(provenance["predicate"]); !strings.Contains(string(raw), strings.TrimSpace(string(commit))) {
		t.Errorf("the provenance does not name the commit %s: %s", commit, raw)
	}
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}
