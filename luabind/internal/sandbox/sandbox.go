package sandbox

import (
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/luaop/luaop/third_party/gopher-lua/pm"

	"github.com/luaop/luaop/luabind/internal/luavalue"
)

// Options configure NewState. Zero fields take the defaults of
// withDefaults, the one place defaults are decided.
type Options struct {
	// CallStackSize bounds Lua call depth (deep recursion fails with "stack overflow").
	CallStackSize int
	// RegistrySize is the initial data stack, in slots; RegistryMaxSize the most it may
	// grow to (it must grow: table.concat of n items needs 2n slots), by
	// RegistryGrowStep slots at a time.
	RegistrySize     int
	RegistryMaxSize  int
	RegistryGrowStep int
	// MaxStringSize bounds, in bytes, the strings that string.rep, string.format,
	// string.gsub and table.concat may build. Default 16 MiB.
	MaxStringSize int
	// Print receives print()'s arguments, to write them joined by tabs (within a
	// budget: luavalue.Budget.Join). Default: discard. L is the state (or thread)
	// print was called on.
	Print func(L *lua.LState, args []lua.LValue)
}

const (
	defaultCallStackSize = 256
	// Small initial stacks: every daemon is a coroutine with a data stack and a call
	// stack of its own (lua.Options are shared by threads); both grow on demand.
	defaultRegistrySize = 256
	defaultRegistryMax  = 1024 * 1024 // slots (16 bytes each): 16 MiB at most
	defaultGrowStep     = 1024
	defaultMaxString    = 16 << 20
)

func (o Options) withDefaults() Options {
	if o.CallStackSize <= 0 {
		o.CallStackSize = defaultCallStackSize
	}
	if o.RegistrySize < 128 {
		o.RegistrySize = defaultRegistrySize
	}
	if o.RegistryMaxSize <= o.RegistrySize {
		o.RegistryMaxSize = max(defaultRegistryMax, 2*o.RegistrySize)
	}
	if o.RegistryGrowStep <= 0 {
		o.RegistryGrowStep = max(defaultGrowStep, o.RegistrySize)
	}
	if o.MaxStringSize <= 0 {
		o.MaxStringSize = defaultMaxString
	}
	if o.Print == nil {
		o.Print = func(*lua.LState, []lua.LValue) {}
	}
	return o
}

// NewState creates an LState for operator scripts:
//   - libraries: package (first), base, table, string, math, and a safe os holding only
//     time, date and clock. No io, debug, coroutine or channel library.
//   - removed: dofile, loadfile, _printregs, package.loadlib, package.path,
//     package.cpath and the file-system loader of require (only package.preload
//     remains; the runtime gives each script load a require of its own that reads
//     the scripts folder's compiled modules, never the file system).
//   - collectgarbage is a harmless function returning 0 (the real one runs a GC of the
//     whole Go program).
//   - print goes to opts.Print.
//   - no string a script builds is larger than MaxStringSize: the `..` operator
//     (lua.Options.MaxStringSize, a patch of gopher-lua: third_party/gopher-lua),
//     string.rep, string.format, string.gsub, table.concat and os.date refuse to.
//     The string metatable's __index is the string table, so ("x"):rep(n) and
//     s:gsub(...) are bounded too.
//   - pattern matching (string.find, match, gmatch, gsub) ends with the state's
//     context: the matcher checks it every few thousand steps (patched pm).
//   - pairs/ipairs honour __pairs/__ipairs (InstallIteration).
func NewState(opts Options) *lua.LState {
	opts = opts.withDefaults()
	L := lua.NewState(lua.Options{
		CallStackSize:       opts.CallStackSize,
		RegistrySize:        opts.RegistrySize,
		RegistryMaxSize:     opts.RegistryMaxSize,
		RegistryGrowStep:    opts.RegistryGrowStep,
		MinimizeStackMemory: true,
		SkipOpenLibs:        true,
		MaxStringSize:       opts.MaxStringSize, // `..` (third_party/gopher-lua)
	})
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage}, // package first: base's require uses it
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
		{lua.OsLibName, lua.OpenOs},
	} {
		L.Push(L.NewFunction(lib.open))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}

	g := L.G.Global
	for _, name := range []string{"dofile", "loadfile", "_printregs"} {
		g.RawSetString(name, lua.LNil)
	}
	g.RawSetString("collectgarbage", L.NewFunction(func(L *lua.LState) int {
		L.Push(lua.LNumber(0))
		return 1
	}))
	printFn := opts.Print
	g.RawSetString("print", L.NewFunction(func(L *lua.LState) int {
		top := L.GetTop()
		args := make([]lua.LValue, top)
		for i := 1; i <= top; i++ {
			args[i-1] = L.Get(i)
		}
		printFn(L, args)
		return 0
	}))
	// tostring through the bounded path (luavalue.Text): __tostring must return a
	// string (Lua 5.2's rule; gopher-lua returned whatever it gave).
	maxString := opts.MaxStringSize
	g.RawSetString("tostring", L.NewFunction(func(L *lua.LState) int {
		s, err := luavalue.NewBudget(luavalue.Limits{MaxBytes: maxString}).Text(L, L.CheckAny(1))
		if err != nil {
			L.RaiseError("tostring: %s", err)
		}
		L.Push(lua.LString(s))
		return 1
	}))

	// A safe os: time, date and clock only.
	loaded, _ := L.G.Registry.RawGetString("_LOADED").(*lua.LTable)
	if full, ok := g.RawGetString("os").(*lua.LTable); ok {
		safe := L.CreateTable(0, 3)
		for _, name := range []string{"time", "date", "clock"} {
			safe.RawSetString(name, full.RawGetString(name))
		}
		g.RawSetString("os", safe)
		if loaded != nil {
			loaded.RawSetString("os", safe)
		}
	}

	// package: no native libraries, no file system.
	if pkg, ok := g.RawGetString("package").(*lua.LTable); ok {
		for _, name := range []string{"loadlib", "path", "cpath"} {
			pkg.RawSetString(name, lua.LNil)
		}
	}
	if loaders, ok := L.G.Registry.RawGetString("_LOADERS").(*lua.LTable); ok {
		// Keep the preload loader (index 1), drop the rest (the package.path searcher).
		for i := loaders.Len(); i >= 2; i-- {
			loaders.RawSetInt(i, lua.LNil)
		}
	}

	boundStrings(L, opts.MaxStringSize)
	luavalue.InstallIteration(L)
	return L
}

// boundStrings replaces string.rep, string.format, string.gsub, table.concat and
// os.date with versions that refuse results larger than limit bytes (the `..`
// operator is bounded by gopher-lua itself: lua.Options.MaxStringSize, patched).
func boundStrings(L *lua.LState, limit int) {
	strMod, ok := L.G.Global.RawGetString("string").(*lua.LTable)
	if ok {
		strMod.RawSetString("rep", L.NewFunction(func(L *lua.LState) int {
			s := L.CheckString(1)
			n := float64(L.CheckNumber(2))
			if !(n >= 1) || len(s) == 0 { // NaN too: nothing to repeat
				L.Push(lua.LString(""))
				return 1
			}
			if size := float64(len(s)) * n; size > float64(limit) {
				L.RaiseError("string.rep: result too large (%.0f bytes > %d)", size, limit)
			}
			L.Push(lua.LString(strings.Repeat(s, int(n))))
			return 1
		}))
		strMod.RawSetString("format", L.NewFunction(func(L *lua.LState) int {
			return format(L, limit)
		}))
		strMod.RawSetString("gsub", L.NewFunction(func(L *lua.LState) int {
			return gsub(L, limit)
		}))
	}
	if osMod, ok := L.G.Global.RawGetString("os").(*lua.LTable); ok {
		if orig, ok := osMod.RawGetString("date").(*lua.LFunction); ok && orig.IsG {
			origDate := orig.GFunction
			osMod.RawSetString("date", L.NewFunction(func(L *lua.LState) int {
				// Each directive (%c, the longest, is about 24 bytes) writes at
				// most 32 bytes for the two of the format.
				if f, ok := L.Get(1).(lua.LString); ok {
					if est := len(f) + 30*strings.Count(string(f), "%"); est > limit {
						L.RaiseError("os.date: result too large (up to %d bytes > %d)", est, limit)
					}
				}
				return origDate(L)
			}))
		}
	}
	if tabMod, ok := L.G.Global.RawGetString("table").(*lua.LTable); ok {
		if orig, ok := tabMod.RawGetString("concat").(*lua.LFunction); ok && orig.IsG {
			origConcat := orig.GFunction
			tabMod.RawSetString("concat", L.NewFunction(func(L *lua.LState) int {
				tbl := L.CheckTable(1)
				sep := L.OptString(2, "")
				n := tbl.Len()
				i := max(L.OptInt(3, 1), 1)
				j := min(L.OptInt(4, n), n)
				// A quick upper bound (numbers count 24 bytes) and, only when it
				// exceeds the limit, the exact size.
				size := func(exact bool) int {
					size := 0
					for k := i; k <= j && size <= limit; k++ {
						switch v := tbl.RawGetInt(k).(type) {
						case lua.LString:
							size += len(v)
						case lua.LNumber:
							if exact {
								size += len(v.String())
							} else {
								size += 24
							}
						}
						if k < j {
							size += len(sep)
						}
					}
					return size
				}
				if size(false) > limit && size(true) > limit {
					L.RaiseError("table.concat: result too large (more than %d bytes)", limit)
				}
				return origConcat(L)
			}))
		}
	}
}

// gsub is gopher-lua's string.gsub with the same semantics, built in linear time
// (gopher-lua's copies the whole string once per match), finding matches in batches
// instead of all at once, honouring the state's context between batches, and refusing a
// result larger than limit (or than the input, when the input is already larger).
func gsub(L *lua.LState, limit int) int {
	str := L.CheckString(1)
	pat := L.CheckString(2)
	L.CheckTypes(3, lua.LTString, lua.LTTable, lua.LTFunction)
	repl := L.Get(3)
	maxN := L.OptInt(4, -1)

	bound := max(limit, len(str))
	src := []byte(str)
	anchored := strings.HasPrefix(pat, "^")
	const batch = 256

	var out []byte
	last := 0  // end of the part of src already copied to out
	count := 0 // matches, as gopher-lua counts them
	for sp := 0; sp <= len(src); {
		want := batch
		if maxN >= 0 {
			want = min(batch, maxN-count)
			if want <= 0 {
				break
			}
		}
		mds, err := pm.FindCheck(pat, src, sp, want, contextCheck(L))
		if err != nil {
			L.RaiseError("%s", err.Error())
		}
		if len(mds) == 0 {
			break
		}
		for _, md := range mds {
			start, end := md.Capture(0), md.Capture(1)
			rep, ok := gsubReplacement(L, str, repl, md)
			if out == nil {
				out = make([]byte, 0, len(src))
			}
			out = append(out, src[last:start]...)
			if ok {
				out = append(out, rep...)
			} else {
				out = append(out, src[start:end]...)
			}
			last = end
			count++
			if len(out)+len(src)-last > bound {
				L.RaiseError("string.gsub: result too large (more than %d bytes)", bound)
			}
			sp = max(start+1, end)
		}
		if anchored || len(mds) < want {
			break
		}
	}
	if count == 0 {
		L.Push(lua.LString(str))
		L.Push(lua.LNumber(0))
		return 2
	}
	out = append(out, src[last:]...)
	L.Push(lua.LString(out))
	L.Push(lua.LNumber(count))
	return 2
}

// contextCheck is the check of pm.FindCheck for L: its context's error once it
// ended, so that a pattern match runs no longer than its call's deadline.
func contextCheck(L *lua.LState) func() error {
	if ctx := L.Context(); ctx != nil {
		return ctx.Err
	}
	return nil
}

// gsubReplacement computes one replacement like gopher-lua does; ok is false when the
// match must stay as it is (a table or function gave false or nil).
func gsubReplacement(L *lua.LState, str string, repl lua.LValue, md *pm.MatchData) (string, bool) {
	switch r := repl.(type) {
	case lua.LString:
		rs := string(r)
		if strings.IndexByte(rs, '%') < 0 {
			return rs, true
		}
		var b strings.Builder
		for i := 0; i < len(rs); i++ {
			c := rs[i]
			if c != '%' || i == len(rs)-1 {
				b.WriteByte(c)
				continue
			}
			i++
			d := rs[i]
			switch {
			case d == '%':
				b.WriteByte('%')
			case d >= '0' && d <= '9':
				b.WriteString(captured(L, md, str, 2*int(d-'0')))
			default:
				b.WriteByte('%')
				b.WriteByte(d)
			}
		}
		return b.String(), true
	case *lua.LTable:
		idx := 0
		if md.CaptureLength() > 2 {
			idx = 2
		}
		var v lua.LValue
		if md.IsPosCapture(idx) {
			v = L.GetTable(r, lua.LNumber(md.Capture(idx)))
		} else {
			v = L.GetField(r, str[md.Capture(idx):md.Capture(idx+1)])
		}
		if lua.LVIsFalse(v) {
			return "", false
		}
		return lua.LVAsString(v), true
	case *lua.LFunction:
		L.Push(r)
		nargs := 0
		if md.CaptureLength() > 2 {
			for i := 2; i < md.CaptureLength(); i += 2 {
				if md.IsPosCapture(i) {
					L.Push(lua.LNumber(md.Capture(i)))
				} else {
					L.Push(lua.LString(str[md.Capture(i):md.Capture(i+1)]))
				}
				nargs++
			}
		} else {
			L.Push(lua.LString(str[md.Capture(0):md.Capture(1)]))
			nargs++
		}
		L.Call(nargs, 1)
		v := L.Get(-1)
		L.Pop(1)
		if lua.LVIsFalse(v) {
			return "", false
		}
		return lua.LVAsString(v), true
	}
	return "", false
}

func captured(L *lua.LState, md *pm.MatchData, str string, idx int) string {
	if idx > 2 && idx >= md.CaptureLength() {
		L.RaiseError("invalid capture index")
	}
	if idx >= md.CaptureLength() && idx == 2 {
		idx = 0
	}
	if md.IsPosCapture(idx) {
		return lua.LNumber(md.Capture(idx)).String()
	}
	return str[md.Capture(idx):md.Capture(idx+1)]
}
