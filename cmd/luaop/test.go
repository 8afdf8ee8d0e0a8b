package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/scripttest"
)

func newTestCommand() *cobra.Command {
	var run, tests, prefix, format string
	verbosity := 0
	var handlerTimeout, defaultBackoff time.Duration
	cmd := &cobra.Command{
		Use:   "test DIR",
		Short: "Run the handler test cases of DIR/tests/*.yaml without a cluster",
		Long: `Run the test cases of DIR/tests/*.yaml (or --tests FOLDER) against the scripts of
DIR, without a cluster: each case runs one handler (or every change handler of a
cause) on an object, with luaop.kube answered by an in-memory fake API, and compares
the patch, the resulting object, status, the error, the Events and the luaop.kube
calls with what the case expects. Daemons run one iteration (until their first
luaop.sleep), timers one tick. The format is in README.md ("Test your handlers").

Prints FAIL and a diff for each failing case (ok for each passing one with -v) and
exits with status 4 when any fails. --format junit (JUnit XML) or json writes a
report on standard output for CI, the text going to standard error. A --run that
matches no case is an error (status 2), as is a test file that does not parse or
has a key the format does not know (with its file:line and the keys allowed).
The format's JSON Schema: luaop stubs --schema FILE.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if tests == "" {
				tests = filepath.Join(dir, "tests")
			}
			if format != "text" && format != "junit" && format != "json" {
				return usageError(fmt.Errorf("--format=%q: use text, junit or json", format))
			}
			files, err := scripttest.Files(tests)
			if err != nil {
				return err
			}
			if len(files) == 0 {
				return usageError(fmt.Errorf("no test files (*.yaml) in %s", tests))
			}
			if handlerTimeout <= 0 {
				return usageError(fmt.Errorf("--handler-timeout must be greater than 0"))
			}
			text := cmd.OutOrStdout()
			if format != "text" {
				text = cmd.ErrOrStderr()
			}
			if defaultBackoff <= 0 {
				return usageError(fmt.Errorf("--default-backoff must be greater than 0"))
			}
			opts := scripttest.Options{Scripts: dir, Tests: files, Out: text, Verbose: verbosity > 0, Prefix: prefix,
				HandlerTimeout: handlerTimeout, DefaultBackoff: defaultBackoff}
			if run != "" {
				if opts.Run, err = regexp.Compile(run); err != nil {
					return usageError(fmt.Errorf("--run: %w", err))
				}
			}
			if err := scriptsFolder(dir); err != nil {
				return err
			}
			started := time.Now()
			sum, err := scripttest.Run(cmd.Context(), opts)
			if errors.Is(err, scripttest.ErrNoCaseMatches) {
				return usageError(err)
			}
			var malformed scripttest.MalformedTestFileError
			if errors.As(err, &malformed) {
				// A report all the same, so that CI shows the file that does not load
				// instead of an empty (unparsable) report.
				sum = scripttest.Summary{Failed: 1, Cases: []scripttest.CaseResult{{File: malformed.File,
					Name: "the test file loads", Failures: []string{err.Error()}}}}
				if err := writeTestReport(cmd, format, sum, started); err != nil {
					return err
				}
				return usageError(err)
			}
			if err != nil {
				return err
			}
			if err := writeTestReport(cmd, format, sum, started); err != nil {
				return err
			}
			if sum.Failed > 0 {
				return silentError(exitTestsFailed, fmt.Errorf("%d case(s) failed", sum.Failed))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "run only the cases whose FILE/NAME matches this regular expression")
	cmd.Flags().StringVar(&tests, "tests", "", "folder of the test files (default: DIR/tests)")
	cmd.Flags().StringVar(&prefix, "prefix", scripttest.DefaultPrefix, "prefix of the operator's annotations, as given to luaop run --prefix (its annotations are not part of the handlers' view of the object)")
	verboseFlag(cmd, &verbosity, "print passing cases too")
	cmd.Flags().StringVar(&format, "format", "text", "report format: text, junit or json (junit and json on standard output, the text on standard error)")
	cmd.Flags().DurationVar(&defaultBackoff, "default-backoff", handling.DefaultBackoff, "the backoff after an arbitrary error, as given to luaop run --default-backoff (the verdict on an attempt looks ahead with it: a handler's timeout)")
	cmd.Flags().DurationVar(&handlerTimeout, "handler-timeout", scripttest.DefaultHandlerTimeout, "deadline of each handler call, script loading and compiling included (luaop run --handler-timeout)")
	return cmd
}

// writeTestReport writes the report of --format junit or json on standard output.
func writeTestReport(cmd *cobra.Command, format string, sum scripttest.Summary, started time.Time) error {
	switch format {
	case "junit":
		return writeTestJUnit(cmd.OutOrStdout(), sum, started)
	case "json":
		return writeTestJSON(cmd.OutOrStdout(), sum)
	}
	return nil
}
