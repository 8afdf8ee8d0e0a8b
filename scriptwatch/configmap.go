package scriptwatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	kwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/luaop/luaop/scriptsource"
)

// ConfigMapSource reads the scripts ConfigMap through the API: one ConfigMap,
// watched by a field selector on its name in its namespace, so that nothing else is
// read or held (RBAC can grant get, list and watch on it by resourceNames). An
// edit reaches the operator as soon as the watch delivers it, not after the
// kubelet's sync period (about a minute) as the mounted folder does.
//
// It reads and hands on, like [Watch]: which change is loaded, and whether the
// folder or the API is the newer, is package reloading's.
type ConfigMapSource struct {
	client   kubernetes.Interface
	ns, name string
	log      *slog.Logger
}

// NewConfigMapSource reads the ConfigMap ns/name with client; log gets the watch's
// errors (default slog.Default()).
func NewConfigMapSource(client kubernetes.Interface, ns, name string, log *slog.Logger) *ConfigMapSource {
	if log == nil {
		log = slog.Default()
	}
	return &ConfigMapSource{client: client, ns: ns, name: name, log: log.With("configmap", ns+"/"+name)}
}

// Name is the ConfigMap, namespace/name, for messages.
func (s *ConfigMapSource) Name() string { return s.ns + "/" + s.name }

// Get reads the ConfigMap as it is now (a quorum read, not a cache's).
func (s *ConfigMapSource) Get(ctx context.Context) (Change, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cm, err := s.client.CoreV1().ConfigMaps(s.ns).Get(ctx, s.name, metav1.GetOptions{})
	if err != nil {
		return Change{}, fmt.Errorf("reading ConfigMap %s: %w", s.Name(), err)
	}
	return changeOf(cm, time.Now())
}

// Watch follows the ConfigMap until ctx is done, and sends its content on the
// returned channel: first as the initial listing finds it (nothing when it does
// not exist), then at every update, whatever changed (the consumer compares the
// hash). A consumer that falls behind gets the latest content only. A deletion
// is logged and sends nothing: the scripts running stay. The channel is closed once
// everything Watch started has ended.
func (s *ConfigMapSource) Watch(ctx context.Context) <-chan Change {
	out := make(chan Change)
	f := &forwarder{wake: make(chan struct{}, 1)}
	informer := cache.NewSharedIndexInformerWithOptions(s.listWatch(), &corev1.ConfigMap{}, cache.SharedIndexInformerOptions{
		ObjectDescription: "scripts ConfigMap " + s.Name(),
	})
	// Hold what a change needs only: not the last-applied annotation (a second copy
	// of every script after kubectl apply) nor the managed fields.
	_ = informer.SetTransform(keepScriptsOnly)
	_ = informer.SetWatchErrorHandlerWithContext(s.watchError())
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.changed(obj, f) },
		UpdateFunc: func(_, obj any) { s.changed(obj, f) },
		DeleteFunc: func(any) {
			s.log.Warn("the scripts ConfigMap was deleted: the scripts running stay; create it again to change them")
		},
	})
	s.log.Info("reading the scripts ConfigMap through the API: its edits are loaded as soon as they are made")
	var wg sync.WaitGroup
	wg.Go(func() { informer.RunWithContext(ctx) })
	wg.Go(func() { f.run(ctx, out) })
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
}

// listWatch lists and watches the one ConfigMap: a field selector on its name, in
// its namespace.
func (s *ConfigMapSource) listWatch() *cache.ListWatch {
	selector := fields.OneTermEqualSelector("metadata.name", s.name).String()
	cms := s.client.CoreV1().ConfigMaps(s.ns)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			return cms.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (kwatch.Interface, error) {
			opts.FieldSelector = selector
			return cms.Watch(ctx, opts)
		},
	}
}

// changed hands the ConfigMap's content on; one whose keys cannot be read as
// scripts is logged instead (the scripts running stay).
func (s *ConfigMapSource) changed(obj any, f *forwarder) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	ch, err := changeOf(cm, time.Now())
	if err != nil {
		s.log.Error("the scripts ConfigMap's scripts cannot be read; the scripts running stay", "resourceVersion", cm.ResourceVersion, "error", err)
		return
	}
	f.offer(ch)
}

// watchError logs why the ConfigMap cannot be watched, once per distinct error (the
// reflector retries with a backoff and would repeat it every few seconds). The
// watch's usual ends (a closed stream, an expired resourceVersion) are not errors.
func (s *ConfigMapSource) watchError() cache.WatchErrorHandlerWithContext {
	var last string // the reflector calls from one goroutine
	return func(_ context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return
		}
		if err.Error() == last {
			return
		}
		last = err.Error()
		next := "the watch is retried"
		if apierrors.IsForbidden(err) {
			next = "grant get, list and watch on it (luaop rbac --scripts-configmap NAME), or turn this off with --scripts-from-api=false"
		}
		s.log.Error("the scripts ConfigMap cannot be watched: edits arrive through the mounted folder only (the kubelet's copy, about a minute later)",
			"error", err, "next", next)
	}
}

// changeOf is the Change of a ConfigMap's content read at at.
func changeOf(cm *corev1.ConfigMap, at time.Time) (Change, error) {
	scripts, err := scriptsource.ScriptsOfConfigMap(cm.Data)
	if err != nil {
		return Change{}, err
	}
	keys := make([]string, 0, len(cm.Data)+len(cm.BinaryData))
	for k := range cm.Data {
		keys = append(keys, k)
	}
	for k := range cm.BinaryData {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return Change{Scripts: scripts, Hash: HashScripts(scripts), At: at, ResourceVersion: cm.ResourceVersion, Keys: keys}, nil
}

// keepScriptsOnly is the informer's transform: the ConfigMap's identity, version
// and keys, nothing else.
func keepScriptsOnly(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cm.Name, Namespace: cm.Namespace, UID: cm.UID, ResourceVersion: cm.ResourceVersion},
		Data:       cm.Data, BinaryData: cm.BinaryData,
	}, nil
}

// forwarder hands the latest content offered to the consumer without ever
// blocking the informer: an offer replaces one not yet taken.
type forwarder struct {
	mu      sync.Mutex // guards pending; never held across a send
	pending *Change
	wake    chan struct{}
}

func (f *forwarder) offer(ch Change) {
	f.mu.Lock()
	f.pending = &ch
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *forwarder) run(ctx context.Context, out chan<- Change) {
	var next *Change
	for {
		var outC chan<- Change
		var send Change
		if next != nil {
			outC, send = out, *next
		}
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
			f.mu.Lock()
			if f.pending != nil {
				next, f.pending = f.pending, nil
			}
			f.mu.Unlock()
		case outC <- send:
			next = nil
		}
	}
}
