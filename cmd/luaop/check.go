package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptcheck"
	"github.com/luaop/luaop/scriptsource"
)

func newCheckCommand() *cobra.Command {
	var format string
	var handlerTimeout time.Duration
	verbosity := 0
	cmd := &cobra.Command{
		Use:   "check DIR",
		Short: "Check the scripts of DIR without a cluster: load them as run does and report every problem with file:line",
		Long: `Load the Lua scripts of DIR exactly as "luaop run" does (the same sandbox, the same
option validation and duplicate-id checks) with no cluster, and analyse their source
for what would only fail at run time: options that do not apply to a handler's kind
(ignored by the operator), resource strings that do not parse, globals the sandbox
lacks (io, os.getenv, coroutine, ...), Lua 5.2+ syntax that Lua 5.1 rejects ('//',
bitwise operators, <const>).

Every problem is reported, not only the first: each handler script is also loaded on
its own, so that a runtime error in one does not hide those of the others. Problems
are printed as FILE:LINE: MESSAGE, one a line (--format json: one JSON document;
--format sarif: SARIF 2.1.0, for code scanning); the exit status is 3 when there is
any. --handler-timeout is the operator's: each file must compile, and the scripts
load, within it, as "luaop run" requires.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := scriptsFolder(dir); err != nil {
				return err
			}
			scripts, err := scriptsource.ReadDir(dir)
			if err != nil {
				return err
			}
			if handlerTimeout <= 0 {
				return usageError(fmt.Errorf("--handler-timeout must be greater than 0 (the operator's, 30s by default)"))
			}
			rep := scriptcheck.Check(cmd.Context(), scripts, luabind.Options{HandlerTimeout: handlerTimeout})
			out := cmd.OutOrStdout()
			switch format {
			case "json", "sarif":
				write := writeCheckJSON
				if format == "sarif" {
					write = writeCheckSARIF
				}
				if err := write(out, dir, rep); err != nil {
					return err
				}
				if n := len(rep.Problems); n > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "%d problem(s) in %s\n", n, dir)
					return silentError(exitProblems, fmt.Errorf("%d problem(s)", n))
				}
				return nil
			case "text":
			default:
				return usageError(fmt.Errorf("--format=%q: use text, json or sarif", format))
			}
			for _, p := range rep.Problems {
				fmt.Fprintln(out, p.String())
			}
			if n := len(rep.Problems); n > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d problem(s) in %s\n", n, dir)
				return silentError(exitProblems, fmt.Errorf("%d problem(s)", n))
			}
			if verbosity > 0 {
				for _, h := range rep.Handlers {
					fmt.Fprintln(out, h)
				}
			}
			fmt.Fprintf(out, "ok: %d file(s), %d handler(s)\n", rep.Files, len(rep.Handlers))
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "text", "output format: text, json or sarif")
	verboseFlag(cmd, &verbosity, "list the handlers found too")
	cmd.Flags().DurationVar(&handlerTimeout, "handler-timeout", 30*time.Second, "the operator's deadline of one Lua call, script loading and compiling included (as luaop run --handler-timeout)")
	return cmd
}
