package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
)

// number is a numeric value normalised so that the many Go types a JSON number can arrive as
// compare by value; integers stay exact instead of going through float64.
type number struct {
	isInt bool
	i     int64
	f     float64
}

func asNumber(v any) (number, bool) {
	switch n := v.(type) {
	case int64:
		return number{isInt: true, i: n}, true
	case float64:
		return number{f: n}, true
	case int:
		return number{isInt: true, i: int64(n)}, true
	case int32:
		return number{isInt: true, i: int64(n)}, true
	case int16:
		return number{isInt: true, i: int64(n)}, true
	case int8:
		return number{isInt: true, i: int64(n)}, true
	case uint:
		return fromUint(uint64(n)), true
	case uint64:
		return fromUint(n), true
	case uint32:
		return number{isInt: true, i: int64(n)}, true
	case uint16:
		return number{isInt: true, i: int64(n)}, true
	case uint8:
		return number{isInt: true, i: int64(n)}, true
	case float32:
		return number{f: float64(n)}, true
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return number{isInt: true, i: i}, true
		}
		if f, err := n.Float64(); err == nil {
			return number{f: f}, true
		}
	}
	return number{}, false
}

func fromUint(u uint64) number {
	if u <= math.MaxInt64 {
		return number{isInt: true, i: int64(u)}
	}
	return number{f: float64(u)}
}

func (a number) equal(b number) bool {
	switch {
	case a.isInt && b.isInt:
		return a.i == b.i
	case a.isInt:
		return intEqualsFloat(a.i, b.f)
	case b.isInt:
		return intEqualsFloat(b.i, a.f)
	default:
		return a.f == b.f
	}
}

// intEqualsFloat avoids float64(i) alone, which would equate distinct large integers.
func intEqualsFloat(i int64, f float64) bool {
	if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return false
	}
	return int64(f) == i
}

// isNull treats nil maps and slices like JSON null, as encoding/json does, so that a typed nil
// passed through an `any` is not mistaken for an empty object.
func isNull(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case map[string]any:
		return x == nil
	case []any:
		return x == nil
	}
	return false
}

// ValuesEqual reports deep equality of JSON-like values with numeric normalisation
// (int64(3) equals float64(3)). Inside maps a key holding nil counts as absent, matching Compare:
// ValuesEqual(a, b) is true exactly when Compare(a, b) is empty.
func ValuesEqual(a, b any) bool {
	if isNull(a) || isNull(b) {
		return isNull(a) && isNull(b)
	}
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range x {
			if !isNull(v) && !ValuesEqual(v, y[k]) {
				return false
			}
		}
		for k, v := range y {
			if !isNull(v) && isNull(x[k]) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !ValuesEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	if na, ok := asNumber(a); ok {
		nb, ok := asNumber(b)
		return ok && na.equal(nb)
	}
	return reflect.DeepEqual(a, b)
}

// DeepCopyValue returns a deep copy of a JSON-like value. Maps and slices are copied
// recursively (including the typed []string and map[string]string that hand-built objects
// tend to contain); everything else is immutable in practice and returned as is.
func DeepCopyValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if x == nil {
			return x
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = DeepCopyValue(e)
		}
		return out
	case []any:
		if x == nil {
			return x
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = DeepCopyValue(e)
		}
		return out
	case map[string]string:
		if x == nil {
			return x
		}
		out := make(map[string]string, len(x))
		for k, e := range x {
			out[k] = e
		}
		return out
	case []string:
		if x == nil {
			return x
		}
		return append([]string(nil), x...)
	}
	return v
}

// encodeJSON is the canonical encoding: encoding/json already sorts map keys; HTML escaping is
// turned off so that the stored text reads like what a user wrote.
func encodeJSON(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

// decodeJSONObject decodes the way client-go's unstructured decoder does (integers as int64,
// other numbers as float64), so that decoded values compare and re-encode like API objects.
func decodeJSONObject(s string) (map[string]any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	m, ok := v.(map[string]any)
	if !ok || m == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	return convertNumbers(m).(map[string]any), nil
}

func convertNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = convertNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = convertNumbers(e)
		}
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
	}
	return v
}

// Identity reads what names an object: its apiVersion, kind, namespace and name
// (empty strings for what it lacks).
func Identity(obj map[string]any) (apiVersion, kind, namespace, name string) {
	apiVersion, _ = obj["apiVersion"].(string)
	kind, _ = obj["kind"].(string)
	m, _ := obj["metadata"].(map[string]any)
	namespace, _ = m["namespace"].(string)
	name, _ = m["name"].(string)
	return
}
