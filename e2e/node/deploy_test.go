package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/luaop/luaop/imagebuild"
)

var widgets = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}

const (
	operatorNS = "luaop-system"
	objectsNS  = "e2e-objects" // the example objects and the counted widgets
	image      = "luaop:latest"
	rollout    = "luaop:rollout" // the same image under another name: a rolling update
)

// suite is the state the steps share, in order.
type suite struct {
	c       *nodeCluster
	report  report
	work    string // the suite's scratch folder
	luaop   string // the luaop binary of the image, for luaop release on the host
	overlay string // a copy of deploy/ (base, components, examples) the steps edit
	// brokenLine is the line of the syntax error the broken widgets.lua has.
	brokenLine int
	// created are the widgets whose create handler ran (each must have run once).
	mu      sync.Mutex
	created []string
}

// TestDeployOnNode runs deploy/ on the node, step by step; a step that fails stops
// the ones after it (they build on it).
func TestDeployOnNode(t *testing.T) {
	c := need(t)
	s := &suite{c: c, work: t.TempDir()}
	defer func() { t.Logf("the node suite's measurements:\n%s", s.report.String()) }()
	start := time.Now()
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"ImageWithoutDocker", s.image},
		{"ApplyExamples", s.applyExamples},
		{"WebhooksThroughService", s.webhooks},
		{"GuardRefusesBrokenEdit", s.guard},
		{"ScriptsEditReachesPods", s.scriptsEdit},
		{"LeaderPodDeleted", s.leaderDeleted},
		{"RollingUpdate", s.rollingUpdate},
		{"NoHandlerRanTwice", s.noHandlerRanTwice},
		{"ReadinessFollowsReadyz", s.readiness},
		{"ProbeFailureUnready", s.probeReadiness},
		{"LivenessRestartsWhenAsked", s.liveness},
		{"MemoryBomb", s.memoryBomb},
		{"Uninstall", func(t *testing.T) { s.uninstall(t, operatorNS, filepath.Join(s.overlay, "examples")) }},
		{"OverlayInAnotherNamespace", s.otherNamespace},
		{"ShardedAcrossReplicas", s.sharded},
	}
	for _, st := range steps {
		began := time.Now()
		ok := t.Run(st.name, st.run)
		s.report.add(st.name, "%s", ms(time.Since(began)))
		if !ok {
			t.Fatalf("step %s failed: the steps after it build on it", st.name)
		}
	}
	s.report.add("the whole suite", "%s", ms(time.Since(start)))
}

// image builds luaop's image with imagebuild (the second recipe of the Dockerfile)
// and imports it into the node's containerd under two names.
func (s *suite) image(t *testing.T) {
	c := s.c
	began := time.Now()
	s.luaop = filepath.Join(s.work, "luaop")
	if err := imagebuild.GoBuild(t.Context(), c.repo, "./cmd/luaop", s.luaop, "", imagebuild.Recipe.VersionFlag+"=node-e2e"); err != nil {
		t.Fatal(err)
	}
	img, err := imagebuild.Build(t.Context(), imagebuild.Options{ModuleDir: c.repo, Binary: s.luaop, Version: "node-e2e"})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(s.work, "luaop-image.tar")
	if err := imagebuild.WriteArchive(archive, img, image, rollout); err != nil {
		t.Fatal(err)
	}
	s.report.add("  image: compile and build the archive", "%s", ms(time.Since(began)))
	began = time.Now()
	if _, err := c.ctr(t.Context(), "images", "import", archive); err != nil {
		t.Fatal(err)
	}
	s.report.add("  image: ctr images import", "%s", ms(time.Since(began)))
	out, err := c.ctr(t.Context(), "images", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"docker.io/library/" + image, "docker.io/library/" + rollout} {
		if !strings.Contains(out, name+"\n") {
			t.Errorf("containerd does not list %s after the import:\n%s", name, out)
		}
	}
	// The copy of deploy/ the later steps edit.
	s.overlay = filepath.Join(s.work, "deploy")
	for _, d := range []string{"base", "components", "examples"} {
		copyTree(t, filepath.Join(c.repo, "deploy", d), filepath.Join(s.overlay, d))
	}
}

// applyExamples: kubectl apply -k deploy/examples; both replicas Running and Ready
// under the restricted Pod Security Standard, non-root with a read-only root
// filesystem (as the kernel shows them), the leader handles the example objects
// and the standby nothing.
func (s *suite) applyExamples(t *testing.T) {
	c := s.c
	began := time.Now()
	c.mustKubectl(t, "apply", "-k", filepath.Join(c.repo, "deploy", "examples"))
	pods := c.waitPods(t, operatorNS, 2, image, 3*time.Minute)
	s.report.add("  apply -k deploy/examples -> 2 pods Ready", "%s", ms(time.Since(began)))

	ns, err := c.kube.CoreV1().Namespaces().Get(t.Context(), operatorNS, metaGet)
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("namespace %s does not enforce the restricted Pod Security Standard: %v", operatorNS, ns.Labels)
	}
	// Enforced for real: a pod that does not meet it (no securityContext: it may
	// run as root, escalate, keep capabilities) is refused there.
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "psa-probe"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "c", Image: image}}}}
	_, err = c.kube.CoreV1().Pods(operatorNS).Create(t.Context(), plain, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) {
		t.Errorf("a pod without securityContext in %s: %v, want a refusal by Pod Security (restricted)", operatorNS, err)
	}
	// What the kernel shows of each container.
	for _, p := range pods {
		pid := c.containerPID(t, p)
		for field, want := range map[string]string{
			"Uid": "65532 65532 65532 65532", "Gid": "65532 65532 65532 65532",
			"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
		} {
			if got := procStatus(t, pid, field); got != want {
				t.Errorf("pod %s, process %d: %s %q, want %q", p.Name, pid, field, got, want)
			}
		}
		if opts := rootMountOptions(t, pid); !strings.HasPrefix(opts, "ro") {
			t.Errorf("pod %s: the root filesystem is mounted %q, want read-only", p.Name, opts)
		}
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/root/scripts/..data", pid)); err != nil || !strings.HasPrefix(target, "..") {
			t.Errorf("pod %s: /scripts/..data is %q (%v): want the kubelet's atomic writer's link", p.Name, target, err)
		}
	}
	leader := c.leaderPod(t, operatorNS, pods)
	standby := pods[0]
	if standby.Name == leader.Name {
		standby = pods[1]
	}

	// The example objects, in a namespace of their own.
	began = time.Now()
	c.mustKubectl(t, "create", "namespace", objectsNS)
	c.mustKubectl(t, "-n", objectsNS, "apply", "-f", filepath.Join(c.repo, "scripts", "examples", "objects"))
	// Handled: each has a status field its handler, daemon or timer wrote (luaop's
	// own bookkeeping, status.luaop_dev, does not count).
	handled := map[string]time.Duration{}
	eventually(t, 2*time.Minute, func() (bool, string) {
		var waiting []string
		for _, res := range []string{"widgets", "generators", "monitors", "quotas", "teams", "tenants"} {
			gvr := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: res}
			list, err := c.dyn.Resource(gvr).Namespace(objectsNS).List(t.Context(), metav1.ListOptions{})
			if err != nil || len(list.Items) == 0 {
				waiting = append(waiting, res)
				continue
			}
			for _, obj := range list.Items {
				status, _, _ := unstructured.NestedMap(obj.Object, "status")
				delete(status, "luaop_dev")
				key := res + "/" + obj.GetName()
				if _, done := handled[key]; len(status) > 0 && !done {
					handled[key] = time.Since(began)
				} else if len(status) == 0 {
					waiting = append(waiting, key)
				}
			}
		}
		return len(waiting) == 0 && len(handled) == 6, fmt.Sprintf("no status written yet: %v", waiting)
	})
	var slowest string
	for k, d := range handled {
		if slowest == "" || d > handled[slowest] {
			slowest = k
		}
	}
	s.report.add("  the 6 example objects handled", "%s (the last: %s)", ms(handled[slowest]), slowest)
	if msg := c.mustKubectl(t, "-n", objectsNS, "get", "widget", "my-widget", "-o", "jsonpath={.status.greet.message}"); msg != "hello from Lua" {
		t.Errorf("my-widget's status.greet.message %q", msg)
	}
	if _, err := c.kube.CoreV1().ConfigMaps(objectsNS).Get(t.Context(), "my-generator-generated", metaGet); err != nil {
		t.Errorf("the generator's ConfigMap: %v", err)
	}
	// /metrics as Prometheus scrapes it (deploy/components: the ServiceMonitor's
	// HTTPS and bearer token, the ClusterRole luaop-metrics-reader bound to its
	// ServiceAccount); the operator asks the API server about each token
	// (TokenReview, SubjectAccessReview). Without a token, 401; with one the role is
	// not bound to, 403.
	c.mustKubectl(t, "apply", "-f", filepath.Join(c.repo, "deploy", "components", "prometheus", "metrics-reader.yaml"))
	defer func() {
		// Cluster-wide, and not part of the overlay: the uninstall must not find them.
		c.mustKubectl(t, "delete", "clusterrolebinding", "e2e-metrics-scraper", "--ignore-not-found")
		c.mustKubectl(t, "delete", "-f", filepath.Join(c.repo, "deploy", "components", "prometheus", "metrics-reader.yaml"), "--ignore-not-found")
	}()
	scraper := c.serviceAccountToken(t, objectsNS, "e2e-scraper")
	stranger := c.serviceAccountToken(t, objectsNS, "e2e-stranger")
	c.mustKubectl(t, "create", "clusterrolebinding", "e2e-metrics-scraper", "--clusterrole", "luaop-metrics-reader", "--serviceaccount", objectsNS+":e2e-scraper")
	for token, want := range map[string]int{"": 401, stranger: 403} {
		code, body, err := getMetrics(t.Context(), leader.Status.PodIP, 9090, token)
		if err != nil || code != want {
			t.Errorf("/metrics of %s with the token of %s: %d %v %.200q, want %d", leader.Name, map[string]string{"": "nobody", stranger: "a ServiceAccount without luaop-metrics-reader"}[token], code, err, body, want)
		}
	}
	if code, _, err := get(t.Context(), leader.Status.PodIP, 9090, "/metrics"); err == nil && code == 200 {
		t.Errorf("/metrics of %s answers plain HTTP; want HTTPS only", leader.Name)
	}
	// The standby handled nothing; the leader did.
	for _, p := range []struct {
		pod    corev1.Pod
		leader bool
	}{{leader, true}, {standby, false}} {
		var code int
		var text string
		var err error
		// The API server's RBAC authorizer sees the binding just made through its
		// informers (soon, not at once); a denial meanwhile is reused by the operator
		// for 10 s (kubeauth's DeniedTTL), then asked again.
		eventually(t, 30*time.Second, func() (bool, string) {
			code, text, err = getMetrics(t.Context(), p.pod.Status.PodIP, 9090, scraper)
			return err == nil && code == 200, fmt.Sprintf("/metrics of %s with luaop-metrics-reader: %d %v %.200q", p.pod.Name, code, err, text)
		})
		runs, master := metricSum(text, "luaop_handler_runs_total"), metricSum(text, "leader_election_master_status")
		if p.leader && (runs == 0 || master != 1) {
			t.Errorf("leader %s: %v handler runs, leader_election_master_status %v", p.pod.Name, runs, master)
		}
		if !p.leader && (runs != 0 || master != 0) {
			t.Errorf("standby %s: %v handler runs, leader_election_master_status %v; want none and 0", p.pod.Name, runs, master)
		}
		if p.leader {
			s.report.add("  handler runs: leader / standby", "%v / 0 (%s / %s)", runs, p.pod.Name, standby.Name)
		}
	}
}

// webhooks: the examples' validate and mutate handlers, served by the pods through
// the Service luaop-webhook.
func (s *suite) webhooks(t *testing.T) {
	c := s.c
	for _, kind := range []string{"validatingwebhookconfiguration", "mutatingwebhookconfiguration"} {
		name := map[string]string{"validatingwebhookconfiguration": "luaop.dev.validate", "mutatingwebhookconfiguration": "luaop.dev.mutate"}[kind]
		svc := c.mustKubectl(t, "get", kind, name, "-o", `jsonpath={range .webhooks[*]}{.clientConfig.service.namespace}/{.clientConfig.service.name} {end}`)
		for _, s := range strings.Fields(svc) {
			if s != operatorNS+"/luaop-webhook" {
				t.Errorf("%s %s calls %s, want the Service %s/luaop-webhook", kind, name, s, operatorNS)
			}
		}
	}
	began := time.Now()
	out, err := applyYAML(t, c, objectsNS, "apiVersion: examples.luaop.dev/v1\nkind: Widget\nmetadata: {name: too-big}\nspec: {size: 1000}\n")
	took := time.Since(began)
	if err == nil || !strings.Contains(err.Error(), "spec.size must be a number from 1 to 100, got 1000") {
		t.Errorf("a widget of size 1000: %v %s, want the validate handler's refusal", err, out)
	}
	s.report.add("  validate webhook refuses (kubectl apply)", "%s", ms(took))
	began = time.Now()
	if _, err := applyYAML(t, c, objectsNS, "apiVersion: examples.luaop.dev/v1\nkind: Widget\nmetadata: {name: no-size}\nspec: {}\n"); err != nil {
		t.Fatal(err)
	}
	s.report.add("  mutate webhook defaults (kubectl apply)", "%s", ms(time.Since(began)))
	if size := c.mustKubectl(t, "-n", objectsNS, "get", "widget", "no-size", "-o", "jsonpath={.spec.size}"); size != "1" {
		t.Errorf("a widget without size was stored with size %q, want 1 (the mutate handler)", size)
	}
}

func applyYAML(t *testing.T, c *nodeCluster, ns, yaml string) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "object.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return c.kubectlErr(t.Context(), "-n", ns, "apply", "-f", f)
}

// breakWidgets writes a widgets.lua into the overlay with a syntax error on its last
// line (remembered in s.brokenLine); restore puts the example back.
func (s *suite) breakWidgets(t *testing.T) (restore func()) {
	t.Helper()
	path := filepath.Join(s.overlay, "examples", "scripts", "widgets.lua")
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	broken := string(good) + "this is not Lua\n"
	s.brokenLine = strings.Count(broken, "\n")
	if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(path, good, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// guard: an edit of the scripts whose code does not load is refused by the
// operator's webhook, through its Service, with file:line; the ConfigMap stays.
func (s *suite) guard(t *testing.T) {
	c := s.c
	before, err := c.kube.CoreV1().ConfigMaps(operatorNS).Get(t.Context(), "luaop-scripts", metaGet)
	if err != nil {
		t.Fatal(err)
	}
	restore := s.breakWidgets(t)
	defer restore()
	began := time.Now()
	_, err = c.kubectlErr(t.Context(), "apply", "-k", filepath.Join(s.overlay, "examples"))
	s.report.add("  a broken edit refused (kubectl apply -k)", "%s", ms(time.Since(began)))
	where := fmt.Sprintf("widgets.lua:%d", s.brokenLine)
	if err == nil || !strings.Contains(err.Error(), "do not load") || !strings.Contains(err.Error(), where) {
		t.Fatalf("kubectl apply -k of a broken widgets.lua: %v; want a refusal naming %s", err, where)
	}
	after, err := c.kube.CoreV1().ConfigMaps(operatorNS).Get(t.Context(), "luaop-scripts", metaGet)
	if err != nil {
		t.Fatal(err)
	}
	if after.Data["widgets.lua"] != before.Data["widgets.lua"] {
		t.Error("the refused edit changed the ConfigMap")
	}
}

// addCountingScript adds testdata/e2e-count.lua to the overlay's scripts.
func (s *suite) addCountingScript(t *testing.T) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(s.c.repo, "e2e", "node", "testdata", "e2e-count.lua"))
	if err != nil {
		t.Fatal(err)
	}
	examples := filepath.Join(s.overlay, "examples")
	if err := os.WriteFile(filepath.Join(examples, "scripts", "e2e-count.lua"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	kpath := filepath.Join(examples, "kustomization.yaml")
	k, err := os.ReadFile(kpath)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(k), "  # END scripts", "  - scripts/e2e-count.lua\n  # END scripts", 1)
	if edited == string(k) {
		t.Fatal("deploy/examples/kustomization.yaml has no '# END scripts' marker")
	}
	if err := os.WriteFile(kpath, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
}

// podsState is each operator pod's scripts hash (/readyz) and ..data link.
type podState struct {
	hash, data string
	status     int
	body       string
}

func (s *suite) podStates(t *testing.T, pods []corev1.Pod) map[string]podState {
	t.Helper()
	states := map[string]podState{}
	for _, p := range pods {
		code, body, _ := get(t.Context(), p.Status.PodIP, 8080, "/readyz")
		var data string
		if pid := s.c.containerPID(t, p); pid > 0 {
			data, _ = os.Readlink(fmt.Sprintf("/proc/%d/root/scripts/..data", pid))
		}
		states[p.Name] = podState{hash: readyzHash(body), data: data, status: code, body: body}
	}
	return states
}

// scriptsEdit: a new script added with kubectl apply -k reaches both pods through
// the API (each reads its scripts ConfigMap with a watch: --scripts-from-api), well
// before the kubelet swaps /scripts/..data: both report the new hash on /readyz and
// run the new code (its probe handler's log line in each pod's log; its create
// handler for a new widget on the leader), without a restart. Then the kubelet's
// copy arrives and nothing reloads a second time. The times from the apply are
// measured.
func (s *suite) scriptsEdit(t *testing.T) {
	c := s.c
	pods := c.waitPods(t, operatorNS, 2, image, time.Minute)
	before := s.podStates(t, pods)
	s.addCountingScript(t)
	applied := time.Now() // from the user's command: kubectl's own time is part of it
	c.mustKubectl(t, "apply", "-k", filepath.Join(s.overlay, "examples"))
	loaded := map[string]time.Duration{}
	swappedFirst := map[string]bool{}
	eventually(t, 3*time.Minute, func() (bool, string) {
		for name, st := range s.podStates(t, pods) {
			if _, done := loaded[name]; !done && st.hash != "" && st.hash != before[name].hash {
				loaded[name] = time.Since(applied)
				swappedFirst[name] = st.data != before[name].data
			}
		}
		return len(loaded) == len(pods), fmt.Sprintf("pods with the new scripts: %v", loaded)
	})
	// The new code is active: its handler runs for a new widget.
	created := time.Now()
	s.createWidget(t, "counted-0", nil)
	s.waitCounted(t, []string{"counted-0"}, time.Minute)
	s.report.add("  ConfigMap edit -> a new widget handled by the new code", "created %s after the apply, counted %s after it",
		ms(created.Sub(applied)), ms(time.Since(applied)))

	// The new code runs in each pod: its probe handler's first run is logged.
	ran := map[string]time.Duration{}
	eventually(t, time.Minute, func() (bool, string) {
		for _, p := range pods {
			if _, done := ran[p.Name]; done {
				continue
			}
			if at, ok := logTime(c.mustKubectl(t, "-n", operatorNS, "logs", "pod/"+p.Name), "e2e-count.lua runs"); ok {
				ran[p.Name] = at.Sub(applied)
			}
		}
		return len(ran) == len(pods), fmt.Sprintf("pods running the new code: %v", ran)
	})
	for _, p := range pods {
		note := "through the API: /scripts/..data not swapped yet"
		if swappedFirst[p.Name] {
			note = "/scripts/..data already swapped by the kubelet"
		}
		s.report.add("  ConfigMap edit -> new scripts in "+p.Name, "%s (%s); its code ran %s after the apply", ms(loaded[p.Name]), note, ms(ran[p.Name]))
	}
	// The kubelet's copy arrives (its sync period, about a minute): no second reload.
	eventually(t, 3*time.Minute, func() (bool, string) {
		states := s.podStates(t, pods)
		for _, p := range pods {
			if states[p.Name].data == before[p.Name].data {
				return false, "waiting for the kubelet to swap /scripts/..data in " + p.Name
			}
		}
		return true, ""
	})
	s.report.add("  ConfigMap edit -> the kubelet's copy in both pods", "%s after the apply", ms(time.Since(applied)))
	for _, p := range c.operatorPods(t, operatorNS) {
		if restarts(p) != 0 {
			t.Errorf("pod %s restarted (%d) for a scripts edit", p.Name, restarts(p))
		}
	}
	states := s.podStates(t, pods)
	for _, p := range pods {
		logs := c.mustKubectl(t, "-n", operatorNS, "logs", "pod/"+p.Name)
		if n := strings.Count(logs, `"msg":"scripts reloaded"`); n != 1 {
			t.Errorf("pod %s reloaded its scripts %d times for one edit, want once (the API's, not again for the kubelet's copy):\n%s",
				p.Name, n, grepLines(logs, "scripts reloaded"))
		}
		if line := grepLines(logs, "scripts reloaded"); !strings.Contains(line, `"source":"configmap `+operatorNS+`/luaop-scripts"`) && !swappedFirst[p.Name] {
			t.Errorf("pod %s: the reload did not come through the API: %s", p.Name, line)
		}
		if states[p.Name].hash == before[p.Name].hash {
			t.Errorf("pod %s reports the old scripts again after the kubelet's copy", p.Name)
		}
	}
}

// logTime is the time of the first JSON log line holding msg.
func logTime(logs, msg string) (time.Time, bool) {
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, msg) {
			continue
		}
		var line struct {
			Time time.Time `json:"time"`
		}
		if json.Unmarshal([]byte(l), &line) == nil && !line.Time.IsZero() {
			return line.Time, true
		}
	}
	return time.Time{}, false
}

// createWidget creates a Widget in objectsNS; labels nil: a counted one.
func (s *suite) createWidget(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": int64(2)},
	}}
	if labels != nil {
		w.SetLabels(labels)
	}
	if _, err := s.c.dyn.Resource(widgets).Namespace(objectsNS).Create(t.Context(), w, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating widget %s: %v", name, err)
	}
	if labels == nil {
		s.mu.Lock()
		s.created = append(s.created, name)
		s.mu.Unlock()
	}
}

// runsOf counts, per widget, the ConfigMaps its count handler made: one per run.
func (s *suite) runsOf(t *testing.T) map[string]int {
	t.Helper()
	list, err := s.c.kube.CoreV1().ConfigMaps(objectsNS).List(t.Context(), metav1.ListOptions{LabelSelector: "e2e.luaop.dev/widget"})
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, cm := range list.Items {
		runs[cm.Labels["e2e.luaop.dev/widget"]]++
	}
	return runs
}

// waitCounted waits until each widget's count handler has run.
func (s *suite) waitCounted(t *testing.T, names []string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() (bool, string) {
		runs := s.runsOf(t)
		var missing []string
		for _, n := range names {
			if runs[n] == 0 {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d widget(s) not counted yet: %v", len(missing), first(missing, 5))
	})
}

func first(l []string, n int) []string {
	if len(l) > n {
		return l[:n]
	}
	return l
}

// creator creates a counted widget every 250 ms until stopped.
type creator struct {
	stop chan struct{}
	done chan struct{}
}

func (s *suite) startCreating(t *testing.T, prefix string) *creator {
	cr := &creator{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(cr.done)
		for i := 0; i < 400; i++ {
			select {
			case <-cr.stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			w := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
				"metadata": map[string]any{"name": fmt.Sprintf("%s-%03d", prefix, i)}, "spec": map[string]any{"size": int64(3)},
			}}
			if _, err := s.c.dyn.Resource(widgets).Namespace(objectsNS).Create(context.Background(), w, metav1.CreateOptions{}); err != nil {
				t.Errorf("creating %s: %v", w.GetName(), err)
				return
			}
			s.mu.Lock()
			s.created = append(s.created, w.GetName())
			s.mu.Unlock()
		}
	}()
	return cr
}

func (cr *creator) Stop() { close(cr.stop); <-cr.done }

// leaseChange is a Lease's state as a watch saw it.
type leaseChange struct {
	at                   time.Time
	holder               string
	renew, acquire       time.Time
	leaseDurationSeconds int32
}

// watchLease records every change of the operator's Lease until stop is called.
func (s *suite) watchLease(t *testing.T, ns string) (changes func() []leaseChange, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w, err := s.c.kube.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=luaop"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []leaseChange
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			ch := leaseChange{at: time.Now(), holder: holderOf(l)}
			if l.Spec.RenewTime != nil {
				ch.renew = l.Spec.RenewTime.Time
			}
			if l.Spec.AcquireTime != nil {
				ch.acquire = l.Spec.AcquireTime.Time
			}
			if l.Spec.LeaseDurationSeconds != nil {
				ch.leaseDurationSeconds = *l.Spec.LeaseDurationSeconds
			}
			mu.Lock()
			seen = append(seen, ch)
			mu.Unlock()
		}
	}()
	return func() []leaseChange {
			mu.Lock()
			defer mu.Unlock()
			return append([]leaseChange(nil), seen...)
		}, func() {
			cancel()
			w.Stop()
			<-done
		}
}

// leaderDeleted: the leader's pod deleted (kubectl delete pod), the standby leads
// within the lease duration, while widgets keep being created.
func (s *suite) leaderDeleted(t *testing.T) {
	c := s.c
	pods := c.waitPods(t, operatorNS, 2, "", time.Minute)
	leader := c.leaderPod(t, operatorNS, pods)
	lease := c.lease(t, operatorNS)
	duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	standby := pods[0]
	if standby.Name == leader.Name {
		standby = pods[1]
	}
	cr := s.startCreating(t, "failover")
	defer cr.Stop()
	time.Sleep(time.Second) // some widgets before the deletion
	deleted := time.Now()
	c.mustKubectl(t, "-n", operatorNS, "delete", "pod", leader.Name, "--wait=false")
	var took time.Duration
	eventually(t, 2*duration, func() (bool, string) {
		holder := holderOf(c.lease(t, operatorNS))
		if podOfIdentity(holder) == standby.Name {
			took = time.Since(deleted)
			return true, ""
		}
		return false, "the lease is held by " + holder
	})
	s.report.add("  leader pod deleted -> the standby leads", "%s (lease duration %s)", ms(took), duration)
	if took > duration {
		t.Errorf("the standby led %s after the leader's pod was deleted, more than the lease duration %s", took, duration)
	}
	c.waitPods(t, operatorNS, 2, "", 2*time.Minute)
}

// rollingUpdate: a new image name rolls the Deployment; the old leader releases its
// lease on SIGTERM and another pod takes it over in under 2 s.
func (s *suite) rollingUpdate(t *testing.T) {
	c := s.c
	pods := c.waitPods(t, operatorNS, 2, "", time.Minute)
	oldLeader := c.leaderPod(t, operatorNS, pods)
	oldIdentity := holderOf(c.lease(t, operatorNS))
	changes, stopWatch := s.watchLease(t, operatorNS)
	defer stopWatch()
	cr := s.startCreating(t, "rollout")
	defer cr.Stop()
	began := time.Now()
	c.mustKubectl(t, "-n", operatorNS, "set", "image", "deployment/luaop", "luaop="+rollout)
	c.mustKubectl(t, "-n", operatorNS, "rollout", "status", "deployment/luaop", "--timeout=3m")
	c.waitPods(t, operatorNS, 2, rollout, 2*time.Minute)
	s.report.add("  rolling update (set image) complete", "%s", ms(time.Since(began)))
	// The release, then the next holder, from the Lease's own timestamps.
	var released, acquired *leaseChange
	var newHolder string
	all := changes()
	for i := range all {
		ch := all[i]
		if released == nil && ch.holder == "" && i > 0 && all[i-1].holder == oldIdentity {
			released = &all[i]
			continue
		}
		if released != nil && ch.holder != "" {
			acquired, newHolder = &all[i], ch.holder
			break
		}
	}
	if released == nil || acquired == nil {
		t.Fatalf("the lease's changes show no release by %s followed by a new holder: %+v", oldLeader.Name, all)
	}
	gap := acquired.acquire.Sub(released.renew)
	s.report.add("  rolling update: old leader's release -> new leader", "%s (%s -> %s)", ms(gap), oldLeader.Name, podOfIdentity(newHolder))
	if gap >= 2*time.Second || gap < 0 {
		t.Errorf("the lease was released at %s and taken at %s by %s: %s, want under 2 s",
			released.renew.Format(time.StampMicro), acquired.acquire.Format(time.StampMicro), newHolder, gap)
	}
}

// noHandlerRanTwice: every widget created before, during and after the two
// handovers was counted exactly once (one ConfigMap per run of its create handler).
func (s *suite) noHandlerRanTwice(t *testing.T) {
	s.mu.Lock()
	names := append([]string(nil), s.created...)
	s.mu.Unlock()
	s.waitCounted(t, names, 2*time.Minute)
	s.checkOnce(t)
	s.report.add("  widgets counted, each exactly once", "%d", len(names))
}

// checkOnce fails for any widget whose create handler ran more than once.
func (s *suite) checkOnce(t *testing.T) {
	t.Helper()
	for name, n := range s.runsOf(t) {
		if n != 1 {
			t.Errorf("the create handler of widget %s ran %d times", name, n)
		}
	}
}

// readiness: Ready follows /readyz. Pods that start on scripts that do not load
// serve the last good scripts and stay Ready, /readyz saying degraded with the
// file:line; without last good scripts they are not Ready until the ConfigMap is
// fixed, which they load without a restart.
func (s *suite) readiness(t *testing.T) {
	c := s.c
	pods := c.waitPods(t, operatorNS, 2, "", time.Minute)
	for name, st := range s.podStates(t, pods) {
		if st.status != 200 {
			t.Errorf("pod %s is Ready with /readyz %d", name, st.status)
		}
	}
	// Broken scripts applied while no replica runs: the guard cannot answer, and its
	// failure policy (Ignore) lets the edit through, as it would for a fix.
	scale := func(n int) {
		c.mustKubectl(t, "-n", operatorNS, "scale", "deployment/luaop", fmt.Sprintf("--replicas=%d", n))
	}
	scale(0)
	c.waitNoPods(t, operatorNS, 2*time.Minute)
	restore := s.breakWidgets(t)
	c.mustKubectl(t, "apply", "-k", filepath.Join(s.overlay, "examples"))
	where := fmt.Sprintf("widgets.lua:%d", s.brokenLine)
	scale(2)
	pods = c.waitPods(t, operatorNS, 2, "", 2*time.Minute)
	for name, st := range s.podStates(t, pods) {
		if st.status != 200 || !strings.Contains(st.body, "degraded") || !strings.Contains(st.body, where) ||
			!strings.Contains(st.body, "last good scripts") {
			t.Errorf("pod %s on broken scripts with last good ones kept: /readyz %d %q; want 200, degraded, %s, the last good scripts serving", name, st.status, st.body, where)
		}
	}
	// Serving the last good scripts: they still handle widgets.
	s.createWidget(t, "while-degraded", nil)
	s.waitCounted(t, []string{"while-degraded"}, time.Minute)

	// Without last good scripts: Running, not Ready, and /readyz says why.
	scale(0)
	c.waitNoPods(t, operatorNS, 2*time.Minute)
	if err := c.kube.CoreV1().ConfigMaps(operatorNS).Delete(t.Context(), "luaop-scripts-last-good", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	scale(2)
	eventually(t, 2*time.Minute, func() (bool, string) {
		pods = c.operatorPods(t, operatorNS)
		if len(pods) != 2 {
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		for _, p := range pods {
			if p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
				return false, p.Name + " not running yet"
			}
			code, body, err := get(t.Context(), p.Status.PodIP, 8080, "/readyz")
			if err != nil || code != 503 || !strings.Contains(body, where) {
				return false, fmt.Sprintf("pod %s: /readyz %d %q %v", p.Name, code, body, err)
			}
		}
		return true, ""
	})
	// They stay unready while /readyz answers 503 (watched for four probe periods).
	for until := time.Now().Add(20 * time.Second); time.Now().Before(until); time.Sleep(250 * time.Millisecond) {
		for _, p := range c.operatorPods(t, operatorNS) {
			if podReady(p) {
				t.Fatalf("pod %s is Ready while its /readyz answers 503", p.Name)
			}
		}
	}
	restore()
	fixed := time.Now()
	c.mustKubectl(t, "apply", "-k", filepath.Join(s.overlay, "examples"))
	pods = c.waitPods(t, operatorNS, 2, "", 3*time.Minute)
	s.report.add("  ConfigMap fixed -> unready pods Ready", "%s (the fix read through the API; the kubelet's readiness probe every 5 s)", ms(time.Since(fixed)))
	for _, p := range pods {
		if restarts(p) != 0 {
			t.Errorf("pod %s restarted to load the fixed scripts", p.Name)
		}
	}
	s.checkOnce(t)
}

// probeReadiness: by default an on.probe handler that fails takes the pods out of
// Ready (and so out of their Services' endpoints) and restarts nothing: /healthz
// keeps answering, /readyz says which probe failed. Ready again once it passes.
func (s *suite) probeReadiness(t *testing.T) {
	c := s.c
	pods := c.waitPods(t, operatorNS, 2, "", time.Minute)
	before := map[string]int32{}
	for _, p := range pods {
		before[p.Name] = restarts(p)
	}
	flag := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "e2e-liveness"}, Data: map[string]string{"fail": "true"}}
	if _, err := c.kube.CoreV1().ConfigMaps(operatorNS).Create(t.Context(), flag, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	failing := time.Now()
	eventually(t, time.Minute, func() (bool, string) {
		var ready []string
		for _, p := range c.operatorPods(t, operatorNS) {
			if podReady(p) {
				ready = append(ready, p.Name)
			}
		}
		return len(ready) == 0, fmt.Sprintf("still Ready: %v", ready)
	})
	s.report.add("  probe handler fails -> both pods not Ready", "%s", ms(time.Since(failing)))
	unready := time.Now()
	for _, p := range c.operatorPods(t, operatorNS) {
		if code, body, err := get(t.Context(), p.Status.PodIP, 8080, "/readyz"); err != nil || code != 503 || !strings.Contains(body, "e2e-liveness") {
			t.Errorf("pod %s: /readyz %d %v %q; want 503 naming the failing probe e2e-liveness", p.Name, code, err, body)
		}
		if code, body, err := get(t.Context(), p.Status.PodIP, 8080, "/healthz"); err != nil || code != 200 {
			t.Errorf("pod %s: /healthz %d %v %q; want 200 (the probes decide readiness only)", p.Name, code, err, body)
		}
	}
	// Unready for longer than the kubelet's liveness probe takes to restart a
	// container (deploy/base: 3 failures 10 s apart): none restarted.
	time.Sleep(35*time.Second - time.Since(unready))
	for _, p := range c.operatorPods(t, operatorNS) {
		if restarts(p) != before[p.Name] {
			t.Errorf("pod %s restarted (%d -> %d) for a failing probe handler; want it unready only", p.Name, before[p.Name], restarts(p))
		}
		events := c.mustKubectl(t, "-n", operatorNS, "get", "events", "--field-selector", "involvedObject.name="+p.Name, "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
		if strings.Contains(events, "Liveness probe failed") {
			t.Errorf("pod %s: its liveness probe failed for a failing probe handler:\n%s", p.Name, events)
		}
	}
	if err := c.kube.CoreV1().ConfigMaps(operatorNS).Delete(t.Context(), "e2e-liveness", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	passing := time.Now()
	c.waitPods(t, operatorNS, 2, "", 2*time.Minute)
	s.report.add("  probe handler passes again -> both pods Ready", "%s", ms(time.Since(passing)))
}

// liveness: with LUAOP_PROBES_AFFECT_LIVENESS=true (kopf's behaviour, asked for)
// the examples' probe handlers make /healthz fail too (the ConfigMap e2e-liveness
// says so): the kubelet restarts the containers after three failed probes, and the
// restarted operator resumes without running handlers again.
func (s *suite) liveness(t *testing.T) {
	c := s.c
	// kopf's behaviour, when asked: the probes decide liveness too.
	began := time.Now()
	c.mustKubectl(t, "-n", operatorNS, "set", "env", "deployment/luaop", "LUAOP_PROBES_AFFECT_LIVENESS=true")
	c.mustKubectl(t, "-n", operatorNS, "rollout", "status", "deployment/luaop", "--timeout=3m")
	pods := c.waitPods(t, operatorNS, 2, "", 2*time.Minute)
	s.report.add("  LUAOP_PROBES_AFFECT_LIVENESS=true rolled out", "%s", ms(time.Since(began)))
	before := map[string]int32{}
	for _, p := range pods {
		before[p.Name] = restarts(p)
	}
	runsBefore := s.runsOf(t)
	flag := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "e2e-liveness"}, Data: map[string]string{"fail": "true"}}
	if _, err := c.kube.CoreV1().ConfigMaps(operatorNS).Create(t.Context(), flag, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	failing := time.Now()
	var firstRestart time.Duration
	restarted := map[string]bool{}
	eventually(t, 3*time.Minute, func() (bool, string) {
		for _, p := range c.operatorPods(t, operatorNS) {
			if restarts(p) > before[p.Name] && !restarted[p.Name] {
				restarted[p.Name] = true
				if firstRestart == 0 {
					firstRestart = time.Since(failing)
				}
			}
		}
		// Both, or one and 30 s more for the other.
		done := len(restarted) == len(pods) || (firstRestart > 0 && time.Since(failing) > firstRestart+30*time.Second)
		return done, fmt.Sprintf("restarted: %v", restarted)
	})
	if err := c.kube.CoreV1().ConfigMaps(operatorNS).Delete(t.Context(), "e2e-liveness", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.report.add("  probe handler fails -> container restarted", "%s (%d of 2 pods)", ms(firstRestart), len(restarted))
	for _, p := range c.operatorPods(t, operatorNS) {
		if !restarted[p.Name] {
			continue
		}
		events := c.mustKubectl(t, "-n", operatorNS, "get", "events", "--field-selector", "involvedObject.name="+p.Name, "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
		if !strings.Contains(events, "Liveness probe failed") {
			t.Errorf("pod %s restarted, but no event says its liveness probe failed:\n%s", p.Name, events)
		}
	}
	for _, p := range c.waitPods(t, operatorNS, 2, "", 2*time.Minute) {
		if st := p.Status.ContainerStatuses; restarted[p.Name] && len(st) > 0 && st[0].State.Running != nil {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady {
					s.report.add("  restarted container -> Ready ("+p.Name+")", "%s (whole seconds)", ms(cond.LastTransitionTime.Sub(st[0].State.Running.StartedAt.Time)))
				}
			}
		}
	}
	// Resumed: nothing ran again, and new work is done once.
	time.Sleep(5 * time.Second)
	after := s.runsOf(t)
	for name, n := range after {
		if n != runsBefore[name] && runsBefore[name] != 0 {
			t.Errorf("widget %s: %d runs before the restart, %d after", name, runsBefore[name], n)
		}
	}
	s.createWidget(t, "after-restart", nil)
	s.waitCounted(t, []string{"after-restart"}, time.Minute)
	s.checkOnce(t)
}

// memoryBombContained says what the memory bomb (testdata/e2e-count.lua: one
// concatenation of 512 MiB) does in the pod. Before the cap on concatenation (issue
// 34: the VM refuses a `..` whose result would pass 16 MiB) the allocation passed the
// container's 384Mi limit in one step, before the memory budget (half of GOMEMLIMIT,
// sampled every 5 ms) could see it, and the kernel OOM-killed the container, again
// after every restart while the Widget existed (seen 2026-12-01: exit 137, OOMKilled,
// 4 to 5 s after the Widget's creation). With the cap the call fails with "string too
// large" and the container lives; false would assert the old outcome.
const memoryBombContained = true

// memoryBomb: a handler doubling a string in the pod with its 384Mi limit. Wanted:
// the call cancelled (the memory budget), the container not OOM-killed, other
// widgets handled meanwhile.
func (s *suite) memoryBomb(t *testing.T) {
	c := s.c
	pods := c.waitPods(t, operatorNS, 2, "", time.Minute)
	leader := c.leaderPod(t, operatorNS, pods)
	before := restarts(leader)
	// The pod's memory cgroup outlives its container's restarts.
	podCgroup := filepath.Dir(memoryCgroup(t, c.containerPID(t, leader)))
	began := time.Now()
	s.createWidget(t, "bomb", map[string]string{"e2e.luaop.dev/bomb": "yes"})
	var outcome string
	oomKilled := false
	eventually(t, 2*time.Minute, func() (bool, string) {
		p, err := c.kube.CoreV1().Pods(operatorNS).Get(t.Context(), leader.Name, metaGet)
		if err == nil && restarts(*p) > before {
			outcome = "the container was restarted"
			if last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; last != nil {
				outcome = fmt.Sprintf("the container was killed: %s (exit %d)", last.Reason, last.ExitCode)
				oomKilled = last.Reason == "OOMKilled"
			}
			return true, ""
		}
		events := c.mustKubectl(t, "-n", objectsNS, "get", "events", "--field-selector", "involvedObject.name=bomb",
			"-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}")
		for _, bounded := range []string{"string too large", "memory budget exceeded"} {
			if strings.Contains(events, bounded) {
				outcome = "cancelled: " + firstLine(events, bounded)
				return true, ""
			}
		}
		return false, "the bomb is neither cancelled nor has it killed the container yet; events: " + events
	})
	took := time.Since(began)
	peak := readCgroupValue(t, podCgroup, "memory.max_usage_in_bytes")
	s.report.add("  memory bomb (a 512 MiB concatenation) in the leader", "%s after %s; the pod's peak memory %d MiB of 384", outcome, ms(took), peak>>20)

	if !memoryBombContained {
		if !oomKilled {
			t.Fatalf("the memory bomb: %s; it was OOM-killed when this step was written: set memoryBombContained to true", outcome)
		}
		t.Logf("KNOWN (issue 34): the memory bomb OOM-kills the container (%s); deleting it", outcome)
		// The Widget kills every leader until it is gone (its handler never finishes).
		if err := c.dyn.Resource(widgets).Namespace(objectsNS).Delete(t.Context(), "bomb", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.waitPods(t, operatorNS, 2, "", 4*time.Minute) // through the crash loop's back-off
		s.createWidget(t, "after-bomb", nil)
		s.waitCounted(t, []string{"after-bomb"}, 2*time.Minute)
		if n := s.runsOf(t)["after-bomb"]; n != 1 {
			t.Errorf("after the bomb, a new widget's handler ran %d times", n)
		}
		return
	}
	if !strings.HasPrefix(outcome, "cancelled") {
		t.Errorf("the memory bomb: %s; want the call cancelled and the container kept", outcome)
	}
	s.createWidget(t, "beside-bomb", nil)
	s.waitCounted(t, []string{"beside-bomb"}, time.Minute)
	if p, err := c.kube.CoreV1().Pods(operatorNS).Get(t.Context(), leader.Name, metaGet); err == nil && restarts(*p) != before {
		t.Errorf("the leader's container restarted during the bomb (%d -> %d)", before, restarts(*p))
	}
	s.checkOnce(t)
}

func firstLine(text, containing string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, containing) {
			if len(l) > 200 {
				return l[:200] + "..."
			}
			return l
		}
	}
	return ""
}

// memoryCgroup is the host path of a process's memory cgroup (v1 or v2).
func memoryCgroup(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[1] == "memory" || strings.Contains(parts[1], "memory")) {
			return filepath.Join("/sys/fs/cgroup/memory", parts[2])
		}
	}
	t.Fatalf("no memory cgroup for process %d:\n%s", pid, data)
	return ""
}

func readCgroupValue(t *testing.T, dir, file string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Logf("reading %s: %v", file, err)
		return 0
	}
	var v int64
	fmt.Sscan(strings.TrimSpace(string(data)), &v)
	return v
}

// uninstall follows deploy/README.md: scale to 0, luaop release, kubectl delete -k,
// luaop webhooks remove; then nothing of it is left, nothing stuck in deletion.
func (s *suite) uninstall(t *testing.T, ns, kustomization string) {
	c := s.c
	began := time.Now()
	c.mustKubectl(t, "-n", ns, "scale", "deployment/luaop", "--replicas=0")
	c.waitNoPods(t, ns, 2*time.Minute)
	scripts := filepath.Join(s.overlay, "examples", "scripts")
	env := []string{"KUBECONFIG=" + c.kubeconfig}
	out, err := run(t.Context(), env, s.luaop, "release", "--leader-election-namespace", ns, scripts)
	if err != nil {
		t.Fatalf("luaop release: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if _, err := c.kubectlErr(ctx, "delete", "-k", kustomization, "--timeout=2m"); err != nil {
		t.Fatalf("kubectl delete -k: %v", err)
	}
	if out, err := run(t.Context(), env, s.luaop, "webhooks", "remove"); err != nil {
		t.Fatalf("luaop webhooks remove: %v\n%s", err, out)
	}
	if _, err := c.kubectlErr(ctx, "delete", "namespace", objectsNS, "--ignore-not-found", "--timeout=2m"); err != nil {
		t.Fatalf("deleting %s: %v", objectsNS, err)
	}
	s.report.add("  uninstall of "+ns+" (scale 0, release, delete -k, webhooks remove)", "%s", ms(time.Since(began)))
	// Nothing left: the namespaces, the CRDs (and so every example object), the
	// cluster-wide RBAC and the webhook configurations.
	eventually(t, time.Minute, func() (bool, string) {
		var left []string
		for _, n := range []string{ns, objectsNS} {
			if _, err := c.kube.CoreV1().Namespaces().Get(t.Context(), n, metaGet); !apierrors.IsNotFound(err) {
				left = append(left, "namespace "+n)
			}
		}
		for _, what := range []string{"customresourcedefinitions", "clusterroles", "clusterrolebindings", "validatingwebhookconfigurations", "mutatingwebhookconfigurations"} {
			out, err := c.kubectlErr(t.Context(), "get", what, "-o", "name")
			if err != nil {
				return false, err.Error()
			}
			for _, name := range strings.Fields(out) {
				if strings.Contains(name, "luaop") {
					left = append(left, name)
				}
			}
		}
		return len(left) == 0, fmt.Sprintf("left after the uninstall: %v", left)
	})
}

// otherNamespace: the examples in another namespace (an overlay setting namespace:)
// work end to end: Ready, handling, the webhooks through that namespace's Service,
// the guard naming that namespace's ConfigMap, and the same uninstall.
func (s *suite) otherNamespace(t *testing.T) {
	c := s.c
	const ns = "team-a"
	overlay := filepath.Join(s.overlay, "team-a")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: team-a\nresources:\n- ../examples\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	c.mustKubectl(t, "apply", "-k", overlay)
	pods := c.waitPods(t, ns, 2, "", 3*time.Minute)
	s.report.add("  team-a: apply -k -> 2 pods Ready", "%s", ms(time.Since(began)))
	c.leaderPod(t, ns, pods)
	c.mustKubectl(t, "create", "namespace", objectsNS)
	s.mu.Lock()
	s.created = nil
	s.mu.Unlock()
	s.createWidget(t, "in-team-a", nil)
	s.waitCounted(t, []string{"in-team-a"}, time.Minute)
	if msg := c.mustKubectl(t, "-n", objectsNS, "get", "widget", "in-team-a", "-o", "jsonpath={.status.greet.message}"); msg != "hello from Lua" {
		t.Errorf("in-team-a's status.greet.message %q", msg)
	}
	svc := c.mustKubectl(t, "get", "validatingwebhookconfiguration", "luaop.dev.validate", "-o", `jsonpath={range .webhooks[*]}{.clientConfig.service.namespace}/{.clientConfig.service.name} {end}`)
	for _, sv := range strings.Fields(svc) {
		if sv != ns+"/luaop-webhook" {
			t.Errorf("the validating webhooks call %s, want %s/luaop-webhook", sv, ns)
		}
	}
	if _, err := applyYAML(t, c, objectsNS, "apiVersion: examples.luaop.dev/v1\nkind: Widget\nmetadata: {name: too-big}\nspec: {size: 1000}\n"); err == nil ||
		!strings.Contains(err.Error(), "spec.size must be a number") {
		t.Errorf("a widget of size 1000 with the operator in team-a: %v, want the validate handler's refusal", err)
	}
	restore := s.breakWidgets(t)
	_, err := c.kubectlErr(t.Context(), "apply", "-k", overlay)
	restore()
	if err == nil || !strings.Contains(err.Error(), ns+"/luaop-scripts") || !strings.Contains(err.Error(), fmt.Sprintf("widgets.lua:%d", s.brokenLine)) {
		t.Errorf("a broken edit in team-a: %v; want the guard's refusal naming %s/luaop-scripts", err, ns)
	}
	if _, err := c.kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "luaop-scripts-last-good", metaGet); err != nil {
		t.Errorf("the last good scripts in %s: %v", ns, err)
	}
	s.uninstall(t, ns, overlay)
}
