package e2e

// Admission webhooks (issue 15): luaop.on.validate and luaop.on.mutate served by the
// operator's HTTPS server on loopback, called by the real API server through the
// ValidatingWebhookConfiguration and MutatingWebhookConfiguration the operator
// writes. What a user sees: kubectl create rejected with the handler's message,
// defaults filled in, configurations following the scripts, removed when asked.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

var doohickeys = schema.GroupVersionResource{Group: "e2e.luaop.dev", Version: "v1", Resource: "doohickeys"}

// startAdmission starts an operator with the scripts and its webhooks on loopback,
// with their own prefix (the callers then wait until the API server calls them: an
// object the handlers must reject or mutate). The webhooks are stopped, and their
// configurations removed, when the test ends.
func startAdmission(t *testing.T, ns, src string) (*testcluster.RunningOperator, *admission.Webhooks, string) {
	t.Helper()
	op := startWith(t, ns, operator.Options{Scripts: script(src)})
	prefix := ns + ".e2e.luaop.dev"
	wh, _ := serveWebhooks(t, op, ns, prefix, admission.Options{})
	return op, wh, prefix
}

// serveWebhooks serves the operator's admission handlers on loopback under prefix,
// for the namespace ns, with RemoveOnExit and opts's other settings (the log, unless
// opts has one: the operator's and the test's). stop ends them, removing their
// configurations, and returns Start's error; the end of the test calls it if the
// test did not, after the cleanups registered later (which may need the webhooks).
func serveWebhooks(t *testing.T, op *testcluster.RunningOperator, ns, prefix string, opts admission.Options) (wh *admission.Webhooks, stop func() error) {
	t.Helper()
	opts.Address, opts.Prefix, opts.Namespaces, opts.RemoveOnExit = "127.0.0.1:0", prefix, []string{ns}, true
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(op.Log, testWriterFor(t)), nil))
	}
	wh, err := admission.New(env.Config, op.Runtime(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- wh.Start(ctx) }()
	var once sync.Once
	var startErr error
	stop = func() error {
		once.Do(func() { cancel(); startErr = <-done })
		return startErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("webhooks: %v", err)
		}
	})
	return wh, stop
}

// warningCollector keeps the warnings the API server returns to a client.
type warningCollector struct {
	mu   sync.Mutex
	text []string
}

func (w *warningCollector) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	w.text = append(w.text, text)
	w.mu.Unlock()
}

func (w *warningCollector) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.text, "\n")
}

type tw struct{ t testing.TB }

func (w tw) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testWriterFor(t testing.TB) io.Writer { return tw{t} }

func doohickey(name string, spec string, labels ...string) *unstructured.Unstructured {
	lbl := ""
	if len(labels) > 0 {
		lbl = "\n  labels: {" + strings.Join(labels, ", ") + "}"
	}
	return mustYAML(nil, fmt.Sprintf("apiVersion: e2e.luaop.dev/v1\nkind: Doohickey\nmetadata:\n  name: %s%s\nspec: %s\n", name, lbl, spec))
}

func createDoohickey(t testing.TB, ns string, obj *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return env.Dynamic.Resource(doohickeys).Namespace(ns).Create(t.Context(), obj.DeepCopy(), opts)
}

// eventuallyRejected creates obj until the API server rejects it (the webhook
// configuration reaches the server's informer shortly after it is written), and
// returns the error; objects created meanwhile are deleted.
func eventuallyRejected(t *testing.T, ns string, obj *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	var rejected error
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := createDoohickey(t, ns, obj, dryRun)
		if err == nil {
			_ = env.Dynamic.Resource(doohickeys).Namespace(ns).Delete(t.Context(), obj.GetName(), metav1.DeleteOptions{})
			return false, "created: the webhook is not called yet"
		}
		if apierrors.IsAlreadyExists(err) {
			_ = env.Dynamic.Resource(doohickeys).Namespace(ns).Delete(t.Context(), obj.GetName(), metav1.DeleteOptions{})
			return false, err.Error()
		}
		rejected = err
		return true, ""
	})
	return rejected
}

func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}

const validateSrc = `
local luaop = require("luaop")
luaop.on.validate("e2e.luaop.dev/v1/Doohickey", function(ctx)
  if ctx.spec.size == nil then
    return false, "spec.size is required"
  end
  if ctx.spec.size > LIMIT then
    error(luaop.admission_error("spec.size must be at most LIMIT, got " .. ctx.spec.size, 422))
  end
end, {id = "size", operations = {"CREATE", "UPDATE"}})
`

func TestAdmissionValidateRejectsWithTheHandlersMessage(t *testing.T) {
	ns := env.Namespace(t)
	startAdmission(t, ns, strings.ReplaceAll(validateSrc, "LIMIT", "10"))

	err := eventuallyRejected(t, ns, doohickey("big", "{size: 11}"), false)
	mustContain(t, err, `admission webhook "size.validate.`+ns+`.e2e.luaop.dev" denied the request`, "spec.size must be at most 10, got 11")
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		t.Fatalf("error %T %v: want the API server's status", err, err)
	}
	if status.Status().Code != 422 {
		t.Errorf("code %d, want the handler's 422", status.Status().Code)
	}
	_, err = createDoohickey(t, ns, doohickey("none", "{}"), false)
	mustContain(t, err, "spec.size is required")
	if _, err := createDoohickey(t, ns, doohickey("fine", "{size: 3}"), false); err != nil {
		t.Fatalf("a valid object is rejected: %v", err)
	}
	// UPDATE is validated too.
	obj := get(t, doohickeys, ns, "fine")
	_ = unstructured.SetNestedField(obj.Object, int64(12), "spec", "size")
	_, err = env.Dynamic.Resource(doohickeys).Namespace(ns).Update(t.Context(), obj, metav1.UpdateOptions{})
	mustContain(t, err, "spec.size must be at most 10, got 12")
}

func TestAdmissionMutateAddsDefaults(t *testing.T) {
	ns := env.Namespace(t)
	startAdmission(t, ns, `
local luaop = require("luaop")
luaop.on.mutate("e2e.luaop.dev/v1/doohickeys", function(ctx)
  if ctx.spec.color == nil then ctx.patch.spec.color = "blue" end
  ctx.patch.metadata.labels["e2e.luaop.dev/defaulted"] = "true"
  if ctx.spec.obsolete ~= nil then ctx.patch.spec.obsolete = luaop.null end
end, {id = "defaults", operations = "CREATE"})
luaop.on.validate("e2e.luaop.dev/v1/doohickeys", function(ctx)
  if ctx.name == "probe" then return false, "probe" end
end, {id = "probe"})
`)
	eventuallyRejected(t, ns, doohickey("probe", "{}"), false)
	// Both configurations are live once the probe is rejected? The mutating one is
	// written in the same sync; wait for its effect.
	var obj *unstructured.Unstructured
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		created, err := createDoohickey(t, ns, doohickey("d1", "{size: 1, obsolete: true}"), false)
		if err != nil {
			return false, err.Error()
		}
		if created.GetLabels()["e2e.luaop.dev/defaulted"] == "true" {
			obj = created
			return true, ""
		}
		_ = env.Dynamic.Resource(doohickeys).Namespace(ns).Delete(t.Context(), "d1", metav1.DeleteOptions{})
		return false, "not mutated yet"
	})
	spec, _, _ := unstructured.NestedMap(obj.Object, "spec")
	if spec["color"] != "blue" || spec["size"] != int64(1) || spec["obsolete"] != nil {
		t.Errorf("spec = %v, want color blue added, size kept, obsolete removed", spec)
	}
	kept, err := createDoohickey(t, ns, doohickey("d2", "{color: red}"), false)
	if err != nil {
		t.Fatal(err)
	}
	if c, _, _ := unstructured.NestedString(kept.Object, "spec", "color"); c != "red" {
		t.Errorf("color %q: a given value must be kept", c)
	}
}

func TestAdmissionDryRunHasNoSideEffects(t *testing.T) {
	ns := env.Namespace(t)
	startAdmission(t, ns, `
local luaop = require("luaop")
luaop.on.validate("e2e.luaop.dev/v1/doohickeys", function(ctx)
  -- a side effect: record the request in a ConfigMap
  luaop.kube.create({apiVersion = "v1", kind = "ConfigMap",
    metadata = {name = "seen-" .. ctx.name, namespace = ctx.namespace}, data = {dryrun = tostring(ctx.dryrun)}})
  if ctx.dryrun then return false, "dryrun=" .. tostring(ctx.dryrun) .. " user=" .. ctx.userinfo.username end
end, {id = "recorder", side_effects = true})
`)
	err := eventuallyRejected(t, ns, doohickey("dry", "{}"), true)
	mustContain(t, err, "dryrun=true", "user=")
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "seen-dry", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the dry-run request's luaop.kube.create was sent (get: %v)", err)
	}
	if _, err := createDoohickey(t, ns, doohickey("wet", "{}"), false); err != nil {
		t.Fatal(err)
	}
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "seen-wet", metav1.GetOptions{})
	if err != nil || cm.Data["dryrun"] != "false" {
		t.Errorf("a real request's side effect: %v %v", cm, err)
	}
	// The configuration declares the side effects (kopf: side_effects=True).
	vname, _ := admission.ConfigurationNames(ns + ".e2e.luaop.dev")
	vc, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), vname, metav1.GetOptions{})
	if err != nil || *vc.Webhooks[0].SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		t.Errorf("configuration %v, %v: want sideEffects NoneOnDryRun", vc, err)
	}
}

func TestAdmissionFailurePolicy(t *testing.T) {
	ns := env.Namespace(t)
	startAdmission(t, ns, `
local luaop = require("luaop")
luaop.on.validate("e2e.luaop.dev/v1/doohickeys", function(ctx)
  error("the strict handler broke")
end, {id = "strict", labels = {policy = "fail"}})
luaop.on.validate("e2e.luaop.dev/v1/doohickeys", function(ctx)
  error("the lenient handler broke")
end, {id = "lenient", labels = {policy = "ignore"}, failure_policy = "Ignore"})
luaop.on.validate("e2e.luaop.dev/v1/doohickeys", function(ctx)
  while true do end
end, {id = "slow", labels = {policy = "slow"}, timeout = 2.5, failure_policy = "Fail"})
`)
	err := eventuallyRejected(t, ns, doohickey("f", "{}", "policy: fail"), false)
	mustContain(t, err, "admission handler strict failed: test.lua:4: the strict handler broke")
	// Allowed, with the failure as a warning the client shows (kubectl: "Warning: ...").
	warnings := &warningCollector{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = warnings
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(doohickeys).Namespace(ns).Create(t.Context(), doohickey("i", "{}", "policy: ignore"), metav1.CreateOptions{}); err != nil {
		t.Errorf("failure_policy Ignore: the request must be allowed, got %v", err)
	}
	if got := warnings.all(); !strings.Contains(got, "admission handler lenient failed: test.lua:7: the lenient handler broke; allowed (failure_policy Ignore)") {
		t.Errorf("warnings returned to the client %q: want the lenient handler's failure", got)
	}
	// A handler past its deadline is answered per its policy before the webhook's
	// timeout (2.5 s: 2 s for the API server): the API server reports the handler's failure, not its own
	// timeout.
	_, err = createDoohickey(t, ns, doohickey("s", "{}", "policy: slow"), false)
	mustContain(t, err, "admission handler slow failed", "deadline")
	if err != nil && strings.Contains(err.Error(), "context deadline exceeded (Client.Timeout") {
		t.Errorf("the API server timed out waiting: %v", err)
	}
}

func TestAdmissionReloadChangesVerdictAndRules(t *testing.T) {
	ns := env.Namespace(t)
	op, wh, prefix := startAdmission(t, ns, strings.ReplaceAll(validateSrc, "LIMIT", "10"))
	vname, mname := admission.ConfigurationNames(prefix)
	err := eventuallyRejected(t, ns, doohickey("fifty", "{size: 50}"), false)
	mustContain(t, err, "at most 10")
	vc, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), vname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vc.Webhooks) != 1 || fmt.Sprint(vc.Webhooks[0].Rules[0].Resources) != "[doohickeys]" ||
		fmt.Sprint(vc.Webhooks[0].Rules[0].Operations) != "[CREATE UPDATE]" || len(vc.Webhooks[0].ClientConfig.CABundle) == 0 ||
		!strings.HasPrefix(*vc.Webhooks[0].ClientConfig.URL, "https://127.0.0.1:") {
		t.Fatalf("configuration = %+v", vc.Webhooks)
	}

	// A reload raising the limit: the next request gets the new verdict.
	reload := func(src string) {
		t.Helper()
		if _, err := op.LoadScripts(t.Context(), script(src)); err != nil {
			t.Fatal(err)
		}
		wh.Resync()
	}
	// A reload lowering the limit: the next request gets the new verdict (a
	// rejection with the new message: an allowed request could also be one the
	// webhook never saw).
	if _, err := createDoohickey(t, ns, doohickey("seven", "{size: 7}"), false); err != nil {
		t.Fatalf("before the reload, size 7 is valid: %v", err)
	}
	reload(strings.ReplaceAll(validateSrc, "LIMIT", "5"))
	_, err = createDoohickey(t, ns, doohickey("eight", "{size: 8}"), false)
	mustContain(t, err, "spec.size must be at most 5, got 8")
	// And raising it: size 50 is now valid.
	reload(strings.ReplaceAll(validateSrc, "LIMIT", "100"))
	if _, err := createDoohickey(t, ns, doohickey("fifty", "{size: 50}"), false); err != nil {
		t.Fatalf("after the reload, size 50 is valid: %v", err)
	}

	// A reload adding a mutate handler and changing the operations: the
	// configurations follow.
	reload(strings.ReplaceAll(strings.ReplaceAll(validateSrc, "LIMIT", "100"), `{"CREATE", "UPDATE"}`, `"DELETE"`) + `
luaop.on.mutate("e2e.luaop.dev/v1/doohickeys", function(ctx) ctx.patch.spec.touched = true end, {id = "touch"})
`)
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		vc, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), vname, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		mc, err := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), mname, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ops := fmt.Sprint(vc.Webhooks[0].Rules[0].Operations)
		return ops == "[DELETE]" && len(mc.Webhooks) == 1 && mc.Webhooks[0].Name == "touch.mutate."+prefix,
			fmt.Sprintf("validate operations %s, mutate webhooks %d", ops, len(mc.Webhooks))
	})

	// A reload without admission handlers: both configurations are deleted.
	reload(`require("luaop").on.create("e2e.luaop.dev/v1/doohickeys", function() end)`)
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		_, errV := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), vname, metav1.GetOptions{})
		_, errM := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), mname, metav1.GetOptions{})
		return apierrors.IsNotFound(errV) && apierrors.IsNotFound(errM), fmt.Sprintf("still there: %v / %v", errV, errM)
	})
}

func TestAdmissionConfigurationsRemovedWhenAsked(t *testing.T) {
	ns := env.Namespace(t)
	op, _, prefix := startAdmission(t, ns, strings.ReplaceAll(validateSrc, "LIMIT", "10"))
	vname, _ := admission.ConfigurationNames(prefix)
	eventuallyRejected(t, ns, doohickey("big", "{size: 11}"), false)

	// Another operator's webhooks with RemoveOnExit: stopping it removes them.
	other := ns + ".other.luaop.dev"
	_, stop := serveWebhooks(t, op, ns, other, admission.Options{})
	ovname, _ := admission.ConfigurationNames(other)
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		_, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), ovname, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), ovname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after stopping with RemoveOnExit, %s: %v; want it deleted", ovname, err)
	}

	// Removal on request (luaop webhooks remove): the first operator's are gone, and
	// the API server stops calling them.
	syncer := &admission.Syncer{Client: env.Kube, Prefix: prefix}
	if err := syncer.Remove(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), vname, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s after Remove: %v", vname, err)
	}
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := createDoohickey(t, ns, doohickey("big", "{size: 11}"), false)
		return err == nil, fmt.Sprint(err)
	})
}

// A webhook whose handler is gone (removed by a reload, a stale configuration)
// is answered per the failure policy it was written with: under Fail the request
// is rejected with the reason, not let through.
func TestAdmissionUnknownHandlerFailsClosed(t *testing.T) {
	ns := env.Namespace(t)
	_, _, prefix := startAdmission(t, ns, strings.ReplaceAll(validateSrc, "LIMIT", "10"))
	vname, _ := admission.ConfigurationNames(prefix)
	eventuallyRejected(t, ns, doohickey("big", "{size: 11}"), false)
	api := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	vc, err := api.Get(t.Context(), vname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := *vc.Webhooks[0].ClientConfig.URL
	if !strings.HasSuffix(u, "/fail/validate/size") {
		t.Fatalf("webhook URL %s: want the failure policy in the path", u)
	}
	stale := strings.TrimSuffix(u, "/size") + "/gone"
	vc.Webhooks[0].ClientConfig.URL = &stale
	if _, err := api.Update(t.Context(), vc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := createDoohickey(t, ns, doohickey("ok", "{size: 1}"), true)
		if err == nil {
			return false, "allowed: the stale webhook is not called yet, or lets requests through"
		}
		return strings.Contains(err.Error(), "luaop serves no admission handler at /validate/gone") &&
			strings.Contains(err.Error(), "rejected (failure_policy Fail)"), err.Error()
	})
}
