package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/luabind/adversary"
	"github.com/luaop/luaop/testcluster"
)

// Issue 34: a real `luaop run` with GOMEMLIMIT=384MiB (what deploy/ sets) serving one
// object per adversarial script: every attack fails its own handler with file:line
// and its reason, objects created meanwhile are handled, the process's peak RSS (the
// kernel's, getrusage of the child) stays under 384 MiB, and SIGTERM ends it while a
// runaway call runs, within the shutdown grace period.
func TestAdversarialOperator(t *testing.T) {
	ns := env.Namespace(t)
	bin := buildLuaop(t)
	kubeconfig := writeKubeconfig(t)
	dir := t.TempDir()
	src, lines := adversary.ScriptFor("examples.luaop.dev/v1/widgets", adversary.Cases, true)
	if err := os.WriteFile(filepath.Join(dir, adversary.File), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(dir string, flags ...string) *process {
		p := &process{log: &testcluster.LogBuffer{}}
		args := append([]string{"run", "--kubeconfig", kubeconfig, "--namespaces", ns,
			"--health-address=", "--metrics-address=", "--post-events=false", "--log-level", "info"}, flags...)
		p.cmd = exec.Command(bin, append(args, dir)...)
		p.cmd.Env = append(os.Environ(), "GOMEMLIMIT=384MiB")
		p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("starting luaop run: %v", err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the log of luaop run (pid %d):\n%s", p.cmd.Process.Pid, shortLines(p.log.String()))
			}
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		})
		return p
	}
	widget := func(name, attack string) string {
		return fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: %s, labels: {attack: %s}}, spec: {size: 1}}", name, attack)
	}
	// stop sends SIGTERM and returns how long the process took to exit and its peak
	// RSS in bytes.
	stop := func(p *process, within time.Duration) (time.Duration, int64) {
		t.Helper()
		start := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(within):
			t.Fatalf("luaop run still running %s after SIGTERM", within)
		}
		ru, _ := p.cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if ru == nil {
			t.Fatal("no rusage")
		}
		return time.Since(start), ru.Maxrss * 1024
	}

	p := start(dir, "--handler-timeout", "2s", "--shutdown-grace-period", "2s")
	for _, c := range adversary.Cases {
		create(t, widgets, ns, widget(adversary.LabelValue(c.ID), adversary.LabelValue(c.ID)))
	}
	// Objects created while the attacks run are handled.
	const fine = 5
	for i := range fine {
		create(t, widgets, ns, widget(fmt.Sprintf("fine-%d", i), "fine"))
	}
	testcluster.Eventually(t, 180*time.Second, func() (bool, string) {
		logs := strings.Split(p.log.String(), "\n")
		for _, c := range adversary.Cases {
			line := lines[c.ID]
			if c.Result {
				line--
			}
			where := fmt.Sprintf("%s:%d:", adversary.File, line)
			found := false
			for _, l := range logs {
				if (strings.Contains(l, `"handler":"`+c.ID+`"`) || strings.Contains(l, "handler="+c.ID+" ")) && strings.Contains(l, where) && c.Stopped(l) {
					found = true
					break
				}
			}
			if !found {
				return false, fmt.Sprintf("no log line of handler %s failing at %s with %q", c.ID, where, c.Want)
			}
		}
		for i := range fine {
			obj := get(t, widgets, ns, fmt.Sprintf("fine-%d", i))
			if v, _, _ := unstructured.NestedString(obj.Object, "status", "fine"); v != "fine" {
				return false, fmt.Sprintf("fine-%d not handled yet", i)
			}
		}
		return true, ""
	})
	took, rss := stop(p, 10*time.Second)
	t.Logf("luaop run: stopped %s after SIGTERM, peak RSS %.1f MiB", took, float64(rss)/(1<<20))
	if rss > 384<<20 {
		t.Errorf("peak RSS %.1f MiB, over 384 MiB", float64(rss)/(1<<20))
	}

	// SIGTERM during a runaway call whose deadline is far (10 minutes): the
	// shutdown grace period (2s) cancels it, the pattern matcher sees it.
	runaway := t.TempDir()
	if err := os.WriteFile(filepath.Join(runaway, "runaway.lua"), []byte(`local luaop = require("luaop")
luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
  ctx.logger.info("RUNAWAY " .. ctx.name)
  return string.find(string.rep("a", 990000), "a-b")
end, {id = "runaway", labels = {attack = "runaway"}})
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		create(t, widgets, ns, widget(fmt.Sprintf("runaway-%d", i), "runaway"))
	}
	q := start(runaway, "--handler-timeout", "10m", "--shutdown-grace-period", "2s")
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		return strings.Contains(q.log.String(), "RUNAWAY runaway-"), "waiting for a runaway call to start"
	})
	took, _ = stop(q, 15*time.Second)
	t.Logf("luaop run with runaway calls: stopped %s after SIGTERM", took)
	if took > 2*time.Second+5*time.Second {
		t.Errorf("stopped %s after SIGTERM, grace period 2s", took)
	}
}

// shortLines cuts every line of a log to 600 bytes (an attack logs 100 KB lines).
func shortLines(log string) string {
	lines := strings.Split(log, "\n")
	for i, l := range lines {
		if len(l) > 600 {
			lines[i] = l[:600] + "…"
		}
	}
	return strings.Join(lines, "\n")
}
