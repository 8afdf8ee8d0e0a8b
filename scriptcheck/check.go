package scriptcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/luaop/luaop/luabind"
)

// Problem is one finding of Check, at a file and line of the scripts.
type Problem struct {
	File    string
	Line    int // 0: the file as a whole
	Message string
	Rule    string // the id of its Rule (RuleLoad, ...)
	// span is the first and last line of the registration call a problem was found
	// in: a load error inside it is the same problem, reported once.
	span [2]int
}

func (p Problem) String() string {
	if p.Line <= 0 {
		return p.File + ": " + p.Message
	}
	return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Message)
}

// CheckReport is what Check found.
type CheckReport struct {
	Problems []Problem
	// Handlers are the handlers the scripts register when they load (none when
	// they do not load).
	Handlers []string
	Files    int
}

// Check loads the scripts the way the operator does (the same sandbox, option
// validation and duplicate-id checks; no cluster: luaop.kube calls made while
// loading fail with an error value) and analyses their source for what would fail
// only at run time: syntax of Lua 5.2 and later, globals the sandbox lacks, options
// that do not apply to a handler's kind, resource strings that do not parse. Every
// compile error is reported (each file on its own), and the errors raised while
// the scripts run: the load's, as the operator would see it, and each handler
// script's loaded on its own.
//
// opts are the operator's options the check must hold to: HandlerTimeout (each
// file's compilation and the load run under it, as in the operator), MaxStringSize
// and MemoryBudget; zero fields take their defaults, the others are the check's.
func Check(ctx context.Context, scripts []luabind.Script, opts luabind.Options) CheckReport {
	rep := CheckReport{Files: len(scripts)}
	if len(scripts) == 0 {
		rep.Problems = append(rep.Problems, Problem{File: ".", Message: "no *.lua files", Rule: RuleNoScripts})
		return rep
	}
	opts = checkOptions(opts)
	a := analyze(ctx, scripts, opts.HandlerTimeout)
	rep.Problems = append(rep.Problems, a.Problems...)
	if !a.syntaxErrors {
		rt := luabind.New(opts)
		defer rt.Close()
		report, err := rt.Load(ctx, scripts)
		if err != nil {
			for _, p := range loadProblems(ctx, scripts, err, opts) {
				if !a.covers(p) && !slices.ContainsFunc(rep.Problems, func(q Problem) bool { return q.String() == p.String() }) {
					rep.Problems = append(rep.Problems, p)
				}
			}
		} else {
			for _, h := range report.Handlers {
				rep.Handlers = append(rep.Handlers, h.ID)
			}
		}
	}
	sortProblems(rep.Problems)
	return rep
}

// loadProblems are the problems of a load that failed with err: err's, and those
// of each handler script loaded on its own with the modules (a load stops at its
// first error, which would hide the others' problems), each under opts (the
// check's options, as the whole load).
func loadProblems(ctx context.Context, scripts []luabind.Script, err error, opts luabind.Options) []Problem {
	out := []Problem{problemOf(err)}
	var modules, handlers []luabind.Script
	for _, s := range scripts {
		if strings.Contains(s.Name, "/") {
			modules = append(modules, s)
		} else {
			handlers = append(handlers, s)
		}
	}
	if len(handlers) < 2 {
		return out
	}
	for _, h := range handlers {
		rt := luabind.New(opts)
		_, err := rt.Load(ctx, append([]luabind.Script{h}, modules...))
		rt.Close()
		if err != nil {
			out = append(out, problemOf(err))
		}
	}
	return out
}

// CheckLoad loads the scripts in a throwaway runtime, the way the operator would
// (the same sandbox, option validation, duplicate ids, modules), without a cluster
// (luaop.kube calls made while loading fail with an error value), and returns the
// load's error with its file:line, or nil when they load. No other runtime is
// touched. The admission webhook guarding the operator's own scripts ConfigMap uses
// it.
// opts as for Check.
func CheckLoad(ctx context.Context, scripts []luabind.Script, opts luabind.Options) error {
	if len(scripts) == 0 {
		return errors.New("no *.lua files")
	}
	rt := luabind.New(checkOptions(opts))
	defer rt.Close()
	_, err := rt.Load(ctx, scripts)
	return err
}

// checkOptions are the options of a throwaway runtime checking scripts: the
// caller's limits, one shard, no cluster, no log.
func checkOptions(opts luabind.Options) luabind.Options {
	out := luabind.Options{Shards: 1, Kube: noCluster{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		HandlerTimeout: opts.HandlerTimeout, MaxStringSize: opts.MaxStringSize, MemoryBudget: opts.MemoryBudget}
	if out.HandlerTimeout <= 0 {
		out.HandlerTimeout = luabind.DefaultHandlerTimeout
	}
	return out
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].File != ps[j].File {
			return ps[i].File < ps[j].File
		}
		return ps[i].Line < ps[j].Line
	})
}

var fileLine = regexp.MustCompile(`^([^\s:]+\.lua):(\d+): (?s)(.*)$`)

// problemOf turns a load error into a Problem with its file and line.
func problemOf(err error) Problem {
	var se *luabind.ScriptError
	if errors.As(err, &se) && se.File != "" {
		msg := se.Message
		// A message raised by a registration function carries the position again.
		if m := fileLine.FindStringSubmatch(msg); m != nil && m[1] == se.File {
			msg = m[3]
		}
		return Problem{File: se.File, Line: se.Line, Message: msg, Rule: RuleLoad}
	}
	msg := err.Error()
	if m := fileLine.FindStringSubmatch(msg); m != nil {
		var line int
		fmt.Sscan(m[2], &line)
		return Problem{File: m[1], Line: line, Message: m[3], Rule: RuleLoad}
	}
	return Problem{File: ".", Message: msg, Rule: RuleLoad}
}

// noCluster answers luaop.kube calls made while checking.
type noCluster struct{}

var errNoCluster = errors.New("no cluster: luaop check runs the scripts without one")

func (noCluster) Get(context.Context, string, string, string, string) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) List(context.Context, string, string, string, string) ([]map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Create(context.Context, map[string]any) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Patch(context.Context, string, string, string, string, any, string) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Delete(context.Context, string, string, string, string) error { return errNoCluster }
func (noCluster) Apply(context.Context, map[string]any, bool) (map[string]any, error) {
	return nil, errNoCluster
}
func (noCluster) Event(context.Context, map[string]any, string, string, string) error {
	return errNoCluster
}
