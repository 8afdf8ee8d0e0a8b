package e2e

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// requestCounter counts the operator's requests to the API server by verb
// (LIST: a GET of a collection without watch; WATCH; GET of one object; ...),
// and the answers that were not a success by verb and code ("PATCH 429").
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
	lists  []string // the paths of the LISTs, for the message
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		verb, path := requestVerb(req), req.URL.Path
		c.mu.Lock()
		if c.counts == nil {
			c.counts = map[string]int{}
		}
		c.counts[verb]++
		if verb == "LIST" {
			c.lists = append(c.lists, path+"?"+req.URL.RawQuery)
		}
		c.mu.Unlock()
		resp, err := rt.RoundTrip(req)
		outcome := ""
		switch {
		case err != nil: // client-go may send it again: counted twice
			outcome = verb + " error"
		case resp.StatusCode >= 300: // refused ones too (a 429 retried by client-go is counted twice)
			outcome = fmt.Sprintf("%s %d", verb, resp.StatusCode)
		}
		if outcome != "" {
			c.mu.Lock()
			c.counts[outcome]++
			c.mu.Unlock()
		}
		return resp, err
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// requestVerb is the Kubernetes verb of a request: a GET of a collection is a
// LIST (a WATCH with watch=true), of one object a GET.
func requestVerb(req *http.Request) string {
	if req.Method != http.MethodGet {
		return req.Method
	}
	if req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1" {
		return "WATCH"
	}
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:] // api/v1
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:] // apis/group/version
	default:
		return "GET" // discovery, /version, /readyz
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	if len(segs) == 1 {
		return "LIST"
	}
	return "GET"
}

func (c *requestCounter) snapshot() (map[string]int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts), slices.Clone(c.lists)
}

// startCounted starts an operator on the whole cluster with one example script,
// its requests counted, and waits until it is ready.
func startCounted(t testing.TB, file string) (*testcluster.RunningOperator, *requestCounter) {
	return startCountedWithin(t, file, 20*time.Second)
}

// startCountedWithin is startCounted waiting up to ready (a cluster holding
// thousands of related objects, a benchmark's, takes longer than 20 s to list).
func startCountedWithin(t testing.TB, file string, ready time.Duration) (*testcluster.RunningOperator, *requestCounter) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(testcluster.RepoRoot(), "scripts", "examples", file))
	if err != nil {
		t.Fatal(err)
	}
	counter := &requestCounter{}
	counted := *env
	counted.Config = rest.CopyConfig(env.Config)
	counted.Config.Wrap(counter.wrap)
	op := counted.StartOperatorAsync(t, "", operator.Options{Scripts: []luabind.Script{{Name: file, Source: src}},
		Processing: processing.Options{ConsistencyTimeout: 5 * time.Second}})
	testcluster.Eventually(t, ready, func() (bool, string) {
		return op.Ready(), "the operator is not ready (scripts loaded, initial listing processed)"
	})
	return op, counter
}

var (
	configmapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	projects      = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "projects"}
)

func labelNamespace(t *testing.T, ns, value string) {
	t.Helper()
	patch := `{"metadata":{"labels":{"luaop.dev/replica":` + value + `}}}`
	if _, err := env.Kube.CoreV1().Namespaces().Patch(t.Context(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitCopy waits until the namespace holds the copy with exactly data (nil: no
// copy), and returns how long it took.
func waitCopy(t *testing.T, ns, name string, data map[string]string, what string) time.Duration {
	t.Helper()
	start := time.Now()
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), name, metav1.GetOptions{})
		if data == nil {
			return apierrors.IsNotFound(err), fmt.Sprintf("%s: %s/%s still exists (%v)", what, ns, name, err)
		}
		if err != nil {
			return false, fmt.Sprintf("%s: %s/%s: %v", what, ns, name, err)
		}
		ok := maps.Equal(cm.Data, data) && cm.Labels["luaop.dev/replica-of"] != ""
		return ok, fmt.Sprintf("%s: %s/%s has data %v labels %v, want data %v", what, ns, name, cm.Data, cm.Labels, data)
	})
	took := time.Since(start)
	t.Logf("%s: %s", what, took.Round(time.Millisecond))
	return took
}

// examples/replicator.lua on the real API server: copies made, healed, propagated,
// given to new namespaces and removed, with no LIST after the informers' first
// ones; then the operator is stopped, copies are tampered with, and the next
// operator heals them at its start.
func TestExampleReplicator(t *testing.T) {
	src := env.Namespace(t)
	a, b, later := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	labelNamespace(t, a, `"true"`)
	labelNamespace(t, b, `"true"`)
	op, counter := startCounted(t, "replicator.lua")
	data := map[string]string{"level": "info", "region": "eu"}
	if _, err := env.Kube.CoreV1().ConfigMaps(src).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings", Labels: map[string]string{"luaop.dev/replicate": "true"}}, Data: data,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCopy(t, a, "settings", data, "copied into "+a)
	waitCopy(t, b, "settings", data, "copied into "+b)
	if cm, _ := env.Kube.CoreV1().ConfigMaps(a).Get(t.Context(), "settings", metav1.GetOptions{}); cm.Labels["luaop.dev/replica-of"] != src+".settings" {
		t.Errorf("the copy is labelled %v: want luaop.dev/replica-of=%s.settings", cm.Labels, src)
	}
	before, _ := counter.snapshot()

	// A hand edit: a changed value and an added key, reverted.
	mergePatch(t, configmapsGVR, a, "settings", `{"data":{"level":"debug","extra":"x"}}`)
	waitCopy(t, a, "settings", data, "a hand edit reverted")
	// A deleted copy, re-created.
	if err := env.Kube.CoreV1().ConfigMaps(b).Delete(t.Context(), "settings", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCopy(t, b, "settings", data, "a deleted copy re-created")
	// A change of the source, propagated (a key removed, one changed).
	mergePatch(t, configmapsGVR, src, "settings", `{"data":{"region":null,"level":"warn"}}`)
	data = map[string]string{"level": "warn"}
	waitCopy(t, a, "settings", data, "the source's change in "+a)
	waitCopy(t, b, "settings", data, "the source's change in "+b)
	// A namespace newly labelled gets the copy; one whose label goes loses it.
	labelNamespace(t, later, `"true"`)
	waitCopy(t, later, "settings", data, "a namespace newly labelled")
	labelNamespace(t, b, "null")
	waitCopy(t, b, "settings", nil, "a namespace unlabelled")

	after, lists := counter.snapshot()
	if after["LIST"] != before["LIST"] {
		t.Errorf("the operator listed %d time(s) while handling the changes (no LIST per event): %v", after["LIST"]-before["LIST"], lists)
	}
	t.Logf("requests while handling: %v (before: %v)", after, before)

	// Changes while the operator is down reach it at its start: the copies'
	// listing triggers their source's handler once.
	if err := op.Stop(); err != nil {
		t.Fatal(err)
	}
	mergePatch(t, configmapsGVR, a, "settings", `{"data":{"level":"tampered"}}`)
	if err := env.Kube.CoreV1().ConfigMaps(later).Delete(t.Context(), "settings", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	startCounted(t, "replicator.lua")
	waitCopy(t, a, "settings", data, "a copy edited while the operator was down")
	waitCopy(t, later, "settings", data, "a copy deleted while the operator was down")

	// Deleting the source deletes its copies.
	if err := env.Kube.CoreV1().ConfigMaps(src).Delete(t.Context(), "settings", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCopy(t, a, "settings", nil, "the source deleted: its copy in "+a)
	waitCopy(t, later, "settings", nil, "the source deleted: its copy in "+later)
	waitGone(t, configmapsGVR, src, "settings")
}

// examples/projects.lua on the real API server: a cluster-scoped Project's owned
// children (a Namespace, a ResourceQuota, a LimitRange) are healed: an edit
// reverted, a deleted child re-created, the namespace itself re-created after a
// deletion, with no timer.
func TestExampleProjectHealsItsChildren(t *testing.T) {
	name := env.Namespace(t) + "-p" // a unique name; the project's namespace is its own
	t.Cleanup(func() {
		_ = env.Dynamic.Resource(projects).Delete(t.Context(), name, metav1.DeleteOptions{})
		_ = env.Kube.CoreV1().Namespaces().Delete(t.Context(), name, metav1.DeleteOptions{})
	})
	startCounted(t, "projects.lua")
	create(t, projects, "", fmt.Sprintf(`{apiVersion: examples.luaop.dev/v1, kind: Project, metadata: {name: %s}, spec: {quota: {pods: "5"}}}`, name))
	waitField(t, projects, "", name, "status.provision.namespace", name)
	quotaPods := func(want string, what string) {
		t.Helper()
		start := time.Now()
		testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
			q, err := env.Kube.CoreV1().ResourceQuotas(name).Get(t.Context(), "project", metav1.GetOptions{})
			if err != nil {
				return false, fmt.Sprintf("%s: %v", what, err)
			}
			got := q.Spec.Hard[corev1.ResourcePods]
			return got.String() == want && len(q.OwnerReferences) == 1 && q.OwnerReferences[0].Kind == "Project",
				fmt.Sprintf("%s: quota pods %s, owners %v", what, got.String(), q.OwnerReferences)
		})
		t.Logf("%s: %s", what, time.Since(start).Round(time.Millisecond))
	}
	quotaPods("5", "provisioned")
	mergePatch(t, schema.GroupVersionResource{Version: "v1", Resource: "resourcequotas"}, name, "project", `{"spec":{"hard":{"pods":"500"}}}`)
	quotaPods("5", "an edited quota reverted")
	if err := env.Kube.CoreV1().LimitRanges(name).Delete(t.Context(), "project", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		_, err := env.Kube.CoreV1().LimitRanges(name).Get(t.Context(), "project", metav1.GetOptions{})
		return err == nil, fmt.Sprintf("the deleted LimitRange: %v", err)
	})
	t.Logf("a deleted LimitRange re-created: %s", time.Since(start).Round(time.Millisecond))
	// The namespace itself: the namespace controller empties it, then it goes;
	// then the Project's handler makes it again, with its content.
	old, err := env.Kube.CoreV1().Namespaces().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Kube.CoreV1().Namespaces().Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
		ns, err := env.Kube.CoreV1().Namespaces().Get(t.Context(), name, metav1.GetOptions{})
		return err == nil && ns.UID != old.UID && ns.DeletionTimestamp == nil, fmt.Sprintf("the namespace not re-created yet (%v)", err)
	})
	t.Logf("a deleted namespace re-created: %s", time.Since(start).Round(time.Millisecond))
	quotaPods("5", "the re-created namespace's quota")
}
