package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// logLevel is the slog level of the settings: --log-level, lowered to -N by -v N so
// that client-go's klog.V(N) messages, which reach slog at level -N, are kept.
func logLevel(s settings) slog.Level {
	var level slog.Level
	_ = level.UnmarshalText([]byte(s.LogLevel))
	if s.Verbosity > 0 && slog.Level(-s.Verbosity) < level {
		level = slog.Level(-s.Verbosity)
	}
	return level
}

// klogRouting sends client-go's klog messages to the operator's log. klog's logger
// can be set only before any client logs (klog.SetLogger is not safe while they
// run), so it is set once, at start (installKlog), to a handler that forwards to the
// one routeKlog names later.
var klogRouting struct {
	once    sync.Once
	fs      *flag.FlagSet
	handler atomic.Pointer[slog.Handler]
}

// installKlog makes klog log through klogHandler, and its -v settable; main calls
// it first (and the tests' init).
func installKlog() {
	klogRouting.once.Do(func() {
		var h slog.Handler = slog.NewTextHandler(os.Stderr, nil)
		klogRouting.handler.Store(&h)
		klogRouting.fs = flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(klogRouting.fs)
		klog.SetSlogLogger(slog.New(klogHandler{}))
	})
}

// routeKlog sends klog's messages to log from now on (one format: the operator's
// JSON or text, with its fields) and sets klog's verbosity to -v N: klog.V(N)
// messages are written at slog level -N, info at info, errors at error.
func routeKlog(log *slog.Logger, verbosity int) {
	installKlog()
	h := log.Handler()
	klogRouting.handler.Store(&h)
	_ = klogRouting.fs.Set("v", strconv.Itoa(verbosity))
}

// klogHandler forwards to the handler routeKlog set, with the attributes and
// groups klog added.
type klogHandler struct {
	ops []func(slog.Handler) slog.Handler
}

func (k klogHandler) current() slog.Handler {
	h := *klogRouting.handler.Load()
	for _, op := range k.ops {
		h = op(h)
	}
	return h
}

func (k klogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return k.current().Enabled(ctx, level)
}

func (k klogHandler) Handle(ctx context.Context, r slog.Record) error {
	return k.current().Handle(ctx, r)
}

func (k klogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return klogHandler{ops: append(append([]func(slog.Handler) slog.Handler(nil), k.ops...), func(h slog.Handler) slog.Handler { return h.WithAttrs(attrs) })}
}

func (k klogHandler) WithGroup(name string) slog.Handler {
	return klogHandler{ops: append(append([]func(slog.Handler) slog.Handler(nil), k.ops...), func(h slog.Handler) slog.Handler { return h.WithGroup(name) })}
}
