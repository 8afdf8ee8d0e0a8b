// Package scriptwatch follows a scripts folder while the operator runs and hands each
// settled change to a reload: the production path of hot reload (`luaop run` on a
// mounted ConfigMap) as much as the developer loop's (`luaop dev`, whose terminal view
// lives in devloop and only consumes what this package reports).
//
// [Watch] watches the folder recursively with fsnotify (folders, not files, so that
// editors saving by rename and Kubernetes ConfigMap volumes swapping their ..data link
// are seen), debounces each burst of events, re-reads the whole script set with
// [scriptsource.ReadDir] once the burst has settled and sends a [Change] only when the
// content hash differs from the last one sent. When inotify is unavailable (watch or
// instance limits, network and FUSE file systems) it falls back to slow polling.
// [Reload] feeds those changes to a [Loader] (the operator's LoadScripts) one at a
// time and reports each outcome as a [ReloadEvent].
//
// Ownership: the watcher's state belongs to the one goroutine Watch starts; Reload
// runs in its caller's goroutine. Neither holds a lock while reading files or loading.
package scriptwatch
