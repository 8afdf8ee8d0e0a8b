// Package slim builds the operator's dynamic client so that the objects it decodes
// from JSON (list items, watch events, answers to writes) come without
// metadata.managedFields:
// server-side apply's bookkeeping, which grows with every writer and which the
// operator never reads. The member is cut from the JSON before decoding, so its
// maps and lists are never built; stripping it after decoding (as controller-runtime's
// TransformStripManagedFields does) still pays for building them. On objects written
// by a few managers, managedFields is a third to a half of the JSON.
//
// Only the JSON serializer is wrapped (with CBOR negotiated, nothing is cut here; the
// informer's transform still drops the field). The cut applies to metadata.managedFields
// of the decoded object and, when a list is decoded (into an UnstructuredList), of each
// of its items; nowhere else: a pod template's metadata inside spec, or a custom
// resource's own top-level "items", are left as they are. Input that does not scan as
// JSON objects is decoded unchanged, so the decoder reports its errors; what is cut is
// not checked (malformed JSON inside managedFields is dropped, not reported). Keys
// written with \u escapes are not recognised (the API server does not write them).
//
// Nothing here holds state: the wrappers are values around client-go's serializers.
//
// Its only user is processing (the reactor's dynamic client); it imports nothing of
// luaop and must stay below every package that decodes objects.
package slim
