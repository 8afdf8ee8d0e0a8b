package scriptsguard

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptcheck"
	"github.com/luaop/luaop/scriptsource"
)

// scriptsGuardID is the webhook's id: served at /validate/luaop-scripts-configmap.
// Script handler ids cannot hold this prefix by accident in practice; a Go handler
// wins over a script's of the same path anyway.
const scriptsGuardID = "luaop-scripts-configmap"

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
	scripts, err := scriptsource.ScriptsOfConfigMap(data)
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
