// Package sandbox makes the gopher-lua states operator scripts run in: only the safe
// libraries (no io, debug or file-system loading), a harmless collectgarbage, print
// routed to the caller, string.rep, string.format, string.gsub and table.concat bounded
// in size (and gsub in time), and pairs/ipairs that honour __pairs/__ipairs. It keeps
// no state of its own: each state it makes belongs to its caller (a luabind shard),
// under the caller's lock.
package sandbox
