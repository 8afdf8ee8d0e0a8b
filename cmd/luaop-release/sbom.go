package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// gopherLuaModule is the upstream module the patched copy was taken from.
const gopherLuaModule = "github.com/yuin/gopher-lua"

var upstreamVersion = regexp.MustCompile(`UpstreamVersion = "(v[^"]+)"`)

// completeSBOMFile reads the SBOM at in, adds the patched gopher-lua, writes it to out.
func completeSBOMFile(in, out, gopherLuaDir string) error {
	data, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("reading the SBOM: %w (make release makes it with cyclonedx-gomod first)", err)
	}
	var bom map[string]any
	if err := json.Unmarshal(data, &bom); err != nil {
		return fmt.Errorf("%s is not a JSON SBOM: %w", in, err)
	}
	component, err := gopherLuaComponent(gopherLuaDir)
	if err != nil {
		return err
	}
	if err := addComponent(bom, component); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	completed, err := json.MarshalIndent(bom, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(completed, '\n'), 0o644)
}

// gopherLuaComponent describes the copy in dir: upstream's module and version (its
// upstream.go), as CycloneDX's pedigree of a patched component.
func gopherLuaComponent(dir string) (map[string]any, error) {
	src, err := os.ReadFile(filepath.Join(dir, "upstream.go"))
	if err != nil {
		return nil, fmt.Errorf("the patched gopher-lua's version: %w", err)
	}
	m := upstreamVersion.FindSubmatch(src)
	if m == nil {
		return nil, fmt.Errorf("%s names no UpstreamVersion", filepath.Join(dir, "upstream.go"))
	}
	version := string(m[1])
	purl := "pkg:golang/" + gopherLuaModule + "@" + version + "?type=module"
	return map[string]any{
		"type":        "library",
		"bom-ref":     purl + "#patched-in-luaop",
		"name":        gopherLuaModule,
		"version":     version,
		"purl":        purl,
		"description": "Lua 5.1 VM, copied into luaop's module as third_party/gopher-lua (not a go.mod dependency) and patched",
		"licenses":    []any{map[string]any{"license": map[string]any{"id": "MIT"}}},
		"pedigree": map[string]any{
			"ancestors": []any{map[string]any{"type": "library", "name": gopherLuaModule, "version": version, "purl": purl}},
			"patches":   []any{map[string]any{"type": "unofficial"}},
			"notes": "luaop's patches (bounds on nesting, compile time, string sizes, call and data stacks, " +
				"pattern matching; every change marked `luaop patch`) are listed, with their reasons and tests, " +
				"in third_party/gopher-lua/README.md of the source.",
		},
	}, nil
}

// addComponent appends component to the SBOM's components and makes the main
// component (metadata.component) depend on it.
func addComponent(bom, component map[string]any) error {
	if bom["bomFormat"] != "CycloneDX" {
		return fmt.Errorf("not a CycloneDX SBOM (bomFormat %v)", bom["bomFormat"])
	}
	components, _ := bom["components"].([]any)
	for _, c := range components {
		if c, ok := c.(map[string]any); ok && c["bom-ref"] == component["bom-ref"] {
			return nil // completed already
		}
	}
	bom["components"] = append(components, component)
	meta, _ := bom["metadata"].(map[string]any)
	main, _ := meta["component"].(map[string]any)
	mainRef, _ := main["bom-ref"].(string)
	if mainRef == "" {
		return fmt.Errorf("the SBOM names no main component")
	}
	deps, _ := bom["dependencies"].([]any)
	for _, d := range deps {
		if d, ok := d.(map[string]any); ok && d["ref"] == mainRef {
			on, _ := d["dependsOn"].([]any)
			d["dependsOn"] = append(on, component["bom-ref"])
			return nil
		}
	}
	bom["dependencies"] = append(deps, map[string]any{"ref": mainRef, "dependsOn": []any{component["bom-ref"]}})
	return nil
}
