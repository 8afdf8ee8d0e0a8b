// Package causes holds the vocabulary shared by the processing core, the Lua
// binding, handling, the operator and luaop test: what happened to an object (a
// Cause), which handlers exist (a Spec), one invocation (a Call) and how a handler
// ended (Result, TemporaryError, PermanentError). It is a leaf: it imports state/
// and apimachinery only, so every side can depend on it without depending on each
// other. It holds data and its small predicates only: the rules of a handler run
// are handling's, the engines processing's; it must call neither.
package causes
