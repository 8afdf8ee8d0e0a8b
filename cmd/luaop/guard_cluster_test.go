package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/testcluster"
)

// guardScript marks the ConfigMaps labelled guard-test=yes with its version.
func guardScript(version string) string {
	return `local luaop = require("luaop")
local mark = require("lib.mark")
luaop.on.create("v1/configmaps", function(ctx)
  ctx.patch.metadata.annotations["guard.luaop.dev/version"] = mark.version
end, { id = "mark", labels = { ["guard-test"] = "yes" } })
` + "-- " + version + "\n"
}

func guardModule(version string) string {
	return "return { version = \"" + version + "\" }\n"
}

const brokenScript = `local luaop = require("luaop")

luaop.on.create("v1/configmaps", function(ctx) end, { id = "mark", retires = 3 })
`

// writeScripts replaces the scripts of dir as the kubelet swaps a ConfigMap's mount.
func writeScripts(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	for name, src := range files {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// The story of issue 21 on a real API server with `luaop run`: the scripts
// ConfigMap's broken update is rejected with file:line; a restart on broken scripts
// serves the last good ones (the gauge at 1, /readyz and /debug saying so); fixing
// the mounted folder brings the new code without a restart; and with no last good
// scripts the operator stays up, unready, until the scripts are fixed.
func TestGuardOfTheScripts(t *testing.T) {
	env, _ := exampleCluster(t)
	ns := env.Namespace(t)
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	prefix := ns + ".guard.luaop.dev"
	ctx := t.Context()
	cms := env.Kube.CoreV1().ConfigMaps(ns)

	v1 := map[string]string{"mark.lua": guardScript("v1"), "lib__mark.lua": guardModule("v1")}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "luaop-scripts"}, Data: v1}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // the mounted ConfigMap
	writeScripts(t, dir, v1)

	logs := &testcluster.LogBuffer{}
	logOutput = logs
	t.Cleanup(func() { logOutput = os.Stderr })
	start := func(extra ...string) (addr string, stop func()) {
		t.Helper()
		addr = freeAddress(t)
		v := viper.New()
		cmd := newRunCommand(v)
		cmd.Flags().String("config", "", "")
		args := append([]string{"--kubeconfig", kubeconfig, "--namespaces", ns, "--health-address", addr, "--metrics-address", addr, "--metrics-secure=false",
			"--post-events=false", "--prefix", prefix, "--webhook-address", "127.0.0.1:0", "--webhook-cleanup",
			"--scripts-configmap", ns + "/luaop-scripts"}, extra...)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		s, err := loadSettings(cmd, v)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- runOperator(rctx, s, dir, false) }()
		var stopped bool
		stop = func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("luaop run ended with %v", err)
			}
		}
		t.Cleanup(stop)
		return addr, stop
	}
	fetch := func(addr, path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	n := 0
	// marked creates a labelled ConfigMap and waits for the handler's version on it.
	marked := func(version string) {
		t.Helper()
		n++
		name := fmt.Sprintf("object-%d", n)
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"guard-test": "yes"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
			cm, err := cms.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got := cm.Annotations["guard.luaop.dev/version"]
			return got == version, fmt.Sprintf("%s marked %q, want %q (the scripts serving)", name, got, version)
		})
	}

	// 1. Good scripts: served, kept as the last good ones.
	addr, stop := start()
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		code, body := fetch(addr, "/readyz")
		return code == 200 && !strings.Contains(body, "degraded"), fmt.Sprintf("/readyz: %d %s", code, body)
	})
	marked("v1")
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		cm, err := cms.Get(ctx, "luaop-scripts-last-good", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["lib__mark.lua"] == v1["lib__mark.lua"] && cm.Annotations[prefix+"/scripts-hash"] != "",
			fmt.Sprintf("last good ConfigMap: %v %v", cm.Annotations, cm.Data)
	})

	// 2. A broken update of the scripts ConfigMap is rejected with file:line (once
	// the webhook configuration is in place).
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		cm, err := cms.Get(ctx, "luaop-scripts", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cm.Data = map[string]string{"mark.lua": brokenScript}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		if err == nil {
			return false, "the broken update was accepted (webhook not configured yet?)"
		}
		return strings.Contains(err.Error(), "mark.lua:3") && strings.Contains(err.Error(), "retires"),
			"update error: " + err.Error()
	})
	// A good update passes.
	cm, err := cms.Get(ctx, "luaop-scripts", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v2 := map[string]string{"mark.lua": guardScript("v2"), "lib__mark.lua": guardModule("v2")}
	cm.Data = v2
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("a good update was rejected: %v", err)
	}
	stop()

	// 3. A restart on broken scripts serves the last good ones.
	writeScripts(t, dir, map[string]string{"mark.lua": brokenScript, "lib__mark.lua": guardModule("v2")})
	addr, stop = start()
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		code, body := fetch(addr, "/readyz")
		return code == 200 && strings.Contains(body, "degraded") && strings.Contains(body, "mark.lua:3") &&
			strings.Contains(body, "last good"), fmt.Sprintf("/readyz: %d %s", code, body)
	})
	if _, body := fetch(addr, "/metrics"); !strings.Contains(body, "\nluaop_scripts_reload_failed 1\n") {
		t.Errorf("/metrics lacks luaop_scripts_reload_failed 1:\n%s", body)
	}
	if _, body := fetch(addr, "/debug"); !strings.Contains(body, `"servingLastGood": true`) || !strings.Contains(body, `"stale": true`) {
		t.Errorf("/debug does not say the last good scripts serve: %s", body)
	}
	marked("v1")
	if !strings.Contains(logs.String(), "mark.lua:3") {
		t.Errorf("the log lacks the error's file:line:\n%s", logs.String())
	}

	// 4. Fixing the mounted folder brings the new code without a restart.
	writeScripts(t, dir, v2)
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		code, body := fetch(addr, "/readyz")
		return code == 200 && !strings.Contains(body, "degraded"), fmt.Sprintf("/readyz: %d %s", code, body)
	})
	if _, body := fetch(addr, "/metrics"); !strings.Contains(body, "\nluaop_scripts_reload_failed 0\n") {
		t.Errorf("/metrics lacks luaop_scripts_reload_failed 0 after the fix")
	}
	marked("v2")
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		cm, err := cms.Get(ctx, "luaop-scripts-last-good", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["lib__mark.lua"] == v2["lib__mark.lua"], "last good scripts not updated to v2"
	})
	stop()

	// 5. No last good scripts: up, unready with the error, ready once fixed.
	writeScripts(t, dir, map[string]string{"mark.lua": brokenScript})
	addr, _ = start("--last-good-configmap", "none")
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		code, body := fetch(addr, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "mark.lua:3"), fmt.Sprintf("/readyz: %d %s", code, body)
	})
	writeScripts(t, dir, map[string]string{"mark.lua": guardScript("v3"), "lib__mark.lua": guardModule("v3")})
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		code, body := fetch(addr, "/readyz")
		return code == 200 && !strings.Contains(body, "degraded"), fmt.Sprintf("/readyz: %d %s", code, body)
	})
	marked("v3")
}
