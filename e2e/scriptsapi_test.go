package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/scriptwatch"
	"github.com/luaop/luaop/testcluster"
)

// versionScript is the scripts ConfigMap's widgets.lua at a version: its create
// handler writes the version into status.version, and a daemon whose code does not
// change between versions runs for every widget.
func versionScript(version string) string {
	return `local luaop = require("luaop")
luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
  return "` + version + `"
end, { id = "version" })
luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
  while luaop.sleep(0.2) do end
end, { id = "steady" })
`
}

// The scripts ConfigMap read through the API, with no kubelet: `luaop run DIR
// --scripts-configmap NS/NAME`, DIR laid out as the kubelet mounts that ConfigMap
// and holding its first version. An edit of the ConfigMap is loaded as soon as it
// is applied (new widgets handled by the new code, /readyz reporting the new hash,
// the daemon of an existing widget kept, one "scripts reloaded" line naming the
// file), DIR untouched; then DIR's ..data swapped to the same content (the kubelet's
// copy arriving a minute later) reloads nothing; a broken edit keeps the scripts
// running and names file:line. The time from the edit to the first widget handled
// by the new code is printed, not asserted.
func TestScriptsConfigMapEditLoadedThroughTheAPI(t *testing.T) {
	ns := env.Namespace(t)
	bin := buildLuaop(t)
	cms := env.Kube.CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "scripts"},
		Data: map[string]string{"widgets.lua": versionScript("v1")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "scripts")
	if err := testcluster.WriteConfigMapVolume(dir, cm.Data); err != nil {
		t.Fatal(err)
	}
	health := freeLoopback(t)
	p := startLuaop(t, bin, writeKubeconfig(t), ns, dir, "--health-address", health, "--standalone",
		"--scripts-configmap", ns+"/scripts", "--log-level", "debug")
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(p.log.String(), "the scripts follow the ConfigMap through the API"), "waiting for the ConfigMap's watch"
	})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w0}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w0", "status.version", "v1")
	before := readyzHash(t, health)
	folder := snapshotFolder(t, dir)

	// The edit, and a widget created every 100 ms from then on, as an SRE watching
	// for the fix would.
	cm.Data = map[string]string{"widgets.lua": versionScript("v2")}
	applied := time.Now()
	if cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	firstNew := widgetsUntilVersion(t, ns, "v2")
	newCode := firstNew.created.Sub(applied)
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return countLines(p.log.String(), `"msg":"scripts reloaded"`) == 1, "waiting for the reload's log line"
	})
	t.Logf("ConfigMap update -> the first widget handled by the new code was created %s after it (handled %s after it); no kubelet involved",
		newCode.Round(time.Millisecond), firstNew.handled.Sub(applied).Round(time.Millisecond))

	line := lineWith(p.log.String(), `"msg":"scripts reloaded"`)
	for _, want := range []string{`"files":["widgets.lua"]`, `"source":"configmap ` + ns + `/scripts"`, `"resourceVersion":"`} {
		if !strings.Contains(line, want) {
			t.Errorf("the reload's log line lacks %s: %s", want, line)
		}
	}
	after := readyzHash(t, health)
	if after == "" || after == before {
		t.Errorf("/readyz reports the scripts %q after the edit, %q before: want a new hash", after, before)
	}
	if status, err := exec.Command(bin, "status", "--address", health).CombinedOutput(); err != nil || !strings.Contains(string(status), "scripts "+after) {
		t.Errorf("luaop status does not report the scripts %s: %v\n%s", after, err, status)
	}
	// Every widget created after the reload is handled by the new code.
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: after-reload}, spec: {size: 1}}")
	waitField(t, widgets, ns, "after-reload", "status.version", "v2")
	if got := snapshotFolder(t, dir); got != folder {
		t.Errorf("the scripts folder changed: %s, was %s", got, folder)
	}

	// The kubelet's copy arrives: the folder's ..data swapped to the same content.
	if err := testcluster.WriteConfigMapVolume(dir, cm.Data); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(p.log.String(), "the scripts folder caught up with the scripts serving"), "waiting for the folder's change to be read"
	})

	// A broken edit (no webhook here to refuse it): the scripts keep running.
	cm.Data = map[string]string{"widgets.lua": strings.Replace(versionScript("v3"), `{ id = "version" })`, `{ id = "version" ]`, 1)}
	if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(p.log.String(), "reload failed; the previous scripts keep running"), "waiting for the broken edit"
	})
	if failed := lineWith(p.log.String(), "reload failed"); !strings.Contains(failed, "widgets.lua:4") {
		t.Errorf("the failed reload does not name widgets.lua:4: %s", failed)
	}
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: after-broken}, spec: {size: 1}}")
	waitField(t, widgets, ns, "after-broken", "status.version", "v2")

	logs := p.log.String()
	if n := countLines(logs, `"msg":"scripts reloaded"`); n != 1 {
		t.Errorf("%d scripts reloaded lines, want 1: the folder's copy of the edit reloaded again", n)
	}
	if got := readyzHash(t, health); got != after {
		t.Errorf("/readyz reports %q after the folder's swap and the broken edit, want %q still", got, after)
	}
	var w0Daemon int
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "daemon started") && strings.Contains(l, `"name":"w0"`) {
			w0Daemon++
		}
	}
	if w0Daemon != 1 {
		t.Errorf("w0's daemon started %d times, want once (its code did not change: the reload keeps it)", w0Daemon)
	}
}

// newWidget is a widget of widgetsUntilVersion: when it was created and when its
// status was first seen.
type newWidget struct {
	name             string
	created, handled time.Time
}

// widgetsUntilVersion creates a widget every 100 ms until one created is handled
// with version, and returns the first such widget (by creation).
func widgetsUntilVersion(t *testing.T, ns, version string) newWidget {
	t.Helper()
	var (
		mu      sync.Mutex
		created []newWidget
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			name := fmt.Sprintf("edit-%d", i)
			w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
				"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": int64(1)}}}
			at := time.Now()
			if _, err := env.Dynamic.Resource(widgets).Namespace(ns).Create(t.Context(), w, metav1.CreateOptions{}); err == nil {
				mu.Lock()
				created = append(created, newWidget{name: name, created: at})
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { close(stop); <-done }()
	var first newWidget
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		mu.Lock()
		list := append([]newWidget(nil), created...)
		mu.Unlock()
		for _, w := range list {
			obj, err := env.Dynamic.Resource(widgets).Namespace(ns).Get(t.Context(), w.name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			if v, _, _ := unstructured.NestedString(obj.Object, "status", "version"); v == version {
				first, first.handled = w, time.Now()
				return true, ""
			}
		}
		return false, fmt.Sprintf("none of %d widgets handled with %s yet", len(list), version)
	})
	return first
}

// readyzHash is the scripts' hash /readyz reports.
func readyzHash(t *testing.T, addr string) string {
	t.Helper()
	_, body := httpGet(addr, "/readyz")
	if m := regexp.MustCompile(`(?m)^scripts (\S+)`).FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}

// snapshotFolder sums what a folder holds: every entry's name, link target and
// content, so that any change to it shows.
func snapshotFolder(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v\n", p, fi.Mode())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			fmt.Fprintf(h, "-> %s %v\n", target, err)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// lineWith is the first line of logs holding s.
func lineWith(logs, s string) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// The ConfigMap read under exactly the RBAC `luaop rbac --scripts-configmap` grants
// (get, list, watch of that ConfigMap by resourceNames): the field selector on its
// name makes the list and the watch authorized, and nothing else of the namespace
// is readable. Without the Role, the watch's refusal is logged once, saying what
// to grant.
func TestScriptsConfigMapSourceUnderItsRBAC(t *testing.T) {
	ns := env.Namespace(t)
	bin := buildLuaop(t)
	cms := env.Kube.CoreV1().ConfigMaps(ns)
	for _, name := range []string{"scripts", "other"} {
		if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string]string{"a.lua": "return 1"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dir := scriptFolder(t, "widgets.lua", versionScript("v1"))
	out, err := exec.Command(bin, "rbac", "--service-account", ns+"/luaop", "--scripts-configmap", ns+"/scripts", dir).Output()
	if err != nil {
		t.Fatalf("luaop rbac: %v", err)
	}
	docs, err := testcluster.DecodeYAML(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	var applied int
	for _, d := range docs {
		if d.GetName() != "luaop-scripts-reader" {
			continue
		}
		gvr := schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: strings.ToLower(d.GetKind()) + "s"}
		if _, err := env.Dynamic.Resource(gvr).Namespace(ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		applied++
	}
	if applied != 2 {
		t.Fatalf("luaop rbac printed %d objects named luaop-scripts-reader, want its Role and RoleBinding:\n%s", applied, out)
	}

	as := func(sa string) (kubernetes.Interface, *testcluster.LogBuffer, <-chan scriptwatch.Change) {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		logs := &testcluster.LogBuffer{}
		src := scriptwatch.NewConfigMapSource(client, ns, "scripts", slog.New(slog.NewJSONHandler(logs, nil)))
		return client, logs, src.Watch(t.Context())
	}
	client, logs, changes := as("luaop")
	next := func() scriptwatch.Change {
		t.Helper()
		select {
		case ch := <-changes:
			return ch
		case <-time.After(30 * time.Second):
			t.Fatalf("nothing read through the API; the log:\n%s", logs.String())
			return scriptwatch.Change{}
		}
	}
	if ch := next(); len(ch.Scripts) != 1 || ch.Scripts[0].Name != "a.lua" || ch.ResourceVersion == "" || !slices.Equal(ch.Keys, []string{"a.lua"}) {
		t.Errorf("first content %+v, want a.lua at a resourceVersion", ch)
	}
	cm, err := cms.Get(t.Context(), "scripts", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["lib__b.lua"] = "return 2"
	if cm, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ch := next(); len(ch.Scripts) != 2 || ch.Scripts[1].Name != "lib/b.lua" || ch.ResourceVersion != cm.ResourceVersion {
		t.Errorf("content after the update %+v, want a.lua and lib/b.lua at %s", ch, cm.ResourceVersion)
	}
	if strings.Contains(logs.String(), "cannot be watched") {
		t.Errorf("the watch failed under the generated RBAC:\n%s", logs.String())
	}
	if _, err := client.CoreV1().ConfigMaps(ns).Get(t.Context(), "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading another ConfigMap: %v, want forbidden", err)
	}
	if _, err := client.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing every ConfigMap: %v, want forbidden", err)
	}

	_, refused, _ := as("someone-else")
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(refused.String(), "cannot be watched") && strings.Contains(refused.String(), "luaop rbac --scripts-configmap"), refused.String()
	})
	time.Sleep(3 * time.Second) // the reflector retries meanwhile, with a backoff
	if n := strings.Count(refused.String(), "cannot be watched"); n != 1 {
		t.Errorf("the refusal logged %d times, want once:\n%s", n, refused.String())
	}
}
