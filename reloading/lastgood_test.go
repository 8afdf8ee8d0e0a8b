package reloading

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/testcluster"
)

// libModule is a module in a folder: kept under the key lib__greeting.lua.
const libModule = "return {}\n"

// The last good scripts: written after a load only when their hash changed, and
// read back as the mounted folder would give them.
func TestLastGoodStoreWritesOnlyNewScripts(t *testing.T) {
	client := fake.NewSimpleClientset()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := NewLastGoodStore(client, "ops", "luaop-scripts-last-good", "luaop.dev", false, log)
	ctx := t.Context()
	if scripts, err := store.Load(ctx); err != nil || scripts != nil {
		t.Fatalf("Load before any write: %v, %v; want none", scripts, err)
	}
	scripts := []luabind.Script{{Name: "hello.lua", Source: []byte(handlerScript("hello"))}, {Name: "lib/greeting.lua", Source: []byte(libModule)}}
	writes := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "create" || a.GetVerb() == "update" {
				n++
			}
		}
		return n
	}
	for _, hash := range []string{"h1", "h1", "h2"} {
		set := &lastGoodSet{scripts: scripts, hash: hash}
		store.Keep(set.scripts, set.hash)
		store.mu.Lock()
		pending := store.pending
		store.pending = nil
		store.mu.Unlock()
		if pending != nil {
			if err := store.write(ctx, pending); err != nil {
				t.Fatal(err)
			}
			store.mu.Lock()
			store.written = pending.hash
			store.mu.Unlock()
		}
	}
	if n := writes(); n != 2 {
		t.Errorf("%d writes for hashes h1, h1, h2; want 2 (a create, an update)", n)
	}
	cm, err := client.CoreV1().ConfigMaps("ops").Get(ctx, "luaop-scripts-last-good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Annotations["luaop.dev/scripts-hash"] != "h2" || cm.Data["lib__greeting.lua"] != libModule {
		t.Errorf("ConfigMap %v, want hash h2 and key lib__greeting.lua", cm)
	}
	got, err := store.Load(ctx)
	if err != nil || len(got) != 2 || got[1].Name != "lib/greeting.lua" || string(got[1].Source) != libModule {
		t.Errorf("Load: %v, %v", got, err)
	}
	// Another replica wrote the same hash: no write.
	other := NewLastGoodStore(client, "ops", "luaop-scripts-last-good", "luaop.dev", false, log)
	before := writes()
	if err := other.write(ctx, &lastGoodSet{scripts: scripts, hash: "h2"}); err != nil {
		t.Fatal(err)
	}
	if writes() != before {
		t.Error("the same hash was written again")
	}
}

// Run writes what Keep offers, in the background; a write that fails (here: no
// RBAC) is tried again at the next offer, and the latest set wins.
func TestLastGoodStoreRunRetriesAFailedWrite(t *testing.T) {
	client := fake.NewSimpleClientset()
	var deny atomic.Bool
	deny.Store(true)
	client.PrependReactor("create", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
		if deny.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "x", errors.New("no RBAC"))
		}
		return false, nil, nil
	})
	logs := &testcluster.LogBuffer{}
	store := NewLastGoodStore(client, "ops", "last-good", "luaop.dev", false, slog.New(slog.NewTextHandler(logs, nil)))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx) }()
	defer func() { cancel(); <-done }()

	scripts := []luabind.Script{{Name: "a.lua", Source: []byte("-- a")}}
	store.Keep(scripts, "h1")
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), "keeping the last good scripts failed"), "no error logged for the denied write:\n" + logs.String()
	})
	deny.Store(false)
	store.Keep(append(scripts, luabind.Script{Name: "b.lua", Source: []byte("-- b")}), "h2")
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		cm, err := client.CoreV1().ConfigMaps("ops").Get(t.Context(), "last-good", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cm.Annotations["luaop.dev/scripts-hash"] == "h2" && cm.Data["b.lua"] == "-- b", fmt.Sprintf("%v", cm)
	})
}

// Replicas start together and each keeps the same scripts: the one whose create or
// update loses the race (AlreadyExists, Conflict) reads the winner's copy, finds
// its hash there and writes nothing, instead of failing. The fake API server has
// another replica write first, between this one's read and write.
func TestLastGoodStoreRaceWithAnotherReplica(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	scripts := []luabind.Script{{Name: "a.lua", Source: []byte("-- a")}}
	for _, verb := range []string{"create", "update"} {
		t.Run(verb, func(t *testing.T) {
			client := fake.NewSimpleClientset()
			store := NewLastGoodStore(client, "ops", "last-good", "luaop.dev", false, log)
			other := NewLastGoodStore(fake.NewSimpleClientset(), "ops", "last-good", "luaop.dev", false, log)
			if verb == "update" {
				if err := store.write(t.Context(), &lastGoodSet{scripts: scripts, hash: "h0"}); err != nil {
					t.Fatal(err)
				}
			}
			if err := other.write(t.Context(), &lastGoodSet{scripts: scripts, hash: "h1"}); err != nil {
				t.Fatal(err)
			}
			winner, err := other.client.CoreV1().ConfigMaps("ops").Get(t.Context(), "last-good", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			winner.ResourceVersion = "" // the other fake API server's
			raced := false
			gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
			client.PrependReactor(verb, "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
				if raced {
					return false, nil, nil
				}
				raced = true
				if verb == "create" {
					if err := client.Tracker().Create(gvr, winner, "ops"); err != nil {
						t.Fatal(err)
					}
					return true, nil, apierrors.NewAlreadyExists(gvr.GroupResource(), "last-good")
				}
				if err := client.Tracker().Update(gvr, winner, "ops"); err != nil {
					t.Fatal(err)
				}
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), "last-good", errors.New("the object has been modified"))
			})
			if err := store.write(t.Context(), &lastGoodSet{scripts: scripts, hash: "h1"}); err != nil {
				t.Fatalf("write, another replica writing the same scripts first: %v", err)
			}
			if !raced {
				t.Fatal("the race was not staged: no " + verb)
			}
			cm, err := client.CoreV1().ConfigMaps("ops").Get(t.Context(), "last-good", metav1.GetOptions{})
			if err != nil || cm.Annotations["luaop.dev/scripts-hash"] != "h1" {
				t.Fatalf("the ConfigMap after the race: %v %v", err, cm)
			}
		})
	}
}
