package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind/adversary"
)

// Issue 34: the adversarial scripts in a real `luaop test` and `luaop check` process
// with GOMEMLIMIT=384MiB (what deploy/ sets): each case fails as expected, within a
// second of its deadline, and the process's peak RSS (the kernel's, not the Go heap)
// stays under 384 MiB. `luaop run` is measured the same way in e2e
// (TestAdversarialOperator).
const adversaryMemLimit = 384 << 20

// buildLuaopBinary builds the command without the race detector (whose shadow
// memory would be measured too).
func buildLuaopBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds luaop")
	}
	bin := filepath.Join(t.TempDir(), "luaop")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building luaop: %v\n%s", err, out)
	}
	return bin
}

// runMeasured runs the binary with GOMEMLIMIT=384MiB and returns its output, exit
// code and peak RSS (getrusage of the child: VmHWM at its end).
func runMeasured(t *testing.T, bin string, args ...string) (string, int, int64) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=384MiB")
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if ru == nil {
		t.Fatal("no rusage")
	}
	return string(out), code, ru.Maxrss * 1024
}

func TestAdversarialProcesses(t *testing.T) {
	bin := buildLuaopBinary(t)
	// 2 s keeps the suite short (a dozen cases run to their deadline);
	// LUAOP_ADVERSARY_DEADLINE=5s runs it under issue 46's conditions.
	deadline := 2 * time.Second
	if v := os.Getenv("LUAOP_ADVERSARY_DEADLINE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LUAOP_ADVERSARY_DEADLINE: %v", err)
		}
		deadline = d
	}

	t.Run("luaop test", func(t *testing.T) {
		dir := t.TempDir()
		src, lines := adversary.Script(adversary.Cases)
		var cases strings.Builder
		cases.WriteString("cases:\n")
		for _, c := range adversary.Cases {
			where := fmt.Sprintf("%s:%d:", adversary.File, lines[c.ID])
			if c.Result {
				where = fmt.Sprintf("%s:%d:", adversary.File, lines[c.ID]-1)
			}
			fmt.Fprintf(&cases, "- name: %s\n  handler: %s\n  object: {apiVersion: example.com/v1, kind: Widget, metadata: {name: w, namespace: default}}\n  expect:\n    error: {message: %q}\n", c.ID, c.ID, where)
		}
		cases.WriteString("- name: fine\n  handler: fine\n  object: {apiVersion: example.com/v1, kind: Widget, metadata: {name: w, namespace: default}}\n  expect:\n    status: {fine: fine}\n")
		mustWrite(t, filepath.Join(dir, adversary.File), src)
		mustWrite(t, filepath.Join(dir, "tests", "adversary.yaml"), cases.String())
		out, code, rss := runMeasured(t, bin, "test", "-v", "--handler-timeout", deadline.String(), dir)
		t.Logf("luaop test: exit %d, peak RSS %.1f MiB", code, float64(rss)/(1<<20))
		if code != 0 {
			t.Fatalf("luaop test failed:\n%s", out)
		}
		if rss > adversaryMemLimit {
			t.Errorf("peak RSS %.1f MiB, over 384 MiB", float64(rss)/(1<<20))
		}
		took := regexp.MustCompile(`(?m)^ok +adversary\.yaml/(\S+) \(([^)]+)\)$`)
		seen := 0
		for _, m := range took.FindAllStringSubmatch(out, -1) {
			d, err := time.ParseDuration(m[2])
			if err != nil {
				t.Fatalf("duration %q: %v", m[2], err)
			}
			if d > deadline+time.Second {
				t.Errorf("%s took %s, more than a second past its %s deadline", m[1], d, deadline)
			}
			seen++
		}
		if seen != len(adversary.Cases)+1 {
			t.Errorf("%d cases reported, want %d:\n%s", seen, len(adversary.Cases)+1, out)
		}
	})

	// Each load case in a check of its own (a check reports compile errors
	// alone when any file does not compile), the cases that compile for seconds
	// with a deadline that lets the limit end them (adversary.LongCompile).
	for _, c := range adversary.LoadCases {
		t.Run("luaop check "+c.Name, func(t *testing.T) {
			dir := t.TempDir()
			mustWrite(t, filepath.Join(dir, c.Name+".lua"), c.Source())
			d := deadline
			if c.LongCompile {
				d = adversary.LongCompileDeadline
			}
			start := time.Now()
			out, code, rss := runMeasured(t, bin, "check", "--handler-timeout", d.String(), dir)
			t.Logf("luaop check: exit %d in %s, peak RSS %.1f MiB:\n%s", code, time.Since(start), float64(rss)/(1<<20), out)
			if rss > adversaryMemLimit {
				t.Errorf("peak RSS %.1f MiB, over 384 MiB", float64(rss)/(1<<20))
			}
			if c.Want == "" {
				if code != 0 {
					t.Errorf("exit %d, want 0", code)
				}
				return
			}
			if code != exitProblems {
				t.Errorf("exit %d, want %d (problems found)", code, exitProblems)
			}
			if want := fmt.Sprintf("%s.lua:%d: ", c.Name, c.Line); !strings.Contains(out, want) || !strings.Contains(out, c.Want) {
				t.Errorf("output lacks %s%s", want, c.Want)
			}
		})
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
