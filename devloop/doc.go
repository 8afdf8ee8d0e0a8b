// Package devloop is the terminal side of `luaop dev`: a readable live view of the
// operator (lipgloss) that shows the loaded handlers, each reload's outcome with the
// file:line of an error, and the operator's log lines, styled by level.
//
// Watching the folder and reloading are not here: they are production code, in
// scriptwatch, which `luaop run` uses without this view.
package devloop
