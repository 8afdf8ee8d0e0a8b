// Package sandbox makes the gopher-lua states operator scripts run in, and keeps the
// scripts sharing a state apart. NewState gives only the safe libraries (no io, debug
// or file-system loading), a harmless collectgarbage, print routed to the caller,
// string.rep, string.format, string.gsub and table.concat bounded in size (and gsub in
// time), and pairs/ipairs that honour __pairs/__ipairs. An Isolation gives each script
// a global environment of its own over read-only views of the libraries and of a
// module, with getfenv, setfenv, load and setmetatable that cannot reach past it.
//
// The package keeps no state of its own: a state it makes, and the Isolation built on
// it, belong to the caller (a luabind shard) and are used under the caller's lock.
package sandbox
