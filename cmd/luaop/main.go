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
