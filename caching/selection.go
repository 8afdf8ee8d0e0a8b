package caching

import (
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/sets"
)

// LabelOp is how a handler's static label filter tests one label.
type LabelOp int

const (
	LabelEquals  LabelOp = iota // the label has Value
	LabelPresent                // the label exists, whatever its value
	LabelAbsent                 // the label does not exist
)

// LabelFilter is one static label filter of a handler (kopf's labels={...} with a
// value, PRESENT or ABSENT; a filter that is a function is none).
type LabelFilter struct {
	Key   string
	Op    LabelOp
	Value string
}

// HandlerFilter is what the API server could filter for one handler: its static
// label filters, and the namespace and the name it is restricted to by a value
// filter on metadata.namespace or metadata.name ("" when it is not). A handler may
// filter more (functions, other fields): the server then sends more than it needs,
// never less.
type HandlerFilter struct {
	Labels    []LabelFilter
	Namespace string
	Name      string
}

// Selection is what one watch asks the API server for: a label selector ("" for
// every object), a namespace and a name ("" for any).
type Selection struct {
	Labels    string
	Namespace string
	Name      string
}

// Selected tells whether the watch holds less than every object of its namespaces.
func (s Selection) Selected() bool { return s.Labels != "" || s.Name != "" }

// FieldSelector is the field selector of the name restriction ("" none).
func (s Selection) FieldSelector() string {
	if s.Name == "" {
		return ""
	}
	return fields.OneTermEqualSelector("metadata.name", s.Name).String()
}

// Union is the narrowest selection that still holds every object any of the handlers
// of one resource may match: the watch of the resource is shared by its handlers,
// so a label takes part only when every handler constrains it, and then as the
// weakest constraint implied by each of them:
//
//	a=x, a=y          -> a in (x,y)
//	a=x, a present    -> a
//	a absent, a absent -> !a
//	a absent, a=x     -> (nothing: no selector says "absent or x")
//	any handler without a filter on a -> (nothing on a)
//
// The namespace and the name are kept when every handler names the same one. No
// handler: no selection (every object).
func Union(handlers []HandlerFilter) Selection {
	if len(handlers) == 0 {
		return Selection{}
	}
	return Selection{Labels: unionLabels(handlers), Namespace: common(handlers, func(h HandlerFilter) string { return h.Namespace }),
		Name: common(handlers, func(h HandlerFilter) string { return h.Name })}
}

func common(handlers []HandlerFilter, of func(HandlerFilter) string) string {
	first := of(handlers[0])
	for _, h := range handlers[1:] {
		if of(h) != first {
			return ""
		}
	}
	return first
}

// keyJoin is what the handlers seen so far require of one label.
type keyJoin struct {
	handlers int // how many handlers constrain the key
	absent   int // of which by absence
	present  bool
	values   sets.Set[string]
}

func unionLabels(handlers []HandlerFilter) string {
	joins := map[string]*keyJoin{}
	for _, h := range handlers {
		for _, f := range firstPerKey(h.Labels) {
			j := joins[f.Key]
			if j == nil {
				j = &keyJoin{values: sets.New[string]()}
				joins[f.Key] = j
			}
			j.handlers++
			switch f.Op {
			case LabelAbsent:
				j.absent++
			case LabelPresent:
				j.present = true
			case LabelEquals:
				j.values.Insert(f.Value)
			}
		}
	}
	var reqs []labels.Requirement
	for key, j := range joins {
		if r, ok := j.requirement(key, len(handlers)); ok {
			reqs = append(reqs, r)
		}
	}
	if len(reqs) == 0 {
		return ""
	}
	sort.Slice(reqs, func(a, b int) bool { return reqs[a].Key() < reqs[b].Key() })
	return labels.NewSelector().Add(reqs...).String()
}

// firstPerKey keeps one filter per label (a handler's labels table has one entry
// per key; two would both have to hold, and the first is as good a bound).
func firstPerKey(filters []LabelFilter) []LabelFilter {
	var out []LabelFilter
	for _, f := range filters {
		if !slices.ContainsFunc(out, func(o LabelFilter) bool { return o.Key == f.Key }) {
			out = append(out, f)
		}
	}
	return out
}

// requirement is the weakest requirement implied by every handler's filter on key,
// if there is one; a key or value the API server would refuse gives none.
func (j *keyJoin) requirement(key string, handlers int) (labels.Requirement, bool) {
	var r *labels.Requirement
	var err error
	switch {
	case j.handlers < handlers:
		return labels.Requirement{}, false
	case j.absent == handlers:
		r, err = labels.NewRequirement(key, selection.DoesNotExist, nil)
	case j.absent > 0:
		return labels.Requirement{}, false
	case j.present:
		r, err = labels.NewRequirement(key, selection.Exists, nil)
	case j.values.Len() == 1:
		r, err = labels.NewRequirement(key, selection.Equals, sets.List(j.values))
	default:
		r, err = labels.NewRequirement(key, selection.In, sets.List(j.values))
	}
	if err != nil {
		return labels.Requirement{}, false
	}
	return *r, true
}

// Covers tells whether every object query selects is one the view's selector
// holds, so that a list from the view answers the query completely: each of the
// view's requirements is implied by one of the query's. An empty view selector
// covers everything.
func Covers(view, query labels.Selector) bool {
	viewReqs, ok := view.Requirements()
	if !ok {
		return false
	}
	var queryReqs labels.Requirements
	if query != nil {
		if queryReqs, ok = query.Requirements(); !ok {
			return false
		}
	}
	for _, v := range viewReqs {
		if !slices.ContainsFunc(queryReqs, func(q labels.Requirement) bool { return q.Key() == v.Key() && implies(q, v) }) {
			return false
		}
	}
	return true
}

// implies tells whether requirement q (of a query) implies v (of a view), both on
// the same key.
func implies(q, v labels.Requirement) bool {
	qIn, qNotIn := inSet(q)
	vIn, vNotIn := inSet(v)
	switch v.Operator() {
	case selection.Exists:
		return qIn != nil || q.Operator() == selection.Exists || q.Operator() == selection.GreaterThan || q.Operator() == selection.LessThan
	case selection.DoesNotExist:
		return q.Operator() == selection.DoesNotExist
	case selection.Equals, selection.DoubleEquals, selection.In:
		return qIn != nil && vIn.IsSuperset(qIn)
	case selection.NotEquals, selection.NotIn:
		switch {
		case q.Operator() == selection.DoesNotExist:
			return true
		case qNotIn != nil:
			return qNotIn.IsSuperset(vNotIn)
		case qIn != nil:
			return !qIn.HasAny(sets.List(vNotIn)...)
		}
	}
	return false
}

// inSet is the set of values a requirement allows (=, ==, in) or refuses (!=,
// notin); nil when it is neither.
func inSet(r labels.Requirement) (in, notIn sets.Set[string]) {
	switch r.Operator() {
	case selection.Equals, selection.DoubleEquals, selection.In:
		return sets.New(r.ValuesUnsorted()...), nil
	case selection.NotEquals, selection.NotIn:
		return nil, sets.New(r.ValuesUnsorted()...)
	}
	return nil, nil
}
