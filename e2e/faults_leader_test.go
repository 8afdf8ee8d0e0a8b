package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/testcluster"
)

// burstScript is sigkillScript (three create handlers; b takes a while in luaop.sleep,
// so that a burst keeps the leader busy) with a delete handler: its runs are the
// barrier before counting (the last thing that can happen to an object).
var burstScript = strings.ReplaceAll(sigkillScript, "SLEEP", "0.3") + `
	luaop.on.delete("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("DELETED " .. ctx.name .. " .")
	end, { id = "gone" })
`

// logLine is one line of `luaop run`'s JSON log.
type logLine struct {
	Time time.Time `json:"time"`
	Msg  string    `json:"msg"`
}

// logLines are the lines of a JSON log whose message passes keep, in order.
func logLines(log string, keep func(msg string) bool) []logLine {
	var out []logLine
	for _, line := range strings.Split(log, "\n") {
		var l logLine
		if json.Unmarshal([]byte(line), &l) == nil && keep(l.Msg) {
			out = append(out, l)
		}
	}
	return out
}

// isHandlerRun tells the handler lines of burstScript ("RAN ...", "STARTED ...").
func isHandlerRun(msg string) bool {
	return strings.HasPrefix(msg, "RAN ") || strings.HasPrefix(msg, "STARTED ")
}

// Two `luaop run` processes with leader election (the default lease settings of
// `luaop run`: 15 s lease, 10 s renew deadline, 2 s retry period); the leader is
// killed with SIGKILL while it handles a burst of objects. The standby takes over
// once the lease expires, every object ends handled, and no handler whose success
// was stored on the object before the kill runs again. The takeover time (the kill
// to the new leader's first handler run) is measured and logged, not asserted.
func TestLeaderKilledMidBurst(t *testing.T) {
	ns := env.Namespace(t)
	bin := buildLuaop(t)
	kubeconfig := writeKubeconfig(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "test.lua"), []byte(burstScript), 0o600); err != nil {
		t.Fatal(err)
	}
	elect := []string{"--leader-elect", "--leader-election-namespace", ns, "--leader-election-name", "luaop-e2e-kill",
		"--workers", "4", "--log-format", "json"}
	waitLog := func(p *process, timeout time.Duration, text string) {
		t.Helper()
		testcluster.Eventually(t, timeout, func() (bool, string) {
			return strings.Contains(p.log.String(), text), fmt.Sprintf("waiting for %q in the log of pid %d", text, p.cmd.Process.Pid)
		})
	}
	first := startLuaop(t, bin, kubeconfig, ns, dir, elect...)
	waitLog(first, 60*time.Second, "became leader")
	second := startLuaop(t, bin, kubeconfig, ns, dir, elect...)
	waitLog(second, 60*time.Second, "standing by; leader is ")

	const n = 40
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: %s}, spec: {size: 1}}", names[i]))
	}
	// Kill it mid-burst: some objects done, the others under way or waiting.
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		done := strings.Count(first.log.String(), `"RAN c `)
		return done >= 2, fmt.Sprintf("waiting for the leader to finish two objects: %d", done)
	})
	killed := time.Now()
	first.kill9(t)

	// What was stored on the objects before the kill must never run again.
	stored := map[string]map[string]bool{}
	storedCount := 0
	for _, name := range names {
		obj := get(t, widgets, ns, name)
		stored[name] = map[string]bool{}
		for _, id := range []string{"a", "b", "c"} {
			if v, _, _ := unstructured.NestedString(obj.Object, "status", id); v == "done" {
				stored[name][id] = true
				storedCount++
			}
		}
	}
	if storedCount == 3*n {
		t.Fatalf("every handler of every object was done before the kill: the kill was not mid-burst")
	}

	waitLog(second, 90*time.Second, "became leader")
	testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
		for _, name := range names {
			obj := get(t, widgets, ns, name)
			for _, id := range []string{"a", "b", "c"} {
				if v, _, _ := unstructured.NestedString(obj.Object, "status", id); v != "done" {
					return false, fmt.Sprintf("waiting for handler %s of %s to be done under the new leader", id, name)
				}
			}
		}
		return true, ""
	})

	// A handler run again on a stale body would come after the consistency
	// timeout: the counts are taken once every object is gone (its delete handler,
	// the last thing that can happen to it, ran and released its finalizer).
	for _, name := range names {
		if err := env.Dynamic.Resource(widgets).Namespace(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		waitWidgetGone(t, 90*time.Second, ns, name)
	}

	runs := logLines(second.log.String(), isHandlerRun)
	if len(runs) == 0 {
		t.Fatalf("the new leader ran no handler although %d of %d handler runs were left after the kill", 3*n-storedCount, 3*n)
	}
	for _, r := range runs {
		if r.Time.Before(killed) {
			t.Errorf("the standby ran a handler while the leader lived: %s at %s", r.Msg, r.Time.Format(time.RFC3339Nano))
		}
		f := strings.Fields(r.Msg) // RAN|STARTED id name .
		if len(f) == 4 && stored[f[2]][f[1]] {
			t.Errorf("handler %s of %s ran again under the new leader (%q) after its success was stored", f[1], f[2], r.Msg)
		}
	}
	// Within one process, no handler of an object runs twice.
	for who, p := range map[string]*process{"the killed leader": first, "the new leader": second} {
		logs := p.log.String()
		for _, name := range names {
			for _, id := range []string{"a", "b", "c"} {
				if got := strings.Count(logs, `"RAN `+id+" "+name+` ."`); got > 1 {
					t.Errorf("%s ran handler %s of %s %d times", who, id, name, got)
				}
			}
		}
	}
	for _, name := range names {
		if got := strings.Count(second.log.String(), `"DELETED `+name+` ."`); got != 1 {
			t.Errorf("the new leader ran the delete handler of %s %d times, want once", name, got)
		}
	}
	takeover := runs[0].Time.Sub(killed)
	elected := "?"
	if became := logLines(second.log.String(), func(msg string) bool { return msg == "became leader" }); len(became) > 0 {
		elected = became[0].Time.Sub(killed).Round(time.Millisecond).String()
	}
	t.Logf("leader killed with %d of %d handler runs stored; the standby became leader %s and ran its first handler %s after the kill "+
		"(lease 15s, retry period 2s); it logged %d handler lines", storedCount, 3*n, elected, takeover.Round(time.Millisecond), len(runs))
}
