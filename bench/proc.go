package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat: 100 on every
// Linux configuration Go supports without cgo.
const clockTicks = 100

// child is one process started by the benchmark: in its own process group (a
// terminal's Ctrl-C reaches the benchmark only, which stops children in order), and
// killed by the kernel if the benchmark dies first (Pdeathsig).
type child struct {
	name   string
	cmd    *exec.Cmd
	stderr string // path of the captured stderr
	stdout *lineWaiter
	exited chan struct{}
	err    error        // Wait's result, after exited is closed
	hwm    atomic.Int64 // VmHWM, sampled every 20 ms while it runs
}

var (
	childrenMu sync.Mutex
	children   = map[*child]bool{}
)

func startChild(name, stderrPath string, argv ...string) (*child, error) {
	errf, err := os.Create(stderrPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	// LUAOP_BENCH_CHILD_ENV="K=V K2=V2" reaches the contestants only, not the
	// benchmark's own clients: e.g. "KUBE_FEATURE_ClientsAllowCBOR=true
	// KUBE_FEATURE_ClientsPreferCBOR=true" (client-go's gates: answers, then requests, in CBOR).
	cmd.Env = append(os.Environ(), strings.Fields(os.Getenv("LUAOP_BENCH_CHILD_ENV"))...)
	cmd.Stderr = errf
	lw := &lineWaiter{}
	cmd.Stdout = lw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		errf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, stderr: stderrPath, stdout: lw, exited: make(chan struct{})}
	childrenMu.Lock()
	children[c] = true
	childrenMu.Unlock()
	go func() {
		// VmHWM only grows: its last reading before the exit is the peak. (The
		// kernel's ru_maxrss of a child cannot serve: it includes the RSS of the
		// benchmark's own address space, which the child shared until exec.)
		for {
			select {
			case <-c.exited:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if hwm, _, err := procStats(c.pid()); err == nil && hwm > c.hwm.Load() {
				c.hwm.Store(hwm)
			}
		}
	}()
	go func() {
		c.err = cmd.Wait()
		errf.Close()
		childrenMu.Lock()
		delete(children, c)
		childrenMu.Unlock()
		close(c.exited)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits; after grace it kills.
func (c *child) stop(grace time.Duration) error {
	if !c.running() {
		return c.err
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		return c.err
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", c.name, grace)
	}
}

// killAllChildren is the last resort of every exit path.
func killAllChildren() {
	childrenMu.Lock()
	list := make([]*child, 0, len(children))
	for c := range children {
		list = append(list, c)
	}
	childrenMu.Unlock()
	for _, c := range list {
		_ = c.stop(5 * time.Second)
	}
}

// usage is what the benchmark knows of an exited child: its peak RSS (the last
// VmHWM sampled) and its CPU time (rusage).
func (c *child) usage() (peakRSS int64, cpu time.Duration) {
	if c.running() || c.cmd.ProcessState == nil {
		return 0, 0
	}
	if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return c.hwm.Load(), cpu
}

// procStats reads VmHWM (peak RSS) and VmRSS in bytes from /proc/<pid>/status.
func procStats(pid int) (hwm, rss int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = kb * 1024
		case "VmRSS:":
			rss = kb * 1024
		}
	}
	return hwm, rss, nil
}

// procCPU is utime+stime of a running process, from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces: fields are counted after ')'.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// countLines counts the lines of a file that contain substr.
func countLines(path, substr string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			n++
		}
	}
	return n
}

// lineWaiter collects a child's stdout and tells when a given line appeared.
type lineWaiter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *lineWaiter) has(line string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Split(w.buf.String(), "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}
