package caching

import (
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

func TestUnionIsTheWeakestSelectionEveryHandlerImplies(t *testing.T) {
	eq := func(k, v string) LabelFilter { return LabelFilter{Key: k, Op: LabelEquals, Value: v} }
	present := func(k string) LabelFilter { return LabelFilter{Key: k, Op: LabelPresent} }
	absent := func(k string) LabelFilter { return LabelFilter{Key: k, Op: LabelAbsent} }
	tests := []struct {
		name     string
		handlers []HandlerFilter
		want     Selection
	}{
		{"no handler: every object", nil, Selection{}},
		{"one handler, one value", []HandlerFilter{{Labels: []LabelFilter{eq("replicate", "true")}}}, Selection{Labels: "replicate=true"}},
		{"the same value twice", []HandlerFilter{{Labels: []LabelFilter{eq("a", "x")}}, {Labels: []LabelFilter{eq("a", "x")}}}, Selection{Labels: "a=x"}},
		{"two values: in", []HandlerFilter{{Labels: []LabelFilter{eq("a", "y")}}, {Labels: []LabelFilter{eq("a", "x")}}}, Selection{Labels: "a in (x,y)"}},
		{"a value and presence: presence", []HandlerFilter{{Labels: []LabelFilter{eq("a", "x")}}, {Labels: []LabelFilter{present("a")}}}, Selection{Labels: "a"}},
		{"absent twice", []HandlerFilter{{Labels: []LabelFilter{absent("a")}}, {Labels: []LabelFilter{absent("a")}}}, Selection{Labels: "!a"}},
		{"absent or a value: nothing", []HandlerFilter{{Labels: []LabelFilter{absent("a")}}, {Labels: []LabelFilter{eq("a", "x")}}}, Selection{}},
		{"absent or present: nothing", []HandlerFilter{{Labels: []LabelFilter{absent("a")}}, {Labels: []LabelFilter{present("a")}}}, Selection{}},
		{"a handler without filters: every object", []HandlerFilter{{Labels: []LabelFilter{eq("a", "x")}}, {}}, Selection{}},
		{"only the keys every handler constrains",
			[]HandlerFilter{{Labels: []LabelFilter{eq("a", "x"), eq("b", "1")}}, {Labels: []LabelFilter{eq("a", "x"), present("c")}}},
			Selection{Labels: "a=x"}},
		{"several keys, sorted", []HandlerFilter{{Labels: []LabelFilter{present("z"), eq("a", "x"), absent("m")}}}, Selection{Labels: "a=x,!m,z"}},
		{"a value the API server refuses is left out", []HandlerFilter{{Labels: []LabelFilter{eq("a", "not a label value"), eq("b", "1")}}}, Selection{Labels: "b=1"}},
		{"the same namespace and name", []HandlerFilter{{Namespace: "prod", Name: "cfg"}, {Namespace: "prod", Name: "cfg", Labels: []LabelFilter{eq("a", "x")}}},
			Selection{Namespace: "prod", Name: "cfg"}},
		{"different namespaces: any", []HandlerFilter{{Namespace: "prod"}, {Namespace: "dev"}}, Selection{}},
		{"one namespace, one handler without: any", []HandlerFilter{{Namespace: "prod"}, {}}, Selection{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Union(tt.handlers); got != tt.want {
				t.Errorf("Union = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// Every object a handler's filter matches is in the union's selection: the watch
// never misses what a handler would have handled.
func TestUnionSelectsEveryObjectAHandlerMatches(t *testing.T) {
	handlers := []HandlerFilter{
		{Labels: []LabelFilter{{Key: "a", Op: LabelEquals, Value: "x"}, {Key: "b", Op: LabelAbsent}}},
		{Labels: []LabelFilter{{Key: "a", Op: LabelPresent}, {Key: "b", Op: LabelAbsent}, {Key: "c", Op: LabelEquals, Value: "1"}}},
		{Labels: []LabelFilter{{Key: "a", Op: LabelEquals, Value: "y"}, {Key: "b", Op: LabelAbsent}}},
	}
	sel, err := labels.Parse(Union(handlers).Labels)
	if err != nil {
		t.Fatal(err)
	}
	objects := []labels.Set{{"a": "x"}, {"a": "y"}, {"a": "z", "c": "1"}, {"a": "x", "b": "1"}, {}, {"c": "1"}, {"a": "x", "c": "2", "d": "0"}}
	for _, obj := range objects {
		for i, h := range handlers {
			if matches(h, obj) && !sel.Matches(obj) {
				t.Errorf("handler %d matches %v, which the selection %q leaves out", i, obj, sel)
			}
		}
	}
	if sel.Matches(labels.Set{"c": "1"}) || sel.Matches(labels.Set{"a": "x", "b": "1"}) {
		t.Errorf("the selection %q holds objects no handler matches that it could leave out", sel)
	}
}

func matches(h HandlerFilter, obj labels.Set) bool {
	for _, f := range h.Labels {
		v, ok := obj[f.Key]
		switch {
		case f.Op == LabelPresent && !ok, f.Op == LabelAbsent && ok, f.Op == LabelEquals && (!ok || v != f.Value):
			return false
		}
	}
	return true
}

func TestCoversWhenTheQueryImpliesTheView(t *testing.T) {
	tests := []struct {
		view, query string
		want        bool
	}{
		{"", "", true},
		{"", "a=x", true},
		{"a=x", "", false},
		{"a=x", "a=x", true},
		{"a=x", "a=x,b=y", true},
		{"a=x", "a=y", false},
		{"a=x", "a in (x)", true},
		{"a=x", "a in (x,y)", false},
		{"a in (x,y)", "a=y", true},
		{"a in (x,y)", "a in (x,y)", true},
		{"a in (x,y)", "a", false},
		{"a", "a=x", true},
		{"a", "a in (x,y)", true},
		{"a", "a", true},
		{"a", "!a", false},
		{"a", "a!=x", false},
		{"!a", "!a", true},
		{"!a", "a=x", false},
		{"a!=x", "a=y", true},
		{"a!=x", "a=x", false},
		{"a!=x", "!a", true},
		{"a notin (x,y)", "a notin (x,y,z)", true},
		{"a notin (x,y)", "a!=x", false},
		{"a notin (x,y)", "a in (z,w)", true},
		{"a=x,b", "b=1,a=x", true},
		{"a=x,b", "a=x", false},
	}
	for _, tt := range tests {
		view, err := labels.Parse(tt.view)
		if err != nil {
			t.Fatal(err)
		}
		query, err := labels.Parse(tt.query)
		if err != nil {
			t.Fatal(err)
		}
		if got := Covers(view, query); got != tt.want {
			t.Errorf("Covers(view %q, query %q) = %v, want %v", tt.view, tt.query, got, tt.want)
		}
	}
}
