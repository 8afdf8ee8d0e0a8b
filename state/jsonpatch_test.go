package state

import (
	"reflect"
	"testing"
)

func TestMergePatchOps(t *testing.T) {
	for _, tc := range []struct {
		name           string
		current, patch map[string]any
		want           []JSONPatchOp
	}{{
		name:    "a scalar replaced, one added, keys in sorted order",
		current: map[string]any{"b": "old"},
		patch:   map[string]any{"c": int64(1), "b": "new"},
		want: []JSONPatchOp{
			{Path: "/b", Value: "new", Existed: true},
			{Path: "/c", Value: int64(1)},
		},
	}, {
		name:    "a map the object has is descended into, not replaced",
		current: map[string]any{"spec": map[string]any{"keep": "k", "deep": map[string]any{"x": "1"}}},
		patch:   map[string]any{"spec": map[string]any{"deep": map[string]any{"y": "2"}}},
		want:    []JSONPatchOp{{Path: "/spec/deep/y", Value: "2"}},
	}, {
		name:    "a map over a scalar or an absent member is set whole, its nulls dropped",
		current: map[string]any{"s": "scalar"},
		patch: map[string]any{
			"s":   map[string]any{"a": "1", "gone": nil},
			"new": map[string]any{"b": map[string]any{"c": "2", "gone": nil}},
		},
		want: []JSONPatchOp{
			{Path: "/new", Value: map[string]any{"b": map[string]any{"c": "2"}}},
			{Path: "/s", Value: map[string]any{"a": "1"}, Existed: true},
		},
	}, {
		name:    "a null removes a member the object has, at any depth",
		current: map[string]any{"top": "t", "m": map[string]any{"inner": "i"}},
		patch:   map[string]any{"top": nil, "m": map[string]any{"inner": nil}},
		want:    []JSONPatchOp{{Path: "/m/inner", Remove: true}, {Path: "/top", Remove: true}},
	}, {
		name:    "a null for a member absent or already null is no operation",
		current: map[string]any{"held-null": nil},
		patch:   map[string]any{"absent": nil, "held-null": nil, "m": map[string]any{"absent": nil}},
		want:    []JSONPatchOp{{Path: "/m", Value: map[string]any{}}},
	}, {
		name:    "lists are set whole; equal values are marked unchanged, numbers by value",
		current: map[string]any{"list": []any{int64(1), int64(2)}, "n": float64(3), "same": []any{"a"}},
		patch:   map[string]any{"list": []any{int64(3)}, "n": int64(3), "same": []any{"a"}},
		want: []JSONPatchOp{
			{Path: "/list", Value: []any{int64(3)}, Existed: true},
			{Path: "/n", Value: int64(3), Existed: true, Unchanged: true},
			{Path: "/same", Value: []any{"a"}, Existed: true, Unchanged: true},
		},
	}, {
		name: "keys holding ~ or / are escaped in the path (RFC 6901)",
		current: map[string]any{"metadata": map[string]any{"annotations": map[string]any{
			"example.com/owner": "old", "a~b": "x"}}},
		patch: map[string]any{"metadata": map[string]any{"annotations": map[string]any{
			"example.com/owner": "new", "a~b": nil, "~/": "both"}}},
		want: []JSONPatchOp{
			{Path: "/metadata/annotations/a~0b", Remove: true},
			{Path: "/metadata/annotations/example.com~1owner", Value: "new", Existed: true},
			{Path: "/metadata/annotations/~0~1", Value: "both"},
		},
	}, {
		name:    "an empty patch has no operations",
		current: map[string]any{"a": "1"},
		patch:   map[string]any{},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MergePatchOps(tc.current, tc.patch); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("MergePatchOps =\n%#v\nwant\n%#v", got, tc.want)
			}
		})
	}
}
