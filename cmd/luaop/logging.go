package main

import (
	"flag"
	"log/slog"
	"strconv"
	"sync"

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

var klogFlags struct {
	once sync.Once
	fs   *flag.FlagSet
}

// routeKlog sends client-go's klog messages to log (one format: the operator's JSON
// or text, with its fields) and sets klog's verbosity to -v N: klog.V(N) messages
// are written at slog level -N, info at info, errors at error. klog's settings are
// process-wide: the last call wins (one operator per process outside tests).
func routeKlog(log *slog.Logger, verbosity int) {
	klogFlags.once.Do(func() {
		klogFlags.fs = flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(klogFlags.fs)
	})
	_ = klogFlags.fs.Set("v", strconv.Itoa(verbosity))
	klog.SetSlogLogger(log)
}

// routeKlogVerbosity sets klog's -v only (tests).
func routeKlogVerbosity(verbosity int) {
	if klogFlags.fs != nil {
		_ = klogFlags.fs.Set("v", strconv.Itoa(verbosity))
	}
}
