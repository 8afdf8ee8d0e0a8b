package scriptcheck

// Rule is a kind of problem luaop check finds: each problem names its rule, which
// a SARIF report lists (one rule id per check, for code scanning to group and
// filter by) with the level the problem deserves.
type Rule struct {
	ID string
	// Level is SARIF's: "error" for what fails at load or run time, "warning" for
	// what the operator ignores (the script runs, not as written).
	Level       string
	Description string
}

// The rules, by id.
const (
	RuleLoad            = "load"
	RuleSandbox         = "sandbox"
	RuleSeparateGlobals = "separate-globals"
	RuleResource        = "resource"
	RuleUnknownOption   = "unknown-option"
	RuleIgnoredOption   = "ignored-option"
	RuleDuplicateID     = "duplicate-id"
	RuleNoScripts       = "no-scripts"
)

// Rules are every rule of luaop check, in the order its documentation lists them.
var Rules = []Rule{
	{RuleLoad, "error", "The scripts do not load as luaop run loads them: a syntax error (Lua 5.2+ syntax included), an error raised while loading, a registration luaop refuses."},
	{RuleSandbox, "error", "A global or a field luaop's sandbox lacks (io, os.getenv, coroutine, ...): the script fails when it reaches it."},
	{RuleSeparateGlobals, "error", "A global another script sets: each script has its own globals, so it is nil here."},
	{RuleResource, "error", "A resource string that does not parse."},
	{RuleUnknownOption, "error", "A handler option that no handler kind has."},
	{RuleIgnoredOption, "warning", "A handler option that does not apply to the handler's kind: the operator ignores it."},
	{RuleDuplicateID, "error", "Two handlers of one resource with one id."},
	{RuleNoScripts, "error", "The folder has no *.lua file."},
}

// RuleOf is the rule of an id (RuleLoad's for an unknown one).
func RuleOf(id string) Rule {
	for _, r := range Rules {
		if r.ID == id {
			return r
		}
	}
	return Rules[0]
}
