package processing

// objectAttrs are the log fields that name an object, each a field of its own so
// that JSON logs can be queried by any of them: resource (as the scripts spell it,
// group/version/plural), kind, namespace (absent for cluster-scoped objects), name
// and uid (absent while unknown), then more.
func objectAttrs(key objectKey, kind, uid string, more ...any) []any {
	attrs := make([]any, 0, 10+len(more))
	attrs = append(attrs, "resource", key.resource.String())
	if kind != "" {
		attrs = append(attrs, "kind", kind)
	}
	if key.namespace != "" {
		attrs = append(attrs, "namespace", key.namespace)
	}
	attrs = append(attrs, "name", key.name)
	if uid != "" {
		attrs = append(attrs, "uid", uid)
	}
	return append(attrs, more...)
}

// kindOf is the kind of a resource's objects, "" while unknown.
func (o *Reactor) kindOf(key objectKey) string {
	if info := o.resourceInfo(key.resource); info != nil {
		return info.kind
	}
	return ""
}
