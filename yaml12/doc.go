// Package yaml12 reads YAML with the YAML 1.2 core schema (the spec's section
// 10.3), for what users write by hand: the test cases of luaop test and
// luaop.yaml.decode in scripts. Parsing is yaml.v3's (go.yaml.in/yaml/v3); the
// resolution of plain scalars is the 1.2 core schema's, not YAML 1.1's that
// sigs.k8s.io/yaml (yaml.v2) and, for some forms, yaml.v3 apply: `n:`, `y:`,
// `NO`, `on` and `off` stay strings (1.1 made them booleans, so `country: NO` was
// false), `014` is 14 and `0o14` 12, `1_000` and `0b101` are strings, a date is a
// string. Values are the JSON ones: map[string]any, []any, string, int64, float64,
// bool and nil; every node keeps its line for error messages.
//
// It imports no luaop package and must stay a leaf (scripttest and luabind's
// luaop.yaml.decode call it).
package yaml12
