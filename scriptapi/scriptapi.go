package scriptapi

import "slices"

// HandlerKind groups the registration functions whose arguments and options are
// alike; "" for the functions that register nothing.
type HandlerKind string

const (
	Change    HandlerKind = "change"    // on.create, on.update, on.delete, on.resume
	Field     HandlerKind = "field"     // on.field: its options come after the field path
	Event     HandlerKind = "event"     // on.event
	Daemon    HandlerKind = "daemon"    // daemon
	Timer     HandlerKind = "timer"     // timer
	Index     HandlerKind = "index"     // index
	Hook      HandlerKind = "hook"      // on.startup, on.cleanup: no resource
	Probe     HandlerKind = "probe"     // on.probe: no resource
	Admission HandlerKind = "admission" // on.validate, on.mutate
)

// HandlerKinds are all the kinds, for the tests of the parts that must know each.
var HandlerKinds = []HandlerKind{Change, Field, Event, Daemon, Timer, Index, Hook, Probe, Admission}

// Target is how a function that reaches the cluster names the objects it touches.
type Target int

const (
	// NoCluster: the function touches no cluster.
	NoCluster Target = iota
	// ByKind: its first two arguments are the apiVersion and the kind.
	ByKind
	// ByObject: its first argument is the object, with apiVersion and kind.
	ByObject
	// CoreEvents: it posts core Events about the objects it is given.
	CoreEvents
	// ByResource: its first argument is a resource as handlers name theirs
	// ("v1/configmaps", "example.com/v1/widgets").
	ByResource
)

// Targets are all the targets of cluster access, for the tests of the parts that
// must know each.
var Targets = []Target{ByKind, ByObject, CoreEvents, ByResource}

// Access is the cluster access a function needs.
type Access struct {
	Target Target
	// Verbs are the RBAC verbs the call needs on its resource (apply: create and
	// patch, server-side apply creates what is missing).
	Verbs []string
	// Subresource is the subresource the verbs apply to ("status"), "" for the
	// resource itself.
	Subresource string
}

// Function is one function of the luaop module.
type Function struct {
	// Name is its path below luaop: "kube.get", "on.create", "sleep".
	Name string
	// Params are its parameters as the stubs declare them
	// (`function luaop.<Name>(<Params>) end`). A registration function's handler
	// options are the parameter "opts", its resource the parameter "resource".
	Params []string
	// Registers is the kind of handler it registers ("" when it registers none).
	Registers HandlerKind
	// Access is the cluster access it needs (zero: none).
	Access Access
	// ReturnsObject: it returns its first argument, an object, changed (not its
	// apiVersion or kind), so that the analyser follows an object through it.
	ReturnsObject bool
}

// Functions are the functions of the luaop module, in the order of the stubs.
var Functions = []Function{
	{Name: "on.create", Params: []string{"resource", "fn", "opts"}, Registers: Change},
	{Name: "on.update", Params: []string{"resource", "fn", "opts"}, Registers: Change},
	{Name: "on.delete", Params: []string{"resource", "fn", "opts"}, Registers: Change},
	{Name: "on.resume", Params: []string{"resource", "fn", "opts"}, Registers: Change},
	{Name: "on.field", Params: []string{"resource", "field", "fn", "opts"}, Registers: Field},
	{Name: "on.related", Params: []string{"resource", "fn", "opts"}, Registers: Change},
	{Name: "on.event", Params: []string{"resource", "fn", "opts"}, Registers: Event},
	{Name: "on.validate", Params: []string{"resource", "fn", "opts"}, Registers: Admission},
	{Name: "on.mutate", Params: []string{"resource", "fn", "opts"}, Registers: Admission},
	{Name: "on.startup", Params: []string{"fn", "opts"}, Registers: Hook},
	{Name: "on.cleanup", Params: []string{"fn", "opts"}, Registers: Hook},
	{Name: "on.probe", Params: []string{"fn", "opts"}, Registers: Probe},
	{Name: "daemon", Params: []string{"resource", "fn", "opts"}, Registers: Daemon},
	{Name: "timer", Params: []string{"resource", "fn", "opts"}, Registers: Timer},
	{Name: "index", Params: []string{"resource", "fn", "opts"}, Registers: Index},
	// reads declares a resource the handlers read: the operator lists and watches it
	// into its cache, where luaop.kube.get and list find it.
	{Name: "reads", Params: []string{"resource", "opts"}, Access: Access{Target: ByResource, Verbs: []string{"get", "list", "watch"}}},

	{Name: "temporary_error", Params: []string{"message", "delay"}},
	{Name: "admission_error", Params: []string{"message", "code"}},
	{Name: "permanent_error", Params: []string{"message"}},

	{Name: "array", Params: []string{"t"}},
	{Name: "object", Params: []string{"t"}},
	{Name: "is_null", Params: []string{"v"}},

	{Name: "owner_reference", Params: []string{"owner", "opts"}},
	{Name: "append_owner_reference", Params: []string{"obj", "owner", "opts"}, ReturnsObject: true},
	{Name: "remove_owner_reference", Params: []string{"obj", "owner"}, ReturnsObject: true},
	{Name: "label", Params: []string{"obj", "labels"}, ReturnsObject: true},
	{Name: "adopt", Params: []string{"obj", "owner", "opts"}, ReturnsObject: true},

	{Name: "event", Params: []string{"objs", "type", "reason", "message"}, Access: eventAccess},
	{Name: "info", Params: []string{"objs", "reason", "message"}, Access: eventAccess},
	{Name: "warn", Params: []string{"objs", "reason", "message"}, Access: eventAccess},
	{Name: "exception", Params: []string{"objs", "reason", "message", "err"}, Access: eventAccess},

	{Name: "sleep", Params: []string{"seconds"}},

	{Name: "kube.get", Params: []string{"apiVersion", "kind", "namespace", "name", "opts"}, Access: Access{Target: ByKind, Verbs: []string{"get"}}},
	{Name: "kube.list", Params: []string{"apiVersion", "kind", "namespace", "selector"}, Access: Access{Target: ByKind, Verbs: []string{"list"}}},
	{Name: "kube.create", Params: []string{"obj"}, Access: Access{Target: ByObject, Verbs: []string{"create"}}},
	{Name: "kube.patch", Params: []string{"apiVersion", "kind", "namespace", "name", "patch", "patch_type"}, Access: Access{Target: ByKind, Verbs: []string{"patch"}}},
	{Name: "kube.delete", Params: []string{"apiVersion", "kind", "namespace", "name"}, Access: Access{Target: ByKind, Verbs: []string{"delete"}}},
	{Name: "kube.apply", Params: []string{"obj", "opts"}, Access: Access{Target: ByObject, Verbs: []string{"create", "patch"}}},

	{Name: "metrics.counter", Params: []string{"name", "help", "labelnames"}},
	{Name: "metrics.gauge", Params: []string{"name", "help", "labelnames"}},
	{Name: "metrics.histogram", Params: []string{"name", "help", "labelnames", "buckets"}},

	{Name: "json.encode", Params: []string{"value"}},
	{Name: "json.decode", Params: []string{"text"}},
	{Name: "yaml.decode", Params: []string{"text"}},
}

// eventAccess is what the event helpers need: the operator's recorder creates an
// Event, then patches its repeats.
var eventAccess = Access{Target: CoreEvents, Verbs: []string{"create", "patch"}}

// Lookup returns the function named name ("kube.get").
func Lookup(name string) (Function, bool) {
	i := slices.IndexFunc(Functions, func(f Function) bool { return f.Name == name })
	if i < 0 {
		return Function{}, false
	}
	return Functions[i], true
}

// Param is the position (0-based) of the parameter named name, or -1.
func (f Function) Param(name string) int { return slices.Index(f.Params, name) }

// HandlerOptions are the options of the registration functions (and of
// ctx.subhandler), in the order error messages list them.
var HandlerOptions = []string{
	"id", "retries", "backoff", "timeout", "errors", "param", "labels", "annotations", "field", "value", "when",
	"old", "new", "optional", "deleted", "interval", "initial_delay", "idle", "sharp",
	"cancellation_backoff", "cancellation_timeout", "operations", "side_effects", "failure_policy", "subresource",
	"owned", "controller", "labelled", "mapped",
}

// IsHandlerOption tells whether name is one of HandlerOptions.
func IsHandlerOption(name string) bool { return slices.Contains(HandlerOptions, name) }
