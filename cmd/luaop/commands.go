package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/devloop"
	"github.com/luaop/luaop/kubeauth"
	"github.com/luaop/luaop/kubeclient"
	"github.com/luaop/luaop/leader"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/peering"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/reloading"
	"github.com/luaop/luaop/scriptsguard"
	"github.com/luaop/luaop/scripttest"
	"github.com/luaop/luaop/scriptwatch"
	"github.com/luaop/luaop/sharding"
)

func newDevCommand(v *viper.Viper) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev DIR",
		Short: "Run the scripts of DIR against the current cluster, for development",
		Long: `Run the Lua scripts of DIR as an operator against the cluster of the current
kubeconfig context (or --kubeconfig / --context), with readable logs.

--apply PATH (repeatable) first applies the objects of YAML files or folders with
server-side apply, CustomResourceDefinitions first (waiting until they are
Established), so that no kubectl is needed:

  luaop dev --apply examples/crds --apply examples/objects examples`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := loadSettings(cmd, v)
			if err != nil {
				return err
			}
			return runOperator(cmd.Context(), s, args[0], true)
		},
	}
	addOperatorFlags(cmd.Flags(), "plain")
	cmd.Flags().Bool("plain", false, "write the view as lines (as when stdout is not a terminal: CI, pipes) instead of the live screen of objects, handlers, daemons and timers")
	cmd.Flags().StringSlice("apply", nil, "YAML files or folders to apply (server-side) before starting: CRDs first, waiting until they are Established, then the other objects (repeatable)")
	// dev's own defaults: not flags the user gave (Changed stays false), so that
	// LUAOP_* variables and the config file still override them.
	for _, flag := range []string{"health-address", "metrics-address"} {
		setDefault(cmd.Flags(), flag, "")
	}
	// In development the webhooks are on, on loopback (a local control plane calls
	// them there), and removed at exit: a webhook nobody answers would reject
	// every request it covers.
	// The guard of the scripts ConfigMap is for production: `luaop dev` reads a
	// folder of the developer's.
	// kopf's `run --dev`: the developer's session wins over the deployed operator.
	// Metrics, when asked for, are plain HTTP on the developer's machine.
	// A fix saved is retried at once, not after the backoff the error set.
	for flag, value := range map[string]string{"webhook-address": "127.0.0.1:0", "webhook-cleanup": "true", "scripts-webhook": "false", "retry-on-reload": "true",
		"metrics-secure": "false", "priority": strconv.Itoa(peering.DevPriority)} {
		setDefault(cmd.Flags(), flag, value)
	}
	return cmd
}

// setDefault changes the default of a declared flag, as if it had been declared with
// it: unlike FlagSet.Set it does not mark the flag as given, so the environment and
// the config file still take precedence over it.
func setDefault(fs *pflag.FlagSet, name, value string) {
	f := fs.Lookup(name)
	if err := f.Value.Set(value); err != nil {
		panic(fmt.Sprintf("default %q of --%s: %v", value, name, err)) // a programming error
	}
	f.DefValue = value
	f.Changed = false
}

func newRunCommand(v *viper.Viper) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run DIR",
		Short: "Run the scripts of DIR as a production operator (JSON logs, health endpoint)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := loadSettings(cmd, v)
			if err != nil {
				return err
			}
			return runOperator(cmd.Context(), s, args[0], false)
		},
	}
	addOperatorFlags(cmd.Flags(), "json")
	return cmd
}

func newLogger(s settings) *slog.Logger {
	opts := &slog.HandlerOptions{Level: logLevel(s)}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(logOutput, opts))
	}
	return slog.New(slog.NewTextHandler(logOutput, opts))
}

// clientConfig loads the kubeconfig as kubectl does: --kubeconfig (one file), else
// the files of $KUBECONFIG (a list, merged), else ~/.kube/config, else the pod's
// service account; --context picks a context other than the current one.
func clientConfig(s settings) clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = s.Kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: s.Context})
}

func restConfig(s settings) (*rest.Config, error) {
	cfg, err := clientConfig(s).ClientConfig()
	if err != nil {
		return nil, unreachableError(fmt.Errorf("no usable kubeconfig (%w); give --kubeconfig, set KUBECONFIG, or start a local cluster (`kind create cluster`, or `make cluster` in a luaop checkout)", err))
	}
	cfg.QPS, cfg.Burst = 500, 1000
	if s.QPS > 0 {
		cfg.QPS = float32(s.QPS)
	}
	if s.Burst > 0 {
		cfg.Burst = s.Burst
	}
	cfg.UserAgent = "luaop"
	return cfg, nil
}

// runOperator runs the scripts of dir as an operator until ctx is done: `luaop
// dev` (dev: the live view, the development defaults) and `luaop run`. It wires
// the parts; the reload is reloading's.
func runOperator(ctx context.Context, s settings, dir string, dev bool) error {
	log, view := startLogging(s, dev)
	if err := scriptsFolder(dir); err != nil {
		return err
	}
	cfg, err := restConfig(s)
	if err != nil {
		return err
	}
	if err := checkReachable(cfg); err != nil {
		return err
	}
	if err := nameCluster(s, cfg, dev, view, log); err != nil {
		return err
	}
	if len(s.Apply) > 0 {
		if err := applyManifests(ctx, cfg, s, log); err != nil {
			return err
		}
	}
	m := metrics.New()
	m.BuildInfo(luaopVersion())
	shards, err := newSharding(cfg, s, m, log)
	if err != nil {
		return err
	}
	if shards != nil && !s.Standalone {
		// The replicas of a shard group serve the same resources at the same
		// priority: peering would pause them all. They coordinate by sharding.
		log.Info("sharding across replicas: peering off (the replicas split the objects instead of pausing)")
		s.Standalone = true
	}
	op, err := newOperator(cfg, s, dir, dev, m, shards, log)
	if err != nil {
		return err
	}
	if view != nil {
		// The screen takes the terminal's keys: its q or ctrl+c ends the session.
		var quit context.CancelFunc
		ctx, quit = context.WithCancel(ctx)
		defer quit()
		defer view.StartScreen(ctx, devloop.ScreenOptions{Snapshot: op.Reactor().Snapshot, Quit: quit, Plain: s.Plain})()
	}
	webhooks, err := newWebhooks(cfg, s, dev, op, m, view, log)
	if err != nil {
		return err
	}
	lastGood, err := newLastGood(ctx, cfg, s, dev, log)
	if err != nil {
		return err
	}
	elector, err := newElector(cfg, s, log)
	if err != nil {
		return err
	}
	peer, scopes, err := newPeering(cfg, s, dev, op, webhooks, m, view, log)
	if err != nil {
		return fmt.Errorf("peering: %w", err)
	}
	ropts := reloadOptions(s, dir, op, m, webhooks, peer, scopes, lastGood, view, log)
	if ropts.API, err = newScriptsAPI(cfg, s, dev, log); err != nil {
		return err
	}
	reloader := reloading.New(ropts)
	// Watched before the first read, so that no save in between is missed.
	if err := reloader.Watch(ctx); err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	// The endpoints answer from now on: /readyz tells why the scripts do not load
	// while the operator waits for them.
	if err := serveOperatorEndpoints(ctx, cfg, s, op, m, elector, webhooks, peer, shards, log); err != nil {
		return err
	}
	if !reloader.First(ctx) {
		return nil // ended while waiting for scripts that load
	}
	stopWebhooks := startWebhooks(ctx, webhooks, log)
	defer stopWebhooks()
	go reloader.Run(ctx)
	return runWork(ctx, cfg, dir, op, peer, stopWebhooks, shards, elector, log)
}

// startLogging sets the process's log up: JSON or plain lines, or with dev the
// live view, whose lines the log becomes.
func startLogging(s settings, dev bool) (*slog.Logger, *devloop.View) {
	log := newLogger(s)
	var view *devloop.View
	if dev {
		view = devloop.NewView(os.Stderr, logLevel(s))
		log = slog.New(view.Handler())
	}
	slog.SetDefault(log)
	routeKlog(log, s.Verbosity)
	log.Info("luaop starting", "version", luaopVersion(), "go", runtime.Version())
	for _, w := range s.Warnings {
		log.Warn(w)
	}
	return log, view
}

// nameCluster names the cluster before anything is applied or watched; luaop dev
// refuses a shared one unless its context is named or allowed (clusterguard.go).
func nameCluster(s settings, cfg *rest.Config, dev bool, view *devloop.View, log *slog.Logger) error {
	target := targetOf(s, cfg)
	if !dev {
		log.Info("cluster: "+target.String(), "context", target.Context, "server", target.Server)
		return nil
	}
	view.Note(true, "cluster: "+target.String())
	return devAllowed(target, s.Context, s.AllowContexts)
}

// newOperator makes the operator of the settings, instrumented, sharded across
// replicas when shards is set, writing nothing with --dry-run.
func newOperator(cfg *rest.Config, s settings, dir string, dev bool, m *metrics.Metrics, shards *sharding.Sharding, log *slog.Logger) (*operator.Operator, error) {
	popts := processing.Options{
		Namespaces:          s.Namespaces,
		Workers:             s.Workers,
		Prefix:              s.Prefix,
		Lifecycle:           processing.Lifecycle(s.Lifecycle),
		ConsistencyTimeout:  s.ConsistencyTimeout,
		DefaultBackoff:      s.DefaultBackoff,
		PostEvents:          &s.PostEvents,
		ShutdownGracePeriod: s.ShutdownGrace,
		RetryOnReload:       s.RetryOnReload,
		Logger:              log,
	}
	popts.ProgressStorage = processing.StorageMode(s.ProgressStorage)
	popts.DiffBaseStorage = processing.StorageMode(s.DiffBaseStorage)
	popts.StatusField = statusField(s.Prefix)
	if !dev {
		// Production logs show what needs attention; `luaop dev` shows every success.
		popts.SuccessLogLevel = slog.LevelDebug
	}
	if shards != nil {
		popts.Shard = shards
		popts.StopAtOnce = shards.StopWritingAtOnce()
	}
	operator.Instrument(&popts, m)
	oopts := operator.Options{
		ScriptsDir: dir,
		Processing: popts,
		Runtime:    luabindOptions(s, log),
		Logger:     log,
		ProbeCache: probeCache(s),
		// Two operators (two prefixes) own their applied fields apart.
		FieldManager: operator.FieldManagerFor(s.Prefix),
	}
	if s.DryRun {
		if err := applyDryRun(cfg, &oopts, log, oopts.FieldManager); err != nil {
			return nil, err
		}
		log.Warn("dry run: nothing is written to the cluster; every write is logged instead")
	}
	op, err := operator.New(cfg, oopts)
	if err != nil {
		return nil, err
	}
	if err := op.AttachMetrics(m); err != nil {
		return nil, err
	}
	if shards != nil {
		shards.Attach(op.Reactor())
	}
	return op, nil
}

// newWebhooks makes the admission webhooks of --webhook-address (nil without
// one), with the guard of the scripts ConfigMap in luaop run.
func newWebhooks(cfg *rest.Config, s settings, dev bool, op *operator.Operator, m *metrics.Metrics, view *devloop.View, log *slog.Logger) (*admission.Webhooks, error) {
	if s.WebhookAddress == "" {
		return nil, nil
	}
	webhooks, err := admission.New(cfg, op.Runtime(), admission.Options{Address: s.WebhookAddress, CertDir: s.WebhookCertDir, ClientCA: s.WebhookClientCA, EnableHTTP2: s.EnableHTTP2,
		Service: s.WebhookService, URL: s.WebhookURL, Prefix: s.Prefix, RemoveOnExit: s.WebhookCleanup, DryRun: s.DryRun, Namespaces: s.Namespaces,
		ProbeNamespace: probeNamespace(s), OnReachability: reachabilityReport(m, view, op.Runtime),
		Inactive: !s.Standalone && !s.DryRun, Logger: log, Observer: m})
	if err != nil {
		return nil, err
	}
	if m != nil {
		m.Certificate("webhook", webhooks.CertificateNotAfter)
	}
	guardNS, guardName, guarded := strings.Cut(s.ScriptsConfigMap, "/")
	if guarded && s.ScriptsWebhook && !dev {
		if err := webhooks.Register(scriptsguard.ScriptsGuard(guardNS, guardName, log, luabindOptions(s, log))); err != nil {
			return nil, fmt.Errorf("the webhook of --scripts-configmap: %w", err)
		}
	}
	return webhooks, nil
}

// newLastGood keeps the last good scripts next to --scripts-configmap in luaop
// run (nil otherwise, or with --last-good-configmap=none), writing until ctx ends.
func newLastGood(ctx context.Context, cfg *rest.Config, s settings, dev bool, log *slog.Logger) (*reloading.LastGoodStore, error) {
	guardNS, _, guarded := strings.Cut(s.ScriptsConfigMap, "/")
	if !guarded || dev || s.LastGoodConfigMap == "none" {
		return nil, nil
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	lastGood := reloading.NewLastGoodStore(client, guardNS, s.LastGoodConfigMap, s.Prefix, s.DryRun, log)
	go lastGood.Run(ctx)
	return lastGood, nil
}

// newScriptsAPI reads the scripts ConfigMap through the API in luaop run with
// --scripts-configmap (nil otherwise, or with --scripts-from-api=false): its edits
// are loaded as soon as they are applied.
func newScriptsAPI(cfg *rest.Config, s settings, dev bool, log *slog.Logger) (reloading.API, error) {
	ns, name, ok := strings.Cut(s.ScriptsConfigMap, "/")
	if !ok || dev || !s.ScriptsFromAPI {
		return nil, nil
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return scriptwatch.NewConfigMapSource(client, ns, name, log), nil
}

// newElector makes the leader election of --leader-elect (nil without it, and in
// a dry run).
func newElector(cfg *rest.Config, s settings, log *slog.Logger) (*leader.Elector, error) {
	if !s.LeaderElect {
		return nil, nil
	}
	if s.DryRun {
		log.Warn("dry run: --leader-elect ignored (a dry run takes no Lease)")
		return nil, nil
	}
	elector, err := leader.New(cfg, leader.Options{Namespace: s.LeaderNamespace, Name: s.LeaderName, Logger: log,
		LeaseDuration: s.LeaseDuration, RenewDeadline: s.RenewDeadline, RetryPeriod: s.RetryPeriod})
	if err != nil {
		return nil, fmt.Errorf("leader election: %w; give --leader-election-namespace when running outside a pod", err)
	}
	return elector, nil
}

// reloadOptions are the reload's parts: those of the process that follow the
// scripts, each left out when the process has none.
func reloadOptions(s settings, dir string, op *operator.Operator, m *metrics.Metrics, webhooks *admission.Webhooks, peer *peering.Peering,
	scopes *scopeResolver, lastGood *reloading.LastGoodStore, view *devloop.View, log *slog.Logger) reloading.Options {
	opts := reloading.Options{Dir: dir, Debounce: s.ReloadDebounce, Operator: op, Logger: log}
	if m != nil {
		opts.Metrics = m
	}
	if webhooks != nil {
		opts.Webhooks = webhooks
	}
	if peer != nil {
		opts.Peering = peerScope{peer: peer, scopes: scopes, rt: op.Runtime()}
	}
	if lastGood != nil {
		opts.LastGood = lastGood
	}
	if view != nil {
		opts.View = devView{view: view, webhooks: webhooks, rt: op.Runtime()}
	}
	return opts
}

// serveOperatorEndpoints serves the health and metrics endpoints (serveEndpoints),
// with the client --metrics-secure authenticates the scrapers with.
func serveOperatorEndpoints(ctx context.Context, cfg *rest.Config, s settings, op *operator.Operator, m *metrics.Metrics, elector *leader.Elector,
	webhooks *admission.Webhooks, peer *peering.Peering, shards *sharding.Sharding, log *slog.Logger) error {
	var kube kubernetes.Interface
	if s.MetricsSecure && s.MetricsAddress != "" {
		var err error
		if kube, err = kubernetes.NewForConfig(cfg); err != nil {
			return err
		}
	}
	return serveEndpoints(ctx, log, s, op, m, elector, webhooks, peer, kube, shards)
}

// startWebhooks starts the webhook server (every replica serves the webhooks, a
// standby too: it holds the scripts), and returns what stops it and waits for it:
// with --webhook-cleanup the configurations are removed before exiting (and
// before the peering Lease goes: runPeered).
func startWebhooks(ctx context.Context, webhooks *admission.Webhooks, log *slog.Logger) (stop func()) {
	if webhooks == nil {
		return func() {}
	}
	webhooksDone := make(chan struct{})
	wctx, cancelWebhooks := context.WithCancel(ctx)
	go func() {
		defer close(webhooksDone)
		if err := webhooks.Start(wctx); err != nil {
			log.Error("webhook server stopped", "error", err)
		}
	}()
	return sync.OnceFunc(func() { cancelWebhooks(); <-webhooksDone })
}

// runWork runs the operator's work: this replica's share with sharding, the
// leader's with leader election, else all of it; under peering in each case.
func runWork(ctx context.Context, cfg *rest.Config, dir string, op *operator.Operator, peer *peering.Peering, stopWebhooks func(),
	shards *sharding.Sharding, elector *leader.Elector, log *slog.Logger) error {
	work := func(ctx context.Context) error { return runPeered(ctx, op, peer, stopWebhooks) }
	if shards != nil {
		// Every replica handles its share; ErrMembershipLost ends the process with
		// status 6 (exitStandingLost: its objects went to the others), and
		// Kubernetes restarts it.
		log.Info("watching the cluster: this replica's share", "server", cfg.Host, "scripts", dir, "labelSelector", shards.Selector())
		return shards.Run(ctx, work)
	}
	if elector != nil {
		// Only the leader watches and handles (and takes part in peering);
		// ErrLeadershipLost ends the process with status 6 (exitStandingLost), and
		// Kubernetes restarts it as a standby.
		return elector.Run(ctx, work)
	}
	log.Info("watching the cluster", "server", cfg.Host, "scripts", dir)
	return work(ctx)
}

// applyManifests applies the objects of --apply (server-side), CRDs first.
func applyManifests(ctx context.Context, cfg *rest.Config, s settings, log *slog.Logger) error {
	manifests, err := kubeclient.ReadManifests(s.Apply...)
	if err != nil {
		return fmt.Errorf("--apply: %w", err)
	}
	// Objects without a namespace go where kubectl apply would put them: the one
	// namespace of -n, else the kubeconfig context's.
	ns, _, err := clientConfig(s).Namespace()
	if err != nil {
		return fmt.Errorf("--apply: the kubeconfig's namespace: %w", err)
	}
	if len(s.Namespaces) == 1 && !strings.ContainsAny(s.Namespaces[0], "*?[!") {
		ns = s.Namespaces[0]
	}
	client, err := kubeclient.New(cfg)
	if err != nil {
		return err
	}
	err = client.ApplyManifests(ctx, manifests, kubeclient.ApplyOptions{
		Namespace: ns,
		Progress: func(what, source, result string) {
			level := slog.LevelInfo
			if result == "established" || result == "unchanged" {
				level = slog.LevelDebug
			}
			log.Log(ctx, level, what+" "+result, "file", source)
		},
	})
	if err != nil {
		return fmt.Errorf("--apply: %w", err)
	}
	log.Info("applied", "objects", len(manifests), "paths", strings.Join(s.Apply, ","))
	return nil
}

// checkReachable fails fast, with what to do, when the API server does not answer.
func checkReachable(cfg *rest.Config) error {
	c := rest.CopyConfig(cfg)
	c.Timeout = 5 * time.Second
	client, err := rest.UnversionedRESTClientFor(withCodec(c))
	if err != nil {
		return err
	}
	if err := client.Get().AbsPath("/version").Do(context.Background()).Error(); err != nil {
		return unreachableError(fmt.Errorf("the cluster at %s cannot be reached: %w; is it running? (a local one: `kind create cluster`, or `make cluster` in a luaop checkout)", cfg.Host, err))
	}
	return nil
}

// healthz answers with the probes' results: 200 when all succeeded, 500 otherwise
// (the kubelet reads the status code, not the body).
func healthz(probe func(context.Context) (map[string]any, bool)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		results, healthy := probe(r.Context())
		w.Header().Set("Content-Type", "application/json")
		if !healthy {
			w.WriteHeader(http.StatusInternalServerError)
		}
		_ = json.NewEncoder(w).Encode(results)
	}
}

// withStuckStates adds to the probes' results the Lua calls holding their state past
// their deadline (luabind.Runtime.Stuck): while there is one, /healthz answers 500
// (a goroutine nothing can stop: only a restart gets its CPU and memory back; the
// runtime replaced its state meanwhile, so the other objects are served).
func withStuckStates(probe func(context.Context) (map[string]any, bool), stuck func() []luabind.StuckCall) func(context.Context) (map[string]any, bool) {
	return func(ctx context.Context) (map[string]any, bool) {
		results, healthy := probe(ctx)
		calls := stuck()
		if len(calls) == 0 {
			return results, healthy
		}
		out := make(map[string]any, len(results)+1)
		for k, v := range results {
			out[k] = v
		}
		msgs := make([]string, len(calls))
		for i, c := range calls {
			msgs[i] = c.String()
		}
		out["luaop.lua"] = map[string]any{"error": strings.Join(msgs, "; ")}
		return out, false
	}
}

// serveEndpoints serves /healthz, /readyz and /debug on --health-address and
// /metrics on --metrics-address (kubebuilder's split: probes and metrics apart, so
// that each can be exposed on its own); one server when both are the same. It
// listens before it returns: an address it cannot listen on is an error (a probe
// or a scrape that never answers would only show as restarts or a missing target).
//
// With --metrics-secure, /metrics is served over HTTPS (the certificate of
// --metrics-cert-dir, else a self-signed one renewed before it expires) to clients
// whose bearer token kube's API server authenticates and authorizes for get on
// /metrics, as controller-runtime's secure metrics. /debug and Go's profiles answer
// loopback clients only (kubectl port-forward arrives on the pod's loopback): they
// show object names and handler messages, the probes nothing but ok.
func serveEndpoints(ctx context.Context, log *slog.Logger, s settings, op *operator.Operator, m *metrics.Metrics, elector *leader.Elector, webhooks *admission.Webhooks, peer *peering.Peering, kube kubernetes.Interface, shards *sharding.Sharding) error {
	var healthLn, metricsLn net.Listener
	var err error
	if s.HealthAddress != "" {
		if healthLn, err = listen("/healthz, /readyz and /debug", "health-address", s.HealthAddress); err != nil {
			return err
		}
	}
	if s.MetricsAddress != "" && s.MetricsAddress != s.HealthAddress {
		if metricsLn, err = listen("/metrics", "metrics-address", s.MetricsAddress); err != nil {
			if healthLn != nil {
				_ = healthLn.Close()
			}
			return err
		}
	}
	if metricsLn != nil && s.MetricsSecure {
		if metricsLn, err = secureListener(ctx, metricsLn, s.MetricsCertDir, s.EnableHTTP2, m, log); err != nil {
			return err
		}
	}
	if healthLn != nil {
		health := healthMux(op, elector, webhooks, peer, s.ProbesAffectLiveness, shards)
		if s.Profiles {
			serveProfiles(health)
		}
		if s.MetricsAddress == s.HealthAddress {
			health.Handle("/metrics", m.Handler())
		}
		go serve(ctx, log, "health endpoint", healthLn, loopbackOnly(health, "/debug"))
	}
	if metricsLn != nil {
		mux := http.NewServeMux()
		var h http.Handler = m.Handler()
		if s.MetricsSecure {
			h = kubeauth.New(kubeauth.Options{Client: kube, Logger: log}).Wrap(h)
		}
		mux.Handle("/metrics", h)
		what := "metrics endpoint"
		if s.MetricsSecure {
			what = "metrics endpoint (HTTPS, authenticated and authorized by the API server)"
		}
		go serve(ctx, log, what, metricsLn, mux)
	}
	return nil
}

// secureListener serves ln over TLS with the certificate of dir (tls.crt, tls.key,
// read again when they change), else a self-signed one renewed before it expires.
// HTTP/2 only with enableHTTP2 (--enable-http2): the protocols the TLS handshake offers.
// Its certificate's expiry is reported to m (nil: not reported).
func secureListener(ctx context.Context, ln net.Listener, dir string, enableHTTP2 bool, m *metrics.Metrics, log *slog.Logger) (net.Listener, error) {
	var certs *admission.Certificates
	var err error
	if dir != "" {
		certs, err = admission.LoadCertificates(dir)
	} else {
		host, _ := os.Hostname()
		certs, err = admission.NewGeneratedCertificates([]string{host}, admission.CertOptions{Logger: log})
	}
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("the certificate of /metrics (--metrics-secure): %w", err)
	}
	go certs.Run(ctx)
	if m != nil {
		m.Certificate("metrics", certs.NotAfter)
	}
	protos := []string{"http/1.1"}
	if enableHTTP2 {
		protos = []string{"h2", "http/1.1"}
	}
	return tls.NewListener(ln, &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: protos}), nil
}

// loopbackOnly answers the paths under prefix to loopback clients only.
func loopbackOnly(next http.Handler, prefix string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, prefix) && !fromLoopback(r) {
			http.Error(w, "Forbidden: "+r.URL.Path+" answers loopback clients only: kubectl -n NAMESPACE port-forward pod/POD 8080, then luaop status", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// listen listens on the address of --flag, serving what.
func listen(what, flag, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot serve %s on --%s=%s: %w; is another process (another luaop?) using that port? "+
			"Stop it, or give another --%s (an empty one turns it off)", what, flag, addr, err, flag)
	}
	return ln, nil
}

func healthMux(op *operator.Operator, elector *leader.Elector, webhooks *admission.Webhooks, peer *peering.Peering, probesAffectLiveness bool, shards *sharding.Sharding) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug", debugHandler(op.Debug, func() string {
		switch {
		case elector == nil:
			return ""
		case elector.IsLeader():
			return "leader"
		}
		return "standby"
	}, func(doc *debugDoc) {
		if peer != nil {
			st := peer.State()
			doc.Peering = &st
		}
		if webhooks != nil {
			doc.Webhooks = webhooksDebug(webhooks)
		}
		if shards != nil {
			st := shards.State()
			doc.Sharding = &st
		}
	}))
	// The on.probe handlers' results (kopf's probes) decide readiness: a failing
	// dependency takes the pod out of the Services (the webhooks') without
	// restarting every replica. With --probes-affect-liveness they decide /healthz
	// too, as kopf's liveness endpoint: the kubelet then restarts the pod. Probe
	// bounds them by its probe deadline (800ms, below the kubelet's 1s default)
	// under the request's context: a probe that does not finish in time is reported
	// as failed, and the answer never waits behind object handlers. A failed probe
	// answers 500 (/healthz) or 503 (/readyz): the kubelet reads the status code.
	// A Lua call holding its state past its deadline fails /healthz whatever the
	// flag (withStuckStates): only a restart gets its goroutine back.
	liveness := alive
	if probesAffectLiveness {
		liveness = op.Probe
	}
	mux.HandleFunc("/healthz", healthz(withStuckStates(liveness, op.Runtime().Stuck)))
	mux.HandleFunc("/readyz", readyz(op, elector, webhooks, peer))
	return mux
}

// readyz answers /readyz. A pod serving scripts is ready even when its scripts
// folder fails to load (a broken ConfigMap edit, or a start on broken scripts
// served from the last good ones): it handles objects and answers admission
// reviews with the scripts it serves, and taking every replica out of the
// Service's endpoints for an edit would make the webhooks fail. The body says so
// ("degraded: ..." with the file:line), as do /debug, the log and the gauge
// luaop_scripts_reload_failed, which an alert watches. A pod with no scripts
// serving (a start on broken scripts and no last good ones) is unready, with the
// error.
//
// An operator paused by peering is ready ("ok (paused: ...)") unless an on.probe
// handler fails: it holds the scripts and serves admission reviews, as a standby
// does. When the webhooks are called at a URL naming this process and the
// reachability probe failed, it is not ready (the API server cannot call it);
// through a Service the probe's failure is a "degraded" note only: a pod is an
// endpoint of its Service once ready, and its readiness must not wait for a probe
// that needs a ready endpoint.
func readyz(op *operator.Operator, elector *leader.Elector, webhooks *admission.Webhooks, peer *peering.Peering) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		loaded, lastGood, failed := op.ScriptsState()
		if !loaded {
			msg := "not ready: scripts not loaded"
			if failed != nil {
				msg = "not ready: the scripts do not load and there are no last good scripts to serve: " + failed.Error() +
					"\nfix the scripts (their ConfigMap): they are loaded without a restart"
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		var note string
		if failed != nil {
			serving := "the previous scripts keep serving"
			if lastGood {
				serving = "the last good scripts kept by the operator are serving"
			}
			note = fmt.Sprintf("degraded: the mounted scripts do not load (%v); %s\n", failed, serving)
		}
		if webhooks != nil && !webhooks.Ready() {
			// The Service sends admission reviews to ready pods only.
			http.Error(w, "not ready: the webhook server is not serving yet", http.StatusServiceUnavailable)
			return
		}
		// The scripts' on.probe handlers (a standby's and a paused operator's too:
		// they serve the webhooks).
		if results, healthy := op.Probe(r.Context()); !healthy {
			body, _ := json.Marshal(results)
			http.Error(w, "not ready: an on.probe handler failed: "+string(body), http.StatusServiceUnavailable)
			return
		}
		if peer != nil {
			// Paused, it owns no webhook configuration: their reachability is the
			// working operator's business.
			if st := peer.State(); st.Paused {
				fmt.Fprintf(w, "ok (paused: %s)\nscripts %s\n%s", st.Reason, op.Runtime().Hash(), note)
				return
			}
		}
		if webhooks != nil {
			if reach := webhooks.Reachability(); reach.Checked && !reach.Reachable {
				if !webhooks.ByService() {
					http.Error(w, "not ready: "+reach.Error, http.StatusServiceUnavailable)
					return
				}
				note += "degraded: " + reach.Error + "\n"
			}
		}
		if elector != nil && !elector.IsLeader() {
			// A standby is ready: it holds the scripts and waits for the lease; a
			// rollout must not stall on it.
			fmt.Fprintf(w, "ok (standby)\nscripts %s\n%s", op.Runtime().Hash(), note)
			return
		}
		if !op.Ready() {
			http.Error(w, "not ready: initial listing not processed", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ok\nscripts %s\n%s", op.Runtime().Hash(), note)
	}
}

// alive is /healthz without --probes-affect-liveness: the process serves.
func alive(context.Context) (map[string]any, bool) { return map[string]any{"status": "alive"}, true }

// serve serves mux on ln until ctx is done.
func serve(ctx context.Context, log *slog.Logger, what string, ln net.Listener, h http.Handler) {
	// The server's own errors (a client speaking HTTP to the HTTPS port, ...) go
	// to the operator's log at debug level, not to stderr.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	log.Info("serving "+what, "address", ln.Addr().String())
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error(what+" stopped", "error", err)
	}
}

// statusField is the status field of the operator's bookkeeping with status storage:
// "luaop.dev" -> status.luaop_dev (dots would make nested fields).
func statusField(prefix string) string { return strings.ReplaceAll(prefix, ".", "_") }

func newStubsCommand() *cobra.Command {
	var output, luacheckrc, luarc, schemaFile string
	cmd := &cobra.Command{
		Use:   "stubs",
		Short: "Write the Lua Language Server definitions of the luaop API (completion and types in editors)",
		Long: `Write a ---@meta definitions file for the Lua Language Server. Keep it outside the
scripts folder (a .lua file there would be loaded as a handler script) and list its
folder in your editor's Lua.workspace.library setting.

With --luarc FILE it also writes a .luarc.json for the Lua Language Server: Lua 5.1
(not its default 5.4, which accepts //, utf8 and integer division), the libraries the
sandbox lacks disabled (io, debug, coroutine, package; os with only time, date and
clock, declared in the definitions), and the folder of -o as its workspace library.
Put it as .luarc.json in the scripts folder.

With --luacheckrc FILE it also writes a luacheck configuration describing the sandbox
(Lua 5.1, exactly the globals luaop's scripts see), so that luacheck (Debian's
lua-check) agrees with luaop: put it as .luacheckrc in the scripts folder or above.

With --schema FILE it also writes the JSON Schema of luaop test's files: a test file
whose first line is "# yaml-language-server: $schema=FILE" (relative to it) is then
completed and checked by yaml-language-server (VS Code's YAML extension).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			stubs := luabind.Stubs()
			if luacheckrc != "" {
				if err := writeFileMkdir(luacheckrc, luabind.Luacheckrc()); err != nil {
					return err
				}
			}
			if luarc != "" {
				stubs = luabind.StubsWithSandbox()
				library := ""
				if output != "" && output != "-" {
					abs, err := filepath.Abs(filepath.Dir(output))
					if err != nil {
						return err
					}
					library = abs
				}
				if err := writeFileMkdir(luarc, luabind.Luarc(library)); err != nil {
					return err
				}
			}
			if schemaFile != "" {
				if err := writeFileMkdir(schemaFile, scripttest.Schema()); err != nil {
					return err
				}
			}
			if output == "" || output == "-" {
				_, err := fmt.Fprint(cmd.OutOrStdout(), stubs)
				return err
			}
			return writeFileMkdir(output, stubs)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "file to write (default: standard output)")
	cmd.Flags().StringVar(&luacheckrc, "luacheckrc", "", "also write a .luacheckrc describing the sandbox to this file")
	cmd.Flags().StringVar(&luarc, "luarc", "", "also write a .luarc.json (Lua Language Server: Lua 5.1, the sandbox's libraries, the stubs' folder as library) to this file")
	cmd.Flags().StringVar(&schemaFile, "schema", "", "also write the JSON Schema of luaop test's files to this file")
	return cmd
}

// writeFileMkdir writes a file, creating its folder when missing.
func writeFileMkdir(file, content string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("creating the folder of %s: %w", file, err)
	}
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

// probeCache maps --probe-cache to operator.Options.ProbeCache, where 0 means the
// default and a negative value disables the cache.
func probeCache(s settings) time.Duration {
	if s.ProbeCache == 0 {
		return -1
	}
	return s.ProbeCache
}

// devView is the dev view as the reload shows itself there: after the scripts
// that loaded, where the API server is to call their admission handlers.
type devView struct {
	view     *devloop.View
	webhooks *admission.Webhooks // nil without webhooks
	rt       *luabind.Runtime
}

func (d devView) Loaded(dir string, report luabind.LoadReport) {
	d.view.Loaded(dir, report)
	d.noteWebhooks()
}

func (d devView) Reloaded(ev reloading.Event) {
	d.view.Reloaded(ev)
	if ev.Err == nil {
		d.noteWebhooks()
	}
}

func (d devView) noteWebhooks() {
	if d.webhooks != nil && len(d.rt.AdmissionHandlers()) > 0 {
		webhooksNote(d.view, d.webhooks, d.rt)
	}
}

// webhooksNote tells in the dev view where the API server is to call the admission
// handlers (the probe's outcome follows: reachabilityReport), or, loudly, why it
// cannot.
func webhooksNote(view *devloop.View, w *admission.Webhooks, rt *luabind.Runtime) {
	if why := w.Unreachable(); why != "" {
		view.Note(false, "webhooks: "+why)
		return
	}
	where := strings.TrimSuffix(w.URL("/"), "/")
	if w.ByService() {
		where = "Service " + w.ByServiceName()
	}
	found := ""
	if how := w.Endpoint().How; how != "" {
		found = " (" + how + ")"
	}
	n := len(rt.AdmissionHandlers())
	view.Note(true, fmt.Sprintf("webhooks: %d admission handler(s) served at %s%s; checking that the API server reaches them", n, where, found))
}
