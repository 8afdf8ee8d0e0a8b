package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// The thinnest complete path: a create handler's return value lands in the object's
// status, and its log lines carry the object's namespace and name.
func TestCreateHandlerResultLandsInStatus(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.logger.info("creating widget of size", ctx.spec.size)
			return { message = "hello " .. ctx.name, doubled = ctx.spec.size * 2 }
		end, { id = "hello" })
	`)})
	create(t, widgets, ns, `
apiVersion: examples.luaop.dev/v1
kind: Widget
metadata: {name: w1}
spec: {size: 21}
`)
	obj := waitField(t, widgets, ns, "w1", "status.hello.message", "hello w1")
	if got := obj.Object["status"].(map[string]any)["hello"].(map[string]any)["doubled"]; got != int64(42) {
		t.Errorf("status.hello.doubled = %#v, want the integer 42", got)
	}
	logs := op.Log.String()
	if !strings.Contains(logs, "creating widget of size 21") || !strings.Contains(logs, "namespace="+ns+" name=w1") {
		t.Errorf("the handler's log line with the object's namespace and name is missing from the operator log:\n%s", logs)
	}
}

// The shipped example handles the shipped example object.
func TestExampleWidgetIsGreeted(t *testing.T) {
	ns := env.Namespace(t)
	root := testcluster.RepoRoot()
	startWith(t, ns, operator.Options{ScriptsDir: filepath.Join(root, "scripts", "examples")})
	objs, err := testcluster.ReadYAML(filepath.Join(root, "scripts", "examples", "objects", "widget.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	create(t, widgets, ns, toJSON(objs[0].Object))
	waitField(t, widgets, ns, objs[0].GetName(), "status.greet.message", "hello from Lua")
}
