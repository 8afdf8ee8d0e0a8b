package devloop

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/reloading"
)

// terminal is the user's side of a pty: it applies what the program writes (the
// cursor moves and erasures bubbletea uses) to a grid of cells, so that a test
// reads the screen as the user sees it, not the stream of escape codes.
type terminal struct {
	mu         sync.Mutex
	rows, cols int
	cells      [][]rune
	row, col   int
	altScreen  bool
	altExited  bool
	pendingEsc []byte
}

func newTerminal(rows, cols int) *terminal {
	t := &terminal{rows: rows, cols: cols}
	t.erase(0, rows)
	return t
}

func (t *terminal) erase(from, to int) {
	for len(t.cells) < t.rows {
		t.cells = append(t.cells, nil)
	}
	for r := from; r < to && r < t.rows; r++ {
		t.cells[r] = []rune(strings.Repeat(" ", t.cols))
	}
}

func (t *terminal) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	data := append(t.pendingEsc, p...)
	t.pendingEsc = nil
	for i := 0; i < len(data); {
		if data[i] == 0x1b {
			n := t.escape(data[i:])
			if n == 0 { // incomplete: wait for the rest
				t.pendingEsc = append([]byte(nil), data[i:]...)
				break
			}
			i += n
			continue
		}
		r, size := []rune(string(data[i:min(i+4, len(data))])), 0
		if len(r) == 0 {
			break
		}
		size = len(string(r[0]))
		if r[0] == '\uFFFD' && i+size > len(data) {
			t.pendingEsc = append([]byte(nil), data[i:]...)
			break
		}
		t.put(r[0])
		i += size
	}
	return len(p), nil
}

func (t *terminal) put(r rune) {
	switch r {
	case '\r':
		t.col = 0
	case '\n':
		if t.row < t.rows-1 {
			t.row++
		}
	case '\b':
		if t.col > 0 {
			t.col--
		}
	default:
		if r < 0x20 {
			return
		}
		if t.col < t.cols {
			t.cells[t.row][t.col] = r
			t.col++
		}
	}
}

// escape applies one escape sequence at the start of b and returns its length (0:
// incomplete).
func (t *terminal) escape(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case '[':
		for i := 2; i < len(b); i++ {
			if b[i] >= 0x40 && b[i] <= 0x7e {
				t.csi(string(b[2:i]), b[i])
				return i + 1
			}
		}
		return 0
	case ']': // OSC, to BEL or ST
		for i := 2; i < len(b); i++ {
			if b[i] == 0x07 {
				return i + 1
			}
			if b[i] == 0x1b && i+1 < len(b) && b[i+1] == '\\' {
				return i + 2
			}
		}
		return 0
	}
	return 2
}

func (t *terminal) csi(params string, final byte) {
	if strings.HasPrefix(params, "?") {
		if params == "?1049" {
			t.altScreen = final == 'h'
			t.altExited = t.altExited || final == 'l'
		}
		return
	}
	nums := []int{}
	for _, p := range strings.Split(params, ";") {
		n, _ := strconv.Atoi(p)
		nums = append(nums, n)
	}
	arg := func(i, def int) int {
		if i < len(nums) && nums[i] > 0 {
			return nums[i]
		}
		return def
	}
	switch final {
	case 'A':
		t.row = max(0, t.row-arg(0, 1))
	case 'B':
		t.row = min(t.rows-1, t.row+arg(0, 1))
	case 'C':
		t.col = min(t.cols-1, t.col+arg(0, 1))
	case 'D':
		t.col = max(0, t.col-arg(0, 1))
	case 'H', 'f':
		t.row, t.col = min(t.rows, arg(0, 1))-1, min(t.cols, arg(1, 1))-1
	case 'J':
		switch arg(0, 0) {
		case 0:
			t.eraseLine(t.col, t.cols)
			t.erase(t.row+1, t.rows)
		case 2, 3:
			t.erase(0, t.rows)
		}
	case 'K':
		switch arg(0, 0) {
		case 0:
			t.eraseLine(t.col, t.cols)
		case 1:
			t.eraseLine(0, t.col+1)
		case 2:
			t.eraseLine(0, t.cols)
		}
	}
}

func (t *terminal) eraseLine(from, to int) {
	for c := from; c < to && c < t.cols; c++ {
		t.cells[t.row][c] = ' '
	}
}

// screen is the text shown now, one line a row, trailing blanks trimmed.
func (t *terminal) screen() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := make([]string, t.rows)
	for i, r := range t.cells {
		lines[i] = strings.TrimRight(string(r), " ")
	}
	return strings.Join(lines, "\n")
}

// waitScreen waits until the screen satisfies ok (the program redraws at its
// pace), failing with the screen as the user would see it.
func waitScreen(t *testing.T, term *terminal, what string, ok func(screen string) bool) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := term.screen()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the screen never showed %s; it shows:\n%s", what, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func contains(parts ...string) func(string) bool {
	return func(s string) bool {
		for _, p := range parts {
			if !strings.Contains(s, p) {
				return false
			}
		}
		return true
	}
}

// logPart is the screen below its LOG title.
func logPart(screen string) string {
	if i := strings.Index(screen, "\nLOG"); i >= 0 {
		return screen[i:]
	}
	return ""
}

// The screen of `luaop dev` in a terminal, driven as a user does: it shows which
// object waits on which handler, retrying with what error, the daemons and timers,
// the last reload's error with file:line; "/" filters objects and log by object or
// handler, "l" raises the log level, "q" ends the session and restores the
// terminal.
func TestScreenInATerminal(t *testing.T) {
	t.Setenv("TERM", "xterm-256color")
	t.Setenv("NO_COLOR", "")
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty on this machine: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	const rows, cols = 40, 140
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		t.Fatal(err)
	}
	term := newTerminal(rows, cols)
	go func() { _, _ = io.Copy(term, ptmx) }()

	now := time.Now()
	delayed, next := now.Add(40*time.Second), now.Add(7*time.Second)
	snapshot := func() processing.Snapshot {
		return processing.Snapshot{
			Objects: []processing.ObjectStatus{
				{Resource: "widgets.examples.luaop.dev", Namespace: "team-a", Name: "w1", Reason: "create", Handlers: []processing.HandlerProgress{
					{ID: "greet", State: "succeeded"},
					{ID: "provision", State: "waiting", Retries: 3, Delayed: &delayed, Message: "quota exceeded"},
				}},
				{Resource: "widgets.examples.luaop.dev", Namespace: "team-b", Name: "w2", Reason: "update", Handlers: []processing.HandlerProgress{
					{ID: "resize", State: "failed", Message: "size must be positive"},
				}},
			},
			Daemons: []processing.DaemonStatus{{Resource: "widgets.examples.luaop.dev", Namespace: "team-a", Name: "w1", Handler: "backup", Since: now.Add(-90 * time.Second)}},
			Timers:  []processing.TimerStatus{{Resource: "widgets.examples.luaop.dev", Namespace: "team-b", Name: "w2", Handler: "tick", Next: &next}},
		}
	}
	v := NewView(tty, slog.LevelInfo)
	quit := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := v.StartScreen(ctx, ScreenOptions{Snapshot: snapshot, Input: tty, Tick: 20 * time.Millisecond, Quit: func() { close(quit) }})
	log := slog.New(v.Handler())
	log.Info("handler succeeded", "namespace", "team-a", "name", "w1", "handler", "greet")
	log.Warn("handler failed; retrying in 40s", "namespace", "team-a", "name", "w1", "handler", "provision", "error", "quota exceeded")
	log.Info("handler succeeded", "namespace", "team-b", "name", "w2", "handler", "label")
	v.Reloaded(reloading.Event{Files: []string{"widgets.lua"}, Err: errors.New("widgets.lua:12: unexpected symbol near 'end'")})

	screen := waitScreen(t, term, "the objects, their handlers, daemons, timers and the reload", contains(
		"team-a/w1", "provision", "retrying in 4", "(retry 3): quota exceeded",
		"team-b/w2", "✘ failed for good: size must be positive",
		"backup daemon running 1m3", "tick timer next in ",
		"widgets.lua:12: unexpected symbol", "keys: / filter"))
	if !strings.Contains(logPart(screen), "team-b/w2 label ✔ handler succeeded") {
		t.Fatalf("the log shows no success of w2:\n%s", screen)
	}

	// Filter by object: w1's object, daemon and log lines stay, w2's go.
	_, _ = ptmx.Write([]byte("/w1\r"))
	waitScreen(t, term, "the filter w1", contains(`filter "w1"`))
	screen = waitScreen(t, term, "only w1", func(s string) bool {
		return strings.Contains(s, "team-a/w1") && !strings.Contains(s, "team-b/w2") && strings.Contains(logPart(s), "provision ! handler failed")
	})
	if strings.Contains(screen, "tick timer") {
		t.Fatalf("w2's timer shows through the filter w1:\n%s", screen)
	}

	// Esc clears the filter; l raises the log's level to warnings: the successes go.
	_, _ = ptmx.Write([]byte("\x1b"))
	waitScreen(t, term, "the filter cleared", func(s string) bool { return strings.Contains(s, "team-b/w2") })
	_, _ = ptmx.Write([]byte("l"))
	waitScreen(t, term, "level ≥ warn", contains("LOG  level ≥ warn"))
	screen = waitScreen(t, term, "no success in the log", func(s string) bool {
		return !strings.Contains(logPart(s), "✔ handler succeeded") && strings.Contains(logPart(s), "! handler failed")
	})

	// q ends the session (the operator's context) and gives the terminal back.
	_, _ = ptmx.Write([]byte("q"))
	select {
	case <-quit:
	case <-time.After(10 * time.Second):
		t.Fatalf("q did not end the session; the screen:\n%s", screen)
	}
	stop()
	term.mu.Lock()
	exited := term.altExited
	term.mu.Unlock()
	if !exited {
		t.Fatal("the screen did not give the terminal back (alternate screen not left)")
	}
}
