package luabind

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/luaop/luaop/third_party/gopher-lua/ast"
	"github.com/luaop/luaop/third_party/gopher-lua/parse"

	"k8s.io/utils/clock"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptsource"
)

// Options configure a Runtime. The zero value of every field means its default.
type Options struct {
	// Shards is the number of Lua states serving objects, each running Lua for one
	// call at a time (calls waiting on I/O or timers let others run meanwhile).
	// Defaults to GOMAXPROCS. Operator-level hooks (startup, cleanup, probe) have one
	// more state of their own, so that probes never wait behind object handlers.
	Shards int
	// HandlerTimeout bounds every Lua call (handlers, filters, script loading), so an
	// endless loop fails that call instead of stalling the operator. Defaults to 30s.
	HandlerTimeout time.Duration
	// MaxStringSize bounds strings built by string.rep and friends, and the size of
	// documents luaop.json.decode and luaop.yaml.decode accept. Defaults to 16 MiB.
	MaxStringSize int
	// MemoryBudget bounds, in bytes, the operator's heap while Lua runs: the call
	// running longest when the heap goes over it is cancelled with an error naming
	// file:line (errors.Is(err, ErrMemoryBudget)) and retried like any handler
	// error (memory.go). 0 means DefaultMemoryBudget(); negative, no budget.
	MemoryBudget int64
	// Logger receives script output (print, ctx.logger). Defaults to slog.Default().
	Logger *slog.Logger
	// Kube serves luaop.kube and the event helpers. Without it they raise an error.
	Kube Kube
	// LogEvents is the lowest level of ctx.logger messages also posted as Kubernetes
	// Events of the handled object (kopf's object logger): debug, info, warning, error
	// or none. Empty means none, kopf's default since 1.41 (ParseLogEventsLevel).
	LogEvents string
}

// DefaultHandlerTimeout is Options.HandlerTimeout's default.
const DefaultHandlerTimeout = 30 * time.Second

func (o *Options) setDefaults() {
	if o.Shards <= 0 {
		o.Shards = runtime.GOMAXPROCS(0)
	}
	if o.HandlerTimeout <= 0 {
		o.HandlerTimeout = DefaultHandlerTimeout
	}
	if o.MaxStringSize <= 0 {
		o.MaxStringSize = 16 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MemoryBudget == 0 {
		o.MemoryBudget, _ = DefaultMemoryBudget()
	}
}

// Script is one Lua file of the scripts folder (scriptsource reads them).
type Script = scriptsource.Script

// Runtime loads scripts and runs their handlers. It satisfies processing.Handlers.
type Runtime struct {
	opts Options
	// shards are the object shards followed by the hook shard (operator-level
	// handlers, uid ""): Load and Close go through all of them.
	shards []atomic.Pointer[shard]
	// mem cancels Lua calls when the heap goes over the memory budget.
	mem    *memWatch
	loadMu sync.Mutex // one load at a time
	closed bool       // set by Close (loadMu held)
	// stuck records the calls held past their deadline (stuck.go).
	stuck stuckState
	gen   atomic.Pointer[generation]
	// opMemo is the operator memo as the last successful startup handler left it:
	// new object memos start as a copy of it (kopf).
	opMemo atomic.Pointer[operatorMemo]
	// protos caches compiled files by name and content hash (loadMu held): a reload
	// compiles only the files whose content changed. A FunctionProto is read-only,
	// so one serves every shard. It holds the files of the current generation and
	// of the last attempt (a broken save's good files are not compiled again).
	protos map[protoKey]*lua.FunctionProto
	// codeHashes are the code hashes of the last successful load by handler id
	// (loadMu held), reused while the handler's reach and spec are the same; reach
	// the reach hashes it computed them from (reach.go), reused by the next load
	// while their inputs are the same.
	codeHashes map[string]codeHashEntry
	reach      map[string]reachEntry
	// scriptMetrics are the metrics of luaop.metrics (metrics.go), shared by the
	// shards and kept across reloads.
	scriptMetrics *ScriptMetrics
	// clock times the shards' turns and the calls' deadlines (schedule.go);
	// preemptions counts the calls preempted.
	clock       clock.WithDelayedExecution
	preemptions atomic.Uint64
	// memReport is what the memory budget found the last time it cancelled a
	// call (holders.go).
	memReport atomic.Pointer[MemoryReport]
}

type codeHashEntry struct {
	spec  causes.Spec // Source and CodeHash cleared
	reach string
	hash  string
}

// protoKey names one compiled file: the name is part of it because a proto records
// its source name (error messages, line info).
type protoKey struct {
	name string
	sum  [sha256.Size]byte
}

// generation is one successfully loaded script set: what every shard registered.
type generation struct {
	specs   []causes.Spec
	filters map[string]*dataFilters // by handler id
	hooks   []causes.Spec           // operator-level hooks, in registration order
	// admission are the validate and mutate handlers, in registration order.
	admission []causes.Spec
	// reads are the declared reads (luaop.reads).
	reads []causes.Read
	hash  string
	files []string
	// protoKeys are the compiled files of this generation (see Runtime.protos).
	protoKeys map[protoKey]bool
}

// New creates the shards' Lua states; no handler exists until Load succeeds.
func New(opts Options) *Runtime { return newRuntime(opts, clock.RealClock{}) }

// newRuntime is New with the clock of the shards' turns and the calls' deadlines.
func newRuntime(opts Options, clk clock.WithDelayedExecution) *Runtime {
	opts.setDefaults()
	r := &Runtime{opts: opts, mem: newMemWatch(opts.MemoryBudget, opts.Logger, clk), scriptMetrics: NewScriptMetrics(), clock: clk}
	r.mem.onStuck, r.mem.onUnstuck = r.onStuck, r.onUnstuck
	r.mem.holders = func(mc *memCall) string {
		if mc.sh == nil {
			return ""
		}
		return r.measureHolders(mc.sh, mc).Summary()
	}
	r.shards = make([]atomic.Pointer[shard], opts.Shards+1) // the last one serves the hooks
	for i := range r.shards {
		r.shards[i].Store(newShard(r, i))
	}
	r.gen.Store(&generation{filters: map[string]*dataFilters{}})
	return r
}

// Close releases the Lua states. Daemons asleep in luaop.sleep (that processing did
// not stop) end at once with an error; other calls still running (a call or daemon
// parked in a blocking function) fail when they next need their state; calls that
// start afterwards fail at once.
func (r *Runtime) Close() {
	r.loadMu.Lock() // a reload in flight finishes first
	r.closed = true
	var parked []*daemonWake
	for i := range r.shards {
		s := r.shards[i].Load()
		s.relock()
		if !s.closed {
			s.closed = true
			s.idle = nil
			s.L.Close()
		}
		for w := range s.parked {
			parked = append(parked, w)
		}
		s.unlock()
	}
	r.loadMu.Unlock()
	// Sleeping daemons end now (with errClosed) rather than when they would wake;
	// their done callbacks run here, with no lock held.
	for _, w := range parked {
		w.wake(wokeEnded)
	}
}

// LoadReport describes a successful load.
type LoadReport struct {
	Files []string
	// Compiled names the files compiled by this load; the others were unchanged
	// since a previous load and their compiled form was reused.
	Compiled []string
	Handlers []causes.Spec
	Hash     string
	Took     time.Duration
	// Held is the longest time the load held one Lua state (running the scripts
	// there; the shards run in parallel): the longest a handler call waited for it.
	Held time.Duration
}

// Load compiles and runs the scripts in every shard and, only if all of that
// succeeds, makes their handlers current. On error nothing changes: the previous
// handlers keep serving. Errors name the file and line.
//
// A reload is incremental where that keeps the semantics: only files whose content
// changed are compiled (the compiled prototypes are cached by name and content hash,
// and shared by every shard), and code hashes are reused for handlers whose function
// and options did not change. Every top-level file still runs in every shard, each
// into a fresh global environment of its own, as on the first load: a file's
// registrations may depend on the modules it requires (run once per load), so
// skipping an unchanged file would change what it registers. Each file's run is
// cheap (its prototype is ready); the shards run in parallel.
func (r *Runtime) Load(ctx context.Context, scripts []Script) (LoadReport, error) {
	start := time.Now()
	r.loadMu.Lock()
	defer r.loadMu.Unlock()

	sorted := append([]Script(nil), scripts...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	protos := make(map[string]*lua.FunctionProto, len(sorted))
	files := make([]string, 0, len(sorted))
	var compiled []string
	hash := sha256.New()
	sums := make(map[string][sha256.Size]byte, len(sorted))
	// The cache after this attempt: what the current generation uses plus what this
	// attempt compiled or reused. On success, the files of the new set only.
	used := make(map[protoKey]*lua.FunctionProto, len(sorted))
	defer func() {
		for k, p := range r.protos {
			if _, ok := used[k]; !ok && r.inCurrent(k) {
				used[k] = p
			}
		}
		r.protos = used
	}()
	// Compiling is under the load's deadline too (the handler deadline, as running
	// the scripts is): the compiler stops when it ends.
	compileCtx, cancelCompile := context.WithTimeout(ctx, r.opts.HandlerTimeout)
	defer cancelCompile()
	for _, s := range sorted {
		key := protoKey{name: s.Name, sum: sha256.Sum256(s.Source)}
		proto, ok := r.protos[key]
		if !ok {
			var err error
			if proto, _, err = compile(compileCtx, s); err != nil {
				if compileCtx.Err() != nil && ctx.Err() == nil {
					err = fmt.Errorf("compiling %s exceeded the %s load deadline (--handler-timeout): %w", s.Name, r.opts.HandlerTimeout, err)
				}
				return LoadReport{}, err
			}
			compiled = append(compiled, s.Name)
		}
		used[key] = proto
		protos[s.Name] = proto
		sums[s.Name] = key.sum
		files = append(files, s.Name)
		fmt.Fprintf(hash, "%s\x00%d\x00", s.Name, len(s.Source))
		hash.Write(s.Source)
	}

	// Run in every shard aside, the shards in parallel (each owns its state; the
	// protos are read-only); commit only when all succeeded.
	setSum := hash.Sum(nil)
	reach := newReachInput(files, protos, sums, setSum, r.reach)
	staged, cols, err := r.stageAll(ctx, files, protos, reach)
	if err != nil {
		return LoadReport{}, err
	}
	first := cols[0]
	for _, col := range cols[1:] {
		if err := sameRegistrations(first, col); err != nil {
			return LoadReport{}, err
		}
	}
	sources := map[string][]byte{}
	for _, sc := range sorted {
		sources[sc.Name] = sc.Source
	}
	hashes := make(map[string]codeHashEntry, len(first.specs))
	for i := range first.specs {
		spec := &first.specs[i]
		spec.CodeHash = r.codeHashCached(hashes, *spec, first.reach[spec.ID].hash)
	}
	evalHashes(first.specs, sources, setSum)
	r.codeHashes, r.reach = hashes, first.reach
	keys := make(map[protoKey]bool, len(used))
	for k := range used {
		keys[k] = true
	}
	for i := range first.admission {
		spec := &first.admission[i]
		spec.CodeHash = r.codeHashCached(hashes, *spec, first.reach[spec.ID].hash)
	}
	gen := &generation{specs: first.specs, filters: first.filters, hooks: first.hooks, admission: first.admission, reads: first.reads,
		hash: hex.EncodeToString(hash.Sum(nil)), files: files, protoKeys: keys}
	var held time.Duration
	for i := range r.shards {
		r.shards[i].Load().commit(staged[i])
		held = max(held, staged[i].held)
	}
	r.gen.Store(gen)
	return LoadReport{Files: files, Compiled: compiled, Handlers: slices.Concat(gen.specs, gen.admission, gen.hooks), Hash: gen.hash, Took: time.Since(start), Held: held}, nil
}

// inCurrent tells whether the current generation uses a compiled file.
func (r *Runtime) inCurrent(k protoKey) bool { return r.gen.Load().protoKeys[k] }

// stageAll stages the scripts in every shard, all at once (the hook shard too: with
// GOMAXPROCS slots it would make a second round of its own). The first failure
// cancels the other shards and is the error returned.
func (r *Runtime) stageAll(ctx context.Context, files []string, protos map[string]*lua.FunctionProto, reach *reachInput) ([]*shardGeneration, []*collected, error) {
	staged := make([]*shardGeneration, len(r.shards))
	cols := make([]*collected, len(r.shards))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for i := range r.shards {
		sh := r.shards[i].Load()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ctx.Err() != nil {
				return // another shard failed
			}
			var in *reachInput
			if i == 0 {
				in = reach // what the handlers reach is computed once, in the first shard
			}
			sg, col, err := sh.stage(ctx, files, protos, in)
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
					cancel()
				}
				mu.Unlock()
				return
			}
			staged[i], cols[i] = sg, col
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil { // cancelled by the caller
		firstErr = fmt.Errorf("loading the scripts: %w", ctx.Err())
	}
	return staged, cols, firstErr
}

// codeHashCached is codeHash, reused from the previous load when the handler's
// reach (reach.go) and its spec are the same; the result is recorded in next.
func (r *Runtime) codeHashCached(next map[string]codeHashEntry, spec causes.Spec, reach string) string {
	spec.Source, spec.CodeHash, spec.EvalHash = "", "", ""
	if e, ok := r.codeHashes[spec.ID]; ok && e.reach == reach && reflect.DeepEqual(e.spec, spec) {
		next[spec.ID] = e
		return e.hash
	}
	h := codeHash(spec, reach)
	next[spec.ID] = codeHashEntry{spec: spec, reach: reach, hash: h}
	return h
}

// MemoryBudget is the budget in force, in bytes (0: none).
func (r *Runtime) MemoryBudget() int64 { return int64(r.mem.budget) }

// Hash is the content hash of the loaded scripts ("" before the first load).
func (r *Runtime) Hash() string { return r.gen.Load().hash }

// ParseScript parses and compiles s exactly as Load does (the same limits, until
// ctx ends) and returns its syntax tree, or the error Load would report with its
// file:line: luaop check analyses the tree the operator compiles.
func ParseScript(ctx context.Context, s Script) ([]ast.Stmt, error) {
	_, chunk, err := compile(ctx, s)
	return chunk, err
}

// compile parses and compiles one script, until ctx ends (the patched gopher-lua
// checks it in the lexer and the compiler): the one place luaop compiles a file
// (Runtime.Load, luaop check). Chunks nested deeper than Lua allows are refused
// ("chunk has too many syntax levels", third_party/gopher-lua/parse/limits.go).
func compile(ctx context.Context, s Script) (*lua.FunctionProto, []ast.Stmt, error) {
	chunk, err := parse.ParseContext(ctx, bytes.NewReader(s.Source), s.Name)
	if err != nil {
		return nil, nil, syntaxError(s.Name, err)
	}
	proto, err := lua.CompileContext(ctx, chunk, s.Name)
	if err != nil {
		se := &ScriptError{File: s.Name, Message: err.Error()}
		if ce, ok := err.(*lua.CompileError); ok {
			se.Line, se.Message = ce.Line, ce.Message
		}
		return nil, nil, se
	}
	// A main chunk is a vararg function, for which gopher-lua (CompatVarArg) builds a
	// Lua 5.0 `arg` table on every call; but it registers no local `arg` in a main
	// chunk (`arg` there is a global, as in Lua 5.1), so that table is unreachable.
	// Not building it saves a table and a Go map per file per shard per load.
	proto.IsVarArg &^= lua.VarArgNeedsArg
	trimProto(proto)
	return proto, chunk, nil
}

// trimProto copies a compiled function's slices, and its nested functions', into
// slices of their own length: gopher-lua's compiler slices the code and line table out
// of buffers made for 1,024 instructions (4 KB of code, 8 KB of lines) and gives every
// other list room for dozens of entries (about 5 KB), so every function of every file
// kept 17 KB, whatever its size, for as long as the script stays loaded (or a daemon
// runs it). Its private string-constant list cannot be reached from here.
func trimProto(p *lua.FunctionProto) {
	p.Code = slices.Clone(p.Code)
	p.DbgSourcePositions = slices.Clone(p.DbgSourcePositions)
	p.Constants = slices.Clone(p.Constants)
	p.FunctionPrototypes = slices.Clone(p.FunctionPrototypes)
	p.DbgLocals = slices.Clone(p.DbgLocals)
	p.DbgCalls = slices.Clone(p.DbgCalls)
	p.DbgUpvalues = slices.Clone(p.DbgUpvalues)
	for _, child := range p.FunctionPrototypes {
		trimProto(child)
	}
}

// syntaxError turns a parser error into a ScriptError with file and line.
func syntaxError(file string, err error) error {
	se := &ScriptError{File: file, Message: err.Error()}
	if pe, ok := err.(*parse.Error); ok {
		se.Line = pe.Pos.Line
		se.Message = fmt.Sprintf("syntax error near '%s': %s", pe.Token, pe.Message)
		if pe.Token == "" && pe.Pos.Line > 0 { // a limit or a cancellation: no token
			se.Message = pe.Message
		}
		if pe.Pos.Line == parse.EOF { // unexpected end of file: no line, no token
			se.Line = 0
			se.Message = "syntax error at end of file (a block or function not closed with 'end'?): " + pe.Message
		}
	}
	return se
}

// sameRegistrations guards against scripts that register differently per state
// (randomness, time): every shard must serve the same handlers.
func sameRegistrations(a, b *collected) error {
	if len(a.specs) != len(b.specs) || len(a.hooks) != len(b.hooks) || len(a.admission) != len(b.admission) || !slices.Equal(a.reads, b.reads) {
		return fmt.Errorf("the scripts registered different handlers in different Lua states; registration must not depend on time or randomness")
	}
	for i := range a.specs {
		if a.specs[i].ID != b.specs[i].ID {
			return fmt.Errorf("the scripts registered different handlers in different Lua states (%s vs %s)", a.specs[i].ID, b.specs[i].ID)
		}
	}
	return nil
}

// Specs returns the resource handlers of the current generation.
func (r *Runtime) Specs() []causes.Spec { return r.gen.Load().specs }

// AdmissionHandlers returns the validate and mutate handlers of the current
// generation, in registration order.
func (r *Runtime) AdmissionHandlers() []causes.Spec { return r.gen.Load().admission }

// Hooks returns the operator-level handlers (startup, cleanup, probe).
func (r *Runtime) Hooks() []causes.Spec { return r.gen.Load().hooks }

// shardFor is the shard of an object; uid "" (operator-level hooks) has its own.
func (r *Runtime) shardFor(uid string) *shard {
	n := len(r.shards) - 1
	if uid == "" {
		return r.shards[n].Load()
	}
	if n == 1 {
		return r.shards[0].Load()
	}
	h := fnv.New32a()
	h.Write([]byte(uid))
	return r.shards[h.Sum32()%uint32(n)].Load()
}

// Forget drops an object's memo. It may be called from any goroutine that holds no
// lock of the caller's; it waits for the shard (at most a handler deadline).
func (r *Runtime) Forget(uid string) {
	if uid == "" {
		return
	}
	sh := r.shardFor(uid)
	if err := sh.lock(context.Background()); err != nil {
		return // closed
	}
	delete(sh.memos, uid)
	delete(sh.memoNames, uid)
	delete(sh.subFns, uid)
	sh.unlock()
}

// Match evaluates a handler's filters for a cause.
func (r *Runtime) Match(ctx context.Context, spec causes.Spec, cause causes.Cause) (bool, error) {
	gen := r.gen.Load()
	f := gen.filters[spec.ID]
	if f == nil {
		return true, nil
	}
	if !f.matchData(cause) {
		return false, nil
	}
	if !f.hasCallbacks {
		return true, nil
	}
	uid := uidOf(cause.Body)
	return withShard(ctx, func() *shard { return r.shardFor(uid) }, func(sh *shard) (bool, error) {
		return sh.match(ctx, spec, f, cause)
	})
}

// Invoke runs one handler of the current generation.
func (r *Runtime) Invoke(ctx context.Context, call causes.Call) (causes.Result, error) {
	uid := uidOf(call.Cause.Body)
	return withShard(ctx, func() *shard { return r.shardFor(uid) }, func(sh *shard) (causes.Result, error) {
		return sh.invoke(ctx, call)
	})
}

func uidOf(body map[string]any) string {
	meta, _ := body["metadata"].(map[string]any)
	uid, _ := meta["uid"].(string)
	return uid
}

// codeHash identifies a handler's code and options: its spec and what its function
// can reach (reach.go: its code and the helpers, values and modules it can run or
// read, so edits elsewhere, even ones that move it, leave it unchanged). Reloads
// restart a daemon, and retry a handler waiting in its backoff (RetryOnReload),
// only when this changes.
func codeHash(spec causes.Spec, reach string) string {
	h := sha256.New()
	spec.Source, spec.CodeHash, spec.EvalHash = "", "", ""
	fmt.Fprintf(h, "%+v\x00%s", spec, reach)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// evalHashes computes Spec.EvalHash for the specs a reload must revisit every object
// for (causes.Spec.RevisitedOnReload): the code hash, the content of the file that
// registered the handler (its filters, data or functions, and whatever constants and
// helpers they read there) and of every module (files below a folder, which any file
// may require); for an index, the content of the whole set (setSum), as its function
// may call anything and its values are kept from the last cycle. Editing a file of
// change handlers only leaves every EvalHash as it was.
func evalHashes(specs []causes.Spec, sources map[string][]byte, setSum []byte) {
	var (
		fileSums   = map[string][]byte{}
		modulesSum []byte
	)
	sumOf := func(name string) []byte {
		if sum, ok := fileSums[name]; ok {
			return sum
		}
		sum := sha256.Sum256(sources[name])
		fileSums[name] = sum[:]
		return sum[:]
	}
	for i := range specs {
		spec := &specs[i]
		if !spec.RevisitedOnReload() {
			continue
		}
		if modulesSum == nil {
			m := sha256.New()
			for _, name := range slices.Sorted(maps.Keys(sources)) {
				if strings.Contains(name, "/") {
					io.WriteString(m, name+"\x00")
					m.Write(sumOf(name))
				}
			}
			modulesSum = m.Sum(nil)
		}
		h := sha256.New()
		io.WriteString(h, spec.CodeHash+"\x00")
		file := spec.Source
		if i := strings.LastIndexByte(file, ':'); i >= 0 {
			file = file[:i]
		}
		io.WriteString(h, file+"\x00")
		h.Write(sumOf(file))
		h.Write(modulesSum)
		if spec.Kind == causes.KindIndex {
			h.Write(setSum)
		}
		spec.EvalHash = hex.EncodeToString(h.Sum(nil))[:16]
	}
}
