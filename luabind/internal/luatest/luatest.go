package luatest

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	kjson "k8s.io/apimachinery/pkg/util/json"
)

// Compile compiles code as chunk `name` (so error messages say name:line:).
func Compile(t testing.TB, L *lua.LState, name, code string) *lua.LFunction {
	t.Helper()
	fn, err := L.Load(strings.NewReader(code), name)
	if err != nil {
		t.Fatalf("compile %s: %v", name, err)
	}
	return fn
}

// Call runs code (as handler.lua) with args and returns its first result, or the
// raw error of PCall.
func Call(t testing.TB, L *lua.LState, code string, args ...lua.LValue) (lua.LValue, error) {
	t.Helper()
	fn := Compile(t, L, "handler.lua", code)
	top := L.GetTop()
	L.Push(fn)
	for _, a := range args {
		L.Push(a)
	}
	if err := L.PCall(len(args), 1, nil); err != nil {
		L.SetTop(top)
		return nil, err
	}
	v := L.Get(-1)
	L.SetTop(top)
	return v, nil
}

// MustCall is Call failing the test on an error.
func MustCall(t testing.TB, L *lua.LState, code string, args ...lua.LValue) lua.LValue {
	t.Helper()
	v, err := Call(t, L, code, args...)
	if err != nil {
		t.Fatalf("lua: %v", err)
	}
	return v
}

// Decode decodes JSON like client-go (int64 / float64 numbers).
func Decode(t testing.TB, data []byte) any {
	t.Helper()
	var v any
	if err := kjson.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return v
}

// TestdataDir is the folder of the JSON documents the tests share.
func TestdataDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata")
}

// LoadFile decodes testdata/name (Decode).
func LoadFile(t testing.TB, name string) any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(TestdataDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	return Decode(t, data)
}

// SameJSON compares a value with what came back from Lua: numbers by value, and an
// integral number within ±2^53 must come back as int64 (so JSON prints 3, not 3.0).
func SameJSON(want, got any, path string) error {
	switch w := want.(type) {
	case int64, float64:
		wf := Float(w)
		gf, ok := Number(got)
		if !ok {
			return fmt.Errorf("%s: want number %v, got %T %v", path, want, got, got)
		}
		if wf != gf {
			return fmt.Errorf("%s: want %v, got %v", path, want, got)
		}
		if wf == math.Trunc(wf) && math.Abs(wf) <= 1<<53 {
			if _, isInt := got.(int64); !isInt {
				return fmt.Errorf("%s: want int64 %v, got %T", path, want, got)
			}
		}
		return nil
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want object, got %T", path, got)
		}
		if len(g) != len(w) {
			return fmt.Errorf("%s: want %d keys, got %d", path, len(w), len(g))
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s.%s: missing", path, k)
			}
			if err := SameJSON(wv, gv, path+"."+k); err != nil {
				return err
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok {
			return fmt.Errorf("%s: want list, got %T", path, got)
		}
		if len(g) != len(w) {
			return fmt.Errorf("%s: want %d items, got %d", path, len(w), len(g))
		}
		for i := range w {
			if err := SameJSON(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Errorf("%s: want %#v, got %#v", path, want, got)
		}
		return nil
	}
}

// Float is the value of a number (int64 or float64), 0 for anything else.
func Float(v any) float64 {
	f, _ := Number(v)
	return f
}

// Number is the value of a number (int64 or float64); ok is false for anything else.
func Number(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}
