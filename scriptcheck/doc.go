// Package scriptcheck is `luaop check`: it reports, with file:line, what the operator
// would refuse when it loads the scripts and what would only fail (or be silently
// ignored) at run time, without a cluster.
//
// It owns:
//   - the static analysis (Analyze): Lua 5.2+ syntax that Lua 5.1 rejects, globals
//     the sandbox lacks or that another file defines, registrations whose options
//     do not apply to their kind or whose resource does not parse, duplicate
//     literal handler ids, and the luaop.kube calls with the apiVersion and kind they
//     resolve to (`luaop rbac` grants those). Which functions register handlers,
//     where their options are, which reach the cluster and which return their object
//     it reads from scriptapi's table; the rule of which option applies to which
//     kind (optionApplies) is its own;
//   - the offline loads (Check, CheckLoad): the scripts loaded in a throwaway
//     luabind.Runtime with one shard, no log and a Kube that answers every call with
//     an error value, under the operator's deadline and limits; a failed load is
//     loaded again file by file, so that one error does not hide the others.
//
// It parses through luabind.ParseScript, so it reads exactly the tree the operator
// compiles. It must not change a running operator: it never touches a Runtime but
// its own throwaway ones, and calls no cluster. cmd/luaop (check, rbac, the scripts
// guard) calls it; luabind must not import it.
package scriptcheck
