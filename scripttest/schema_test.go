package scripttest

import (
	"encoding/json"
	"slices"
	"sort"
	"testing"
)

// The schema describes exactly the keys the format reads: no key it lacks (an
// editor would flag a valid file) and none it has more (an editor would accept a
// key luaop test refuses).
func TestSchemaMatchesTheFormat(t *testing.T) {
	var doc struct {
		Properties  map[string]json.RawMessage `json:"properties"`
		Definitions map[string]struct {
			Properties           map[string]json.RawMessage `json:"properties"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
		} `json:"definitions"`
	}
	if err := json.Unmarshal([]byte(Schema()), &doc); err != nil {
		t.Fatalf("the schema is not JSON: %v", err)
	}
	keys := func(m map[string]json.RawMessage) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	if got := keys(doc.Properties); !slices.Equal(got, fileKeys) {
		t.Errorf("file keys: schema %v, format %v", got, fileKeys)
	}
	for def, want := range map[string][]string{"case": caseKeys, "expect": expectKeys, "error": errorKeys, "related": relatedKeys} {
		d := doc.Definitions[def]
		if got := keys(d.Properties); !slices.Equal(got, want) {
			t.Errorf("%s keys: schema %v, format %v", def, got, want)
		}
		if d.AdditionalProperties == nil || *d.AdditionalProperties {
			t.Errorf("%s: additionalProperties must be false (luaop test refuses unknown keys)", def)
		}
	}
}
