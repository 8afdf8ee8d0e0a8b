package main

import (
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/peering"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/sharding"
)

// luaop status prints what /debug says in lines an SRE reads at a glance.
func TestPrintStatus(t *testing.T) {
	now := time.Date(2026, 11, 30, 16, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	doc := debugDoc{Version: "v1.2.3", Election: "leader", Debug: operator.Debug{
		Ready:       true,
		ScriptsHash: "abc123",
		Handlers: []operator.DebugHandler{
			{Kind: "probe", ID: "now", Source: "widgets.lua:20"},
			{Resource: "examples.luaop.dev/v1/tenants", Kind: "change", ID: "register", Source: "tenants.lua:11"},
		},
		LastReload: &operator.ReloadStatus{At: now.Add(-3 * time.Minute), Files: []string{"widgets.lua"}, Error: "widgets.lua:7: '=' expected near 'end'"},
		Snapshot: processing.Snapshot{
			Objects: []processing.ObjectStatus{{Resource: "tenants.examples.luaop.dev", Namespace: "team-a", Name: "acme", Reason: "create",
				ProcessingSince: at(-2 * time.Second),
				Handlers: []processing.HandlerProgress{
					{ID: "register", State: "waiting", Retries: 2, Delayed: at(time.Minute), Message: "registry not reachable"},
					{ID: "notify", State: "pending"},
				}}},
			Daemons: []processing.DaemonStatus{{Resource: "monitors.examples.luaop.dev", Namespace: "default", Name: "m", Handler: "watcher", Since: now.Add(-time.Hour)}},
			Timers:  []processing.TimerStatus{{Resource: "quotas.examples.luaop.dev", Name: "q", Handler: "usage", Next: at(41 * time.Second)}},
		},
	}}
	var out strings.Builder
	printStatus(&out, doc, now)
	for _, want := range []string{
		"luaop v1.2.3: ready",
		"leader: this replica handles the objects",
		"scripts abc123",
		"last reload 3m0s ago: FAILED (the previous scripts keep running) widgets.lua",
		"  widgets.lua:7: '=' expected near 'end'",
		"handlers (2):",
		"(operator)",
		"register  examples.luaop.dev/v1/tenants  tenants.lua:11",
		"objects in flight (1):",
		"  tenants.examples.luaop.dev team-a/acme, processing for 2s, cause create",
		"      register: waiting until " + now.Add(time.Minute).Local().Format("15:04:05") + ", 2 retries: registry not reachable",
		"      notify: pending",
		"daemons (1):",
		"monitors.examples.luaop.dev  default/m  watcher  running for 1h0m0s",
		"timers (1):",
		"quotas.examples.luaop.dev  q  usage  next in 41s",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in:\n%s", want, out.String())
		}
	}
}

// After a start on broken scripts, luaop status says which scripts serve.
func TestPrintStatusOfBrokenScripts(t *testing.T) {
	now := time.Date(2026, 11, 30, 16, 0, 0, 0, time.UTC)
	failed := &operator.ReloadStatus{At: now.Add(-time.Minute), Error: "hello.lua:3: unknown handler option retires"}
	for _, tt := range []struct {
		name string
		doc  operator.Debug
		want []string
	}{
		{"last good serving", operator.Debug{Ready: true, ScriptsHash: "abc", ServingLastGood: true, Stale: true, LastReload: failed},
			[]string{"scripts abc: the last good ones kept by the operator", "FAILED (the last good scripts keep running)", "hello.lua:3"}},
		{"nothing serving", operator.Debug{LastReload: failed},
			[]string{"scripts: none serving", "FAILED (no scripts serving)", "hello.lua:3"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			printStatus(&out, debugDoc{Version: "v1", Debug: tt.doc}, now)
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("missing %q in:\n%s", w, out.String())
				}
			}
		})
	}
}

func TestPrintStatusOfPeeringAndWebhooks(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	doc := debugDoc{Version: "v1",
		Peering: &peering.State{Namespace: "luaop-system", Lease: "luaop.dev-peer-1", Priority: 0, Paused: true,
			Reason: "paused in favour of me@laptop/1 (priority 666, luaop dev on laptop)",
			Peers:  []peering.Peer{{Identity: "me@laptop/1", Priority: 666, Mode: "dev", Host: "laptop"}}},
		Webhooks: &webhooksDoc{Address: "0.0.0.0:9443", Reachability: admission.Reachability{Checked: true, At: now.Add(-time.Minute),
			Error: "the API server cannot call the webhooks through Service luaop-system/luaop: no endpoints"}}}
	var out strings.Builder
	printStatus(&out, doc, now)
	for _, want := range []string{
		"peering: PAUSED (paused in favour of me@laptop/1 (priority 666, luaop dev on laptop)); priority 0, Lease luaop-system/luaop.dev-peer-1\n",
		"  peer me@laptop/1 (priority 666, luaop dev on laptop): working\n",
		"webhooks: NOT REACHED by the API server (1m0s ago): the API server cannot call the webhooks through Service luaop-system/luaop: no endpoints\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("luaop status lacks %q:\n%s", want, out.String())
		}
	}
}

func TestPrintStatusOfSharding(t *testing.T) {
	doc := debugDoc{Version: "v1", Sharding: &sharding.State{Group: "luaop", Namespace: "luaop-system", Member: "luaop-7d9f-1a2b",
		Members: []string{"luaop-7d9f-1a2b", "luaop-7d9f-3c4d", "luaop-7d9f-5e6f"}, Coordinator: true, Owned: 1003, Draining: 2, Released: 17,
		Resources: []sharding.ResourceState{{Resource: "widgets.examples.luaop.dev", Mode: "label selector"}}}}
	var out strings.Builder
	printStatus(&out, doc, time.Now())
	for _, want := range []string{
		"sharding: member and coordinator luaop-7d9f-1a2b of group luaop-system/luaop; owns 1003 objects (fair share 1/3), 2 being handed over, 17 handed over\n",
		"  members (3): luaop-7d9f-1a2b, luaop-7d9f-3c4d, luaop-7d9f-5e6f\n",
		"  widgets.examples.luaop.dev: label selector\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("luaop status lacks %q:\n%s", want, out.String())
		}
	}
}

// The memory budget's last report (issue 46): luaop status names who held the most.
func TestPrintStatusOfLuaMemory(t *testing.T) {
	now := time.Date(2026, 11, 30, 16, 0, 0, 0, time.UTC)
	doc := debugDoc{Version: "v1", Debug: operator.Debug{Ready: true, ScriptsHash: "abc", LuaMemory: &luabind.MemoryReport{
		At: now.Add(-time.Minute), Call: "innocent", Heap: 200 << 20, Budget: 192 << 20,
		Holders: []luabind.MemoryHolder{{What: "file cache.lua", Bytes: 175 << 20}, {What: "memo of default/w1", Bytes: 2 << 20}},
	}}}
	var out strings.Builder
	printStatus(&out, doc, now)
	want := "Lua memory budget last exceeded 1m0s ago (call innocent cancelled, heap 200.0 MiB, budget 192.0 MiB): data kept across calls, measured: most by file cache.lua 175.0 MiB, then memo of default/w1 2.0 MiB"
	if !strings.Contains(out.String(), want) {
		t.Errorf("missing %q in:\n%s", want, out.String())
	}
}
