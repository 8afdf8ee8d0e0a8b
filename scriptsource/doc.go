// Package scriptsource reads the scripts folder: every *.lua file below it as a
// Script (name relative to the folder, source), ConfigMap volumes included (links
// into ..data followed, a top-level "lib__util.lua" read as "lib/util.lua"), hidden
// entries and editor leftovers skipped (IgnoredName). FileCache makes a watcher's
// repeated reads open only the files that changed. ScriptsOfConfigMap reads a
// ConfigMap's data by the same rules (the scripts guard, the last good scripts),
// ConfigMapKey writes a script's key. NotAVolumeOf tells whether a folder is a
// ConfigMap's volume, as the kubelet mounts it, and that ConfigMap's alone.
//
// It owns the Script type and the rules of which files are scripts and what they
// are named; luabind runs what it reads, scriptwatch decides when to read again. It
// reads files and nothing else: it must not import luabind, Lua or anything of the
// operator (luabind imports it for Script).
package scriptsource
