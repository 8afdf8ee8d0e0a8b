package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing"
)

// settings are every option of the operator, read through viper from flags,
// LUAOP_* environment variables and a config file, in that order of precedence.
type settings struct {
	Kubeconfig         string
	Context            string
	Namespaces         []string
	Workers            int
	Shards             int
	Prefix             string
	ProgressStorage    string
	DiffBaseStorage    string
	Lifecycle          string
	HandlerTimeout     time.Duration
	ConsistencyTimeout time.Duration
	LogFormat          string
	LogLevel           string
	HealthAddress      string
	ProbeCache         time.Duration
	PostEvents         bool
	LogEvents          string
	ShutdownGrace      time.Duration
	LeaderElect        bool
	LeaderNamespace    string
	LeaderName         string
	DryRun             bool
}

func newRootCommand() *cobra.Command {
	v := viper.New()
	root := &cobra.Command{
		Use:   "luaop",
		Short: "Kubernetes operators with handlers written in Lua",
		Long: `luaop runs Kubernetes operators whose handlers are Lua scripts, with kopf's semantics:
create/update/delete/resume and field handlers, progress persisted on the objects,
retries, finalizers, daemons and timers, and scripts reloaded while it runs.

Every flag can also be set as a LUAOP_* environment variable (--log-format ->
LUAOP_LOG_FORMAT) or as a key of the config file given with --config.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("config", "", "config file (YAML, JSON or TOML) with the same keys as the flags")
	root.AddCommand(newDevCommand(v), newRunCommand(v), newStubsCommand(), newVersionCommand(),
		newCheckCommand(), newRBACCommand(), newTestCommand())
	return root
}

// addOperatorFlags declares the settings shared by dev and run, with their defaults.
func addOperatorFlags(fs *pflag.FlagSet, logFormat string) {
	fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)")
	fs.String("context", "", "kubeconfig context to use (default: its current context)")
	fs.StringSlice("namespaces", nil, "namespaces to serve: names, globs (team-*), exclusions (!kube-*); empty means cluster-wide")
	fs.Int("workers", 16, "objects processed at once")
	fs.Int("shards", 0, "Lua states running handlers in parallel (0: one per CPU)")
	fs.String("prefix", "luaop.dev", "prefix of the annotations and the finalizer this operator writes")
	fs.String("progress-storage", "auto", "where handler progress is kept: auto (per resource: status when the CRD has a status subresource whose schema keeps unknown fields, else annotations), annotations or status")
	fs.String("diffbase-storage", "auto", "where the last handled state is kept: auto, annotations or status (status for both makes one /status patch per handled change)")
	fs.String("lifecycle", "asap", "handlers run per cycle: asap (one, fewest retries first), one-by-one, all-at-once")
	fs.Duration("handler-timeout", 30*time.Second, "deadline of one Lua handler call")
	fs.Duration("consistency-timeout", 5*time.Second, "how long change handlers wait for the operator's own last patch to come back through the watch")
	fs.String("log-format", logFormat, "log format: plain or json")
	fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.String("health-address", ":8080", "address of /healthz and /readyz (empty: off)")
	fs.Duration("probe-cache", 10*time.Second, "how long /healthz reuses the results of successful on.probe handlers before running them again (0: run them on every request)")
	fs.Bool("post-events", true, "post Kubernetes Events: handler outcomes and the scripts' luaop.info/warn/exception (rate-limited per object)")
	fs.String("log-events-level", "info", "ctx.logger messages at this level or above are also posted as Events of the object (kopf's default): debug, info, warning, error or none (needs --post-events)")
	fs.Bool("leader-elect", false, "run several replicas: only the holder of a coordination.k8s.io Lease handles objects, the others stand by")
	fs.String("leader-election-namespace", "", "namespace of the Lease (default: the pod's own namespace)")
	fs.String("leader-election-name", "luaop", "name of the Lease; operators sharing one take turns")
	fs.Duration("shutdown-grace-period", 20*time.Second, "on SIGTERM, how long running handlers and daemons may take to finish before they are cancelled")
	fs.Bool("dry-run", false, "run the handlers against the cluster but write nothing: patches, finalizer changes, the scripts' luaop.kube writes and Events are logged as they would have been sent (reads still go to the cluster; no leader election)")
}

// loadSettings binds the flags, the environment and the config file into settings.
func loadSettings(cmd *cobra.Command, v *viper.Viper) (settings, error) {
	if err := v.BindPFlags(cmd.Flags()); err != nil {
		return settings{}, err
	}
	v.SetEnvPrefix("LUAOP")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	if path, _ := cmd.Flags().GetString("config"); path != "" {
		v.SetConfigFile(path)
		if err := v.ReadInConfig(); err != nil {
			return settings{}, fmt.Errorf("reading the config file %s: %w", path, err)
		}
	}
	s := settings{
		Kubeconfig:         v.GetString("kubeconfig"),
		Context:            v.GetString("context"),
		Namespaces:         v.GetStringSlice("namespaces"),
		Workers:            v.GetInt("workers"),
		Shards:             v.GetInt("shards"),
		Prefix:             v.GetString("prefix"),
		ProgressStorage:    v.GetString("progress-storage"),
		DiffBaseStorage:    v.GetString("diffbase-storage"),
		Lifecycle:          v.GetString("lifecycle"),
		HandlerTimeout:     v.GetDuration("handler-timeout"),
		ConsistencyTimeout: v.GetDuration("consistency-timeout"),
		LogFormat:          v.GetString("log-format"),
		LogLevel:           v.GetString("log-level"),
		HealthAddress:      v.GetString("health-address"),
		ProbeCache:         v.GetDuration("probe-cache"),
		PostEvents:         v.GetBool("post-events"),
		LogEvents:          v.GetString("log-events-level"),
		ShutdownGrace:      v.GetDuration("shutdown-grace-period"),
		LeaderElect:        v.GetBool("leader-elect"),
		LeaderNamespace:    v.GetString("leader-election-namespace"),
		LeaderName:         v.GetString("leader-election-name"),
		DryRun:             v.GetBool("dry-run"),
	}
	if s.Kubeconfig == "" {
		s.Kubeconfig = os.Getenv("KUBECONFIG")
	}
	for flag, value := range map[string]string{"progress-storage": s.ProgressStorage, "diffbase-storage": s.DiffBaseStorage} {
		if _, err := processing.ParseStorageMode(value); err != nil {
			return s, fmt.Errorf("--%s: %w", flag, err)
		}
	}
	if s.ProbeCache < 0 {
		return s, fmt.Errorf("--probe-cache=%s: use a duration >= 0 (0 disables the cache)", s.ProbeCache)
	}
	if _, _, err := luabind.ParseLogEventsLevel(s.LogEvents); err != nil {
		return s, fmt.Errorf("--log-events-level=%q: use debug, info, warning, error or none", s.LogEvents)
	}
	switch s.LogFormat {
	case "plain", "json":
	default:
		return s, fmt.Errorf("--log-format=%q: use plain or json", s.LogFormat)
	}
	switch s.Lifecycle {
	case "asap", "one-by-one", "all-at-once":
	default:
		return s, fmt.Errorf("--lifecycle=%q: use asap, one-by-one or all-at-once", s.Lifecycle)
	}
	return s, nil
}
