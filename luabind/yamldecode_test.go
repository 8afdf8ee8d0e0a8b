package luabind

import (
	"reflect"
	"testing"
)

// luaop.yaml.decode reads YAML 1.2: `n:` and `NO` stay strings (YAML 1.1 made them
// booleans: `country: NO` was false), 014 is 14, a date a string.
func TestYAMLDecodeIsYAML12(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "y.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  local v, err = luaop.yaml.decode("n: 2\ncountry: NO\nswitch: on\nport: 014\nday: 2001-12-14\nok: true\n")
  if v == nil then error(err) end
  local keys = {}
  for k, x in pairs(v) do keys[#keys + 1] = k .. "=" .. type(x) .. ":" .. tostring(x) end
  table.sort(keys)
  return table.concat(keys, " ")
end, {id = "decode"})
`)
	res, _, err := invokeHandler(t, rt, "decode", createCause("u1"))
	if err != nil {
		t.Fatal(err)
	}
	want := "country=string:NO day=string:2001-12-14 n=number:2 ok=boolean:true port=number:14 switch=string:on"
	if !reflect.DeepEqual(res.Value, want) {
		t.Errorf("decoded %v, want %s", res.Value, want)
	}
}
