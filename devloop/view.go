package devloop

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"
	"github.com/mattn/go-isatty"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/reloading"
)

// View is the live terminal view of `luaop dev`: the loaded scripts and their
// handlers, every reload (ok, or the error with file:line), every handler run as it
// happens, and the scripts' own log lines. On a terminal it is colored and boxed;
// otherwise (or with NO_COLOR) it writes plain lines.
type View struct {
	// mu guards the lines written and, while the screen is open (screenOn), what
	// the screen takes at its next tick (pending, head).
	mu       sync.Mutex
	screenOn bool
	pending  []logEntry
	head     header
	out      io.Writer
	fancy    bool
	level    slog.Level
	styles   viewStyles
	renderer *lipgloss.Renderer
}

type viewStyles struct {
	box, title, dim, ok, warn, fail, object, handler lipgloss.Style
}

// NewView writes to out (usually os.Stderr); level filters log lines.
func NewView(out io.Writer, level slog.Level) *View {
	fancy := false
	if f, ok := out.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		fancy = os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
	}
	r := lipgloss.NewRenderer(out)
	v := &View{out: out, fancy: fancy, level: level, renderer: r}
	v.styles = viewStyles{
		box:     r.NewStyle().Border(lipgloss.RoundedBorder()).BorderForeground(lipgloss.Color("63")).Padding(0, 1),
		title:   r.NewStyle().Bold(true).Foreground(lipgloss.Color("63")),
		dim:     r.NewStyle().Foreground(lipgloss.Color("245")),
		ok:      r.NewStyle().Foreground(lipgloss.Color("42")),
		warn:    r.NewStyle().Foreground(lipgloss.Color("214")),
		fail:    r.NewStyle().Bold(true).Foreground(lipgloss.Color("196")),
		object:  r.NewStyle().Foreground(lipgloss.Color("39")),
		handler: r.NewStyle().Foreground(lipgloss.Color("170")),
	}
	return v
}

func (v *View) render(s lipgloss.Style, text string) string {
	if !v.fancy {
		return text
	}
	return s.Render(text)
}

// println writes one line, or hands it to the open screen.
func (v *View) println(l logEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.screenOn {
		v.pending = append(v.pending, l)
		if over := len(v.pending) - logRingSize; over > 0 {
			v.pending = append(v.pending[:0:0], v.pending[over:]...)
		}
		return
	}
	fmt.Fprintln(v.out, l.text)
}

// setHead changes what the screen's top shows.
func (v *View) setHead(change func(h *header)) {
	v.mu.Lock()
	change(&v.head)
	v.mu.Unlock()
}

// Loaded shows the scripts and their handlers.
func (v *View) Loaded(dir string, r luabind.LoadReport) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %s\n", v.render(v.styles.title, "luaop dev"), v.render(v.styles.dim, dir))
	fmt.Fprintf(&b, "%d script(s), %d handler(s), loaded in %s\n", len(r.Files), len(r.Handlers), r.Took.Round(time.Microsecond))
	handlers := append(r.Handlers[:0:0], r.Handlers...)
	sort.SliceStable(handlers, func(i, j int) bool { return handlers[i].Source < handlers[j].Source })
	for _, h := range handlers {
		target := h.Resource.String()
		if h.Resource.Resource == "" {
			target = "(operator)"
		}
		// Pad before styling: escape codes would count as width.
		fmt.Fprintf(&b, "  %-8s %s %-40s %s\n", h.Kind, v.render(v.styles.handler, fmt.Sprintf("%-28s", h.ID)), target, v.render(v.styles.dim, h.Source))
	}
	text := strings.TrimRight(b.String(), "\n")
	if v.fancy {
		text = v.styles.box.Render(text)
	}
	v.setHead(func(h *header) { h.dir, h.scripts, h.handlers = dir, len(r.Files), len(r.Handlers) })
	v.println(logEntry{level: slog.LevelInfo, text: text})
}

// Note shows one line about the session (the webhook server's address, or why the
// cluster cannot reach it), marked as fine or as a problem.
func (v *View) Note(ok bool, text string) {
	stamp := v.render(v.styles.dim, time.Now().Format("15:04:05"))
	shown := text
	if !ok {
		shown = v.render(v.styles.fail, "✘ "+text)
	}
	v.setHead(func(h *header) {
		topic := noteTopic(text)
		for i, n := range h.notes {
			if noteTopic(stripStyle(n)) == topic {
				h.notes[i] = shown
				return
			}
		}
		h.notes = append(h.notes, shown)
	})
	if ok {
		v.println(logEntry{level: slog.LevelInfo, text: fmt.Sprintf("%s %s", stamp, text)})
		return
	}
	v.println(logEntry{level: slog.LevelError, text: fmt.Sprintf("%s %s %s", stamp, v.render(v.styles.fail, "✘"), v.render(v.styles.fail, text))})
}

// Reloaded shows one reload attempt.
func (v *View) Reloaded(ev reloading.Event) {
	stamp := v.render(v.styles.dim, time.Now().Format("15:04:05"))
	files := strings.Join(ev.Files, ", ")
	if ev.Err != nil {
		title, hint := "✘ reload failed", "the previous scripts keep running; fix the file and save again"
		if ev.NothingServes {
			title, hint = "✘ the scripts do not load", "no scripts serve yet; fix the file and save again"
		}
		v.setHead(func(h *header) {
			h.reloadOK, h.reload = false, fmt.Sprintf("%s %s %s: %s", time.Now().Format("15:04:05"), title, files, ev.Err)
		})
		// One entry per line: the screen's log counts lines.
		v.println(logEntry{level: slog.LevelError, text: fmt.Sprintf("%s %s %s", stamp, v.render(v.styles.fail, title), files)})
		v.println(logEntry{level: slog.LevelError, text: "         " + v.render(v.styles.fail, ev.Err.Error())})
		v.println(logEntry{level: slog.LevelError, text: "         " + v.render(v.styles.dim, hint)})
		return
	}
	v.setHead(func(h *header) {
		h.reloadOK, h.handlers = true, len(ev.Report.Handlers)
		if n := len(ev.Report.Files); n > 0 {
			h.scripts = n
		}
		h.reload = fmt.Sprintf("%s ✔ reloaded %s in %s", time.Now().Format("15:04:05"), files, ev.Latency.Round(time.Millisecond))
	})
	v.println(logEntry{level: slog.LevelInfo, text: fmt.Sprintf("%s %s %s in %s (%d handlers)", stamp, v.render(v.styles.ok, "✔ reloaded"), files,
		ev.Latency.Round(time.Millisecond), len(ev.Report.Handlers))})
}

// stripStyle drops the escape codes of a styled text.
func stripStyle(s string) string { return ansi.Strip(s) }

// Handler returns a slog handler that renders log records as view lines.
func (v *View) Handler() slog.Handler { return &viewHandler{view: v} }

type viewHandler struct {
	view  *View
	attrs []slog.Attr
}

func (h *viewHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.view.level }

func (h *viewHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &viewHandler{view: h.view, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h *viewHandler) WithGroup(string) slog.Handler { return h }

func (h *viewHandler) Handle(_ context.Context, r slog.Record) error {
	v := h.view
	s := v.styles
	var object, namespace, name, handler, resource string
	var rest []string
	add := func(a slog.Attr) bool {
		switch a.Key {
		case "object":
			object = a.Value.String()
		case "namespace":
			namespace = a.Value.String()
		case "name":
			name = a.Value.String()
		case "kind", "uid":
			// The object is shown as namespace/name; kind and uid are for JSON logs.
		case "handler":
			handler = a.Value.String()
		case "resource":
			resource = a.Value.String()
		default:
			rest = append(rest, a.Key+"="+a.Value.String())
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	if object == "" && name != "" {
		object = name
		if namespace != "" {
			object = namespace + "/" + name
		}
	} else if namespace != "" || name != "" {
		// Not an object's line (a namespace or a name of something else).
		for _, kv := range [][2]string{{"namespace", namespace}, {"name", name}} {
			if kv[1] != "" {
				rest = append(rest, kv[0]+"="+kv[1])
			}
		}
	}

	msg := r.Message
	style := s.dim
	switch {
	case r.Level >= slog.LevelError:
		style, msg = s.fail, "✘ "+msg
	case r.Level >= slog.LevelWarn:
		style, msg = s.warn, "! "+msg
	case strings.HasPrefix(msg, "handler succeeded"):
		style, msg = s.ok, "✔ "+msg
	case handler != "":
		style = lipgloss.NewStyle()
	}
	var b strings.Builder
	b.WriteString(v.render(s.dim, r.Time.Format("15:04:05")))
	if object != "" {
		b.WriteString(" " + v.render(s.object, object))
	} else if resource != "" {
		b.WriteString(" " + v.render(s.object, resource))
	}
	if handler != "" {
		b.WriteString(" " + v.render(s.handler, handler))
	}
	b.WriteString(" " + v.render(style, msg))
	if len(rest) > 0 {
		b.WriteString(" " + v.render(s.dim, strings.Join(rest, " ")))
	}
	v.println(logEntry{level: r.Level, object: object, handler: handler, text: b.String()})
	return nil
}
