package luabind

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unsafe"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
)

// Whose memory (issue 46).
//
// The memory budget counts the whole heap: data a script keeps across calls (a
// file-level table filled by every call, a module's cache, an object's memo) stays
// counted, and the call that happens to run when the heap passes the budget is
// cancelled, though it may hold nothing. So, when the budget cancels a call, the
// data the scripts hold across calls is measured (Lua values reachable from each
// holder, each value counted once, for the first holder that reaches it) and the
// error and /debug (Runtime.MemoryReport) name the holders that hold the most:
//   - "file cache.lua": the file's globals, the file-level locals its functions
//     keep (upvalues of its handlers and filters), and the value it returned as a
//     module;
//   - "memo of default/w1": an object's memo (ctx.memo), "operator memo" the hooks';
// summed over the Lua states (a file's data is in each state that ran it). A state
// busy with another call (not parked in a blocking function) is not measured: the
// report says so. Sizes are estimates from the values' own sizes (strings, tables'
// parts, closures), the way the heap holds them; what the runtime shares between
// holders (the libraries, the luaop module) is nobody's.

// MemoryHolder is one holder of data kept across calls, with its measured size.
type MemoryHolder struct {
	// What holds it: "file cache.lua", "memo of default/w1", "operator memo".
	What  string `json:"what"`
	Bytes int64  `json:"bytes"`
}

func (h MemoryHolder) String() string { return h.What + " " + FormatBytes(uint64(h.Bytes)) }

// MemoryReport is what the budget found the last time it cancelled a call.
type MemoryReport struct {
	At time.Time `json:"at"`
	// Call is the call cancelled (a handler's id, or "loading the scripts").
	Call   string `json:"call"`
	Heap   uint64 `json:"heapBytes"`
	Budget uint64 `json:"budgetBytes"`
	// Holders are the largest holders of data kept across calls, largest first
	// (at most maxHolders, each holding 1% of the budget at least).
	Holders []MemoryHolder `json:"holders"`
	// Unmeasured are the Lua states busy with a call while the others were
	// measured.
	Unmeasured []int `json:"unmeasuredStates,omitempty"`
}

// maxHolders is how many holders a report keeps.
const maxHolders = 5

// Summary says who holds the most, for the budget's error.
func (m *MemoryReport) Summary() string {
	if len(m.Holders) == 0 {
		return "the scripts hold little data across calls (measured): the calls running filled it"
	}
	parts := make([]string, len(m.Holders))
	for i, h := range m.Holders {
		parts[i] = h.String()
	}
	s := "data kept across calls, measured: most by " + parts[0]
	if len(parts) > 1 {
		s += ", then " + strings.Join(parts[1:], ", ")
	}
	if len(m.Unmeasured) > 0 {
		s += fmt.Sprintf(" (%d Lua state(s) busy, not measured)", len(m.Unmeasured))
	}
	return s
}

// MemoryReport is the report of the last call the memory budget cancelled, nil
// when none was.
func (r *Runtime) MemoryReport() *MemoryReport { return r.memReport.Load() }

// measureHolders measures what the scripts hold across calls in every state: own's
// lock is held by the caller (the call that was cancelled), the others are measured
// when they are free, without waiting. The report is kept for MemoryReport.
func (r *Runtime) measureHolders(own *shard, mc *memCall) *MemoryReport {
	rep := &MemoryReport{At: time.Now(), Call: mc.what, Heap: mc.heapAt.Load(), Budget: r.mem.budget}
	sizes := map[string]int64{}
	for i := range r.shards {
		sh := r.shards[i].Load()
		if sh == nil {
			continue
		}
		if sh != own {
			if !sh.tryLock() {
				rep.Unmeasured = append(rep.Unmeasured, sh.idx)
				continue
			}
		}
		for what, n := range sh.measureHolders() {
			sizes[what] += n
		}
		if sh != own {
			sh.unlock()
		}
	}
	for what, n := range sizes {
		if uint64(n) >= rep.Budget/100 { // smaller ones are not whose memory it is
			rep.Holders = append(rep.Holders, MemoryHolder{What: what, Bytes: n})
		}
	}
	sort.Slice(rep.Holders, func(i, j int) bool {
		a, b := rep.Holders[i], rep.Holders[j]
		if a.Bytes != b.Bytes {
			return a.Bytes > b.Bytes
		}
		return a.What < b.What
	})
	if len(rep.Holders) > maxHolders {
		rep.Holders = rep.Holders[:maxHolders]
	}
	r.memReport.Store(rep)
	return rep
}

// tryLock takes the shard lock if it is free.
func (s *shard) tryLock() bool {
	if !s.sched.tryJoin(firstSlice) {
		return false
	}
	if s.closed {
		s.unlock()
		return false
	}
	s.turnStart = s.L.G.Instructions
	return true
}

// measureHolders measures the holders of this state's data (file, memo). Shard
// lock held.
func (s *shard) measureHolders() map[string]int64 {
	m := newMeasurer(s)
	out := map[string]int64{}
	// The files, in name order (a value two files share counts for the first).
	roots := map[string][]lua.LValue{}
	for file, h := range s.held {
		roots[file] = append(roots[file], h.env)
		if h.value != nil {
			roots[file] = append(roots[file], h.value)
		}
	}
	addFn := func(fn *lua.LFunction) {
		if fn != nil && fn.Proto != nil {
			roots[fn.Proto.SourceName] = append(roots[fn.Proto.SourceName], fn)
		}
	}
	each := func(f *handlerFns) {
		addFn(f.fn)
		addFn(f.when)
		addFn(f.valueFn)
		addFn(f.oldFn)
		addFn(f.newFn)
		for _, fn := range f.labelFns {
			addFn(fn)
		}
		for _, fn := range f.annotFns {
			addFn(fn)
		}
	}
	for _, f := range s.fns {
		each(f)
	}
	for _, subs := range s.subFns {
		for _, f := range subs {
			each(f)
		}
	}
	files := make([]string, 0, len(roots))
	for f := range roots {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		if n := m.measure(roots[f]...); n > 0 {
			out["file "+f] += n
		}
	}
	for uid, memo := range s.memos {
		name := s.memoNames[uid]
		if name == "" {
			name = uid
		}
		if n := m.measure(memo); n > 0 {
			out["memo of "+name] += n
		}
	}
	if n := m.measure(s.opMemo); n > 0 {
		out["operator memo"] += n
	}
	return out
}

// nameMemo records the object a memo belongs to (namespace/name), for the report.
// Shard lock held.
func (s *shard) nameMemo(uid string, body map[string]any) {
	if uid == "" || s.memoNames[uid] != "" {
		return
	}
	meta, _ := body["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if ns, _ := meta["namespace"].(string); ns != "" {
		name = ns + "/" + name
	}
	s.memoNames[uid] = name
}

// maxMeasured bounds the values one measurement visits (a heap of tens of millions
// of values is measured in part: the holders found so far are named).
const maxMeasured = 20_000_000

// measurer walks Lua values, each once, estimating what they hold.
type measurer struct {
	seen    map[unsafe.Pointer]struct{}
	visited int
}

// newMeasurer starts a walk that never enters what the runtime shares: the
// state's own globals and registry, the base environment, the luaop module.
func newMeasurer(s *shard) *measurer {
	m := &measurer{seen: map[unsafe.Pointer]struct{}{}}
	for _, t := range []*lua.LTable{s.L.G.Global, s.L.G.Registry, s.module, s.ctxMT, s.patchMT, s.deadPatchMT, s.memoMT} {
		if t != nil {
			m.seen[unsafe.Pointer(t)] = struct{}{}
		}
	}
	if base := s.iso.Base(); base != nil {
		m.seen[unsafe.Pointer(base)] = struct{}{}
	}
	return m
}

// measure is the estimated size of what roots reach that no earlier measure
// reached.
func (m *measurer) measure(roots ...lua.LValue) int64 {
	var n int64
	todo := append([]lua.LValue(nil), roots...)
	for len(todo) > 0 && m.visited < maxMeasured {
		v := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		m.visited++
		switch x := v.(type) {
		case lua.LString:
			if len(x) < 32 { // small strings: counted each time, not remembered
				n += int64(len(x)) + 16
				continue
			}
			if m.first(unsafe.Pointer(unsafe.StringData(string(x)))) {
				n += int64(len(x)) + 16
			}
		case lua.LNumber:
			n += 8
		case *lua.LTable:
			if !m.first(unsafe.Pointer(x)) {
				continue
			}
			n += int64(x.MemSize())
			x.ForEach(func(k, v lua.LValue) { todo = append(todo, k, v) })
			if x.Metatable != lua.LNil {
				todo = append(todo, x.Metatable)
			}
		case *lua.LFunction:
			if !m.first(unsafe.Pointer(x)) {
				continue
			}
			n += 64 + 40*int64(len(x.Upvalues))
			if x.Env != nil {
				todo = append(todo, x.Env)
			}
			for _, uv := range x.Upvalues {
				if uv != nil {
					todo = append(todo, uv.Value())
				}
			}
		case *lua.LUserData:
			if m.first(unsafe.Pointer(x)) {
				n += 48
			}
		}
	}
	return n
}

// first tells whether p is seen for the first time.
func (m *measurer) first(p unsafe.Pointer) bool {
	if _, ok := m.seen[p]; ok {
		return false
	}
	m.seen[p] = struct{}{}
	return true
}
