package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

func newRootCommand() *cobra.Command {
	v := viper.New()
	root := &cobra.Command{
		Use:   "luaop",
		Short: "Kubernetes operators with handlers written in Lua",
		Long: `luaop runs Kubernetes operators whose handlers are Lua scripts, with kopf's semantics:
create/update/delete/resume and field handlers, progress persisted on the objects,
retries, finalizers, daemons and timers, and scripts reloaded while it runs.

Every flag can also be set as a LUAOP_* environment variable (--log-format ->
LUAOP_LOG_FORMAT; lists comma-separated: LUAOP_NAMESPACES=a,b) or as a key of the
config file given with --config or LUAOP_CONFIG (run, dev and release). Unknown keys
and invalid values are refused with the accepted ones.

` + exitCodesHelp,
		Version:       luaopVersion(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// Declared here so that cobra's own --version has no -v shorthand: -v is
	// --verbose in the subcommands, as in kopf.
	root.Flags().Bool("version", false, "print the version of luaop")
	// No SetVersionTemplate: executing a text/template makes every exported method of
	// every type the linker sees reachable (reflect's MethodByName), which linked all of
	// client-go's typed clients: 29 MB more binary and 17 MiB more RSS at start. Cobra's
	// default prints "luaop version <v>" without a template.
	root.AddCommand(newDevCommand(v), newRunCommand(v), newStubsCommand(), newVersionCommand(),
		newCheckCommand(), newRBACCommand(), newTestCommand(), newReleaseCommand(v), newWebhooksCommand(), newStatusCommand(),
		newInitCommand())
	// --config only where a config file means something: the commands that read
	// the operator's settings. Elsewhere it is refused, not ignored.
	for _, c := range root.Commands() {
		switch c.Name() {
		case "dev", "run", "release":
			addConfigFlag(c.Flags())
		}
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if strings.Contains(err.Error(), "unknown flag: --config") {
			return usageError(fmt.Errorf("luaop %s reads no config file: --config is a flag of luaop run, dev and release only", cmd.Name()))
		}
		return usageError(err)
	})
	addCompletions(root)
	setExamples(root)
	return root
}

// addConfigFlag declares --config on a command that reads the operator's settings.
func addConfigFlag(fs *pflag.FlagSet) {
	fs.String("config", "", "config file (YAML, JSON or TOML) with the same keys as the flags (also LUAOP_CONFIG); a file that does not exist is an error")
}
