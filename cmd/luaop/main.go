// Command luaop runs Kubernetes operators whose handlers are Lua scripts.
//
//	luaop dev ./handlers     the developer loop against the current cluster
//	luaop run /scripts       production: JSON logs, health endpoint
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	installKlog() // before any client: klog's logger cannot change under them
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
