package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(source), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &luaopProcess{log: &testcluster.LogBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append(args, dir)...)
	p.cmd.Env = append(os.Environ(), "NO_COLOR=1")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		if t.Failed() {
			log := p.log.String()
			if tail > 0 {
				log = lastLines(log, tail)
			}
			t.Logf("the log of %s:\n%s", title, log)
		}
		p.signal(syscall.SIGKILL)
	})
	return p
}

func (p *luaopProcess) signal(sig syscall.Signal) {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(sig)
		<-p.exited
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
