package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptcheck"
	"github.com/luaop/luaop/scriptsource"
)

// The operator guards its own scripts (issue 21):
//   - scriptsGuard is a validating webhook on the scripts ConfigMap
//     (--scripts-configmap): an update whose scripts do not load is rejected with
//     the file:line of the error, checked in a throwaway runtime;
//   - lastGoodStore keeps the last scripts that loaded in a ConfigMap the operator
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

// scriptsGuard is the validating webhook of the scripts ConfigMap ns/name.
// Its failure policy is Ignore: when no replica answers (all of them down), an
// edit of the scripts must still be possible, the fix above all; the replicas
// then guard themselves (a broken load keeps the previous or last good scripts).
//
// opts are the operator's Lua options: the check holds the scripts to the same
// deadline and limits (scriptcheck.CheckLoad).
func scriptsGuard(ns, name string, log *slog.Logger, opts luabind.Options) admission.Handler {
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

// lastGoodStore keeps the last scripts that loaded in the ConfigMap ns/name,
// annotated with their content hash; it writes only when the hash changes.
type lastGoodStore struct {
	client   kubernetes.Interface
	ns, name string
	hashKey  string // the annotation holding the content hash
	dryRun   bool
	log      *slog.Logger

	mu      sync.Mutex // guards pending and written; never held across a call
	pending *lastGoodSet
	written string
	wake    chan struct{}
}

type lastGoodSet struct {
	scripts []luabind.Script
	hash    string
}

func newLastGoodStore(client kubernetes.Interface, ns, name, prefix string, dryRun bool, log *slog.Logger) *lastGoodStore {
	return &lastGoodStore{client: client, ns: ns, name: name, hashKey: prefix + "/scripts-hash", dryRun: dryRun, log: log,
		wake: make(chan struct{}, 1)}
}

// Keep offers scripts that loaded: run writes the latest offered set.
func (s *lastGoodStore) Keep(scripts []luabind.Script, hash string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	if hash != s.written {
		s.pending = &lastGoodSet{scripts: append([]luabind.Script(nil), scripts...), hash: hash}
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run writes what Keep offered until ctx is done (a failed write is retried at
// the next offer, or after a while).
func (s *lastGoodStore) Run(ctx context.Context) {
	retry := time.NewTicker(30 * time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-retry.C:
		}
		s.mu.Lock()
		set := s.pending
		s.pending = nil
		s.mu.Unlock()
		if set == nil {
			continue
		}
		if err := s.write(ctx, set); err != nil {
			s.log.Error("keeping the last good scripts failed; a pod that starts on broken scripts would have none to serve",
				"configmap", s.ns+"/"+s.name, "error", err, "next", "check the operator may get, create and update it (luaop rbac --scripts-configmap NAME), or turn it off with --last-good-configmap=none")
			s.mu.Lock()
			if s.pending == nil {
				s.pending = set
			}
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		s.written = set.hash
		s.mu.Unlock()
	}
}

func (s *lastGoodStore) write(ctx context.Context, set *lastGoodSet) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	data := make(map[string]string, len(set.scripts))
	for _, sc := range set.scripts {
		data[configMapKey(sc.Name)] = string(sc.Source)
	}
	cms := s.client.CoreV1().ConfigMaps(s.ns)
	cur, err := cms.Get(ctx, s.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.ns,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "luaop"},
			Annotations: map[string]string{s.hashKey: set.hash}}, Data: data}
		if s.dryRun {
			s.log.Info("dry run: would create the ConfigMap of the last good scripts", "configmap", s.ns+"/"+s.name, "hash", set.hash)
			return nil
		}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating ConfigMap %s/%s: %w", s.ns, s.name, err)
		}
	case err != nil:
		return fmt.Errorf("reading ConfigMap %s/%s: %w", s.ns, s.name, err)
	default:
		if cur.Annotations[s.hashKey] == set.hash {
			return nil // another replica wrote them
		}
		if s.dryRun {
			s.log.Info("dry run: would update the ConfigMap of the last good scripts", "configmap", s.ns+"/"+s.name, "hash", set.hash)
			return nil
		}
		cur = cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[s.hashKey] = set.hash
		cur.Data, cur.BinaryData = data, nil
		if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating ConfigMap %s/%s: %w", s.ns, s.name, err)
		}
	}
	s.log.Info("last good scripts kept", "configmap", s.ns+"/"+s.name, "hash", set.hash, "files", len(set.scripts))
	return nil
}

// Load reads the last good scripts: none (nil, nil) when there are none yet.
func (s *lastGoodStore) Load(ctx context.Context) ([]luabind.Script, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cm, err := s.client.CoreV1().ConfigMaps(s.ns).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", s.ns, s.name, err)
	}
	scripts, err := scriptsOfConfigMap(cm.Data)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w", s.ns, s.name, err)
	}
	if len(scripts) == 0 {
		return nil, errors.New("ConfigMap " + s.ns + "/" + s.name + " holds no *.lua key")
	}
	s.mu.Lock()
	s.written = cm.Annotations[s.hashKey]
	s.mu.Unlock()
	return scripts, nil
}
