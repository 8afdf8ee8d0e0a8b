package operator

import (
	"errors"
	"time"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/processing/causes"
)

// Debug is what the operator is doing now, as /debug serves it (JSON) and `luaop
// status` prints it.
type Debug struct {
	// Ready is /readyz's answer: scripts loaded and the initial listing processed.
	Ready bool `json:"ready"`
	// ScriptsHash is the content hash of the scripts serving now.
	ScriptsHash string         `json:"scriptsHash"`
	Handlers    []DebugHandler `json:"handlers"`
	// LastReload is the last load of the scripts (the first one included); when it
	// failed, the previous scripts are the ones serving.
	LastReload *ReloadStatus `json:"lastReload,omitempty"`
	// ServingLastGood is set when the scripts serving are the last good ones kept
	// by the operator (its scripts folder did not load at start); Stale when the
	// scripts serving differ from the folder's because its last load failed.
	ServingLastGood bool `json:"servingLastGood,omitempty"`
	Stale           bool `json:"stale,omitempty"`
	// LuaMemory is what the Lua memory budget found the last time it cancelled a
	// call: the scripts' largest holders of data kept across calls (files, memos).
	LuaMemory *luabind.MemoryReport `json:"luaMemory,omitempty"`
	processing.Snapshot
}

// DebugHandler is one handler of the scripts serving now.
type DebugHandler struct {
	// Resource is the resource as the script names it (group/version/plural), empty
	// for operator-level handlers (startup, cleanup, probe).
	Resource string `json:"resource,omitempty"`
	Kind     string `json:"kind"`
	ID       string `json:"id"`
	Source   string `json:"source,omitempty"` // file:line
}

// ReloadStatus is the outcome of one load of the scripts.
type ReloadStatus struct {
	At    time.Time `json:"at"`
	OK    bool      `json:"ok"`
	Files []string  `json:"files,omitempty"`
	Error string    `json:"error,omitempty"`
}

// NoteReload records the outcome of a load of the scripts for Debug (the reload
// loop calls it; LoadScripts does not know which files changed).
func (o *Operator) NoteReload(files []string, err error) {
	st := &ReloadStatus{At: time.Now(), OK: err == nil, Files: append([]string(nil), files...)}
	if err != nil {
		st.Error = err.Error()
	}
	o.lastReload.Store(st)
}

// NoteLastGood records whether the scripts serving are the last good ones kept by
// the operator rather than its scripts folder's (Debug, Scripts).
func (o *Operator) NoteLastGood(serving bool) { o.lastGood.Store(serving) }

// ScriptsState says how the scripts serving relate to the scripts folder's:
// loaded (any scripts serving), and, when the folder's last load failed, its
// error (file:line): the scripts serving are the previous ones, or the last good
// ones kept by the operator (lastGood), or none (loaded false).
func (o *Operator) ScriptsState() (loaded, lastGood bool, failed error) {
	if st := o.lastReload.Load(); st != nil && !st.OK {
		failed = errors.New(st.Error)
	}
	return o.loaded.Load(), o.lastGood.Load(), failed
}

// Debug takes a snapshot of the operator: its scripts, handlers, last reload, and
// what processing is doing (objects in flight, daemons, timers). Each part is copied
// from its owner without waiting for any cycle.
func (o *Operator) Debug() Debug {
	d := Debug{Ready: o.Ready(), ScriptsHash: o.runtime.Hash(), LastReload: o.lastReload.Load(), Snapshot: o.reactor.Snapshot()}
	d.ServingLastGood = o.lastGood.Load()
	d.LuaMemory = o.runtime.MemoryReport()
	d.Stale = d.LastReload != nil && !d.LastReload.OK && o.loaded.Load()
	d.Handlers = []DebugHandler{}
	for _, list := range [][]causes.Spec{o.runtime.Hooks(), o.runtime.Specs()} {
		for _, h := range list {
			dh := DebugHandler{Kind: string(h.Kind), ID: h.ID, Source: h.Source}
			if h.Resource.Resource != "" {
				dh.Resource = h.Resource.String()
			}
			d.Handlers = append(d.Handlers, dh)
		}
	}
	return d
}
