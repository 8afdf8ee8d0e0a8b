// Package devloop is the terminal side of `luaop dev`: a readable live view of the
// operator (lipgloss) that shows the loaded handlers, each reload's outcome with the
// file:line of an error, and the operator's log lines, styled by level.
//
// It owns the rendering only. Watching the folder (scriptwatch) and reloading
// (reloading, which shows its outcomes through a View this package's [View]
// satisfies) are production code, which `luaop run` uses without this view; devloop
// must not call the operator, the reload or the cluster.
//
// Lock rule: View.mu only orders the lines written to the output (a leaf: held for
// one write, never while calling out).
package devloop
