// Package scriptwatch follows a scripts folder while the operator runs and hands each
// settled change on: the production path of hot reload (`luaop run` on a mounted
// ConfigMap) as much as the developer loop's (`luaop dev`). It owns the watching and
// the reading only; what a change does (the load, the last good scripts, metrics,
// webhooks, the view) is package reloading's, its one consumer in the operator.
//
// [Watch] watches the folder recursively with fsnotify (folders, not files, so that
// editors saving by rename and Kubernetes ConfigMap volumes swapping their ..data link
// are seen), debounces each burst of events, re-reads the whole script set with
// [scriptsource.ReadDir] once the burst has settled and sends a [Change] only when the
// content hash differs from the last one sent. When inotify is unavailable (watch or
// instance limits, network and FUSE file systems) it falls back to slow polling.
//
// [ConfigMapSource] is the second source of the same scripts: the ConfigMap the folder
// is mounted from, read through the API (one ConfigMap, watched by a field selector on
// its name), so that an edit arrives as soon as it is applied rather than after the
// kubelet's sync period. Its [Change] carries the ConfigMap's resourceVersion and
// keys; both sources hash a script set alike ([HashScripts]).
//
// It must not load scripts or call the operator: it knows nothing above its sources;
// which change to load, and which source is the newer, is package reloading's.
//
// Ownership: the watcher's state (its watches, the pending change, the timers)
// belongs to the one goroutine Watch starts; it holds no lock, and it never blocks
// on its consumer (a consumer that falls behind gets one Change covering every save
// since the last it took).
// A ConfigMapSource's informer hands each content to a forwarder goroutine through
// a one-slot pending change (forwarder.mu guards it, never held across a send), so
// the informer never blocks on the consumer either.
package scriptwatch
