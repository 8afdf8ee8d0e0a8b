package parity

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scripttest/fakeapi"
)

// The fake answers the table as the API server did when e2e's TestFakeAPIParity
// last recorded it (testdata/answers.json): what luaop test's handlers observe is
// held to the server's answers on every change, without a cluster.
func TestFakeAnswersAsTheRecordedServer(t *testing.T) {
	crds, err := fakeapi.ReadCRDs("gadgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fake, err := fakeapi.New(fakeapi.Options{CRDs: crds})
	if err != nil {
		t.Fatal(err)
	}
	const ns = "parity-offline"
	got := Run(t.Context(), func(manager string) luabind.Kube { return fake.As(manager) }, ns)
	data, err := os.ReadFile(filepath.Join("testdata", "answers.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want []Answer
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(Steps(ns)) {
		t.Fatalf("testdata/answers.json has %d answers for %d steps: record it again (e2e TestFakeAPIParity with LUAOP_UPDATE_PARITY=1)", len(want), len(Steps(ns)))
	}
	if d := Diff(want, got, canonicalShow(ns)); d != "" {
		t.Errorf("the fake answers otherwise than the recorded API server:\n%s", d)
	}
}

// canonicalShow shows an answer as the golden file holds it (the namespace NS,
// numbers as JSON decodes them).
func canonicalShow(ns string) func(Answer) string {
	show := Show(ns)
	return func(a Answer) string {
		var round Answer
		data, _ := json.Marshal(a)
		_ = json.Unmarshal(data, &round)
		return show(round)
	}
}
