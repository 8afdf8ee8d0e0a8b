package kindlike

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/luaop/luaop/testcluster"
)

var widgets = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}

// admissionScript: a validate handler with failure_policy "Fail" and a mutate
// handler giving a default, on the example Widgets.
const admissionScript = `
local luaop = require("luaop")
local WIDGETS = "examples.luaop.dev/v1/widgets"
luaop.on.validate(WIDGETS, function(ctx)
  local size = ctx.spec.size
  if size ~= nil and size > 100 then
    return false, "size " .. tostring(size) .. " is over 100"
  end
end, { id = "max-size", operations = { "CREATE", "UPDATE" }, failure_policy = "Fail" })
luaop.on.mutate(WIDGETS, function(ctx)
  if ctx.spec.size == nil then ctx.patch.spec.size = 7 end
end, { id = "default-size", operations = "CREATE", failure_policy = "Fail" })
`

// devProcess is one `luaop dev`, its view (plain: not a terminal) in a buffer.
type devProcess struct {
	cmd    *exec.Cmd
	log    *testcluster.LogBuffer
	exited chan struct{}
	err    error
}

func startDev(t *testing.T, c *cluster, args ...string) *devProcess {
	t.Helper()
	p := &devProcess{log: &testcluster.LogBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(c.Luaop, append([]string{"dev"}, args...)...)
	p.cmd.Env = append(os.Environ(), "NO_COLOR=1", "KUBECONFIG=/nonexistent")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting luaop dev: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("the view of luaop dev %s:\n%s", strings.Join(args, " "), p.log.String())
		}
	})
	return p
}

// stop ends luaop dev as Ctrl-C does, and waits for it.
func (p *devProcess) stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Error("luaop dev did not exit within 60 s of SIGINT")
	}
}

// waitLog waits until the view shows every part (on one line), or luaop dev exits.
func (p *devProcess) waitLog(t *testing.T, parts ...string) string {
	t.Helper()
	var line string
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		for _, l := range strings.Split(p.log.String(), "\n") {
			all := true
			for _, part := range parts {
				all = all && strings.Contains(l, part)
			}
			if all {
				line = l
				return true, ""
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("luaop dev exited (%v) before showing %q", p.err, parts)
		default:
		}
		return false, fmt.Sprintf("the view to show a line with %q", parts)
	})
	return line
}

func scriptsDir(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "handlers.lua"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func namespace(t *testing.T, c *cluster, base string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", base, rand.IntN(1_000_000))
	if _, err := c.Kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return name
}

func widget(ns, name string, size any) *unstructured.Unstructured {
	spec := map[string]any{}
	if size != nil {
		spec["size"] = size
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
}

// configurationsEver records every webhook configuration of prefix created while
// the test runs (a watch from now on), and tells which exist at the end.
type configWatch struct {
	mu   sync.Mutex
	seen map[string]bool
}

func watchConfigurations(t *testing.T, c *cluster, prefix string) *configWatch {
	t.Helper()
	cw := &configWatch{seen: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v, err := c.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []watch.Interface{v, m} {
		go func() {
			for ev := range w.ResultChan() {
				if ev.Type != watch.Added {
					continue
				}
				meta, err := metaOf(ev.Object)
				if err == nil && strings.HasPrefix(meta.GetName(), prefix+".") {
					cw.mu.Lock()
					cw.seen[meta.GetName()] = true
					cw.mu.Unlock()
				}
			}
		}()
	}
	return cw
}

func (cw *configWatch) created(name string) bool {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.seen[name]
}

func metaOf(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		return o, nil
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		return o, nil
	}
	return nil, fmt.Errorf("%T", obj)
}

// existing names the webhook configurations of prefix that exist now.
func existing(t *testing.T, c *cluster, prefix string) []string {
	t.Helper()
	var out []string
	vs, err := c.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs.Items {
		if strings.HasPrefix(v.Name, prefix+".") {
			out = append(out, v.Name)
		}
	}
	ms, err := c.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms.Items {
		if strings.HasPrefix(m.Name, prefix+".") {
			out = append(out, m.Name)
		}
	}
	return out
}

// The first thing an SRE does: luaop dev on a kind cluster, with no flag about
// webhooks. The API server (in its own network) reaches them at this machine's
// address on the route to the node; a validate handler with failure_policy "Fail"
// refuses a bad Widget with its message, a good one passes, the mutate handler's
// default is applied; at exit the configurations go.
func TestDevWebhooksOnAKindLikeCluster(t *testing.T) {
	c := require(t)
	ns := namespace(t, c, "kl-webhooks")
	const prefix = "kl-webhooks.test"
	root := testcluster.RepoRoot()
	dev := startDev(t, c, "--kubeconfig", c.Kubeconfig, "--apply", filepath.Join(root, "scripts", "examples", "crds"),
		"-n", ns, "--prefix", prefix, "--peering-namespace", ns, scriptsDir(t, admissionScript))
	reached := dev.waitLog(t, "the API server reaches them (probe")
	t.Logf("the view says: %s", reached)
	if want := "https://" + c.HostIP + ":"; !strings.Contains(reached, want) {
		t.Errorf("the webhooks are not registered at this machine's veth address %s: %s", want, reached)
	}
	// The cluster is named before anything is applied.
	view := dev.log.String()
	named, applied := strings.Index(view, `cluster: context "luaop-local", server https://127.0.0.1:`), strings.Index(view, " applied objects=")
	if named < 0 || applied < 0 || named > applied {
		t.Errorf("the view does not name the cluster before applying (at %d, applying at %d)", named, applied)
	}

	api := c.Dynamic.Resource(widgets).Namespace(ns)
	// The handlers' configurations are written after the probe: the API server
	// applies them a moment later (it reads them through a watch). A dry run
	// (nothing stored) shows when.
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		_, err := api.Create(t.Context(), widget(ns, "probe", 200), dry)
		if err == nil || !strings.Contains(err.Error(), "size 200 is over 100") {
			return false, fmt.Sprintf("a dry run of a bad widget refused by the handler (got %v)", err)
		}
		got, err := api.Create(t.Context(), widget(ns, "probe", nil), dry)
		if err != nil {
			return false, fmt.Sprintf("a dry run of a widget without size: %v", err)
		}
		size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size")
		return size == 7, fmt.Sprintf("a dry run of a widget without size defaulted (spec.size %d)", size)
	})
	_, err := api.Create(t.Context(), widget(ns, "too-big", 200), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), `admission webhook "max-size.validate.`+prefix+`" denied the request: size 200 is over 100`) {
		t.Errorf("a widget of size 200: %v, want the handler's refusal", err)
	}
	if _, err := api.Get(t.Context(), "too-big", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused widget exists (%v)", err)
	}
	if _, err := api.Create(t.Context(), widget(ns, "fine", int64(5)), metav1.CreateOptions{}); err != nil {
		t.Errorf("a widget of size 5: %v", err)
	}
	got, err := api.Create(t.Context(), widget(ns, "defaulted", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a widget without size: %v", err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 7 {
		t.Errorf("the mutate handler's default: spec.size = %d, want 7", size)
	}
	dev.stop(t)
	if left := existing(t, c, prefix); len(left) > 0 {
		t.Errorf("webhook configurations left after luaop dev exited: %v", left)
	}
}

// The same session where the API server cannot reach the address luaop dev
// listens on (an unreachable route in the cluster's network): nothing is
// registered but the probe's own configuration, which goes too; the view says why,
// in red, with what to do; the resource is not blocked.
func TestDevRegistersNothingTheAPIServerCannotReach(t *testing.T) {
	c := require(t)
	ns := namespace(t, c, "kl-noroute")
	const prefix = "kl-noroute.test"
	// A second address of this machine on the veth, to which the cluster's network
	// has no route.
	unreachable := strings.TrimSuffix(c.HostIP, ".1") + ".129"
	ipCmd(t, "addr", "add", unreachable+"/32", "dev", c.Veth)
	t.Cleanup(func() { ipCmdQuiet("addr", "del", unreachable+"/32", "dev", c.Veth) })
	ipCmd(t, "-n", c.Netns, "route", "add", "unreachable", unreachable+"/32")
	t.Cleanup(func() { ipCmdQuiet("-n", c.Netns, "route", "del", "unreachable", unreachable+"/32") })

	seen := watchConfigurations(t, c, prefix)
	dev := startDev(t, c, "--kubeconfig", c.Kubeconfig, "-n", ns, "--prefix", prefix, "--peering-namespace", ns,
		"--webhook-address", unreachable+":0", scriptsDir(t, admissionScript))
	line := dev.waitLog(t, "cannot call the webhook server at https://"+unreachable+":")
	t.Logf("the view says: %s", line)
	for _, part := range []string{"✘", "no route to host", "--webhook-url", "are not registered"} {
		if !strings.Contains(line, part) {
			t.Errorf("the view's line does not say %q: %s", part, line)
		}
	}
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		left := existing(t, c, prefix)
		return len(left) == 0, fmt.Sprintf("no configuration of %s left (%v)", prefix, left)
	})
	for _, name := range []string{prefix + ".validate", prefix + ".mutate"} {
		if seen.created(name) {
			t.Errorf("%s was created although the API server cannot reach the webhooks", name)
		}
	}
	if !seen.created(prefix + ".probe") {
		t.Error("no probe configuration was written: the failure did not come from a probe")
	}
	// Nothing blocks the resource: a widget the handler would refuse is stored.
	if _, err := c.Dynamic.Resource(widgets).Namespace(ns).Create(t.Context(), widget(ns, "big", 200), metav1.CreateOptions{}); err != nil {
		t.Errorf("creating a widget with no webhook registered: %v", err)
	}
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func ipCmdQuiet(args ...string) { _ = exec.Command("ip", args...).Run() }

// luaop dev against a cluster that is not a local one (here: the same API server
// reached at its address in its own network, under a context named like a shared
// cluster's) names it and exits before any write; allowed with --allow-context, it
// runs.
func TestDevRefusesASharedClusterBeforeAnyWrite(t *testing.T) {
	c := require(t)
	kc, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		cl.Server = "https://" + c.NodeIP + ":6443"
	}
	ctx := kc.Contexts[kc.CurrentContext]
	kc.Contexts = map[string]*clientcmdapi.Context{"shared-prod": ctx}
	kc.CurrentContext = "shared-prod"
	shared := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, shared); err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("kl-guard-%d", rand.IntN(1_000_000))
	manifest := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(manifest, []byte(fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied, namespace: %s}\n", ns, ns)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	scripts := scriptsDir(t, `local luaop = require("luaop")
luaop.on.create("v1/configmaps", function(ctx) return "seen" end, { id = "seen" })`)
	const prefix = "kl-guard.test"

	refused := startDev(t, c, "--kubeconfig", shared, "--apply", manifest, "-n", ns, "--prefix", prefix, scripts)
	select {
	case <-refused.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("luaop dev did not exit on a cluster that is not allowed")
	}
	view := refused.log.String()
	if refused.err == nil {
		t.Errorf("luaop dev exited with status 0 on a shared cluster:\n%s", view)
	}
	for _, part := range []string{`cluster: context "shared-prod", server https://` + c.NodeIP + ":6443",
		"is not a local one", "--context shared-prod", "--allow-context shared-prod"} {
		if !strings.Contains(view, part) {
			t.Errorf("the view does not say %q:\n%s", part, view)
		}
	}
	if _, err := c.Kube.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the namespace of --apply exists after the refusal (%v): luaop dev wrote before checking", err)
	}
	if left := existing(t, c, prefix); len(left) > 0 {
		t.Errorf("webhook configurations written: %v", left)
	}

	allowed := startDev(t, c, "--kubeconfig", shared, "--allow-context", "shared-prod", "--apply", manifest, "-n", ns, "--prefix", prefix,
		"--peering-namespace", ns, scripts)
	allowed.waitLog(t, "seen", "handler succeeded")
	if _, err := c.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "applied", metav1.GetOptions{}); err != nil {
		t.Errorf("with --allow-context the objects are applied: %v", err)
	}
}

// freeAddress is a loopback address with a port nothing listens on now.
func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
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

// luaop run applies the same check: /readyz and luaop_webhook_reachable say
// whether the API server reaches its webhook server at the address it registered.
func TestRunReportsWebhookReachability(t *testing.T) {
	c := require(t)
	ns := namespace(t, c, "kl-run")
	unreachable := strings.TrimSuffix(c.HostIP, ".1") + ".130"
	ipCmd(t, "addr", "add", unreachable+"/32", "dev", c.Veth)
	t.Cleanup(func() { ipCmdQuiet("addr", "del", unreachable+"/32", "dev", c.Veth) })
	ipCmd(t, "-n", c.Netns, "route", "add", "unreachable", unreachable+"/32")
	t.Cleanup(func() { ipCmdQuiet("-n", c.Netns, "route", "del", "unreachable", unreachable+"/32") })
	scripts := scriptsDir(t, admissionScript)
	for _, tc := range []struct {
		name, listen string
		code         int
		body, metric string
	}{
		{"reached", c.HostIP + ":0", http.StatusOK, "ok\n", "luaop_webhook_reachable 1"},
		{"not reached", unreachable + ":0", http.StatusServiceUnavailable, "not ready: the API server cannot call the webhook server at https://" + unreachable, "luaop_webhook_reachable 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			health := freeAddress(t)
			p := &devProcess{log: &testcluster.LogBuffer{}, exited: make(chan struct{})}
			p.cmd = exec.Command(c.Luaop, "run", "--kubeconfig", c.Kubeconfig, "-n", ns, "--prefix", "kl-run.test", "--peering-namespace", ns,
				"--webhook-address", tc.listen, "--webhook-cleanup", "--health-address", health, "--metrics-address", health, "--metrics-secure=false", scripts)
			p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
			if err := p.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { p.err = p.cmd.Wait(); close(p.exited) }()
			t.Cleanup(func() {
				p.stop(t)
				if t.Failed() {
					t.Logf("the log of luaop run:\n%s", p.log.String())
				}
			})
			testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
				code, body := httpGet(health, "/readyz")
				_, metrics := httpGet(health, "/metrics")
				return code == tc.code && strings.HasPrefix(body, tc.body) && strings.Contains(metrics, "\n"+tc.metric+"\n"),
					fmt.Sprintf("/readyz %d %q and %q in /metrics", code, body, tc.metric)
			})
		})
	}
}
