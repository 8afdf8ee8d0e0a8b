package devloop

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/mattn/go-isatty"

	"github.com/luaop/luaop/processing"
)

// The screen of `luaop dev` on a terminal: what the operator is doing now (the
// objects whose handlers are not all done, the daemons and timers running, the
// last reload, the notes about the cluster, the webhooks and peering), and the log
// below it, filtered by object or handler and by level. It is redrawn from the
// Reactor's Snapshot at every tick, so it shows state rather than scrolling: an
// event handler or a timer adds a log line at most, and objects nothing is being
// done for (another user's namespace deleted) never appear.
//
// Design: the program (bubbletea) owns the screen's model; the View only collects,
// under its leaf lock, the log lines and the header facts written since the last
// tick, which the model takes at its next tick. No logger ever waits for the
// screen, and the model never waits for a lock held while calling out.

// ScreenOptions connect the screen to the operator.
type ScreenOptions struct {
	// Snapshot is what the operator does now (processing.Reactor.Snapshot).
	Snapshot func() processing.Snapshot
	// Quit is called when the user quits the screen (q or ctrl+c): the terminal is
	// in raw mode, so no SIGINT arrives; it must end the session.
	Quit func()
	// Input is where keys are read (default: os.Stdin).
	Input *os.File
	// Tick is how often the screen is redrawn from Snapshot (default 250ms).
	Tick time.Duration
	// Plain keeps the line output although a terminal is there (--plain).
	Plain bool
}

// logRingSize is how many log lines the screen keeps for its filters.
const logRingSize = 2000

// logEntry is one log line, with the fields the screen filters by.
type logEntry struct {
	level           slog.Level
	object, handler string
	text            string // rendered, styled as in the line output
}

// header is what the screen's top shows besides the Snapshot.
type header struct {
	dir               string
	scripts, handlers int
	reload            string // the last reload's line, ✔ or ✘ with file:line
	reloadOK          bool
	notes             []string // "cluster: ...", "webhooks: ...", the last per topic
}

// StartScreen opens the screen when the view writes to a terminal and keys come
// from one (and not opts.Plain); otherwise the view keeps writing lines (CI, pipes)
// and StartScreen does nothing. The returned stop closes the screen (the terminal
// is restored and the last log lines are written below it); ctx's end closes it too.
func (v *View) StartScreen(ctx context.Context, opts ScreenOptions) (stop func()) {
	if opts.Input == nil {
		opts.Input = os.Stdin
	}
	if !v.fancy || opts.Plain || !isatty.IsTerminal(opts.Input.Fd()) {
		return func() {}
	}
	if opts.Tick <= 0 {
		opts.Tick = 250 * time.Millisecond
	}
	m := &screenModel{view: v, opts: opts, level: v.level}
	p := tea.NewProgram(m, tea.WithAltScreen(), tea.WithInput(opts.Input), tea.WithOutput(v.out), tea.WithoutSignalHandler())
	v.mu.Lock()
	v.screenOn = true
	v.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := p.Run(); err != nil {
			v.mu.Lock()
			v.screenOn = false
			v.mu.Unlock()
			v.println(logEntry{level: slog.LevelWarn, text: "the screen failed (" + err.Error() + "); writing lines instead, as with --plain"})
		}
	}()
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			p.Quit()
		case <-stopped:
		}
	}()
	return func() {
		close(stopped)
		p.Quit()
		<-done
		v.mu.Lock()
		v.screenOn = false
		pending := v.pending
		v.pending = nil
		v.mu.Unlock()
		// What the screen showed last stays readable after it closed.
		lines := append(m.lines, pending...)
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		for _, l := range lines {
			v.println(l)
		}
	}
}

// take hands the model what was written since the last tick.
func (v *View) take() (header, []logEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	h := v.head
	h.notes = append([]string(nil), v.head.notes...)
	pending := v.pending
	v.pending = nil
	return h, pending
}

type tickMsg time.Time

// screenModel is the screen's state, owned by the program's goroutine.
type screenModel struct {
	view    *View
	opts    ScreenOptions
	head    header
	snap    processing.Snapshot
	lines   []logEntry
	filter  string
	editing bool // typing the filter
	level   slog.Level
	width   int
	height  int
}

func (m *screenModel) tick() tea.Cmd {
	return tea.Tick(m.opts.Tick, func(t time.Time) tea.Msg { return tickMsg(t) })
}

func (m *screenModel) Init() tea.Cmd {
	m.refresh()
	return m.tick()
}

func (m *screenModel) refresh() {
	h, pending := m.view.take()
	m.head = h
	m.lines = append(m.lines, pending...)
	if over := len(m.lines) - logRingSize; over > 0 {
		m.lines = append(m.lines[:0:0], m.lines[over:]...)
	}
	if m.opts.Snapshot != nil {
		m.snap = m.opts.Snapshot()
	}
}

func (m *screenModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tickMsg:
		m.refresh()
		return m, m.tick()
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tea.KeyMsg:
		return m, m.keys(msg)
	}
	return m, nil
}

// levels is the order the l key walks.
var levels = []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}

// keys handles what the terminal sent at once one key at a time: keys typed fast
// (or pasted) arrive as one message of several runes.
func (m *screenModel) keys(k tea.KeyMsg) tea.Cmd {
	if k.Type != tea.KeyRunes || len(k.Runes) < 2 || k.Paste {
		return m.key(k)
	}
	var cmds []tea.Cmd
	for _, r := range k.Runes {
		cmds = append(cmds, m.key(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{r}}))
	}
	return tea.Batch(cmds...)
}

func (m *screenModel) key(k tea.KeyMsg) tea.Cmd {
	if k.Type == tea.KeyCtrlC {
		return m.quit()
	}
	if m.editing {
		switch k.Type {
		case tea.KeyEnter:
			m.editing = false
		case tea.KeyEsc:
			m.editing, m.filter = false, ""
		case tea.KeyBackspace:
			if r := []rune(m.filter); len(r) > 0 {
				m.filter = string(r[:len(r)-1])
			}
		case tea.KeyRunes, tea.KeySpace:
			m.filter += string(k.Runes)
		}
		return nil
	}
	switch k.String() {
	case "q":
		return m.quit()
	case "/":
		m.editing = true
	case "esc":
		m.filter = ""
	case "l":
		m.level = nextLevel(m.level)
	case "ctrl+l":
		return tea.ClearScreen
	}
	return nil
}

func nextLevel(l slog.Level) slog.Level {
	for i, x := range levels {
		if x == l {
			return levels[(i+1)%len(levels)]
		}
	}
	return slog.LevelInfo
}

func (m *screenModel) quit() tea.Cmd {
	if m.opts.Quit != nil {
		m.opts.Quit()
	}
	return tea.Quit
}

func (m *screenModel) View() string {
	s := m.view.styles
	now := time.Now()
	var top []string
	top = append(top, m.headerLines(now)...)
	top = append(top, "", s.title.Render(fmt.Sprintf("OBJECTS (%d)", len(m.snap.Objects))))
	top = append(top, m.objectLines(now)...)
	top = append(top, "", s.title.Render(fmt.Sprintf("DAEMONS (%d)  TIMERS (%d)", len(m.snap.Daemons), len(m.snap.Timers))))
	top = append(top, m.engineLines(now)...)
	height := m.height
	if height <= 0 {
		height = 40
	}
	// The state takes at most two thirds of the screen; the log the rest.
	if limit := height * 2 / 3; len(top) > limit {
		top = append(top[:limit-1], s.dim.Render("  … (more; narrow it with / filter)"))
	}
	keys := s.dim.Render("keys: / filter by object or handler   l level   esc clear filter   ctrl+l redraw   q quit")
	if m.editing {
		keys = "filter: " + m.filter + "█   (enter: keep, esc: clear)"
	}
	logTitle := fmt.Sprintf("LOG  level ≥ %s", strings.ToLower(m.level.String()))
	if m.filter != "" {
		logTitle += fmt.Sprintf("  filter %q", m.filter)
	}
	room := height - len(top) - 3
	logLines := m.logLines(room)
	out := append(top, "", s.title.Render(logTitle))
	out = append(out, logLines...)
	for len(out) < height-1 {
		out = append(out, "")
	}
	return strings.Join(append(out, keys), "\n")
}

func (m *screenModel) headerLines(now time.Time) []string {
	s := m.view.styles
	h := m.head
	first := fmt.Sprintf("%s  %s  %d script(s), %d handler(s)", s.title.Render("luaop dev"), s.dim.Render(h.dir), h.scripts, h.handlers)
	if m.snap.Paused != "" {
		first += "  " + s.warn.Render("paused: "+m.snap.Paused)
	}
	lines := []string{first}
	switch {
	case h.reload == "":
	case h.reloadOK:
		lines = append(lines, "reload: "+s.ok.Render(h.reload))
	default:
		lines = append(lines, "reload: "+s.fail.Render(h.reload))
	}
	return append(lines, h.notes...)
}

func (m *screenModel) objectLines(now time.Time) []string {
	s := m.view.styles
	var lines []string
	for _, o := range m.snap.Objects {
		if len(o.Handlers) == 0 && o.ProcessingSince == nil {
			continue
		}
		name := objectName(o.Namespace, o.Name)
		if !m.matches(name, "") && !anyHandlerMatches(m, name, o.Handlers) {
			continue
		}
		head := fmt.Sprintf("  %s %s", s.object.Render(name), s.dim.Render(o.Resource))
		if o.Reason != "" {
			head += " " + o.Reason
		}
		if o.ProcessingSince != nil {
			head += s.dim.Render(" (running " + now.Sub(*o.ProcessingSince).Round(time.Second).String() + ")")
		}
		lines = append(lines, head)
		for _, h := range o.Handlers {
			lines = append(lines, fmt.Sprintf("      %s %s", s.handler.Render(fmt.Sprintf("%-28s", h.ID)), m.handlerState(h, now)))
		}
	}
	if len(lines) == 0 {
		lines = append(lines, s.dim.Render("  nothing waits on a handler"))
	}
	return lines
}

func anyHandlerMatches(m *screenModel, object string, hs []processing.HandlerProgress) bool {
	for _, h := range hs {
		if m.matches(object, h.ID) {
			return true
		}
	}
	return false
}

func (m *screenModel) handlerState(h processing.HandlerProgress, now time.Time) string {
	s := m.view.styles
	switch h.State {
	case "succeeded":
		return s.ok.Render("✔ done")
	case "failed":
		return s.fail.Render("✘ failed for good: " + h.Message)
	case "waiting":
		in := ""
		if h.Delayed != nil {
			in = " in " + h.Delayed.Sub(now).Round(time.Second).String()
		}
		if h.Message == "" {
			return s.dim.Render("waiting" + in)
		}
		return s.warn.Render(fmt.Sprintf("! retrying%s (retry %d): %s", in, h.Retries, h.Message))
	default:
		return s.dim.Render("pending")
	}
}

func (m *screenModel) engineLines(now time.Time) []string {
	s := m.view.styles
	var lines []string
	for _, d := range m.snap.Daemons {
		name := objectName(d.Namespace, d.Name)
		if !m.matches(name, d.Handler) {
			continue
		}
		state := "daemon running " + now.Sub(d.Since).Round(time.Second).String()
		if d.Stopping {
			state = "daemon stopping"
		}
		lines = append(lines, fmt.Sprintf("  %s %s %s", s.object.Render(name), s.handler.Render(d.Handler), s.dim.Render(state)))
	}
	for _, t := range m.snap.Timers {
		name := objectName(t.Namespace, t.Name)
		if !m.matches(name, t.Handler) {
			continue
		}
		state := "timer waiting for a change"
		if t.Next != nil {
			state = "timer next in " + t.Next.Sub(now).Round(time.Second).String()
		}
		if t.Retries > 0 {
			state += fmt.Sprintf(" (retry %d)", t.Retries)
		}
		lines = append(lines, fmt.Sprintf("  %s %s %s", s.object.Render(name), s.handler.Render(t.Handler), s.dim.Render(state)))
	}
	if len(lines) == 0 {
		lines = append(lines, s.dim.Render("  none running"))
	}
	return lines
}

// matches: the filter is a substring of the object's namespace/name or of the
// handler's id (empty: everything).
func (m *screenModel) matches(object, handler string) bool {
	if m.filter == "" {
		return true
	}
	return strings.Contains(object, m.filter) || (handler != "" && strings.Contains(handler, m.filter))
}

func (m *screenModel) logLines(room int) []string {
	if room < 1 {
		return nil
	}
	var out []string
	for i := len(m.lines) - 1; i >= 0 && len(out) < room; i-- {
		l := m.lines[i]
		if l.level < m.level || (m.filter != "" && !m.matches(l.object, l.handler)) {
			continue
		}
		out = append(out, l.text)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func objectName(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// noteTopic is what a note is about ("webhooks" of "webhooks: ..."): the header
// keeps the last note per topic.
func noteTopic(text string) string {
	if i := strings.Index(text, ":"); i > 0 && i < 24 {
		return text[:i]
	}
	return text
}
