package luabind

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	yamlv3 "go.yaml.in/yaml/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/scriptapi"
	"github.com/luaop/luaop/yaml12"
)

// Kube is the cluster access that scripts get as luaop.kube and the event helpers.
// kubeclient.Client implements it; objects are JSON maps.
type Kube interface {
	Get(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error)
	List(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error)
	Create(ctx context.Context, obj map[string]any) (map[string]any, error)
	Patch(ctx context.Context, apiVersion, kind, namespace, name string, patch any, patchType string) (map[string]any, error)
	Delete(ctx context.Context, apiVersion, kind, namespace, name string) error
	Apply(ctx context.Context, obj map[string]any, force bool) (map[string]any, error)
	Event(ctx context.Context, obj map[string]any, eventType, reason, message string) error
}

// installKube adds luaop.kube, the event helpers, json, yaml and sleep to the module.
// Failures the script can expect (not found, conflict) come back as values, the way
// Lua's io functions do: nil, message, reason ("NotFound", "AlreadyExists", ...).
func (s *shard) installKube(mod *lua.LTable) {
	L := s.L
	for _, ns := range []struct {
		name  string
		impls map[string]goFunction
	}{{"kube", kubeFunctions}, {"json", jsonFunctions}, {"yaml", yamlFunctions}} {
		t := L.NewTable()
		s.installFunctions(t, ns.name, ns.impls)
		mod.RawSetString(ns.name, t)
	}
	s.installFunctions(mod, "", eventFunctions)
	mod.RawSetString("sleep", s.sleepFunction())
}

// goFunction is the Go implementation of a function of the luaop module, called with
// its shard and the calling state.
type goFunction func(s *shard, L *lua.LState) int

// installFunctions sets impls (keyed by their name in scriptapi's table, "kube.get")
// on t, each under its last name part. Every implementation must be listed in the
// table, which luaop check, luaop rbac and the stubs read (a function missing there
// would be unknown to them: luaop rbac would not grant its verbs); with a namespace
// ("kube"), every function the table lists in it must have an implementation. Both
// tables are constants: a disagreement is a bug, and no state can be made.
func (s *shard) installFunctions(t *lua.LTable, namespace string, impls map[string]goFunction) {
	for name, impl := range impls {
		if _, ok := scriptapi.Lookup(name); !ok {
			panic("luabind: luaop." + name + " is not in scriptapi.Functions: add it there (luaop check, luaop rbac and the stubs read that table)")
		}
		impl := impl
		t.RawSetString(name[strings.LastIndex(name, ".")+1:], s.L.NewFunction(func(L *lua.LState) int { return impl(s, L) }))
	}
	if namespace == "" {
		return
	}
	for _, f := range scriptapi.Functions {
		if strings.HasPrefix(f.Name, namespace+".") && impls[f.Name] == nil {
			panic("luabind: scriptapi.Functions lists luaop." + f.Name + ", which has no implementation")
		}
	}
}

// kubeFunctions implement luaop.kube.
var kubeFunctions = map[string]goFunction{
	"kube.get": (*shard).kubeGet, "kube.list": (*shard).kubeList, "kube.create": (*shard).kubeCreate,
	"kube.patch": (*shard).kubePatch, "kube.delete": (*shard).kubeDelete, "kube.apply": (*shard).kubeApply,
}

// kubeGet is luaop.kube.get(apiVersion, kind, namespace, name, opts): answered from
// the operator's cache when it holds the resource, from the API server with
// {live = true} (reads.go).
func (s *shard) kubeGet(L *lua.LState) int {
	k := s.readKube(L, liveOption(L.Get(5)))
	apiVersion, kind, ns, name := L.CheckString(1), L.CheckString(2), L.OptString(3, ""), L.CheckString(4)
	var obj map[string]any
	var err error
	s.blockingPoint(L, func(ctx context.Context) { obj, err = k.Get(ctx, apiVersion, kind, ns, name) })
	return s.pushObject(L, obj, err)
}

// kubeList is luaop.kube.list(apiVersion, kind, namespace, selector): selector is a
// label selector, or a table {selector = ..., live = true}.
func (s *shard) kubeList(L *lua.LState) int {
	selector := ""
	switch v := L.Get(4).(type) {
	case lua.LString:
		selector = string(v)
	case *lua.LTable:
		selector = lua.LVAsString(v.RawGetString("selector"))
	}
	k := s.readKube(L, liveOption(L.Get(4)))
	apiVersion, kind, ns := L.CheckString(1), L.CheckString(2), L.OptString(3, "")
	var items []map[string]any
	var err error
	s.blockingPoint(L, func(ctx context.Context) { items, err = k.List(ctx, apiVersion, kind, ns, selector) })
	if err != nil {
		return s.pushError(L, err)
	}
	t := L.CreateTable(len(items), 0)
	for _, it := range items {
		t.Append(luavalue.ToLua(L, it))
	}
	listMT, _ := luavalue.Markers(L)
	L.SetMetatable(t, listMT)
	L.Push(t)
	return 1
}

func (s *shard) kubeCreate(L *lua.LState) int {
	k := s.kube(L)
	obj := s.checkObject(L, 1)
	var created map[string]any
	var err error
	s.blockingPoint(L, func(ctx context.Context) { created, err = k.Create(ctx, obj) })
	return s.pushObject(L, created, err)
}

func (s *shard) kubePatch(L *lua.LState) int {
	patch, err := luavalue.FromLua(L.CheckAny(5))
	if err != nil {
		L.ArgError(5, err.Error())
	}
	k := s.kube(L)
	apiVersion, kind, ns, name, patchType := L.CheckString(1), L.CheckString(2), L.OptString(3, ""), L.CheckString(4), L.OptString(6, "merge")
	var out map[string]any
	s.blockingPoint(L, func(ctx context.Context) { out, err = k.Patch(ctx, apiVersion, kind, ns, name, patch, patchType) })
	return s.pushObject(L, out, err)
}

func (s *shard) kubeDelete(L *lua.LState) int {
	k := s.kube(L)
	apiVersion, kind, ns, name := L.CheckString(1), L.CheckString(2), L.OptString(3, ""), L.CheckString(4)
	var err error
	s.blockingPoint(L, func(ctx context.Context) { err = k.Delete(ctx, apiVersion, kind, ns, name) })
	if err != nil {
		return s.pushError(L, err)
	}
	L.Push(lua.LTrue)
	return 1
}

func (s *shard) kubeApply(L *lua.LState) int {
	obj := s.checkObject(L, 1)
	force := true
	if opts := L.OptTable(2, nil); opts != nil {
		if v := opts.RawGetString("force"); v != lua.LNil {
			force = lua.LVAsBool(v)
		}
	}
	k := s.kube(L)
	var out map[string]any
	var err error
	s.blockingPoint(L, func(ctx context.Context) { out, err = k.Apply(ctx, obj, force) })
	return s.pushObject(L, out, err)
}

// eventFunctions are the event helpers (kopf's posting): luaop.event(objs, type,
// reason, message) with any type; luaop.info / warn(objs, reason, message);
// luaop.exception(objs, reason, message, err) or luaop.exception(objs, err). objs is
// an object or a list of objects: one Event each.
var eventFunctions = map[string]goFunction{
	"event": func(s *shard, L *lua.LState) int {
		objs := s.checkObjects(L, 1)
		eventType, reason, message := L.CheckString(2), L.CheckString(3), L.OptString(4, "")
		return s.postEvents(L, objs, eventType, reason, message)
	},
	"info": func(s *shard, L *lua.LState) int { return s.postTypedEvents(L, "Normal") },
	"warn": func(s *shard, L *lua.LState) int { return s.postTypedEvents(L, "Warning") },
	"exception": func(s *shard, L *lua.LState) int {
		objs := s.checkObjects(L, 1)
		reason, message, err := exceptionArgs(L)
		return s.postEvents(L, objs, "Warning", reason, message+err)
	},
}

// postTypedEvents is luaop.info and luaop.warn: (objs, reason, message).
func (s *shard) postTypedEvents(L *lua.LState, eventType string) int {
	objs := s.checkObjects(L, 1)
	reason, message := L.CheckString(2), L.OptString(3, "")
	return s.postEvents(L, objs, eventType, reason, message)
}

// jsonFunctions implement luaop.json.
var jsonFunctions = map[string]goFunction{"json.encode": (*shard).jsonEncode, "json.decode": (*shard).jsonDecode}

func (s *shard) jsonEncode(L *lua.LState) int {
	// The bounded path counts the encoding's bytes (escapes included) as it
	// converts: nothing over the limit is built.
	data, err := luavalue.NewBudget(luavalue.Limits{MaxBytes: s.rt.opts.MaxStringSize}).EncodeJSON(L.CheckAny(1))
	if err != nil {
		L.ArgError(1, err.Error())
	}
	L.Push(lua.LString(data))
	return 1
}

func (s *shard) jsonDecode(L *lua.LState) int {
	data := []byte(L.CheckString(1))
	if err := s.checkDecodeSize(data); err != nil {
		L.Push(lua.LNil)
		L.Push(lua.LString("json.decode: " + err.Error()))
		return 2
	}
	var v any
	var err error
	s.offLua(L, func() { err = utiljson.Unmarshal(data, &v) })
	if err != nil {
		L.Push(lua.LNil)
		L.Push(lua.LString("json.decode: " + err.Error()))
		return 2
	}
	L.Push(luavalue.ToLua(L, v))
	return 1
}

// yamlFunctions implement luaop.yaml.
var yamlFunctions = map[string]goFunction{"yaml.decode": (*shard).yamlDecode}

// yamlDecode decodes YAML 1.2 (the core schema): `n:` and `NO` stay strings, 014 is
// 14. The value budget bounds what aliases expand to as well.
func (s *shard) yamlDecode(L *lua.LState) int {
	src := []byte(L.CheckString(1))
	var v any
	err := s.checkDecodeSize(src)
	if err == nil {
		// Off Lua, so that the call's deadline holds; aliases are bounded first
		// (the bytes they expand to, as the values are while converting).
		s.offLua(L, func() {
			if err = s.checkYAMLAliases(src); err != nil {
				return
			}
			var node *yaml12.Node
			if node, err = yaml12.Parse(src); err == nil && node != nil {
				v, err = yaml12.Value(node, maxDecodeValues)
			}
		})
	}
	if err != nil {
		L.Push(lua.LNil)
		L.Push(lua.LString("yaml.decode: " + err.Error()))
		return 2
	}
	L.Push(luavalue.ToLua(L, v))
	return 1
}

// sleep(seconds) waits with the shard released, and returns false early when the
// call's context ends (deadline, shutdown) or a daemon is asked to stop. In a daemon
// it first flushes ctx.patch, and waits under the daemon's context rather than the
// handler deadline (which restarts after the sleep). A daemon sleeping at the top
// level of its Lua (not inside pcall, an iterator or a metamethod) yields its
// coroutine: it then waits without a goroutine (daemon.go).
//
// A stopped daemon is told so once: the sleep it is in when stopped, or its next
// one, returns false (at once). After that its sleeps sleep, as kopf's do, until its
// cancellation (cancellation_backoff after the stop), which ends the daemon there
// (cancellationPoint): a loop that relies on cancellation, as kopf's async daemons
// do, does not spin.
func (s *shard) sleep(L *lua.LState) int {
	d := sleepDuration(L)
	var patch map[string]any
	var flush func(map[string]any)
	var stopped, cancelled <-chan struct{}
	var daemonCtx context.Context
	notified := false
	if cs := s.callOf(L); cs != nil && cs.daemon {
		s.cancellationPoint(L)
		patch, daemonCtx = s.takeDaemonPatch(L, cs), cs.ctx // patch is nil without a link
		if link := cs.call.Daemon; link != nil {
			flush = link.Flush
			switch {
			case !cs.notified && link.Stopped != nil && link.Stopped.Err() != nil:
				// Stopped since its last sleep: told so, at once.
				cs.notified = true
				if patch != nil {
					s.blocking(L, func(context.Context) { flush(patch) })
				}
				L.Push(lua.LFalse)
				return 1
			case !cs.notified && link.Stopped != nil:
				stopped = link.Stopped.Done()
			case cs.notified && link.Cancelled != nil:
				cancelled = link.Cancelled.Done()
			}
		}
		notified = cs.notified
		s.endStretch(L, cs)
		if s.canYield(L) { // a daemon is a coroutine (daemon.go)
			cs.sleep = &daemonSleep{d: d, patch: patch, notified: notified}
			return L.Yield()
		}
	}
	var by wokeBy
	s.blocking(L, func(ctx context.Context) {
		if daemonCtx != nil {
			ctx = daemonCtx
		}
		if patch != nil {
			flush(patch)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			by = wokeSlept
		case <-stopped:
			by = wokeStopped
		case <-cancelled:
			by = wokeCancelled
		case <-ctx.Done():
			by = wokeEnded
		}
	})
	if cs := s.callOf(L); cs != nil && cs.daemon {
		switch by {
		case wokeStopped:
			cs.notified = true
		case wokeCancelled:
			s.raiseCancellation(L, cs)
		}
	}
	L.Push(lua.LBool(by == wokeSlept))
	return 1
}

// sleepFunction is luaop.sleep: sleep behind a Lua function that returns exactly
// one value. A Go function that yields leaves its caller's result registers to
// whoever resumes it: the resume fills one, so a call wanting more (local a, b =
// luaop.sleep(1)) would read unset registers, and a tail call (return
// luaop.sleep(1)) would end the coroutine instead of sleeping. The wrapper's own call
// of sleep wants one result and is no tail call; it runs in the same VM loop, so the
// yield stays possible. sleep checks the argument (sleepDuration) and reports a bad
// one at the script's line; other errors located in the wrapper are too (an internal
// chunk, luaerr.Translate).
func (s *shard) sleepFunction() lua.LValue {
	L := s.L
	wrap, err := L.Load(strings.NewReader(sleepWrapper), luaerr.InternalChunk("sleep"))
	if err != nil {
		panic("luabind: the sleep wrapper does not compile: " + err.Error()) // a constant
	}
	L.Push(wrap)
	L.Push(L.NewFunction(s.sleep))
	L.Call(1, 1)
	fn := L.Get(-1)
	L.Pop(1)
	return fn
}

const sleepWrapper = `local sleep = ...
return function(seconds)
  local slept = sleep(seconds)
  return slept
end
`

// maxSleepSeconds is the longest sleep a time.Duration holds (292 years): a longer
// one sleeps that long, so it ends when its call does (deadline, stop, shutdown).
var maxSleepSeconds = float64(math.MaxInt64) / float64(time.Second)

// sleepDuration reads luaop.sleep's argument as Lua checks arguments: a number (or
// a string of one, as tonumber), neither NaN, nor infinite, nor negative: before,
// time.Duration overflowed for 1/0, 0/0 and 1e10 and a negative one returned at
// once, so a daemon looping on them spun. The error names the script's line, even
// through pcall (luaerr.RaiseAtScript).
func sleepDuration(L *lua.LState) time.Duration {
	v := L.Get(1)
	n, ok := v.(lua.LNumber)
	if str, isString := v.(lua.LString); isString {
		n, ok = stringNumber(string(str))
	}
	f := float64(n)
	switch {
	case !ok:
		luaerr.RaiseAtScript(L, "bad argument #1 to 'luaop.sleep' (number expected, got %s)", typeName(v))
	case math.IsNaN(f):
		luaerr.RaiseAtScript(L, "bad argument #1 to 'luaop.sleep' (seconds must be a number, got nan)")
	case math.IsInf(f, 0):
		luaerr.RaiseAtScript(L, "bad argument #1 to 'luaop.sleep' (seconds must be finite, got %s)", map[bool]string{true: "inf", false: "-inf"}[f > 0])
	case f < 0:
		luaerr.RaiseAtScript(L, "bad argument #1 to 'luaop.sleep' (seconds must not be negative, got %s)", n)
	case f >= maxSleepSeconds:
		return math.MaxInt64
	}
	return time.Duration(f * float64(time.Second))
}

// stringNumber reads a string as tonumber does: a decimal number or a
// hexadecimal integer (0x10), with spaces around.
func stringNumber(s string) (lua.LNumber, bool) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return lua.LNumber(f), true
	}
	neg := strings.HasPrefix(s, "-")
	digits := strings.TrimPrefix(s, "-")
	if len(digits) > 2 && (digits[:2] == "0x" || digits[:2] == "0X") {
		if u, err := strconv.ParseUint(digits[2:], 16, 64); err == nil {
			if neg {
				return lua.LNumber(-float64(u)), true
			}
			return lua.LNumber(u), true
		}
	}
	return 0, false
}

// typeName is Lua's type(v), "no value" for an absent argument.
func typeName(v lua.LValue) string {
	if v == lua.LNil {
		return "no value"
	}
	return v.Type().String()
}

// exceptionArgs reads luaop.exception's arguments after the objects, as kopf's
// exception(objs, reason, message, exc): (reason, message, err), or (err) alone when
// err is a luaop error value (luaop.temporary_error(...), or one pcall caught). The
// reason defaults to the kind of the error (TemporaryError, PermanentError,
// AdmissionError, Error); the message is "message err" (kopf's f'{message} {exc}'),
// returned as message and the " err" part.
func exceptionArgs(L *lua.LState) (reason, message, errText string) {
	var errValue lua.LValue = lua.LNil
	if ud, ok := L.Get(2).(*lua.LUserData); ok && L.GetTop() == 2 {
		errValue = ud
	} else {
		reason, message = L.OptString(2, ""), L.OptString(3, "")
		errValue = L.Get(4)
	}
	if errValue != lua.LNil {
		text, err := luavalue.ToString(L, errValue)
		if err != nil {
			L.ArgError(4, err.Error())
		}
		text = luavalue.Cut(text, luaerr.MaxMessage)
		kind := ""
		if ud, ok := errValue.(*lua.LUserData); ok && ud.Metatable != lua.LNil && L.GetMetaField(ud, "__metatable") == lua.LString("luaop.error") {
			kind = L.GetField(ud, "kind").String()
			text = L.GetField(ud, "message").String()
		}
		if reason == "" {
			reason = map[string]string{"temporary": "TemporaryError", "permanent": "PermanentError", "admission": "AdmissionError"}[kind]
			if reason == "" {
				reason = "Error"
			}
		}
		if message != "" {
			errText = " " + text
		} else {
			errText = text
		}
	}
	if reason == "" {
		L.ArgError(2, "a reason or an error expected")
	}
	return reason, message, errText
}

// checkObjects reads an object, or a list of objects, to post Events about.
func (s *shard) checkObjects(L *lua.LState, n int) []map[string]any {
	v, err := luavalue.FromLua(L.CheckAny(n))
	if err != nil {
		L.ArgError(n, err.Error())
	}
	switch x := v.(type) {
	case map[string]any:
		return []map[string]any{x}
	case []any:
		out := make([]map[string]any, 0, len(x))
		for i, item := range x {
			obj, ok := item.(map[string]any)
			if !ok {
				L.ArgError(n, fmt.Sprintf("item %d of the list is not a Kubernetes object", i+1))
			}
			out = append(out, obj)
		}
		return out
	}
	L.ArgError(n, "a Kubernetes object (a table with apiVersion, kind and metadata), or a list of them, expected")
	return nil
}

// postEvents posts one Event per object and returns true, or nil, message, reason
// of the first failure (the others are posted all the same).
func (s *shard) postEvents(L *lua.LState, objs []map[string]any, eventType, reason, message string) int {
	k := s.kube(L)
	message = luavalue.Cut(message, luaerr.MaxMessage) // the recorder cuts it further
	var first error
	s.blockingPoint(L, func(ctx context.Context) {
		for _, obj := range objs {
			if err := k.Event(ctx, obj, eventType, reason, message); err != nil && first == nil {
				first = err
			}
		}
	})
	if first != nil {
		return s.pushError(L, first)
	}
	L.Push(lua.LTrue)
	return 1
}

func (s *shard) kube(L *lua.LState) Kube {
	if s.rt.opts.Kube == nil {
		L.RaiseError("luaop.kube is not available: the runtime has no cluster client")
	}
	if cs := s.callOf(L); cs != nil && cs.adm != nil && cs.adm.req.DryRun {
		// A dry-run admission request must have no side effects: writes are
		// logged, not sent.
		return DryRunKube(s.rt.opts.Kube, s.log(L))
	}
	return s.rt.opts.Kube
}

// callContext is the context of the Lua call running on L: its handler deadline (a
// sleeping daemon's own context: see endStretch).
func (s *shard) callContext(L *lua.LState) context.Context {
	if ctx := L.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// The helpers below take the calling state: a call thread (or a coroutine the
// script made), not the shard's main state, and values must go on its stack.

func (s *shard) checkObject(L *lua.LState, n int) map[string]any {
	v, err := luavalue.FromLua(L.CheckAny(n))
	if err != nil {
		L.ArgError(n, err.Error())
	}
	obj, ok := v.(map[string]any)
	if !ok {
		L.ArgError(n, "a Kubernetes object (a table with apiVersion, kind and metadata) expected")
	}
	return obj
}

func (s *shard) pushObject(L *lua.LState, obj map[string]any, err error) int {
	if err != nil {
		return s.pushError(L, err)
	}
	L.Push(luavalue.ToLua(L, obj))
	return 1
}

// pushError returns nil, message, reason; a deadline is raised instead, so that a
// stuck API call fails the handler like any timeout.
func (s *shard) pushError(L *lua.LState, err error) int {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// Raised as the Go error, so the deadline stays recognisable (errors.Is).
		luaerr.Throw(L, fmt.Errorf("API call interrupted: %w", err))
	}
	L.Push(lua.LNil)
	L.Push(lua.LString(err.Error()))
	L.Push(lua.LString(fmt.Sprint(apierrors.ReasonForError(err))))
	return 3
}

// maxDecodeValues bounds the values (objects, lists, and their items) of a document
// luaop.json.decode or luaop.yaml.decode converts: each becomes Lua values of about
// a hundred bytes, so a few MiB of "[]," would otherwise become gigabytes, in one Go
// call that the memory budget's watchdog cannot interrupt.
const maxDecodeValues = 1 << 18

// offLua runs fn, a Go computation that touches no Lua value and whose cost grows
// with its input (decoding, encoding a document of up to MaxStringSize bytes), so
// that the call's deadline holds: fn runs on a goroutine of its own and, when the
// call's context ends first, the call fails at once with the context's error (as
// the VM would), fn finishing in the background (its work is bounded by the size
// limits). The shard stays held meanwhile, as for any Go function.
func (s *shard) offLua(L *lua.LState, fn func()) {
	ctx := L.Context()
	if ctx == nil {
		fn()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-ctx.Done():
		L.RaiseError("%s", ctx.Err().Error())
	}
}

// checkYAMLAliases refuses a YAML document whose aliases would expand past the
// decode limits (MaxStringSize bytes, maxDecodeValues values): the decoded value
// shares an aliased string, but the script's every later use of it (encoding it,
// patching it onto an object) expands it (a 15 MB scalar aliased 400 times is
// 6 GB). The document is parsed into nodes, which keep aliases as they are, and
// its expanded size computed once per anchor. A document this parser refuses is
// left to yaml12.Parse, whose error (with its line) the script gets.
func (s *shard) checkYAMLAliases(src []byte) error {
	if !bytes.ContainsRune(src, '*') {
		return nil // no alias
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(src, &doc); err != nil {
		return nil
	}
	type size struct{ values, bytes int }
	memo := map[*yamlv3.Node]size{}
	var walk func(n *yamlv3.Node, depth int) size
	walk = func(n *yamlv3.Node, depth int) size {
		if n == nil || depth > 1000 {
			return size{}
		}
		if sz, ok := memo[n]; ok {
			return sz
		}
		memo[n] = size{} // an alias cycle counts nothing more
		sz := size{values: 1, bytes: len(n.Value)}
		if n.Kind == yamlv3.AliasNode {
			sz = walk(n.Alias, depth+1)
		}
		for _, c := range n.Content {
			csz := walk(c, depth+1)
			sz.values = min(sz.values+csz.values, 1<<40)
			sz.bytes = min(sz.bytes+csz.bytes, 1<<40)
		}
		memo[n] = sz
		return sz
	}
	sz := walk(&doc, 0)
	if limit := s.rt.opts.MaxStringSize; sz.bytes > limit {
		return fmt.Errorf("document too large once its aliases are expanded (%s, more than the %s allowed)", FormatBytes(uint64(sz.bytes)), FormatBytes(uint64(limit)))
	}
	if sz.values > maxDecodeValues {
		return fmt.Errorf("document too large once its aliases are expanded (%d values, more than the %d allowed)", sz.values, maxDecodeValues)
	}
	return nil
}

// checkDecodeSize refuses documents over MaxStringSize bytes or with more than
// maxDecodeValues values (counted from the bytes: brackets, braces and commas, so
// ones inside strings count too, which only errs on the safe side).
func (s *shard) checkDecodeSize(data []byte) error {
	if limit := s.rt.opts.MaxStringSize; len(data) > limit {
		return fmt.Errorf("document too large (%s, more than the %s allowed)", FormatBytes(uint64(len(data))), FormatBytes(uint64(limit)))
	}
	n := 1
	for _, b := range data {
		if b == '[' || b == '{' || b == ',' || b == '\n' {
			n++
		}
	}
	if n > maxDecodeValues {
		return fmt.Errorf("document too large (about %d values, more than the %d allowed)", n, maxDecodeValues)
	}
	return nil
}
