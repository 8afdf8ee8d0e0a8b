package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// commandExamples are the Examples of every command's --help, by command path
// ("webhooks remove"): one place, so that a test runs those that need no cluster as
// written (TestHelpExamplesRun), in a folder where scripts/ holds the examples.
var commandExamples = map[string]string{
	"check": `  luaop check scripts/                          # every problem as FILE:LINE: MESSAGE; exit 3 if any
  luaop check --format sarif scripts/ > luaop-check.sarif   # for code scanning`,
	"test": `  luaop test scripts/                           # the cases of scripts/tests/*.yaml; exit 4 if one fails
  luaop test -v --run 'widgets.yaml/.*' scripts/
  luaop test --format junit scripts/ > luaop-test.xml`,
	"rbac": `  luaop rbac scripts/ > rbac.yaml               # the least-privilege Role of the scripts
  luaop rbac --leader-elect --scripts-configmap luaop-scripts scripts/`,
	"init": `  luaop init my-operator                        # scripts/, tests/, editor support and a deploy overlay`,
	"stubs": `  luaop stubs -o luaop-stubs/luaop.lua --luarc .luarc.json
  luaop stubs --schema luaop-test.schema.json`,
	"version": `  luaop version`,
	"dev": `  luaop dev scripts/                            # on the cluster of the current kubeconfig context
  luaop dev --apply scripts/crds --apply scripts/objects -n demo scripts/`,
	"run": `  luaop run --leader-elect scripts/
  luaop run --namespaces team-a,team-b --log-format json scripts/`,
	"status": `  luaop status                                  # the operator serving on localhost:8080
  kubectl -n luaop-system port-forward deploy/luaop 8080 & luaop status`,
	"webhooks remove": `  luaop webhooks remove --prefix luaop.dev      # after uninstalling an operator with admission handlers`,
}

// setExamples gives every command without an Example of its own its entry of
// commandExamples.
func setExamples(cmd *cobra.Command) {
	path := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	if ex, ok := commandExamples[path]; ok && cmd.Example == "" {
		cmd.Example = ex
	}
	for _, c := range cmd.Commands() {
		setExamples(c)
	}
}
