// Command pause is the pod sandbox of the local node (localcluster/node-up.sh): the
// first process of every pod, holding its namespaces. Like Kubernetes' pause image it
// waits for SIGTERM or SIGINT and, being PID 1 of pods that share their process
// namespace, reaps the children it adopts. Static, built by cmd/luaop-image pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
