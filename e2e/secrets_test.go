package e2e

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/state"
	"github.com/luaop/luaop/testcluster"
)

// Issue 50: no Secret value in an annotation. luaop's diff-base of a Secret keeps
// its data as digests: a field handler on data.password still runs on a change of
// that key only (its old value is a digest, its new one the value); a diff-base an
// older luaop (or kopf) stored with the values is rewritten at the next cycle, with
// no handler run again.
func TestSecretValuesAreNotKeptInAnnotations(t *testing.T) {
	ns := env.Namespace(t)
	src := `
		local luaop = require("luaop")
		luaop.on.create("v1/secrets", function(ctx) ctx.logger.info("RUN create " .. ctx.name) end, { id = "made" })
		luaop.on.field("v1/secrets", "data.password", function(ctx)
			ctx.logger.info("RUN password " .. ctx.name .. " old=" .. tostring(ctx.old) .. " new=" .. tostring(ctx.new))
		end, { id = "password" })
	`
	secrets := env.Kube.CoreV1().Secrets(ns)
	values := []string{"hunter2", "admin", "rotated", "older-luaop"}
	// What an older luaop stored: the Secret's essence with its values, before the
	// operator below starts.
	legacy, err := secrets.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
		Data: map[string][]byte{"password": []byte("older-luaop")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writeLegacyDiffBase(t, legacy)

	op := startWith(t, ns, operator.Options{Scripts: script(src)})
	if _, err := secrets.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Data: map[string][]byte{"password": []byte("hunter2"), "user": []byte("admin")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	noValueInAnnotations := func(name string) {
		t.Helper()
		testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
			s, err := secrets.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			base := s.Annotations["luaop.dev/last-handled-configuration"]
			if !strings.Contains(base, "sha256:") {
				return false, fmt.Sprintf("%s's diff-base holds no digest yet: %q", name, base)
			}
			for k, v := range s.Annotations {
				for _, value := range values {
					if strings.Contains(v, value) || strings.Contains(v, base64.StdEncoding.EncodeToString([]byte(value))) {
						return false, fmt.Sprintf("%s's annotation %s holds the value %q: %s", name, k, value, v)
					}
				}
			}
			return true, ""
		})
	}
	noValueInAnnotations("s")
	noValueInAnnotations("legacy")

	if _, err := secrets.Patch(t.Context(), "s", types.MergePatchType,
		[]byte(`{"data":{"password":"`+base64.StdEncoding.EncodeToString([]byte("rotated"))+`"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	wantNew := "new=" + base64.StdEncoding.EncodeToString([]byte("rotated"))
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), wantNew), "waiting for the password handler to see the rotation"
	})
	noValueInAnnotations("s")
	logs := op.Log.String()
	if !strings.Contains(logs, "RUN password s old=sha256:") {
		t.Errorf("the password handler's old value is not the digest of the previous one:\n%s", logs)
	}
	if n := strings.Count(logs, "RUN password s "); n != 2 {
		t.Errorf("the password handler ran %d times for s (its creation, one rotation), want 2:\n%s", n, logs)
	}
	if strings.Contains(logs, "RUN create legacy") || strings.Contains(logs, "RUN password legacy") {
		t.Errorf("a Secret handled by an older luaop was handled again when its diff-base was rewritten:\n%s", logs)
	}
}

// writeLegacyDiffBase stores obj's essence, values included, as the annotation
// luaop wrote before digests (and kopf writes).
func writeLegacyDiffBase(t *testing.T, secret *corev1.Secret) {
	t.Helper()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(secret)
	if err != nil {
		t.Fatal(err)
	}
	raw["apiVersion"], raw["kind"] = "v1", "Secret"
	patch := state.NewPatch()
	if err := state.NewAnnotationsDiffBase("luaop.dev").Store(raw, patch, state.Essence(raw, "luaop.dev")); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Kube.CoreV1().Secrets(secret.Namespace).Patch(t.Context(), secret.Name, types.MergePatchType,
		[]byte(toJSON(patch.Map())), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
