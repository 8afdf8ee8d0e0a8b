package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/luaop/luaop/testcluster"
)

// luaopProcess is one luaop process (run or dev) a test starts on a scripts folder
// of one file: its log kept, killed when the test ends.
type luaopProcess struct {
	cmd    *exec.Cmd
	log    *testcluster.LogBuffer
	exited chan struct{}
}

// startLuaopProcess runs bin with args and a fresh folder holding the script
// (name, source). When the test failed, the log is shown under title: its last
// tail lines, or all of it with tail 0.
func startLuaopProcess(t *testing.T, bin string, args []string, name, source, title string, tail int) *luaopProcess {
	t.Helper()
	dir := scriptFolder(t, name, source)
	p, err := launchLuaop(bin, append(args, dir), &testcluster.LogBuffer{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		showLogIfFailed(t, p.log, title, tail)
		p.signal(syscall.SIGKILL)
	})
	return p
}

func scriptFolder(t *testing.T, name, source string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(source), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// launchLuaop starts bin with args, its output appended to log. It does not touch
// the test: a supervisor starts processes again from its own goroutine.
func launchLuaop(bin string, args []string, log *testcluster.LogBuffer) (*luaopProcess, error) {
	p := &luaopProcess{log: log, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "NO_COLOR=1")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	return p, nil
}

func showLogIfFailed(t *testing.T, log *testcluster.LogBuffer, title string, tail int) {
	if !t.Failed() {
		return
	}
	text := log.String()
	if tail > 0 {
		text = lastLines(text, tail)
	}
	t.Logf("the log of %s:\n%s", title, text)
}

func (p *luaopProcess) signal(sig syscall.Signal) {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(sig)
		<-p.exited
	}
}

// restartBackoff is how long a supervised process stays down before it is
// started again (a kubelet's first back-off is 10 s; shorter here, the test
// waits for it).
const restartBackoff = time.Second

// maxRestarts is how many restarts a supervised process gets: a replica that
// loses its membership on every start (its own renewals stuck, not the API
// server's stall) must fail the test, not loop until an unrelated wait fails.
const maxRestarts = 3

// supervisedProcess is a luaop process started again, with the same arguments,
// when it exits by itself for a reason restartable accepts: what a Deployment's
// restartPolicy Always does for a replica that exits by design (a lost Lease).
// Any other exit of its own fails the test (a crash). A process stopped on
// purpose (stop) stays down.
type supervisedProcess struct {
	bin         string
	args        []string
	title       string
	log         *testcluster.LogBuffer // every run's output, one after the other
	restartable func(exitCode int, output string) (reason string, ok bool)

	mu       sync.Mutex
	current  *luaopProcess
	stopping bool
	stopSig  syscall.Signal
	exits    []time.Time // when it exited restartably (and was started again)

	stopped chan struct{} // closed by stop
	done    chan struct{} // closed when the supervisor ended
}

// startSupervisedLuaopProcess is startLuaopProcess under a supervisor.
func startSupervisedLuaopProcess(t *testing.T, bin string, args []string, name, source, title string, tail int,
	restartable func(exitCode int, output string) (string, bool)) *supervisedProcess {
	t.Helper()
	s := &supervisedProcess{bin: bin, args: append(args, scriptFolder(t, name, source)), title: title,
		log: &testcluster.LogBuffer{}, restartable: restartable, stopped: make(chan struct{}), done: make(chan struct{})}
	p, err := launchLuaop(bin, s.args, s.log)
	if err != nil {
		t.Fatal(err)
	}
	s.current = p
	go s.supervise(t, 0)
	t.Cleanup(func() {
		s.stop(syscall.SIGKILL)
		showLogIfFailed(t, s.log, title, tail)
	})
	return s
}

// supervise waits for each run to end and starts the next; from is where the
// run's output begins in the log.
func (s *supervisedProcess) supervise(t *testing.T, from int) {
	defer close(s.done)
	for {
		s.mu.Lock()
		p := s.current
		s.mu.Unlock()
		<-p.exited
		if s.isStopping() {
			return
		}
		output := s.log.String()
		code := p.cmd.ProcessState.ExitCode()
		reason, ok := s.restartable(code, output[from:])
		if !ok {
			t.Errorf("%s exited by itself (%s), which is no reason to restart it: a crash; its last lines:\n%s",
				s.title, p.cmd.ProcessState, lastLines(output[from:], 10))
			return
		}
		s.mu.Lock()
		s.exits = append(s.exits, time.Now())
		restarts := len(s.exits)
		s.mu.Unlock()
		if restarts > maxRestarts {
			t.Errorf("%s exited (%s) for the %dth time: more than %d restarts is a failure, not a stall; its last lines:\n%s",
				s.title, reason, restarts, maxRestarts, lastLines(output[from:], 10))
			return
		}
		t.Logf("%s exited (status %d: %s): started again in %s, as its Deployment would", s.title, code, reason, restartBackoff)
		select {
		case <-time.After(restartBackoff):
		case <-s.stopped:
			return
		}
		from = len(s.log.String())
		next, err := launchLuaop(s.bin, s.args, s.log)
		if err != nil {
			t.Errorf("starting %s again: %v", s.title, err)
			return
		}
		s.mu.Lock()
		s.current = next
		stopping, sig := s.stopping, s.stopSig
		s.mu.Unlock()
		if stopping { // stop signalled the previous run: this one gets the same
			next.signal(sig)
			return
		}
	}
}

func (s *supervisedProcess) isStopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// stop sends sig to the running process, on purpose: it is not started again.
// Returns once it exited.
func (s *supervisedProcess) stop(sig syscall.Signal) {
	s.mu.Lock()
	first := !s.stopping
	s.stopping, s.stopSig = true, sig
	p := s.current
	s.mu.Unlock()
	if first {
		close(s.stopped)
	}
	p.signal(sig)
	<-s.done
	s.mu.Lock()
	p = s.current // a run started while stop signalled the previous one got sig too
	s.mu.Unlock()
	<-p.exited
}

// pid is the running process's.
func (s *supervisedProcess) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current.cmd.Process.Pid
}

// exitsBetween is how many times it exited restartably between from and to.
func (s *supervisedProcess) exitsBetween(from, to time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, at := range s.exits {
		if at.After(from) && !at.After(to) {
			n++
		}
	}
	return n
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
