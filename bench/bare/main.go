package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

var gvr = schema.GroupVersionResource{Group: "bench.luaop.dev", Version: "v1", Resource: "benchobjects"}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace to watch (required)")
	workers := flag.Int("workers", 16, "worker goroutines (luaop's --workers)")
	expect := flag.Int("expect", 0, "exit once this many objects are done (0: run until SIGTERM)")
	flag.Parse()
	if *namespace == "" {
		fmt.Fprintln(os.Stderr, "bare: -namespace is required")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *namespace, *workers, *expect); err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		os.Exit(1)
	}
}

// patchFor returns the status patch an object needs, or nil when it is done.
func patchFor(u *unstructured.Unstructured) map[string]any {
	status := map[string]any{}
	if handled, _, _ := unstructured.NestedBool(u.Object, "status", "handled"); !handled {
		status["handled"] = true
	}
	if n, ok := number(u.Object, "spec", "n"); ok && n >= 1 {
		if got, ok := number(u.Object, "status", "updated"); !ok || got != n {
			status["updated"] = n
		}
	}
	if len(status) == 0 {
		return nil
	}
	return map[string]any{"status": status}
}

func number(obj map[string]any, path ...string) (int64, bool) {
	v, found, _ := unstructured.NestedFieldNoCopy(obj, path...)
	if !found {
		return 0, false
	}
	switch x := v.(type) {
	case int64:
		return x, true
	case float64:
		return int64(x), true
	}
	return 0, false
}

func run(kubeconfig, namespace string, workers, expect int) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 500, 1000 // the same client limits as luaop (cmd/luaop restConfig)
	cfg.UserAgent = "luaop-bench-bare"
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, finish := context.WithCancel(ctx)
	defer finish()

	inf := dynamicinformer.NewFilteredDynamicInformer(dyn, gvr, namespace, 0, cache.Indexers{}, nil).Informer()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())

	var mu sync.Mutex
	done := map[string]bool{}
	observe := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		key, _ := cache.MetaNamespaceKeyFunc(u)
		if patchFor(u) != nil {
			mu.Lock()
			delete(done, key)
			mu.Unlock()
			queue.Add(key)
			return
		}
		mu.Lock()
		done[key] = true
		reached := expect > 0 && len(done) >= expect
		mu.Unlock()
		if reached {
			finish()
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
				key, _ := cache.MetaNamespaceKeyFunc(u)
				mu.Lock()
				delete(done, key)
				mu.Unlock()
			}
		},
	})
	if err != nil {
		return err
	}

	client := dyn.Resource(gvr).Namespace(namespace)
	process := func(key string) error {
		item, exists, err := inf.GetStore().GetByKey(key)
		if err != nil || !exists {
			return err
		}
		u := item.(*unstructured.Unstructured)
		p := patchFor(u)
		if p == nil {
			return nil
		}
		data, err := json.Marshal(p)
		if err != nil {
			return err
		}
		_, err = client.Patch(ctx, u.GetName(), types.MergePatchType, data, metav1.PatchOptions{}, "status")
		if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}

	go inf.RunWithContext(ctx)
	// The registration's HasSynced (not the informer's): the initial listing has
	// also been delivered to the handler above.
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil // stopped (signal, or -expect reached) before the listing was in
	}
	fmt.Println("synced")

	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				key, shutdown := queue.Get()
				if shutdown {
					return
				}
				if err := process(key); err != nil {
					fmt.Fprintf(os.Stderr, "bare: %s: %v (retrying)\n", key, err)
					queue.AddRateLimited(key)
				} else {
					queue.Forget(key)
				}
				queue.Done(key)
			}
		}()
	}
	<-ctx.Done()
	queue.ShutDown()
	waitTimeout(&wg, 10*time.Second)
	return nil
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	select {
	case <-c:
	case <-time.After(d):
	}
}
