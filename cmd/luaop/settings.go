package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/peering"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/scriptwatch"
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
	LuaMemoryBudget    int64 // bytes; 0: luabind's default; -1: off
	ConsistencyTimeout time.Duration
	DefaultBackoff     time.Duration
	LogFormat          string
	LogLevel           string
	// Verbosity is kubectl's -v N (klog's): client-go's messages up to V(N) are
	// logged (6: every request's URL, 8: bodies); 4 or more is debug level.
	Verbosity       int
	HealthAddress   string
	MetricsAddress  string
	ProbeCache      time.Duration
	PostEvents      bool
	LogEvents       string
	ShutdownGrace   time.Duration
	ReloadDebounce  time.Duration
	RetryOnReload   bool
	Plain           bool // luaop dev --plain: lines, not the screen
	Profiles        bool
	LeaderElect     bool
	LeaderNamespace string
	LeaderName      string
	// LeaseDuration, RenewDeadline and RetryPeriod time the leader election
	// (controller-runtime's and client-go's defaults: 15s, 10s, 2s).
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// QPS and Burst limit the requests to the API server (client-go's rate
	// limiter): the framework's and the scripts' together.
	QPS   float64
	Burst int
	// MetricsSecure serves /metrics over HTTPS to authenticated and authorized
	// clients only (TokenReview and SubjectAccessReview), as controller-runtime's
	// secure metrics; MetricsCertDir holds its certificate (empty: generated).
	MetricsSecure  bool
	MetricsCertDir string
	// EnableHTTP2 lets the webhook and secure metrics servers speak HTTP/2 (off:
	// admission.Options.EnableHTTP2 says why).
	EnableHTTP2 bool
	// ProbesAffectLiveness makes /healthz run the on.probe handlers (kopf's
	// liveness probes); by default they decide /readyz only.
	ProbesAffectLiveness bool
	DryRun               bool
	Apply                []string
	WebhookAddress       string
	WebhookCertDir       string
	WebhookClientCA      string
	WebhookService       string
	WebhookURL           string
	WebhookCleanup       bool
	ScriptsConfigMap     string // namespace/name
	ScriptsWebhook       bool
	// ScriptsFromAPI: the scripts ConfigMap is also read through the API, so that
	// an edit is loaded at once rather than when the kubelet updates the folder.
	ScriptsFromAPI    bool
	LastGoodConfigMap string // a name in ScriptsConfigMap's namespace; "none": off
	// AllowContexts are the kubeconfig contexts luaop dev may use although they are
	// not local clusters (clusterguard.go).
	AllowContexts []string
	// Peering (peers.go): off with Standalone.
	Standalone           bool
	Priority             int
	PeeringNamespace     string
	PeeringLeaseDuration time.Duration
	// Sharding across replicas (scaleout.go; not --shards, the Lua states).
	ScaleOut shardSettings
	// Warnings are LUAOP_* variables that look like misspelled settings: logged at start.
	Warnings []string
}

// addClusterFlags declares how a command reaches the cluster and which namespaces it
// serves, with kubectl's spellings: --kubeconfig, --context, -n (repeatable; also
// --namespace) and -A.
func addClusterFlags(fs *pflag.FlagSet) {
	fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, a list of files merged as kubectl does, then ~/.kube/config, then in-cluster)")
	fs.String("context", "", "kubeconfig context to use (default: its current context)")
	fs.StringSliceP("namespaces", "n", nil, "namespaces to serve, repeatable or comma-separated (also --namespace): names, globs (team-*), exclusions (!kube-*); none means cluster-wide")
	fs.BoolP("all-namespaces", "A", false, "serve every namespace (overrides namespaces from LUAOP_NAMESPACES or the config file)")
	fs.SetNormalizeFunc(normalizeFlagName)
}

// flagAliases are the spellings of other tools accepted for luaop's flags:
// kubectl's --namespace, controller-runtime's (kubebuilder's main.go) and
// component-base's leader-election and client flags. An alias is the same flag: it
// is shown once, under luaop's name, and its LUAOP_* variable and config key are
// luaop's.
var flagAliases = map[string]string{
	"namespace":                       "namespaces",
	"metrics-bind-address":            "metrics-address",
	"health-probe-bind-address":       "health-address",
	"leader-elect-resource-namespace": "leader-election-namespace",
	"leader-elect-resource-name":      "leader-election-name",
	"leader-election-id":              "leader-election-name",
	"kubeconfig-context":              "context",
}

func normalizeFlagName(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	if canonical, ok := flagAliases[name]; ok {
		name = canonical
	}
	return pflag.NormalizedName(name)
}

// verbosityFlag is kubectl's -v N (klog's -v) on a flag that, given alone (-v), is
// kopf's --verbose: debug level, as -v=4.
type verbosityFlag struct{ level *int }

// verboseAlone is the level of -v given without a number: debug.
const verboseAlone = 4

func (f verbosityFlag) String() string {
	if f.level == nil {
		return "0"
	}
	return strconv.Itoa(*f.level)
}

func (f verbosityFlag) Set(v string) error {
	n, err := parseVerbosity(v)
	if err != nil {
		return err
	}
	*f.level = n
	return nil
}

func (verbosityFlag) Type() string { return "N" }

// verboseFlag gives cmd the -v/--verbose of every luaop command: more output, -v
// alone or -v N as kubectl takes it (any N > 0 is "more" where there are no levels;
// luaop run and dev log at debug level from 4, client-go's requests from 6).
func verboseFlag(cmd *cobra.Command, level *int, more string) {
	f := cmd.Flags().VarPF(verbosityFlag{level}, "verbose", "v", "say more, as everywhere in luaop (-v alone or -v N, kubectl's levels): "+more)
	f.NoOptDefVal = strconv.Itoa(verboseAlone)
}

// parseVerbosity reads a verbosity: a whole number of at least 0, or true (4) and
// false (0) as LUAOP_VERBOSE=true and "verbose: true" in a config file had it.
func parseVerbosity(v string) (int, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true":
		return verboseAlone, nil
	case "false", "":
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a verbosity: use a whole number of at least 0 (kubectl's -v: 4 debug, 6 requests, 8 request bodies)", v)
	}
	return n, nil
}

// addOperatorFlags declares the settings shared by dev and run, with their defaults.
func addOperatorFlags(fs *pflag.FlagSet, logFormat string) {
	addClusterFlags(fs)
	fs.Int("workers", 16, "objects processed at once (at least 1)")
	fs.Int("shards", 0, "Lua states running handlers in parallel (0: one per CPU)")
	fs.String("prefix", "luaop.dev", "prefix of the annotations and the finalizer this operator writes (a DNS subdomain; two operators on the same objects need different ones)")
	fs.String("progress-storage", string(processing.StorageAuto), "where handler progress is kept: auto (per resource: status when the CRD has a status subresource whose schema keeps unknown fields, else annotations), annotations or status")
	fs.String("diffbase-storage", string(processing.StorageAuto), "where the last handled state is kept: auto, annotations or status (status for both makes one /status patch per handled change)")
	fs.String("lifecycle", "asap", "handlers run per cycle: asap (one, fewest retries first), one-by-one, all-at-once, randomized (one, at random), shuffled (all, in a random order)")
	fs.Duration("handler-timeout", luabind.DefaultHandlerTimeout, "deadline of one Lua handler call, script loading and compiling included (> 0; luaop test and luaop check hold the scripts to the same default)")
	fs.String("lua-memory-budget", "auto", "heap the operator may reach while Lua runs; the Lua call running longest when it is passed fails with \"memory budget exceeded\" and is retried: auto (half of GOMEMLIMIT, else half of the container's memory limit, else 1Gi), a size (512Mi, 1G) or off")
	fs.Duration("consistency-timeout", 5*time.Second, "how long change handlers wait for the operator's own last patch to come back through the watch (> 0)")
	fs.Duration("default-backoff", handling.DefaultBackoff, "how long a handler that failed with an arbitrary error waits before its retry, unless it sets its own backoff (> 0; kopf's settings.execution.default_backoff)")
	fs.String("log-format", logFormat, "log format: plain or json")
	fs.String("log-level", "info", "log level: debug, info, warn, error")
	level := 0
	verbose := fs.VarPF(verbosityFlag{&level}, "verbose", "v", "log verbosity as kubectl's -v N: 4 (or -v alone, as kopf's --verbose) is debug level, 6 adds client-go's request URLs, 8 their bodies")
	verbose.NoOptDefVal = strconv.Itoa(verboseAlone)
	fs.Bool("debug", false, "kopf's --debug: debug level and client-go's requests (-v=6)")
	fs.BoolP("quiet", "q", false, "log warnings and errors only (--log-level=warn)")
	fs.String("health-address", ":8080", "address of /healthz, /readyz and /debug, host:port (empty: off; also --health-probe-bind-address). /debug and Go's profiles answer loopback clients only (kubectl port-forward)")
	fs.String("metrics-address", ":9090", "address of /metrics for Prometheus, host:port (empty: off; the same as --health-address: one server for both, without --metrics-secure; also --metrics-bind-address)")
	fs.Bool("metrics-secure", true, "serve /metrics over HTTPS to clients whose bearer token the API server authenticates (TokenReview) and authorizes for get on /metrics (SubjectAccessReview), as controller-runtime's secure metrics; false: plain HTTP to anyone who reaches it")
	fs.Bool("enable-http2", false, "let clients of the webhook and secure metrics servers speak HTTP/2; off by default since the 2023 HTTP/2 rapid-reset advisories (CVE-2023-44487), as kubebuilder's scaffold")
	fs.String("metrics-cert-dir", "", "folder with tls.crt and tls.key for --metrics-secure (read again when they change); empty: a self-signed certificate, renewed before it expires")
	fs.Bool("probes-affect-liveness", false, "run the on.probe handlers for /healthz too (kopf's liveness probes: a failing probe restarts the pod); by default they decide /readyz only, so that a flaky dependency takes the pod out of the Service without restarting every replica")
	fs.Float64("kube-api-qps", 500, "requests per second to the API server the operator may make in the long run, the framework's and the scripts' together (client-go's rate limiter)")
	fs.Int("kube-api-burst", 1000, "requests above --kube-api-qps allowed in a burst")
	fs.Duration("probe-cache", 10*time.Second, "how long /healthz reuses the results of successful on.probe handlers before running them again (0: run them on every request)")
	fs.Bool("profiles", false, "serve Go's profiles on --health-address at /debug/pprof/heap, allocs, goroutine and profile?seconds=N (off by default: they show the process's memory), for go tool pprof")
	fs.Bool("post-events", true, "post Kubernetes Events: handler outcomes and the scripts' luaop.info/warn/exception (rate-limited per object)")
	fs.String("log-events-level", "none", "ctx.logger messages at this level or above are also posted as Events of the object: debug, info, warning, error or none (kopf's default: none; needs --post-events)")
	fs.Bool("leader-elect", false, "run several replicas: only the holder of a coordination.k8s.io Lease handles objects, the others stand by")
	fs.String("leader-election-namespace", "", "namespace of the Lease (default: the pod's own namespace)")
	fs.String("leader-election-name", "luaop", "name of the Lease; operators sharing one take turns")
	fs.Duration("leader-elect-lease-duration", 15*time.Second, "how long standbys wait after the leader's last renewal before taking the Lease over (whole seconds, at least 1s)")
	fs.Duration("leader-elect-renew-deadline", 10*time.Second, "how long the leader tries to renew before it gives the leadership up (less than the lease duration)")
	fs.Duration("leader-elect-retry-period", 2*time.Second, "how often to try to acquire or renew the Lease (the renew deadline must exceed 1.2 times it)")
	addShardFlags(fs)
	fs.Bool("retry-on-reload", false, "after a reload, retry at once the handlers waiting in their backoff after an error whose code the reload changed (on in luaop dev; off in luaop run: a production reload must not retry every failing handler at once)")
	fs.Duration("reload-debounce", scriptwatch.DefaultDebounce, "quiet time after a file event before the scripts folder is read again and reloaded (> 0): raise it for editors or file systems that write a file in several pauses")
	fs.Duration("shutdown-grace-period", 20*time.Second, "on SIGTERM, how long running handlers and daemons may take to finish before they are cancelled (> 0)")
	fs.String("webhook-address", "", "address of the HTTPS server of the validate and mutate handlers, host:port (\":9443\"; empty: off)")
	fs.String("webhook-cert-dir", "", "folder with tls.crt, tls.key and optionally ca.crt (cert-manager, a mounted Secret); empty: a CA and a certificate are generated at start")
	fs.String("webhook-client-ca", "", "PEM file of the CAs of the client certificates the API server may present; a verified one reaches admission handlers as ctx.sslpeer (kopf's cafile); empty: none is asked for")
	fs.String("webhook-service", "", "namespace/name of the Service the API server calls the webhooks through (in-cluster); empty: --webhook-url")
	fs.String("webhook-url", "", "https base URL the API server calls the webhooks at; empty: https://127.0.0.1:<port> (a control plane on this machine)")
	fs.Bool("webhook-cleanup", false, "delete the webhook configurations when the operator stops")
	fs.String("scripts-configmap", "", "namespace/name of the ConfigMap the scripts folder is mounted from: its edits are read through the API (--scripts-from-api), with --webhook-address its updates are validated (scripts that do not load are rejected with file:line), and the last good scripts are kept next to it for a start on broken scripts")
	fs.Bool("scripts-from-api", true, "with --scripts-configmap, watch that ConfigMap through the API and load an edit as soon as it is applied (about a second), not when the kubelet updates the mounted folder (about a minute); needs get, list and watch on it (luaop rbac --scripts-configmap). false: the folder alone (no such access), edits a minute later")
	fs.Bool("scripts-webhook", true, "with --scripts-configmap and --webhook-address, validate the updates of the scripts ConfigMap (false: opt out; always off in luaop dev)")
	fs.String("last-good-configmap", "", "ConfigMap (in --scripts-configmap's namespace) where the operator keeps the last scripts that loaded (default: <name>-last-good; none: keep none)")
	fs.StringSlice("allow-context", nil, "luaop dev: a kubeconfig context it may use although it is not a local cluster (kind-*, k3d-*, minikube, docker-desktop, a server on this machine); repeatable (Tilt's allow_k8s_contexts); --context NAME also allows NAME")
	fs.Bool("standalone", false, "no peering: do not coordinate with other operators of the same --prefix (kopf's --standalone)")
	fs.Int("priority", 0, "peering priority: of the operators of one --prefix serving the same resources, those with a lower priority pause while a higher one runs (luaop dev: 666, luaop run: 0); equal priorities both pause")
	fs.String("peering-namespace", "", "namespace of the peering Leases, the same for every operator that should coordinate (default: the pod's own namespace, else "+peering.DefaultNamespace+")")
	fs.Duration("peering-lease-duration", peering.DefaultLeaseDuration, "how long an operator that stopped renewing its peering Lease (killed) still counts as running (whole seconds)")
	fs.Bool("dry-run", false, "run the handlers against the cluster but write nothing: patches, finalizer changes, the scripts' luaop.kube writes and Events are logged as they would have been sent (reads still go to the cluster; no leader election)")
}

// notSettings are flags that are not keys of the config file.
var notSettings = []string{"help", "config", "version"}

// loadSettings binds the command's flags, the LUAOP_* environment and the config file
// (--config or LUAOP_CONFIG) into settings. Only the settings the command declares as
// flags are read; the config file may hold no other key. Every invalid value is
// reported, naming where it came from and what is allowed.
func loadSettings(cmd *cobra.Command, v *viper.Viper) (settings, error) {
	s, err := readSettings(cmd, v, false)
	return s, usageError(err)
}

// loadSubsetSettings is loadSettings for a command that reads a few of the operator's
// settings (luaop release): the config file (and LUAOP_* variables) of the operator
// may also hold the settings of luaop run and dev, which it ignores; a key that is
// no setting of luaop is still refused, with the nearest one suggested.
func loadSubsetSettings(cmd *cobra.Command, v *viper.Viper) (settings, error) {
	s, err := readSettings(cmd, v, true)
	return s, usageError(err)
}

func readSettings(cmd *cobra.Command, v *viper.Viper, subset bool) (settings, error) {
	fs := cmd.Flags()
	if err := v.BindPFlags(fs); err != nil {
		return settings{}, err
	}
	v.SetEnvPrefix("LUAOP")
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()
	r := &settingsReader{fs: fs, v: v, subset: subset}
	if file := v.GetString("config"); file != "" {
		if err := r.readConfig(file); err != nil {
			return settings{}, err
		}
	}
	var s settings
	// Read in the order the settings were always read (errors come in it; not
	// quite the flags' declaration order: dry-run, kube-api-burst, metrics-secure,
	// reload-debounce are read with their groups).
	for _, read := range []func(*settings){r.readCluster, r.readProcessing, r.readLogging, r.readServing,
		r.readLeaderElection, r.readClientAndMetrics, r.readWebhooksAndScripts, r.readPeering} {
		read(&s)
	}
	if s.DryRun && len(s.Apply) > 0 {
		r.fail("--apply writes to the cluster, --dry-run writes nothing: give one of them")
	}
	s.Warnings = r.envWarnings()
	return s, errors.Join(r.errs...)
}

// readCluster reads how the cluster is reached and which namespaces are served.
func (r *settingsReader) readCluster(s *settings) {
	s.Kubeconfig = r.str("kubeconfig")
	s.Context = r.str("context")
	s.Namespaces = r.namespaces("namespaces")
	if r.bool("all-namespaces") {
		// The higher source wins (flag > LUAOP_* > file); both from one source conflict.
		switch all, ns := r.source("all-namespaces"), r.source("namespaces"); {
		case ns == sourceDefault || all > ns:
			s.Namespaces = nil
		case all == ns:
			r.fail("%s and %s: give one of them (cluster-wide or these namespaces)",
				r.describe("all-namespaces", true), r.describe("namespaces", strings.Join(s.Namespaces, ",")))
		}
	}
}

// readProcessing reads how objects are handled.
func (r *settingsReader) readProcessing(s *settings) {
	s.Workers = r.int("workers", 1, "a whole number of at least 1 (objects processed at once)")
	s.Shards = r.int("shards", 0, "a whole number of at least 0 (0: one Lua state per CPU)")
	s.Prefix = r.prefix("prefix")
	s.ProgressStorage = r.storage("progress-storage")
	s.DiffBaseStorage = r.storage("diffbase-storage")
	s.Lifecycle = r.oneOf("lifecycle", "asap", "one-by-one", "all-at-once", "randomized", "shuffled")
	s.HandlerTimeout = r.duration("handler-timeout", false)
	s.LuaMemoryBudget = r.memoryBudget("lua-memory-budget")
	s.ConsistencyTimeout = r.duration("consistency-timeout", false)
	s.DefaultBackoff = r.duration("default-backoff", false)
}

// readLogging reads the log's format and level.
func (r *settingsReader) readLogging(s *settings) {
	s.LogFormat = r.oneOf("log-format", "plain", "json")
	s.LogLevel = r.logLevel()
	s.Verbosity = r.verbosity
}

// readServing reads the endpoints' addresses, the Events, the shutdown and the
// reload.
func (r *settingsReader) readServing(s *settings) {
	s.HealthAddress = r.address("health-address")
	s.MetricsAddress = r.address("metrics-address")
	s.ProbeCache = r.duration("probe-cache", true)
	s.PostEvents = r.bool("post-events")
	s.Profiles = r.bool("profiles")
	s.LogEvents = r.logEventsLevel("log-events-level")
	s.ShutdownGrace = r.duration("shutdown-grace-period", false)
	s.ReloadDebounce = r.duration("reload-debounce", false)
	s.RetryOnReload = r.bool("retry-on-reload")
	if r.has("plain") {
		s.Plain = r.bool("plain")
	}
}

// readLeaderElection reads the leader election and the sharding across replicas.
func (r *settingsReader) readLeaderElection(s *settings) {
	s.LeaderElect = r.bool("leader-elect")
	s.LeaderNamespace = r.dnsName("leader-election-namespace", true)
	s.LeaderName = r.dnsName("leader-election-name", false)
	s.ScaleOut = readShardSettings(r)
	s.LeaseDuration = r.duration("leader-elect-lease-duration", false)
	s.RenewDeadline = r.duration("leader-elect-renew-deadline", false)
	s.RetryPeriod = r.duration("leader-elect-retry-period", false)
	if !r.has("leader-elect-lease-duration") {
		return
	}
	switch {
	case s.LeaseDuration%time.Second != 0:
		r.invalid("leader-elect-lease-duration", s.LeaseDuration.String(), "a whole number of seconds (the Lease stores seconds), such as 15s")
	case s.RenewDeadline >= s.LeaseDuration && s.RenewDeadline > 0:
		r.fail("%s must be less than %s: the leader stops before a standby may take over",
			r.describe("leader-elect-renew-deadline", s.RenewDeadline.String()), r.describe("leader-elect-lease-duration", s.LeaseDuration.String()))
	case float64(s.RenewDeadline) <= 1.2*float64(s.RetryPeriod) && s.RetryPeriod > 0:
		r.fail("%s must exceed 1.2 times %s (client-go's jitter)",
			r.describe("leader-elect-renew-deadline", s.RenewDeadline.String()), r.describe("leader-elect-retry-period", s.RetryPeriod.String()))
	}
}

// readClientAndMetrics reads the API client's rate limits and how /metrics and
// the probes are served.
func (r *settingsReader) readClientAndMetrics(s *settings) {
	s.QPS = r.float("kube-api-qps")
	s.Burst = r.int("kube-api-burst", 1, "a whole number of at least 1 (requests)")
	s.MetricsSecure = r.bool("metrics-secure")
	s.MetricsCertDir = r.str("metrics-cert-dir")
	s.EnableHTTP2 = r.bool("enable-http2")
	if s.MetricsSecure && s.MetricsAddress != "" && s.MetricsAddress == s.HealthAddress {
		r.fail("%s is %s: with --metrics-secure, /metrics is served over HTTPS and needs an address of its own (the probes stay on plain HTTP); give another --metrics-address, or --metrics-secure=false",
			r.describe("metrics-address", s.MetricsAddress), r.describe("health-address", s.HealthAddress))
	}
	s.ProbesAffectLiveness = r.bool("probes-affect-liveness")
}

// readWebhooksAndScripts reads the dry run, --apply, the admission webhooks and
// the guard of the scripts ConfigMap.
func (r *settingsReader) readWebhooksAndScripts(s *settings) {
	s.DryRun = r.bool("dry-run")
	s.Apply = r.list("apply")
	s.WebhookAddress = r.address("webhook-address")
	s.WebhookCertDir = r.str("webhook-cert-dir")
	s.WebhookClientCA = r.str("webhook-client-ca")
	s.WebhookService = r.namespacedName("webhook-service", "namespace/name of a Service")
	s.WebhookURL = r.str("webhook-url")
	if s.WebhookURL != "" && !strings.HasPrefix(s.WebhookURL, "https://") {
		r.invalid("webhook-url", s.WebhookURL, "an https:// URL the API server reaches")
	}
	s.WebhookCleanup = r.bool("webhook-cleanup")
	s.ScriptsConfigMap = r.namespacedName("scripts-configmap", "namespace/name of a ConfigMap")
	s.ScriptsWebhook = r.bool("scripts-webhook")
	s.ScriptsFromAPI = r.bool("scripts-from-api")
	s.LastGoodConfigMap = r.str("last-good-configmap")
	if s.LastGoodConfigMap == "" {
		if _, name, ok := strings.Cut(s.ScriptsConfigMap, "/"); ok {
			s.LastGoodConfigMap = name + "-last-good"
		}
	}
	for _, p := range s.Apply {
		if _, err := os.Stat(p); err != nil {
			r.invalid("apply", p, "files or folders of YAML manifests ("+err.Error()+")")
		}
	}
}

// readPeering reads luaop dev's allowed contexts and peering.
func (r *settingsReader) readPeering(s *settings) {
	s.AllowContexts = r.list("allow-context")
	s.Standalone = r.bool("standalone")
	s.Priority = r.int("priority", math.MinInt, "a whole number (higher wins)")
	s.PeeringNamespace = r.dnsName("peering-namespace", true)
	s.PeeringLeaseDuration = r.duration("peering-lease-duration", false)
	if r.has("peering-lease-duration") && (s.PeeringLeaseDuration < time.Second || s.PeeringLeaseDuration%time.Second != 0) {
		r.invalid("peering-lease-duration", s.PeeringLeaseDuration.String(), "a whole number of seconds, at least 1s")
	}
}

// settingsReader reads typed settings from viper, collecting what is wrong.
type settingsReader struct {
	fs       *pflag.FlagSet
	v        *viper.Viper
	file     string
	fileKeys map[string]bool
	errs     []error
	subset   bool // the command reads a subset of luaop's settings: ignore the others
	// verbosity is what logLevel read of -v N and --debug.
	verbosity int
}

// Where a setting's value comes from, lowest precedence first.
const (
	sourceDefault = iota
	sourceFile
	sourceEnv
	sourceFlag
)

// source tells where the value of key comes from.
func (r *settingsReader) source(key string) int {
	if f := r.fs.Lookup(key); f != nil && f.Changed {
		return sourceFlag
	}
	if os.Getenv(envName(key)) != "" {
		return sourceEnv
	}
	if r.fileKeys[key] {
		return sourceFile
	}
	return sourceDefault
}

func envName(key string) string {
	return "LUAOP_" + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
}

// luaopKeys are the settings of every luaop command that reads them (run and dev;
// release reads a subset), sorted.
func luaopKeys() []string {
	fs := pflag.NewFlagSet("luaop", pflag.ContinueOnError)
	addOperatorFlags(fs, "plain")
	fs.StringSlice("apply", nil, "")
	var keys []string
	fs.VisitAll(func(f *pflag.Flag) { keys = append(keys, f.Name) })
	slices.Sort(keys)
	return keys
}

func (r *settingsReader) fail(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf(format, args...))
}

// readConfig reads the config file into viper after checking that every key is a
// setting of the command.
func (r *settingsReader) readConfig(file string) error {
	keys := viper.New()
	for _, vp := range []*viper.Viper{keys, r.v} {
		vp.SetConfigFile(file)
		if filepath.Ext(file) == "" {
			vp.SetConfigType("yaml")
		}
	}
	if err := keys.ReadInConfig(); err != nil {
		return fmt.Errorf("reading the config file %s: %w", file, err)
	}
	known := r.known()
	suggest := known
	if r.subset {
		suggest = slices.Compact(slices.Sorted(slices.Values(append(luaopKeys(), known...))))
	}
	r.file, r.fileKeys = file, map[string]bool{}
	var unknown []error
	for key := range keys.AllSettings() {
		r.fileKeys[key] = true
		if slices.Contains(suggest, key) {
			continue // known, or (subset) a setting of luaop run the command ignores
		}
		hint := ""
		if near := closest(key, suggest, max(2, len(key)/3)); near != "" {
			hint = fmt.Sprintf(": did you mean %q?", near)
		}
		unknown = append(unknown, fmt.Errorf("%s: unknown key %q%s", file, key, hint))
	}
	if len(unknown) > 0 {
		slices.SortFunc(unknown, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		unknown = append(unknown, fmt.Errorf("the keys of a config file of luaop %s are its flags: %s", r.commandName(), strings.Join(known, ", ")))
		return errors.Join(unknown...)
	}
	if err := r.v.ReadInConfig(); err != nil {
		return fmt.Errorf("reading the config file %s: %w", file, err)
	}
	return nil
}

func (r *settingsReader) commandName() string {
	name := r.fs.Name()
	if i := strings.LastIndex(name, " "); i >= 0 {
		name = name[i+1:]
	}
	return name
}

// known are the keys of the settings the command has, sorted.
func (r *settingsReader) known() []string {
	var keys []string
	r.fs.VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(notSettings, f.Name) {
			keys = append(keys, f.Name)
		}
	})
	slices.Sort(keys)
	return keys
}

// closest is the known key nearest to a misspelled one within maxDist edits, or "".
func closest(key string, known []string, maxDist int) string {
	norm := strings.ReplaceAll(strings.ToLower(key), "_", "-")
	best, bestDist := "", math.MaxInt
	for _, k := range known {
		if d := editDistance(norm, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if bestDist <= maxDist {
		return best
	}
	return ""
}

// envWarnings names the LUAOP_* variables that look like a misspelled setting
// (LUAOP_WORKRES): viper reads only the exact names, so they would be ignored. Others
// (LUAOP_TEST_KUBECONFIG, the tools' own) are left alone.
func (r *settingsReader) envWarnings() []string {
	known := r.known()
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(name, "LUAOP_")
		if !ok || rest == "CONFIG" {
			continue
		}
		key := strings.ReplaceAll(strings.ToLower(rest), "_", "-")
		if slices.Contains(known, key) || len(key) < 4 || (r.subset && slices.Contains(luaopKeys(), key)) {
			continue
		}
		if near := closest(key, known, 2); near != "" {
			out = append(out, fmt.Sprintf("%s is not a setting of luaop %s and is ignored: did you mean LUAOP_%s?",
				name, r.commandName(), strings.ToUpper(strings.ReplaceAll(near, "-", "_"))))
		}
	}
	slices.Sort(out)
	return out
}

// editDistance is the Levenshtein distance of two strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// has tells whether the command has the setting.
func (r *settingsReader) has(key string) bool { return r.fs.Lookup(key) != nil }

// describe names a setting's value as the user wrote it: --workers=0,
// LUAOP_WORKERS=0, or "workers: 0 in luaop.yaml".
func (r *settingsReader) describe(key string, value any) string {
	if s, ok := value.(string); ok {
		value = strconv.Quote(s)
	}
	if f := r.fs.Lookup(key); f != nil && f.Changed {
		return fmt.Sprintf("--%s=%v", key, value)
	}
	env := "LUAOP_" + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
	if _, ok := os.LookupEnv(env); ok {
		return fmt.Sprintf("%s=%v", env, value)
	}
	if r.fileKeys[key] {
		return fmt.Sprintf("%s: %v in %s", key, value, r.file)
	}
	return fmt.Sprintf("--%s=%v", key, value)
}

// invalid records that key's value is not allowed.
func (r *settingsReader) invalid(key string, value any, allowed string) {
	r.fail("invalid %s: use %s", r.describe(key, value), allowed)
}

// get is the value of a setting, as viper has it; ok is false when the command
// has no such setting.
func (r *settingsReader) get(key string) (raw any, ok bool) {
	if !r.has(key) {
		return nil, false
	}
	return r.v.Get(key), true
}

// numberOf is a number as viper gives it (an int or int64 from a flag or YAML, a
// float64 from YAML or JSON, a string from LUAOP_* or a quoted value: read with
// parse); ok is false for another type, a string parse refuses, or a fraction
// where T is int.
func numberOf[T int | float64](raw any, parse func(string) (T, error)) (T, bool) {
	switch x := raw.(type) {
	case int:
		return T(x), true
	case int64:
		return T(x), true
	case float64:
		// A config file's number, for an int setting: whole and within int64 (a
		// conversion out of range is not defined by Go), else refused with the value
		// as written.
		var zero T
		if _, whole := any(zero).(int); whole && (x != math.Trunc(x) || math.Abs(x) >= 1<<63) {
			return 0, false
		}
		return T(x), true
	case string:
		n, err := parse(strings.TrimSpace(x))
		return n, err == nil
	}
	return 0, false
}

func (r *settingsReader) str(key string) string {
	raw, ok := r.get(key)
	if !ok {
		return ""
	}
	switch x := raw.(type) {
	case nil:
		return ""
	case string:
		return x
	case int, int64, float64, bool:
		return fmt.Sprint(x)
	default:
		r.invalid(key, x, "a string")
		return ""
	}
}

func (r *settingsReader) oneOf(key string, allowed ...string) string {
	s := r.str(key)
	if r.has(key) && !slices.Contains(allowed, s) {
		r.invalid(key, s, strings.Join(allowed[:len(allowed)-1], ", ")+" or "+allowed[len(allowed)-1])
	}
	return s
}

func (r *settingsReader) int(key string, least int, allowed string) int {
	raw, ok := r.get(key)
	if !ok {
		return 0
	}
	n, ok := numberOf(raw, strconv.Atoi)
	if !ok {
		r.invalid(key, raw, allowed)
		return 0
	}
	if n < least {
		r.invalid(key, n, allowed)
	}
	return n
}

func (r *settingsReader) bool(key string) bool {
	raw, ok := r.get(key)
	if !ok {
		return false
	}
	switch x := raw.(type) {
	case bool:
		return x
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(x))
		if err != nil {
			r.invalid(key, x, "true or false")
		}
		return b
	default:
		r.invalid(key, x, "true or false")
		return false
	}
}

// duration reads a duration with a unit ("30s", "1m30s"); zero is allowed only when
// zeroOK, negative values never.
func (r *settingsReader) duration(key string, zeroOK bool) time.Duration {
	raw, ok := r.get(key)
	if !ok {
		return 0
	}
	allowed := "a duration with a unit, greater than 0 (for example 30s, 2m, 1m30s)"
	if zeroOK {
		allowed = "a duration with a unit, 0 or more (for example 0, 10s, 1m)"
	}
	var d time.Duration
	switch x := raw.(type) {
	case time.Duration:
		d = x
	case string:
		var err error
		if d, err = time.ParseDuration(strings.TrimSpace(x)); err != nil {
			r.invalid(key, x, allowed)
			return 0
		}
	case int:
		if x != 0 {
			r.invalid(key, x, allowed+"; a number alone has no unit")
			return 0
		}
	default:
		r.invalid(key, x, allowed)
		return 0
	}
	if d < 0 || (d == 0 && !zeroOK) {
		r.invalid(key, d.String(), allowed)
	}
	return d
}

// list reads a list: a YAML list, or a string of comma-separated items (flags and
// environment variables: LUAOP_NAMESPACES=a,b).
func (r *settingsReader) list(key string) []string {
	raw, ok := r.get(key)
	if !ok {
		return nil
	}
	var items []string
	switch x := raw.(type) {
	case nil:
	case string:
		items = strings.Split(x, ",")
	case []string:
		for _, s := range x {
			items = append(items, strings.Split(s, ",")...)
		}
	case []any:
		for _, e := range x {
			switch e := e.(type) {
			case string:
				items = append(items, e)
			case int, int64, float64:
				items = append(items, fmt.Sprint(e))
			default:
				r.invalid(key, x, "a list of strings")
				return nil
			}
		}
	default:
		r.invalid(key, x, "a list of strings, or one string of comma-separated items")
		return nil
	}
	var out []string
	for _, s := range items {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// namespaces reads namespace patterns: names, path.Match globs, "!" exclusions.
func (r *settingsReader) namespaces(key string) []string {
	patterns := r.list(key)
	for _, p := range patterns {
		name := strings.TrimSpace(strings.TrimPrefix(p, "!"))
		_, globErr := path.Match(name, "")
		switch {
		case name == "" || globErr != nil:
			r.invalid(key, p, "namespace names, globs (team-*) or exclusions (!kube-*)")
		case !strings.ContainsAny(name, `*?[\`) && len(validation.IsDNS1123Label(name)) > 0:
			r.invalid(key, p, "namespace names (lower-case letters, digits and '-'), globs (team-*) or exclusions (!kube-*)")
		}
	}
	return patterns
}

// namespacedName reads namespace/name (empty: none).
func (r *settingsReader) namespacedName(key, allowed string) string {
	v := r.str(key)
	if ns, name, ok := strings.Cut(v, "/"); v != "" && (!ok || ns == "" || name == "") {
		r.invalid(key, v, allowed)
	}
	return v
}

func (r *settingsReader) prefix(key string) string {
	p := r.str(key)
	if r.has(key) && len(validation.IsDNS1123Subdomain(p)) > 0 {
		r.invalid(key, p, "a DNS subdomain (lower-case letters, digits, '-' and '.', such as luaop.dev or team-a.example.com): it prefixes the annotations and the finalizer")
	}
	return p
}

func (r *settingsReader) dnsName(key string, emptyOK bool) string {
	n := r.str(key)
	if !r.has(key) || (n == "" && emptyOK) {
		return n
	}
	if len(validation.IsDNS1123Subdomain(n)) > 0 {
		r.invalid(key, n, "a Kubernetes object name (lower-case letters, digits, '-' and '.')")
	}
	return n
}

func (r *settingsReader) storage(key string) string {
	s := r.str(key)
	if r.has(key) {
		if _, err := processing.ParseStorageMode(s); err != nil {
			r.invalid(key, s, "auto, annotations or status")
		}
	}
	return s
}

func (r *settingsReader) logEventsLevel(key string) string {
	s := r.str(key)
	if r.has(key) {
		if _, _, err := luabind.ParseLogEventsLevel(s); err != nil {
			r.invalid(key, s, "debug, info, warning, error or none")
		}
	}
	return s
}

// logLevel reads --log-level, and -v/--verbose and -q/--quiet that stand for it.
func (r *settingsReader) logLevel() string {
	if !r.has("log-level") {
		return ""
	}
	level := strings.ToLower(r.str("log-level"))
	switch level {
	case "debug", "info", "warn", "error":
	case "warning":
		level = "warn"
	default:
		r.invalid("log-level", r.str("log-level"), "debug, info, warn or error")
	}
	// The higher source wins (flag > LUAOP_* > file > default); two of them from one
	// source conflict.
	// -v N below 4 only adds client-go's messages up to V(N): the level stays.
	r.verbosity = r.verbosityOf("verbose")
	if r.bool("debug") && r.verbosity < 6 {
		r.verbosity = 6
	}
	verbose, quiet := r.verbosity >= verboseAlone, r.bool("quiet")
	vkey := "verbose"
	if r.bool("debug") && r.source("debug") >= r.source("verbose") {
		vkey = "debug"
	}
	short, shortKey := "", ""
	switch vs, qs := r.source(vkey), r.source("quiet"); {
	case verbose && quiet && vs == qs:
		r.fail("%s and %s: give one of them", r.describe(vkey, unquoted(fmt.Sprint(r.v.Get(vkey)))), r.describe("quiet", true))
		return level
	case verbose && (!quiet || vs > qs):
		short, shortKey = "debug", vkey
	case quiet:
		short, shortKey = "warn", "quiet"
		r.verbosity = 0
	}
	if short == "" {
		return level
	}
	switch ls, ss := r.source("log-level"), r.source(shortKey); {
	case ls == ss:
		r.fail("%s and %s: give one of them", r.describe("log-level", r.str("log-level")), r.describe(shortKey, unquoted(fmt.Sprint(r.v.Get(shortKey)))))
	case ss > ls:
		level = short
	default:
		r.verbosity = 0 // --log-level wins over the file's verbose
	}
	return level
}

// unquoted is a value describe writes as it is (a number or true given as text).
type unquoted string

// verbosityOf reads a verbosity (-v N, LUAOP_VERBOSE=N, verbose: N; true is 4).
func (r *settingsReader) verbosityOf(key string) int {
	raw, ok := r.get(key)
	if !ok {
		return 0
	}
	if b, isBool := raw.(bool); isBool {
		if b {
			return verboseAlone
		}
		return 0
	}
	if n, ok := numberOf(raw, parseVerbosity); ok && n >= 0 {
		return n
	}
	r.invalid(key, raw, "a whole number of at least 0 (kubectl's -v: 4 debug, 6 requests, 8 request bodies), or true (4)")
	return 0
}

// float reads a number of at least 0.
func (r *settingsReader) float(key string) float64 {
	raw, ok := r.get(key)
	if !ok {
		return 0
	}
	f, ok := numberOf(raw, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
	if !ok {
		r.invalid(key, raw, "a number greater than 0")
		return 0
	}
	if f <= 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		r.invalid(key, f, "a number greater than 0")
	}
	return f
}

// memoryBudget reads auto (0), off (-1) or a Kubernetes quantity of bytes.
func (r *settingsReader) memoryBudget(key string) int64 {
	v := strings.TrimSpace(r.str(key))
	switch v {
	case "", "auto":
		return 0
	case "off":
		return -1
	}
	q, err := resource.ParseQuantity(v)
	if n, ok := q.AsInt64(); err != nil || !ok || n < 16<<20 {
		r.invalid(key, v, "auto, off or a size of at least 16Mi (512Mi, 1Gi, 2G)")
		return 0
	}
	return q.Value()
}

// address reads a listen address: host:port, :port, or empty for off.
func (r *settingsReader) address(key string) string {
	a := r.str(key)
	if !r.has(key) || a == "" {
		return a
	}
	_, port, err := net.SplitHostPort(a)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		r.invalid(key, a, "host:port or :port, such as :8080 or 127.0.0.1:8080 (empty: off)")
	}
	return a
}
