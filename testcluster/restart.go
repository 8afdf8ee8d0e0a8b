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
	pid, args, err := runningComponent(dir, name)
	if err != nil {
		return 0, err
	}
	if err := killAndWaitGone(ctx, pid, name); err != nil {
		return 0, err
	}
	c, err := startComponent(dir, name, args)
	if err != nil {
		return 0, err
	}
	if name == "etcd" {
		// etcd first answers itself: kube-apiserver's /readyz may pass before it has
		// noticed that etcd went away.
		if err := c.waitEtcdHealthy(ctx); err != nil {
			return 0, err
		}
	}
	if err := c.waitAPIServerReady(ctx, kube); err != nil {
		return 0, err
	}
	return time.Since(c.started), nil
}

// runningComponent reads the pid up.sh wrote for name in dir and the command line
// that process runs.
func runningComponent(dir, name string) (pid int, args []string, err error) {
	pidFile := filepath.Join(dir, name+".pid")
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, nil, err
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", pidFile, err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, nil, fmt.Errorf("reading %s's command line: %w", name, err)
	}
	args = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if filepath.Base(args[0]) != name {
		return 0, nil, fmt.Errorf("pid %d runs %s, not %s", pid, args[0], name)
	}
	return pid, args, nil
}

// killAndWaitGone kills pid with SIGKILL and waits until its ports are free.
func killAndWaitGone(ctx context.Context, pid int, name string) error {
	proc, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if err := proc.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s: %w", name, err)
	}
	// Its ports are free once every thread is gone: the main thread turns zombie
	// (nobody may reap it here) while the others still exit and hold the sockets.
	return poll(ctx, 30*time.Second, func() (bool, string) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true, ""
		}
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		return strings.Contains(string(stat), ") Z ") && (err != nil || len(tasks) <= 1),
			fmt.Sprintf("waiting for %s to exit (%d threads left)", name, len(tasks))
	})
}

// restarted is a component started again by RestartComponent.
type restarted struct {
	name, logPath string
	args          []string
	started       time.Time
	exited        chan error // Wait's result, put back by alive once read
}

// startComponent starts name again with args in dir, appending to its log, and
// writes its pid file.
func startComponent(dir, name string, args []string) (*restarted, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }() // the child has its own descriptor
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s again: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		return nil, err
	}
	c := &restarted{name: name, logPath: logPath, args: args, started: time.Now(), exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait() }()
	return c, nil
}

// logTail is the end of the component's log.
func (c *restarted) logTail() string {
	data, _ := os.ReadFile(c.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// alive is an error, with the end of the log, once the process has exited.
func (c *restarted) alive() error {
	select {
	case err := <-c.exited:
		c.exited <- err
		return fmt.Errorf("%s exited after its restart (%v); the end of its log:\n%s", c.name, err, c.logTail())
	default:
		return nil
	}
}

// pollAlive polls cond until it holds, failing at once if the process exits.
func (c *restarted) pollAlive(ctx context.Context, timeout time.Duration, cond func() (bool, string)) error {
	var failed error
	if err := poll(ctx, timeout, func() (bool, string) {
		if failed = c.alive(); failed != nil {
			return true, ""
		}
		return cond()
	}); err != nil {
		return err
	}
	return failed
}

// waitEtcdHealthy waits until the restarted etcd answers healthy at its first
// client URL.
func (c *restarted) waitEtcdHealthy(ctx context.Context) error {
	var health string
	for i, a := range c.args {
		if a == "--listen-client-urls" && i+1 < len(c.args) {
			health = strings.Split(c.args[i+1], ",")[0] + "/health"
		}
	}
	if health == "" {
		return fmt.Errorf("etcd's command line has no --listen-client-urls: %q", c.args)
	}
	return c.pollAlive(ctx, 60*time.Second, func() (bool, string) {
		resp, err := http.Get(health)
		if err != nil {
			return false, fmt.Sprintf("waiting for the restarted etcd to answer at %s: %v", health, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`),
			fmt.Sprintf("waiting for the restarted etcd to be healthy at %s: %d %s", health, resp.StatusCode, body)
	})
}

// waitAPIServerReady waits until kube-apiserver's /readyz passes.
func (c *restarted) waitAPIServerReady(ctx context.Context, kube kubernetes.Interface) error {
	// kube-apiserver's etcd client reconnects with a growing backoff: after an etcd
	// outage of 15-30 s it took up to 10 s more (measured by hand), hence the margin.
	return c.pollAlive(ctx, 120*time.Second, func() (bool, string) {
		body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").Param("verbose", "1").DoRaw(ctx)
		return err == nil, fmt.Sprintf("waiting for kube-apiserver to be ready again after restarting %s: %v\n%s", c.name, err, body)
	})
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
