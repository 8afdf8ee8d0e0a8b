package reloading

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptcheck"
	"github.com/luaop/luaop/scriptsource"
)

// The operator guards its own scripts (issue 21):
//   - [ScriptsGuard] is a validating webhook on the scripts ConfigMap
//     (--scripts-configmap): an update whose scripts do not load is rejected with
//     the file:line of the error, checked in a throwaway runtime;
//   - [LastGoodStore] keeps the last scripts that loaded in a ConfigMap the operator
//     owns (--last-good-configmap), so that a pod starting on broken scripts serves
//     them instead of crash-looping.

// scriptsGuardID is the webhook's id: served at /validate/luaop-scripts-configmap.
// Script handler ids cannot hold this prefix by accident in practice; a Go handler
// wins over a script's of the same path anyway.
const scriptsGuardID = "luaop-scripts-configmap"

// scriptsOfConfigMap maps a ConfigMap's data to scripts as a mounted ConfigMap is
// read (scriptsource.ReadDir): the *.lua keys, "lib__util.lua" read as "lib/util.lua".
func scriptsOfConfigMap(data map[string]string) ([]luabind.Script, error) {
	seen := map[string]string{}
	var scripts []luabind.Script
	for key, src := range data {
		if scriptsource.IgnoredName(key) || !strings.HasSuffix(key, ".lua") {
			continue
		}
		name := scriptsource.FlatKeyPath(key)
		if first, dup := seen[name]; dup {
			a, b := first, key
			if b < a {
				a, b = b, a
			}
			return nil, fmt.Errorf("keys %s and %s both stand for %s (a key a__b.lua is read as a/b.lua): keep one", a, b, name)
		}
		seen[name] = key
		scripts = append(scripts, luabind.Script{Name: name, Source: []byte(src)})
	}
	sort.Slice(scripts, func(i, j int) bool { return scripts[i].Name < scripts[j].Name })
	return scripts, nil
}

// configMapKey is the ConfigMap key of a script: its folders joined by "__".
func configMapKey(name string) string { return strings.ReplaceAll(name, "/", "__") }

// ScriptsGuard is the validating webhook of the scripts ConfigMap ns/name.
// Its failure policy is Ignore: when no replica answers (all of them down), an
// edit of the scripts must still be possible, the fix above all; the replicas
// then guard themselves (a broken load keeps the previous or last good scripts).
//
// opts are the operator's Lua options: the check holds the scripts to the same
// deadline and limits (scriptcheck.CheckLoad).
func ScriptsGuard(ns, name string, log *slog.Logger, opts luabind.Options) admission.Handler {
	return admission.Handler{
		ID:   scriptsGuardID,
		Kind: causes.KindValidate,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
				Resources: []string{"configmaps"}, Scope: ptrTo(admissionregistrationv1.NamespacedScope)},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		FailurePolicy:     "Ignore",
		Timeout:           10 * time.Second,
		Source:            "--scripts-configmap " + ns + "/" + name,
		Admit: func(ctx context.Context, req admission.Request) (admission.Response, error) {
			if req.Namespace != ns || req.Name != name || req.Object == nil {
				return admission.Response{Allowed: true}, nil
			}
			msg := checkScriptsConfigMap(ctx, req.Object, opts)
			if msg == "" {
				return admission.Response{Allowed: true}, nil
			}
			log.Warn("scripts ConfigMap update rejected: its scripts do not load", "configmap", ns+"/"+name, "error", msg)
			return admission.Response{Allowed: false, Code: 422, Message: fmt.Sprintf(
				"luaop: the scripts of ConfigMap %s/%s do not load, the update is rejected: %s; fix the script and apply again (`luaop check DIR` lists every problem)",
				ns, name, msg)}, nil
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// checkScriptsConfigMap loads the scripts of a ConfigMap object in a throwaway
// runtime: "" when they load, else the error (file:line).
func checkScriptsConfigMap(ctx context.Context, obj map[string]any, opts luabind.Options) string {
	data := map[string]string{}
	if d, ok := obj["data"].(map[string]any); ok {
		for k, v := range d {
			if s, ok := v.(string); ok {
				data[k] = s
			}
		}
	}
	scripts, err := scriptsOfConfigMap(data)
	if err != nil {
		return err.Error()
	}
	if len(scripts) == 0 {
		return "no *.lua key (the operator would have no scripts)"
	}
	if err := scriptcheck.CheckLoad(ctx, scripts, opts); err != nil {
		return err.Error()
	}
	return ""
}
