package luabind

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"math"
	"slices"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/processing/causes"
)

// What a handler can reach, and why a reload restarts a daemon (issue 45).
//
// A daemon runs the closure a load made; a reload makes new closures, so a running
// daemon keeps the old code until it is restarted (processing restarts it, its memo
// kept, when its Spec.CodeHash changes). A change handler or a timer runs the
// current closure at its next call, but its retry waits for its backoff unless
// told that its code changed (RetryOnReload). So CodeHash must change exactly when
// anything the handler can run, or read at load time, changed; and not for an edit
// elsewhere, or every save restarts every daemon.
//
// The reach of a handler's function is computed from the compiled prototypes and
// the values the load left, in the shard that staged it, as the closure graph:
//
//   - the function's prototype: its bytecode, its constants and its nested
//     functions' (not its line numbers: moving a function, or editing a comment,
//     changes nothing it runs);
//   - the values of its upvalues (helpers defined as locals of the file, module
//     tables required at the top, configuration tables, strings), each walked in
//     turn: a function by its own reach, a table by its keys, values and
//     metatable;
//   - the globals its code names (GETGLOBAL/SETGLOBAL, its nested functions'
//     included), looked up in its file's environment: a global helper function
//     is walked as an upvalue is; a name the file does not define is a library or
//     the sandbox's, the same for every load. A function that names _G, getfenv
//     or setfenv may reach any global of its file: the whole environment is walked;
//   - the modules its code may require at run time: every string constant that is
//     the require() name of a module (a file in a folder) adds that file's
//     compiled prototype, and the modules its constants name in turn. (A handler
//     script required by name is not followed: "backup" or "widgets" as a string
//     of a handler would otherwise pull in the whole file of that name.)
//
// It is conservative: what it cannot tell apart it counts as reached (a whole
// module table, not the one function of it called; a whole environment for _G).
// Values are what the load left, so a value the file computes at load time
// differently at each load (os.time()) restarts the daemon at every reload of
// its file or of a module; a walk over more than maxReachNodes values gives up and
// hashes the whole script set (every reload restarts it). Go functions and
// userdata (the luaop module and the libraries, read-only views; metrics) are the
// same in every load and are not looked into.

// maxReachNodes bounds one handler's walk; past it the walk gives up (the hash of
// the whole script set stands for it).
const maxReachNodes = 100_000

// reachInput is what staging needs to compute reach hashes: the load's files,
// compiled, by name and by require() name, their content sums, the sum of the
// modules and of the whole set, and the previous load's hashes to reuse.
type reachInput struct {
	protos   map[string]*lua.FunctionProto
	byModule map[string]string // require() name (moduleName) -> file in a folder
	sums     map[string][sha256.Size]byte
	// modules sums every file in a folder (a module): a handler's values may come
	// from any module its file required at load time.
	modules [sha256.Size]byte
	setSum  []byte
	prev    map[string]reachEntry
}

// reachEntry is one handler's reach hash, with what it was computed from: it is
// reused by the next load when the handler's function is the same compiled one,
// its file (what ran to make its upvalues' values) and the modules unchanged.
type reachEntry struct {
	proto   *lua.FunctionProto
	file    [sha256.Size]byte
	modules [sha256.Size]byte
	hash    string
}

func newReachInput(files []string, protos map[string]*lua.FunctionProto, sums map[string][sha256.Size]byte, setSum []byte, prev map[string]reachEntry) *reachInput {
	in := &reachInput{protos: protos, byModule: make(map[string]string, len(files)), sums: sums, setSum: setSum, prev: prev}
	m := sha256.New()
	for _, f := range files { // sorted by name
		if isModule(f) {
			in.byModule[moduleName(f)] = f
			sum := sums[f]
			m.Write([]byte(f + "\x00"))
			m.Write(sum[:])
		}
	}
	copy(in.modules[:], m.Sum(nil))
	return in
}

// hashes computes the reach of every handler collected by a staging (shard lock
// held: the values are the staged load's, which nothing else runs yet), reusing
// the previous load's where nothing it came from changed.
func (in *reachInput) hashes(col *collected) map[string]reachEntry {
	out := make(map[string]reachEntry, len(col.specs)+len(col.admission))
	for _, list := range [][]string{idsOf(col.specs), idsOf(col.admission)} {
		for _, id := range list {
			fns := col.fns[id]
			var fn *lua.LFunction
			if fns != nil {
				fn = fns.fn
			}
			out[id] = in.entry(id, fn, col.sources[id])
		}
	}
	return out
}

func (in *reachInput) entry(id string, fn *lua.LFunction, source string) reachEntry {
	e := reachEntry{file: in.sums[fileOf(source)], modules: in.modules}
	if fn != nil {
		e.proto = fn.Proto
	}
	if p, ok := in.prev[id]; ok && p.proto == e.proto && p.file == e.file && p.modules == e.modules {
		return p
	}
	e.hash = in.reach(fn)
	return e
}

// reach hashes what fn can reach ("" for no function).
func (in *reachInput) reach(fn *lua.LFunction) string {
	if fn == nil {
		return ""
	}
	w := &reachWalker{in: in, h: sha256.New(), seen: map[any]int{}, envs: map[*lua.LTable]bool{}, modules: map[string]bool{}}
	w.function(fn)
	w.requiredModules()
	if w.nodes > maxReachNodes {
		return "set:" + hex.EncodeToString(in.setSum)
	}
	return hex.EncodeToString(w.h.Sum(nil))[:16]
}

func idsOf(specs []causes.Spec) []string {
	ids := make([]string, len(specs))
	for i := range specs {
		ids[i] = specs[i].ID
	}
	return ids
}

// reachWalker walks one handler's reach into h.
type reachWalker struct {
	in *reachInput
	h  hash.Hash
	// seen numbers the functions and tables met: met again, they are written as a
	// reference (cycles, shared helpers).
	seen map[any]int
	// envs are the file environments walked whole (their metatable, the sandbox's
	// shared one, is not looked into).
	envs map[*lua.LTable]bool
	// modules are the require() names met as string constants; done those added.
	modules map[string]bool
	nodes   int
	buf     [9]byte
}

func (w *reachWalker) tag(b byte, s string) {
	w.buf[0] = b
	w.h.Write(w.buf[:1])
	binary.LittleEndian.PutUint32(w.buf[1:5], uint32(len(s)))
	w.h.Write(w.buf[1:5])
	w.h.Write([]byte(s))
}

func (w *reachWalker) number(b byte, f float64) {
	w.buf[0] = b
	binary.LittleEndian.PutUint64(w.buf[1:], math.Float64bits(f))
	w.h.Write(w.buf[:9])
}

// ref writes a reference to v when it was met before, else numbers it.
func (w *reachWalker) ref(v any) bool {
	if i, ok := w.seen[v]; ok {
		w.number('@', float64(i))
		return true
	}
	w.seen[v] = len(w.seen)
	return false
}

func (w *reachWalker) value(v lua.LValue) {
	if w.nodes++; w.nodes > maxReachNodes {
		return
	}
	switch x := v.(type) {
	case lua.LBool:
		if x {
			w.tag('b', "true")
		} else {
			w.tag('b', "false")
		}
	case lua.LNumber:
		w.number('n', float64(x))
	case lua.LString:
		w.tag('s', string(x))
	case *lua.LFunction:
		w.function(x)
	case *lua.LTable:
		w.table(x)
	case nil:
		w.tag('x', "nil")
	default:
		// nil, userdata (the luaop module, the libraries, metrics), Go states:
		// the same in every load.
		w.tag('t', v.Type().String())
	}
}

func (w *reachWalker) function(fn *lua.LFunction) {
	if w.ref(fn) {
		return
	}
	if fn.IsG || fn.Proto == nil {
		w.tag('g', "")
		return
	}
	w.proto(fn.Proto)
	for _, uv := range fn.Upvalues {
		if uv == nil {
			w.tag('x', "nil")
			continue
		}
		w.value(uv.Value())
	}
	w.globals(fn)
}

// proto writes a prototype's code and constants, and its nested functions', and
// notes the module names among its string constants. Line numbers are left out.
func (w *reachWalker) proto(p *lua.FunctionProto) {
	w.number('p', float64(len(p.Code)))
	w.buf[0], w.buf[1], w.buf[2] = p.NumParameters, p.IsVarArg, p.NumUpvalues
	w.h.Write(w.buf[:3])
	code := make([]byte, 4*len(p.Code))
	for i, inst := range p.Code {
		binary.LittleEndian.PutUint32(code[4*i:], inst)
	}
	w.h.Write(code)
	for _, c := range p.Constants {
		w.value(c)
		if s, ok := c.(lua.LString); ok {
			if _, isModule := w.in.byModule[string(s)]; isModule {
				w.modules[string(s)] = true
			}
		}
	}
	for _, child := range p.FunctionPrototypes {
		w.proto(child)
	}
}

// globals walks the globals fn's code names, as its file's environment holds
// them now; the whole environment when it names _G, getfenv or setfenv.
func (w *reachWalker) globals(fn *lua.LFunction) {
	names := globalNames(fn.Proto, nil)
	if len(names) == 0 || fn.Env == nil {
		return
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, name := range names {
		switch name {
		case "_G", "getfenv", "setfenv":
			w.tag('E', name)
			w.envs[fn.Env] = true
			w.table(fn.Env)
			return
		}
	}
	for _, name := range names {
		w.tag('G', name)
		w.value(fn.Env.RawGetString(name))
	}
}

// table writes a table's entries (in its iteration order, the same for the same
// load) and its metatable.
func (w *reachWalker) table(t *lua.LTable) {
	if w.ref(t) {
		return
	}
	w.tag('T', "")
	for k, v := t.Next(lua.LNil); k != lua.LNil; k, v = t.Next(k) {
		if w.nodes > maxReachNodes {
			return
		}
		w.value(k)
		w.value(v)
	}
	w.tag('M', "")
	if mt, ok := t.Metatable.(*lua.LTable); ok && !w.envs[t] {
		w.table(mt)
	}
}

// requiredModules adds the compiled files of the modules named by the constants
// met, and of those their own constants name.
func (w *reachWalker) requiredModules() {
	done := map[string]bool{}
	for {
		var next []string
		for name := range w.modules {
			if !done[name] {
				next = append(next, name)
			}
		}
		if len(next) == 0 || w.nodes > maxReachNodes {
			return
		}
		slices.Sort(next)
		for _, name := range next {
			done[name] = true
			file := w.in.byModule[name]
			w.tag('R', file)
			if p := w.in.protos[file]; p != nil {
				w.proto(p)
			}
		}
	}
}

// Opcodes of gopher-lua's instructions (third_party/gopher-lua/opcode.go: the
// opcode in the top 6 bits, Bx in the low 18), read to find the globals a function
// names; TestReachFindsGlobals keeps this in step with the compiler.
func instOpCode(inst uint32) int { return int(inst >> 26) }
func instArgBx(inst uint32) int  { return int(inst & 0x3ffff) }

// globalNames appends the names of the globals p and its nested functions read or
// write.
func globalNames(p *lua.FunctionProto, names []string) []string {
	for _, inst := range p.Code {
		switch instOpCode(inst) {
		case lua.OP_GETGLOBAL, lua.OP_SETGLOBAL:
			if bx := instArgBx(inst); bx < len(p.Constants) {
				if s, ok := p.Constants[bx].(lua.LString); ok {
					names = append(names, string(s))
				}
			}
		}
	}
	for _, child := range p.FunctionPrototypes {
		names = globalNames(child, names)
	}
	return names
}

// fileOf is the file of a "file:line" source.
func fileOf(source string) string {
	if i := strings.LastIndexByte(source, ':'); i >= 0 {
		return source[:i]
	}
	return source
}

// isModule tells whether a file of the scripts folder is a module (in a folder),
// not a handler script.
func isModule(file string) bool { return strings.Contains(file, "/") }
