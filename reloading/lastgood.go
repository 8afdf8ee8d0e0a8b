package reloading

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptsource"
)

// LastGoodStore keeps the last scripts that loaded in the ConfigMap ns/name
// (--last-good-configmap, issue 21), annotated with their content hash; it writes
// only when the hash changes. A pod starting on broken scripts serves these
// instead of crash-looping.
type LastGoodStore struct {
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

// NewLastGoodStore keeps the last good scripts in the ConfigMap ns/name (created
// when missing, labelled managed-by luaop), their hash in the annotation
// <prefix>/scripts-hash; with dryRun it logs the writes it would make instead. Run
// does the writing.
func NewLastGoodStore(client kubernetes.Interface, ns, name, prefix string, dryRun bool, log *slog.Logger) *LastGoodStore {
	return &LastGoodStore{client: client, ns: ns, name: name, hashKey: prefix + "/scripts-hash", dryRun: dryRun, log: log,
		wake: make(chan struct{}, 1)}
}

// Name is the store's ConfigMap, namespace/name, for messages.
func (s *LastGoodStore) Name() string { return s.ns + "/" + s.name }

// Keep offers scripts that loaded: Run writes the latest offered set. It never
// waits for the write.
func (s *LastGoodStore) Keep(scripts []luabind.Script, hash string) {
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
func (s *LastGoodStore) Run(ctx context.Context) {
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

// write writes set unless the ConfigMap holds it already. The replicas of a
// Deployment start together and each keeps the same scripts: a create or update
// that loses the race to another replica's (AlreadyExists, Conflict) reads the
// winner's copy and compares again, instead of failing (it did, on a node with three
// replicas: an error logged, advising RBAC, and the write retried 30 s later).
func (s *LastGoodStore) write(ctx context.Context, set *lastGoodSet) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var err error
	for range 3 {
		if err = s.writeOnce(ctx, set); !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

func (s *LastGoodStore) writeOnce(ctx context.Context, set *lastGoodSet) error {
	data := make(map[string]string, len(set.scripts))
	for _, sc := range set.scripts {
		data[scriptsource.ConfigMapKey(sc.Name)] = string(sc.Source)
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
func (s *LastGoodStore) Load(ctx context.Context) ([]luabind.Script, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cm, err := s.client.CoreV1().ConfigMaps(s.ns).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", s.ns, s.name, err)
	}
	scripts, err := scriptsource.ScriptsOfConfigMap(cm.Data)
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
