package testcluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
)

// RestartComponent kills a process of a control plane that localcluster/up.sh
// started in dir (etcd or kube-apiserver: SIGKILL, a crash, no graceful shutdown of
// open watches), starts it again with the same command line (same ports, same data;
// its log appended to <dir>/<name>.log, its pid in <dir>/<name>.pid for down.sh), and
// waits until it answers (etcd's /health) and kube-apiserver is ready again (through
// kube, bounded by ctx). A restarted process that exits is an error with the end of
// its log. It returns how long kube-apiserver took to be ready after the new process
// started.
func RestartComponent(ctx context.Context, dir, name string, kube kubernetes.Interface) (time.Duration, error) {
	pidFile := filepath.Join(dir, name+".pid")
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", pidFile, err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, fmt.Errorf("reading %s's command line: %w", name, err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if filepath.Base(args[0]) != name {
		return 0, fmt.Errorf("pid %d runs %s, not %s", pid, args[0], name)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return 0, err
	}
	if err := proc.Signal(syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("killing %s: %w", name, err)
	}
	// Its ports are free once every thread is gone: the main thread turns zombie
	// (nobody may reap it here) while the others still exit and hold the sockets.
	if err := poll(ctx, 30*time.Second, func() (bool, string) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true, ""
		}
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		return strings.Contains(string(stat), ") Z ") && (err != nil || len(tasks) <= 1),
			fmt.Sprintf("waiting for %s to exit (%d threads left)", name, len(tasks))
	}); err != nil {
		return 0, err
	}
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s again: %w", name, err)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		return 0, err
	}
	started := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	logTail := func() string {
		data, _ := os.ReadFile(logPath)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		return string(data)
	}
	alive := func() error {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("%s exited after its restart (%v); the end of its log:\n%s", name, err, logTail())
		default:
			return nil
		}
	}
	if name == "etcd" {
		// etcd first answers itself: kube-apiserver's /readyz may pass before it has
		// noticed that etcd went away.
		var health string
		for i, a := range args {
			if a == "--listen-client-urls" && i+1 < len(args) {
				health = strings.Split(args[i+1], ",")[0] + "/health"
			}
		}
		if health == "" {
			return 0, fmt.Errorf("etcd's command line has no --listen-client-urls: %q", args)
		}
		var failed error
		if err := poll(ctx, 60*time.Second, func() (bool, string) {
			if failed = alive(); failed != nil {
				return true, ""
			}
			resp, err := http.Get(health)
			if err != nil {
				return false, fmt.Sprintf("waiting for the restarted etcd to answer at %s: %v", health, err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`),
				fmt.Sprintf("waiting for the restarted etcd to be healthy at %s: %d %s", health, resp.StatusCode, body)
		}); err != nil {
			return 0, err
		}
		if failed != nil {
			return 0, failed
		}
	}
	// kube-apiserver's etcd client reconnects with a growing backoff: after an etcd
	// outage of 15-30 s it took up to 10 s more (measured by hand), hence the margin.
	var failed error
	if err := poll(ctx, 120*time.Second, func() (bool, string) {
		if failed = alive(); failed != nil {
			return true, ""
		}
		body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").Param("verbose", "1").DoRaw(ctx)
		return err == nil, fmt.Sprintf("waiting for kube-apiserver to be ready again after restarting %s: %v\n%s", name, err, body)
	}); err != nil {
		return 0, err
	}
	if failed != nil {
		return 0, failed
	}
	return time.Since(started), nil
}

// poll checks cond every 50 ms until it holds, ctx ends or timeout passes (an error
// with cond's last message).
func poll(ctx context.Context, timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %s", timeout, msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), msg)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
