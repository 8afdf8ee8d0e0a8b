// Command luaop runs Kubernetes operators whose handlers are Lua scripts.
//
//	luaop dev ./handlers     the developer loop against the current cluster
//	luaop run /scripts       production: JSON logs, health endpoint
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		var quiet silentError
		if !errors.As(err, &quiet) {
			fmt.Fprintln(os.Stderr, "luaop:", err)
		}
		os.Exit(1)
	}
}

// silentError is an error already shown to the user.
type silentError struct{ error }
