package operator

import (
	"strings"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
)

// scriptHandlers is the Lua runtime as the processing core takes it, with the
// filters of each handler the API server can apply (processing.WatchFilters): the
// runtime's static label filters and string value filters, in caching's data form.
// An adapter until the handlers' specs carry their filters as data.
type scriptHandlers struct{ *luabind.Runtime }

// WatchFilter is what the API server could filter for spec's handler.
func (h scriptHandlers) WatchFilter(spec causes.Spec) caching.HandlerFilter {
	var f caching.HandlerFilter
	for _, l := range h.LabelFilters(spec.ID) {
		switch {
		case l.Present:
			f.Labels = append(f.Labels, caching.LabelFilter{Key: l.Key, Op: caching.LabelPresent})
		case l.Absent:
			f.Labels = append(f.Labels, caching.LabelFilter{Key: l.Key, Op: caching.LabelAbsent})
		default:
			f.Labels = append(f.Labels, caching.LabelFilter{Key: l.Key, Op: caching.LabelEquals, Value: l.Value})
		}
	}
	if field, value, ok := h.ValueFilter(spec.ID); ok {
		switch strings.Join(field, ".") {
		case "metadata.namespace":
			f.Namespace = value
		case "metadata.name":
			f.Name = value
		}
	}
	return f
}
