package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// The benchmark's own resource: namespaced, status subresource, schemaless spec and
// status. Installed (or updated) by the benchmark itself.
var (
	benchGVR = schema.GroupVersionResource{Group: "bench.luaop.dev", Version: "v1", Resource: "benchobjects"}
	crdGVR   = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

const benchResource = "bench.luaop.dev/v1/benchobjects"

func benchCRD() *unstructured.Unstructured {
	preserve := map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "benchobjects.bench.luaop.dev"},
		"spec": map[string]any{
			"group": "bench.luaop.dev",
			"scope": "Namespaced",
			"names": map[string]any{"plural": "benchobjects", "singular": "benchobject", "kind": "BenchObject"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":       "object",
					"properties": map[string]any{"spec": preserve, "status": preserve},
				}},
			}},
		},
	}}
}

// cluster is the benchmark's own connection: high client limits, so that the
// creators are limited by the API server only.
type cluster struct {
	kubeconfig string
	cfg        *rest.Config
	dyn        dynamic.Interface
	kube       kubernetes.Interface
}

func connect(kubeconfig string) (*cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100000, 100000
	cfg.UserAgent = "luaop-bench"
	c := &cluster{kubeconfig: kubeconfig, cfg: cfg}
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if _, err := c.kube.Discovery().ServerVersion(); err != nil {
		return nil, fmt.Errorf("the cluster at %s does not answer: %w", cfg.Host, err)
	}
	return c, nil
}

// installCRD creates or updates the CRD and waits until it is Established (plus the
// server's warm-up for creates of a new CRD's objects).
func (c *cluster) installCRD(ctx context.Context) error {
	crd := benchCRD()
	client := c.dyn.Resource(crdGVR)
	existing, err := client.Get(ctx, crd.GetName(), metav1.GetOptions{})
	created := false
	switch {
	case apierrors.IsNotFound(err):
		if _, err := client.Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating the CRD: %w", err)
		}
		created = true
	case err != nil:
		return err
	default:
		crd.SetResourceVersion(existing.GetResourceVersion())
		if _, err := client.Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating the CRD: %w", err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := client.Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					if created {
						time.Sleep(2 * time.Second)
					}
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CRD %s not Established after 30s", crd.GetName())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *cluster) createNamespace(ctx context.Context, variant string, n int) (string, error) {
	name := fmt.Sprintf("bench-%s-%d-%05d", variant, n, rand.IntN(100000))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return name, nil
}

// deleteNamespace deletes a namespace and waits until the namespace controller has
// removed it with its objects.
func (c *cluster) deleteNamespace(ctx context.Context, name string) error {
	err := c.kube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	start := time.Now()
	lastReport := start
	for {
		_, err := c.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			progress("namespace %s deleted in %s", name, time.Since(start).Round(100*time.Millisecond))
			return nil
		}
		if time.Since(lastReport) > 10*time.Second {
			progress("waiting for namespace %s to be deleted (%s)", name, time.Since(start).Round(time.Second))
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s still there: %w", name, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func objectName(i int) string { return fmt.Sprintf("o-%06d", i) }

func objectIndex(name string) (int, bool) {
	if !strings.HasPrefix(name, "o-") {
		return 0, false
	}
	i, err := strconv.Atoi(name[2:])
	return i, err == nil
}

// phase names what the tracker is timing.
type phase int

const (
	phaseIdle   phase = iota
	phaseCreate       // an object counts when status.handled is true
	phaseUpdate       // an object counts when status.updated == 1
	phaseResume       // only writes are counted
	phaseSleep        // an object counts when status.slept is a table (bench -scenario sleep)
)

// tracker is the benchmark's own informer on the scenario namespace. It timestamps
// the first time each object shows the phase's result, and counts the writes (new
// resourceVersions of existing objects) made during the phase.
type tracker struct {
	n      int
	mu     sync.Mutex
	phase  phase
	issued []time.Time // when the create/patch call of the phase returned
	seen   []time.Time // when the result was first seen
	// labelled: when the shard label (luaop.dev/shard, -scenario sharding) was
	// first seen: the object's assignment to a replica.
	labelled []time.Time
	count    int // objects seen with the result
	writes   int // MODIFIED notifications with a new resourceVersion
	stop     context.CancelFunc
}

// trackedNamespace makes a fresh namespace for one run of the sleep or sharding
// scenario and a watch timing its tracked objects; cleanup stops the watch and
// deletes the namespace (bounded, whatever ended the run: defer it at once).
func (c *cluster) trackedNamespace(ctx context.Context, variant string, n, tracked int, tag string) (ns string, tr *tracker, cleanup func(), err error) {
	ns, err = c.createNamespace(ctx, variant, n)
	if err != nil {
		return "", nil, nil, err
	}
	trCtx, trCancel := context.WithCancel(ctx)
	cleanup = func() {
		trCancel()
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := c.deleteNamespace(dctx, ns); err != nil {
			progress("%s cleanup: %v", tag, err)
		}
	}
	if tr, err = c.startTracker(trCtx, ns, tracked); err != nil {
		cleanup()
		return "", nil, nil, err
	}
	return ns, tr, cleanup, nil
}

func (c *cluster) startTracker(ctx context.Context, ns string, n int) (*tracker, error) {
	t := &tracker{n: n, issued: make([]time.Time, n), seen: make([]time.Time, n), labelled: make([]time.Time, n)}
	ctx, t.stop = context.WithCancel(ctx)
	inf := dynamicinformer.NewFilteredDynamicInformer(c.dyn, benchGVR, ns, 0, cache.Indexers{}, nil).Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { t.observe(nil, obj) },
		UpdateFunc: func(old, obj any) {
			t.observe(old, obj)
		},
	})
	if err != nil {
		return nil, err
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil, fmt.Errorf("the benchmark's informer did not sync")
	}
	return t, nil
}

func (t *tracker) observe(old, obj any) {
	now := time.Now()
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	i, ok := objectIndex(u.GetName())
	if !ok || i >= t.n {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := old.(*unstructured.Unstructured); ok && o.GetResourceVersion() != u.GetResourceVersion() {
		t.writes++
	}
	var done bool
	switch t.phase {
	case phaseCreate:
		done, _, _ = unstructured.NestedBool(u.Object, "status", "handled")
	case phaseSleep:
		_, done, _ = unstructured.NestedMap(u.Object, "status", "slept")
	case phaseUpdate:
		v, _, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "updated")
		switch x := v.(type) {
		case int64:
			done = x == 1
		case float64:
			done = x == 1
		}
	}
	if done && t.seen[i].IsZero() {
		t.seen[i] = now
		t.count++
	}
	if t.labelled[i].IsZero() && u.GetLabels()[shardLabel] != "" {
		t.labelled[i] = now
	}
}

func (t *tracker) setPhase(p phase) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.phase = p
	clear(t.issued)
	clear(t.seen)
	clear(t.labelled)
	t.count, t.writes = 0, 0
}

func (t *tracker) issuedAt(i int, at time.Time) {
	t.mu.Lock()
	t.issued[i] = at
	t.mu.Unlock()
}

func (t *tracker) counts() (seen, writes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.count, t.writes
}

// latencies returns, per object, the time from its call's return to the result seen
// (0 when the result came first), and the last time a result was seen.
func (t *tracker) latencies() ([]time.Duration, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []time.Duration
	var last time.Time
	for i := range t.n {
		if t.seen[i].IsZero() || t.issued[i].IsZero() {
			continue
		}
		out = append(out, max(0, t.seen[i].Sub(t.issued[i])))
		if t.seen[i].After(last) {
			last = t.seen[i]
		}
	}
	return out, last
}

// assignments returns, per object of from..to-1 with the shard label, the time from its create
// call's return to the label seen (0 when the label came first: the watch's
// notification raced the answer).
func (t *tracker) assignments(from, to int) []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []time.Duration
	for i := from; i < min(to, t.n); i++ {
		if !t.labelled[i].IsZero() && !t.issued[i].IsZero() {
			out = append(out, max(0, t.labelled[i].Sub(t.issued[i])))
		}
	}
	return out
}

// releaseFinalizers removes the finalizers of every object of the namespace (the
// operator that put them is stopped), so that the namespace can be deleted.
func (c *cluster) releaseFinalizers(ctx context.Context, ns string, workers int) error {
	client := c.dyn.Resource(benchGVR).Namespace(ns)
	list, err := client.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	names := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				_, err := client.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, item := range list.Items {
		if len(item.GetFinalizers()) > 0 {
			names <- item.GetName()
		}
	}
	close(names)
	wg.Wait()
	return firstErr
}
