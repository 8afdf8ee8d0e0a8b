package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scripttest"
)

// releaseVersion is the newest release (CHANGELOG.md's newest heading; a test keeps
// them equal): what luaop init pins the remote base and the image of the overlay
// it writes to.
const releaseVersion = "v0.1.0"

// The files luaop init writes, relative to its folder.
const (
	initHandler = `-- A handler of ConfigMaps labelled hello.luaop.dev/greet=yes: it counts their keys
-- into the annotation hello.luaop.dev/keys and logs a greeting. It returns nothing:
-- a handler's result goes to status.<id>, and a ConfigMap has no status (the API
-- server would drop it; luaop test and luaop check say so). Written defensively, as
-- handlers must be: an object may lack any field it does not require (data, labels).
local luaop = require("luaop")
local greeting = require("lib.greeting")

luaop.on.create("v1/configmaps", function(ctx)
  local data = ctx.body.data or {}
  local keys = 0
  for _ in pairs(data) do keys = keys + 1 end
  ctx.logger.info(greeting.hello(ctx.name), {keys = keys})
  ctx.patch.metadata.annotations["hello.luaop.dev/keys"] = tostring(keys)
end, { id = "greet", labels = { ["hello.luaop.dev/greet"] = "yes" } })
`
	initModule = `-- A module: loaded by require("lib.greeting"), not run as a handler script (files of
-- sub-folders are modules). In the ConfigMap it is the key lib__greeting.lua.
local M = {}

function M.hello(name)
  return "hello, " .. (name or "stranger")
end

return M
`
	initTests = `cases:
- name: counts the keys of a labelled ConfigMap
  handler: greet
  object:
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: demo, namespace: default, labels: {hello.luaop.dev/greet: "yes"}}
    data: {a: "1", b: "2"}
  expect:
    patch: {metadata: {annotations: {hello.luaop.dev/keys: "2"}}}
    result: null
- name: a ConfigMap without data has no keys
  handler: greet
  object:
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: empty, namespace: default, labels: {hello.luaop.dev/greet: "yes"}}
  expect:
    object: {metadata: {annotations: {hello.luaop.dev/keys: "0"}}}
- name: an unlabelled ConfigMap is not handled
  handler: greet
  object:
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: other, namespace: default}
  expect:
    skipped: true
`
	initKustomization = `# luaop with the scripts of scripts/, on the base of luaop %[1]s.
#   luaop check scripts && luaop test scripts     # offline, in CI
#   luaop rbac --leader-elect --scripts-configmap luaop-scripts scripts > rbac.yaml   # after changing the scripts
#   kubectl apply -k .
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization

namespace: luaop-system

resources:
- https://github.com/luaop/luaop//deploy/base?ref=%[1]s
- rbac.yaml

# The scripts, one key per file (a module of a sub-folder as KEY=FILE, its folders
# joined by "__"), mounted as the folder /scripts. A stable name: kubectl apply -k
# updates the ConfigMap in place, and luaop reloads the scripts without a restart.
configMapGenerator:
- name: luaop-scripts
  options:
    disableNameSuffixHash: true
  files:
  - scripts/hello.lua
  - lib__greeting.lua=scripts/lib/greeting.lua

images:
- name: luaop
  newName: luaop
  newTag: %[1]s
`
	initReadme = `# luaop scripts

- scripts/: the handlers (hello.lua) and a module (lib/greeting.lua)
- scripts/tests/: the test cases of luaop test (YAML 1.2; the JSON Schema next to them
  makes yaml-language-server complete and check them)
- kustomization.yaml, rbac.yaml: the deployment (kubectl apply -k .)
- .luaop/luaop.lua: the Lua Language Server definitions; scripts/.luarc.json points
  the editor at them (Lua 5.1, the sandbox's libraries)

    luaop check scripts          # every problem as file:line (exit 3)
    luaop test scripts           # the cases of scripts/tests (exit 4 on failures)
    luaop dev scripts            # against the current cluster
`
)

func newInitCommand() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Scaffold a scripts folder with tests, editor support and a deploy overlay",
		Long: `Write into DIR (created if missing; existing files are not overwritten unless
--force) a handler script and a module, their test cases with the JSON Schema of the
test files, the Lua Language Server definitions and .luarc.json, a .luacheckrc, and a
kustomize overlay on the base of luaop ` + releaseVersion + ` with the RBAC the scripts need.
As written, luaop check DIR/scripts and luaop test DIR/scripts pass.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			files := map[string]string{
				"scripts/hello.lua":                    initHandler,
				"scripts/lib/greeting.lua":             initModule,
				"scripts/tests/hello.yaml":             scripttest.SchemaModeline("luaop-test.schema.json") + initTests,
				"scripts/tests/luaop-test.schema.json": scripttest.Schema(),
				"scripts/.luarc.json":                  luabind.Luarc("../.luaop"),
				"scripts/.luacheckrc":                  luabind.Luacheckrc(),
				".luaop/luaop.lua":                     luabind.StubsWithSandbox(),
				"kustomization.yaml":                   fmt.Sprintf(initKustomization, releaseVersion),
				"README.md":                            initReadme,
			}
			if !force {
				var exist []string
				for name := range files {
					if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
						exist = append(exist, name)
					}
				}
				if _, err := os.Stat(filepath.Join(dir, "rbac.yaml")); err == nil {
					exist = append(exist, "rbac.yaml")
				}
				if len(exist) > 0 {
					return usageError(fmt.Errorf("%s already has %s: give another folder, or --force to overwrite", dir, strings.Join(exist, ", ")))
				}
			}
			for name, content := range files {
				if err := writeFileMkdir(filepath.Join(dir, name), content); err != nil {
					return err
				}
			}
			// luaop rbac's defaults (luaop run's: secure metrics, peering), with what
			// deploy/base sets: leader election and the scripts ConfigMap.
			o := defaultRBACOptions()
			o.LeaderElect, o.ScriptsConfigMap, o.ScriptsFromAPI = true, "luaop-scripts", true
			o.command = rbacCommandLine("scripts", o)
			rbac, _, err := generateRBAC(cmd, filepath.Join(dir, "scripts"), o)
			if err != nil {
				return errors.Join(errors.New("the scaffold's scripts do not load (please report it)"), err)
			}
			rbac = strings.Replace(rbac, filepath.Join(dir, "scripts"), "scripts", 1)
			if err := writeFileMkdir(filepath.Join(dir, "rbac.yaml"), rbac); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: scripts/ (a handler, a module, tests/), kustomization.yaml and rbac.yaml (luaop %s), editor support\nnext: luaop check %s && luaop test %s\n",
				dir, releaseVersion, filepath.Join(dir, "scripts"), filepath.Join(dir, "scripts"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "overwrite files that exist")
	return cmd
}
