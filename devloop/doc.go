// Package devloop supports the edit-and-reload loop of Lua handler scripts: it watches a
// scripts folder and reports each settled change of its content, so the operator can
// reload the scripts while it runs.
//
// [Watch] watches the folder recursively with fsnotify (folders, not files, so that
// editors saving by rename and Kubernetes ConfigMap volumes swapping their ..data link
// are seen), debounces each burst of events, re-reads the whole script set with
// [luabind.ReadDir] once the burst has settled and sends a [Change] only when the
// content hash differs from the last one sent. When inotify is unavailable (watch or
// instance limits, network and FUSE file systems) it falls back to slow polling.
package devloop
