package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Provenance's kinds: an in-toto statement with a SLSA v1 provenance predicate.
const (
	statementType  = "https://in-toto.io/Statement/v1"
	provenanceType = "https://slsa.dev/provenance/v1"
	buildType      = "https://github.com/luaop/luaop/blob/main/Makefile#release"
)

// writeProvenance describes every file of dist (but the statement itself) as a
// subject with its SHA-256, built from this checkout's commit with these parameters.
func writeProvenance(ctx context.Context, dist, version, platforms, out string) error {
	subjects, err := digests(dist, filepath.Base(out))
	if err != nil {
		return err
	}
	if len(subjects) == 0 {
		return fmt.Errorf("%s holds no artifact: run make release", dist)
	}
	commit, err := gitOutput(ctx, "rev-parse", "HEAD")
	if err != nil {
		return fmt.Errorf("the source's commit: %w", err)
	}
	dirty, _ := gitOutput(ctx, "status", "--porcelain")
	finished := time.Now().UTC()
	statement := map[string]any{
		"_type":         statementType,
		"subject":       subjects,
		"predicateType": provenanceType,
		"predicate": map[string]any{
			"buildDefinition": map[string]any{
				"buildType":          buildType,
				"externalParameters": map[string]any{"version": version, "platforms": strings.Fields(platforms)},
				"internalParameters": map[string]any{"go": runtime.Version(), "cgo": false, "trimpath": true, "sourceModified": dirty != ""},
				"resolvedDependencies": []any{map[string]any{
					"uri": "git+file://" + mustAbs("."), "digest": map[string]any{"gitCommit": commit},
				}},
			},
			"runDetails": map[string]any{
				"builder":  map[string]any{"id": "make release (unsigned, on the releaser's machine)"},
				"metadata": map[string]any{"finishedOn": finished.Format(time.RFC3339)},
			},
		},
	}
	data, err := json.MarshalIndent(statement, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

// digests are the subjects of the files of dir, sorted by name, skipping skip.
func digests(dir, skip string) ([]any, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != skip {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	out := make([]any, 0, len(names))
	for _, name := range names {
		sum, err := sha256File(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		out = append(out, map[string]any{"name": name, "digest": map[string]any{"sha256": sum}})
	}
	return out, nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func gitOutput(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", args...).Output()
	return strings.TrimSpace(string(out)), err
}

func mustAbs(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	return abs
}
