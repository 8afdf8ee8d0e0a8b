package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/testcluster"
)

// peeredScript counts its create handler's runs on the object, per operator (an
// annotation runs.test/<OWNER>), and has a daemon beating in status.beat_<OWNER>.
const peeredScript = `
local luaop = require("luaop")
local WIDGETS = "examples.luaop.dev/v1/widgets"
local OWNER = "__OWNER__"
luaop.on.create(WIDGETS, function(ctx)
  local key = "runs.test/" .. OWNER
  local n = tonumber((ctx.meta.annotations or {})[key] or "0") + 1
  ctx.patch.metadata.annotations[key] = tostring(n)
  return OWNER
end, { id = "count" })
luaop.daemon(WIDGETS, function(ctx)
  local n = 0
  while not ctx.stopped() do
    n = n + 1
    ctx.patch.status["beat_" .. OWNER] = n
    luaop.sleep(0.25)
  end
end, { id = "beat", cancellation_timeout = 5 })
`

// peer is one luaop process (run or dev) of the peering test.
type peer struct{ *luaopProcess }

func startPeer(t *testing.T, bin, command, owner string, args ...string) *peer {
	t.Helper()
	all := append([]string{command}, args...)
	script := strings.ReplaceAll(peeredScript, "__OWNER__", owner)
	return &peer{startLuaopProcess(t, bin, all, "peered.lua", script, "luaop "+command+" ("+owner+")", 0)}
}

// waitLines waits until the log has n lines containing text.
func (p *peer) waitLines(t *testing.T, text string, n int) {
	t.Helper()
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		got := strings.Count(p.log.String(), text)
		return got >= n, fmt.Sprintf("%d line(s) with %q in the log (%d so far)", n, text, got)
	})
}

// runsOf is how many times each operator ran the create handler on the object.
func runsOf(obj *unstructured.Unstructured) map[string]int {
	out := map[string]int{}
	for k, v := range obj.GetAnnotations() {
		if owner, ok := strings.CutPrefix(k, "runs.test/"); ok {
			n, _ := strconv.Atoi(v)
			out[owner] = n
		}
	}
	return out
}

func beatOf(obj *unstructured.Unstructured, owner string) int64 {
	n, _, _ := unstructured.NestedInt64(obj.Object, "status", "beat_"+owner)
	return n
}

// Peering as kopf has it: a `luaop run` (priority 0) handles the widgets; a `luaop
// dev` (666) on the same resources makes it pause (it handles nothing, its daemons
// stop) and only then works; when dev exits cleanly, run resumes at once; when dev
// is killed, run resumes when dev's lease expires. Every create handler runs
// exactly once per object across the handovers, counted on the objects.
func TestPeeringRunAndDevHandOver(t *testing.T) {
	ns := env.Namespace(t)
	bin := buildLuaop(t)
	kubeconfig := writeKubeconfig(t)
	common := []string{"--kubeconfig", kubeconfig, "-n", ns, "--prefix", "peering.e2e.test", "--peering-namespace", ns,
		"--peering-lease-duration", "4s", "--post-events=false"}
	health := freeLoopback(t)
	// Plain /metrics beside the probes (luaop run's default is HTTPS with
	// authentication, on an address of its own): the test reads luaop_peering_*.
	run := startPeer(t, bin, "run", "run", append(common, "--health-address", health, "--metrics-address", health, "--metrics-secure=false")...)
	run.waitLines(t, "no other operator of this prefix serves the same resources", 1)

	api := env.Dynamic.Resource(widgets).Namespace(ns)
	createWidget := func(name string) {
		t.Helper()
		if _, err := api.Create(t.Context(), mustYAML(t, fmt.Sprintf("apiVersion: examples.luaop.dev/v1\nkind: Widget\nmetadata: {name: %s}\nspec: {size: 1}\n", name)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(name, what string, cond func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
		t.Helper()
		var obj *unstructured.Unstructured
		testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
			o, err := api.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			obj = o
			return cond(o), fmt.Sprintf("%s: %s (runs %v, status %v)", name, what, runsOf(o), o.Object["status"])
		})
		return obj
	}
	// Handled: the handler's run counted and the cycle's bookkeeping stored (with
	// status storage, a /status patch after the object's: an operator killed between
	// the two has not finished its cycle, and the next one runs the handler again,
	// as it must).
	handledBy := func(owner string) func(*unstructured.Unstructured) bool {
		return func(o *unstructured.Unstructured) bool {
			_, stored, _ := unstructured.NestedString(o.Object, "status", "peering_e2e_test", "last-handled-configuration")
			return runsOf(o)[owner] >= 1 && stored
		}
	}

	createWidget("w1")
	waitFor("w1", "handled by run, its daemon beating", func(o *unstructured.Unstructured) bool {
		return handledBy("run")(o) && beatOf(o, "run") >= 2
	})

	// dev arrives: run pauses (its work in flight ended) before dev works.
	dev := startPeer(t, bin, "dev", "dev", common...)
	run.waitLines(t, "paused: the work in flight has ended", 1)
	dev.waitLines(t, "working; paused in favour of this operator", 1)
	frozen := beatOf(waitFor("w1", "read", func(*unstructured.Unstructured) bool { return true }), "run")
	// A paused operator is ready (it serves admission reviews), says why, and its
	// gauge says paused.
	if code, body := httpGet(health, "/readyz"); code != 200 || !strings.HasPrefix(body, "ok (paused: paused in favour of ") || !strings.Contains(body, "luaop dev") {
		t.Errorf("run's /readyz while paused: %d %q", code, body)
	}
	if _, body := httpGet(health, "/metrics"); !strings.Contains(body, "\nluaop_peering_paused 1\n") || !strings.Contains(body, "\nluaop_peering_peers 1\n") {
		t.Errorf("run's peering gauges while paused:\n%s", grepLines(body, "luaop_peering"))
	}
	createWidget("w2")
	waitFor("w2", "handled by dev", handledBy("dev"))
	// Dev's daemon on w1 beats three times: run's stays where it was.
	w1 := waitFor("w1", "dev's daemon beating", func(o *unstructured.Unstructured) bool { return beatOf(o, "dev") >= 3 })
	if got := beatOf(w1, "run"); got != frozen {
		t.Errorf("run's daemon beat on while paused: %d, then %d", frozen, got)
	}

	// dev exits cleanly: run resumes at once (its Lease is deleted).
	dev.signal(syscall.SIGINT)
	run.waitLines(t, "no other operator of this prefix serves the same resources", 2)
	createWidget("w3")
	waitFor("w3", "handled by run", handledBy("run"))
	// Beating again: a restarted daemon counts from 1, and what the stopped one
	// wrote last before the pause may only now be written (one value): three new
	// values are the restarted daemon's.
	beats := map[int64]bool{}
	waitFor("w1", "run's daemon beating again", func(o *unstructured.Unstructured) bool {
		if b := beatOf(o, "run"); b != frozen {
			beats[b] = true
		}
		return len(beats) >= 3
	})

	// dev again, then killed: run resumes once dev's lease expired.
	dev2 := startPeer(t, bin, "dev", "dev", common...)
	run.waitLines(t, "paused: the work in flight has ended", 2)
	createWidget("w4")
	waitFor("w4", "handled by dev", handledBy("dev"))
	dev2.signal(syscall.SIGKILL)
	createWidget("w5")
	waitFor("w5", "handled by run after dev's lease expired", handledBy("run"))
	run.waitLines(t, "no other operator of this prefix serves the same resources", 3)
	// Run's resume gives every object a cycle (its daemons start again): by then a
	// handler that would run twice has.
	for _, name := range []string{"w2", "w4"} {
		waitFor(name, "run's daemon beating after the resume", func(o *unstructured.Unstructured) bool { return beatOf(o, "run") >= 1 })
	}

	want := map[string]string{"w1": "run", "w2": "dev", "w3": "run", "w4": "dev", "w5": "run"}
	for name, owner := range want {
		o, err := api.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		runs := runsOf(o)
		total := 0
		for _, n := range runs {
			total += n
		}
		if total != 1 || runs[owner] != 1 {
			t.Errorf("%s: the create handler ran %v, want once, by %s", name, runs, owner)
		}
	}
}

// freeLoopback is a loopback address with a port nothing listens on now.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

func httpGet(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func grepLines(text, part string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, part) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
