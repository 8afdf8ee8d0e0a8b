package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/luaop/luaop/leader"
	"github.com/luaop/luaop/sharding"
)

// Exit statuses of luaop, documented in `luaop --help` and README.md ("Exit
// statuses"), so that CI and scripts can tell what went wrong.
const (
	exitOK = 0
	// exitError: the command failed (an API error, a file that cannot be read, ...).
	exitError = 1
	// exitUsage: the command line or the settings are wrong (an unknown flag, a
	// missing argument, an invalid value, an unknown config key): nothing was done.
	exitUsage = 2
	// exitProblems: luaop check found problems in the scripts (or run and dev
	// could not load them at start).
	exitProblems = 3
	// exitTestsFailed: luaop test ran, and cases failed.
	exitTestsFailed = 4
	// exitUnreachable: no usable kubeconfig, or the API server does not answer.
	exitUnreachable = 5
	// exitStandingLost: luaop run stopped by design because this replica lost its
	// standing: its leader election Lease (--leader-elect) or its shard membership
	// Lease (--shard-across-replicas) could not be renewed in time, so its work went
	// to the others. Not a crash: the replica is meant to be started again (its
	// Deployment does), and a supervisor or an alert can tell the two apart.
	exitStandingLost = 6
)

const exitCodesHelp = `Exit statuses: 0 success; 1 the command failed; 2 a usage error (flags, arguments,
settings: nothing was done); 3 luaop check found problems; 4 luaop test had failing
cases; 5 no usable kubeconfig or the cluster cannot be reached; 6 luaop run lost its
leader election or shard membership (its work went to the other replicas; start it again).`

// exitError is an error that ends luaop with a status of its own.
type exitCodeError struct {
	code int
	err  error
	// shown: the error was already printed (a summary line of check or test).
	shown bool
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }

// usageError marks an error of the command line or the settings.
func usageError(err error) error {
	if err == nil {
		return nil
	}
	return exitCodeError{code: exitUsage, err: err}
}

// unreachableError marks a cluster that cannot be reached or configured.
func unreachableError(err error) error {
	if err == nil {
		return nil
	}
	return exitCodeError{code: exitUnreachable, err: err}
}

// silentError is an error already shown to the user (a summary of check or test),
// with the exit status it ends luaop with.
func silentError(code int, err error) error { return exitCodeError{code: code, err: err, shown: true} }

// usageArgs wraps a cobra argument validator so that its errors are usage errors.
func usageArgs(args cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error { return usageError(args(cmd, a)) }
}

// exitCode is the exit status of an error returned by a command.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var e exitCodeError
	if errors.As(err, &e) {
		return e.code
	}
	if errors.Is(err, sharding.ErrMembershipLost) || errors.Is(err, leader.ErrLeadershipLost) {
		return exitStandingLost
	}
	// cobra's own: an unknown command or a flag of the root.
	if msg := err.Error(); strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown flag") ||
		strings.HasPrefix(msg, "unknown shorthand flag") || strings.Contains(msg, "flag needs an argument") {
		return exitUsage
	}
	return exitError
}

// shown tells whether err was already printed.
func shown(err error) bool {
	var e exitCodeError
	return errors.As(err, &e) && e.shown
}

// verbosityArg is "-v N" or "--verbose N" as kubectl takes it: a number after -v.
var verbosityArg = regexp.MustCompile(`^\d+$`)

// normalizeArgs joins kubectl's "-v N" into "-v=N": -v given alone is kopf's
// --verbose (debug), so pflag would not take the number after it as its value. A
// scripts folder named with digits only is written ./6.
func normalizeArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if (a == "-v" || a == "--verbose") && i+1 < len(args) && verbosityArg.MatchString(args[i+1]) {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// execute runs luaop with the arguments and returns its exit status.
func execute(ctx context.Context, args []string) int {
	return executeWith(ctx, newRootCommand(), args, os.Stderr)
}

func executeWith(ctx context.Context, root *cobra.Command, args []string, stderr io.Writer) int {
	root.SetArgs(normalizeArgs(args))
	err := root.ExecuteContext(ctx)
	if err != nil && !shown(err) {
		fmt.Fprintln(stderr, "luaop:", err)
		if exitCode(err) == exitUsage {
			fmt.Fprintln(stderr, "run 'luaop --help' or 'luaop COMMAND --help' for the usage")
		}
	}
	return exitCode(err)
}

// scriptsFolder is the usage error of a DIR argument that is not a folder: every
// command taking the scripts' folder says it the same way, with the same status.
func scriptsFolder(dir string) error {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return usageError(fmt.Errorf("%s is not a folder of Lua scripts", dir))
	}
	return nil
}
