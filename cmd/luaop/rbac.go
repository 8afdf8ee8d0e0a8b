package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptcheck"
	"github.com/luaop/luaop/scriptsource"
)

type rbacOptions struct {
	Name            string
	ServiceAccount  string // namespace/name
	LeaderElect     bool
	LeaderNamespace string
	Namespaces      []string
	// ScriptsConfigMap ([namespace/]name): the Role for the ConfigMap of the last
	// good scripts next to it; ScriptsWebhook: the webhook configurations for its
	// validating webhook even without admission handlers in the scripts.
	ScriptsConfigMap string
	ScriptsWebhook   bool
	// Prefix is the operator's --prefix: it names the webhook configurations the
	// operator may write ("<prefix>.validate", "<prefix>.mutate", "<prefix>.probe").
	Prefix string
	// WebhookService ([namespace/]name) names the Secret of the generated webhook
	// certificate, "<name>-tls".
	WebhookService string
	// MetricsAuth grants what --metrics-secure needs: TokenReviews and
	// SubjectAccessReviews.
	MetricsAuth bool
	// Standalone: the operator runs with --standalone (no peering Role);
	// PeeringNamespace is its --peering-namespace (default: the ServiceAccount's).
	Standalone       bool
	PeeringNamespace string
	// Shard: the operator runs with --shard-across-replicas (rbac_sharding.go).
	Shard   rbacShardOptions
	command string // how the output was made, for its header
}

func newRBACCommand() *cobra.Command {
	var o rbacOptions
	cmd := &cobra.Command{
		Use:   "rbac DIR",
		Short: "Print the least-privilege RBAC the scripts of DIR need (no cluster needed)",
		Long: `Print the ClusterRole (or, with --namespaces naming namespaces, one Role per
namespace), its binding to the operator's ServiceAccount, the Role for the peering
Leases (unless --standalone or --shard-across-replicas: a sharded operator does not
peer), and with --leader-elect the Role for the Lease (with --shard-across-replicas,
the Role for the sharding Leases), that the scripts of DIR need:
  - the resources the handlers watch: get, list, watch, patch, and patch of their
    status subresource (handler results, progress with --progress-storage=status);
  - core Events: create, patch (handler outcomes, luaop.info/warn/exception);
  - the resources of luaop.kube calls whose apiVersion and kind are literals in the
    source (or locals, or objects built by local functions): the verbs they use
    (apply needs create and patch).
Calls it cannot resolve are listed on standard error: grant their resources by hand.

Without a cluster, resource names cannot be discovered: the plural of a kind is
derived by Kubernetes' usual rules (Ingress -> ingresses, Policy -> policies), and a
few short names of built-in resources (cm, svc, deploy, ...) are known; a kind with an
irregular plural (e.g. Endpoints) must be checked by hand.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := scriptsFolder(args[0]); err != nil {
				return err
			}
			o.command = rbacCommandLine(args[0], o)
			out, warnings, err := generateRBAC(cmd, args[0], o)
			if err != nil {
				return err
			}
			for _, w := range warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			_, err = io.WriteString(cmd.OutOrStdout(), out)
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Name, "name", "luaop", "name of the ClusterRole, Roles and bindings")
	fs.StringVar(&o.ServiceAccount, "service-account", "luaop-system/luaop", "the operator's ServiceAccount, as namespace/name")
	fs.BoolVar(&o.LeaderElect, "leader-elect", false, "add the Role for the leader-election Lease")
	fs.StringVar(&o.LeaderNamespace, "leader-election-namespace", "", "namespace of the Lease (default: the ServiceAccount's)")
	fs.StringVar(&o.ScriptsConfigMap, "scripts-configmap", "", "the scripts ConfigMap, [namespace/]name (default namespace: the ServiceAccount's): add the Role for the ConfigMap <name>-last-good where the operator keeps the last scripts that loaded")
	fs.BoolVar(&o.ScriptsWebhook, "scripts-webhook", false, "the operator validates the scripts ConfigMap (--scripts-configmap with the webhooks component): grant the webhook configurations even if no script has admission handlers")
	fs.BoolVar(&o.Standalone, "standalone", false, "the operator runs with --standalone: no Role for the peering Leases")
	fs.StringVar(&o.PeeringNamespace, "peering-namespace", "", "the operator's --peering-namespace (default: the ServiceAccount's)")
	fs.StringSliceVar(&o.Namespaces, "namespaces", nil, "namespaces the operator serves (plain names): Roles in each instead of a ClusterRole")
	fs.StringVar(&o.Prefix, "prefix", "luaop.dev", "the operator's --prefix: the webhook configurations it writes are <prefix>.validate, <prefix>.mutate and <prefix>.probe (granted by name)")
	fs.StringVar(&o.WebhookService, "webhook-service", "luaop-webhook", "the operator's --webhook-service ([namespace/]name): the generated webhook certificate is kept in the Secret <name>-tls (granted by name)")
	addRBACShardFlags(fs, &o.Shard)
	fs.BoolVar(&o.MetricsAuth, "metrics-auth", true, "grant TokenReviews and SubjectAccessReviews, with which --metrics-secure (luaop run's default) authenticates and authorizes the clients of /metrics")
	return cmd
}

// builtinShortNames maps short names and kinds of built-in resources used in
// resource strings ("v1/cm") to their plural.
var builtinShortNames = map[string]string{
	"cm": "configmaps", "svc": "services", "po": "pods", "ns": "namespaces", "sa": "serviceaccounts",
	"deploy": "deployments", "ds": "daemonsets", "sts": "statefulsets", "rs": "replicasets",
	"pvc": "persistentvolumeclaims", "pv": "persistentvolumes", "ing": "ingresses", "no": "nodes",
	"cj": "cronjobs", "ep": "endpoints", "endpoints": "endpoints", "Endpoints": "endpoints",
	"netpol": "networkpolicies", "pdb": "poddisruptionbudgets", "hpa": "horizontalpodautoscalers",
	"crd": "customresourcedefinitions", "crds": "customresourcedefinitions",
}

// builtinGroups are the API groups of Kubernetes itself; withStatus their resources
// that have a status subresource. A custom resource is assumed to have one (a CRD
// without it answers 404 to the status patch, which luaop does not send then).
var (
	builtinGroups = []string{"", "apps", "batch", "autoscaling", "policy", "networking.k8s.io", "rbac.authorization.k8s.io",
		"storage.k8s.io", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io", "scheduling.k8s.io", "node.k8s.io",
		"certificates.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "flowcontrol.apiserver.k8s.io",
		"resource.k8s.io", "storagemigration.k8s.io", "internal.apiserver.k8s.io"}
	withStatus = map[string]bool{
		"/pods": true, "/services": true, "/nodes": true, "/namespaces": true, "/persistentvolumes": true,
		"/persistentvolumeclaims": true, "/replicationcontrollers": true, "/resourcequotas": true,
		"apps/deployments": true, "apps/statefulsets": true, "apps/daemonsets": true, "apps/replicasets": true,
		"batch/jobs": true, "batch/cronjobs": true, "autoscaling/horizontalpodautoscalers": true,
		"policy/poddisruptionbudgets": true, "networking.k8s.io/ingresses": true, "networking.k8s.io/servicecidrs": true,
		"storage.k8s.io/volumeattachments": true, "certificates.k8s.io/certificatesigningrequests": true,
		"apiextensions.k8s.io/customresourcedefinitions": true, "apiregistration.k8s.io/apiservices": true,
		"flowcontrol.apiserver.k8s.io/flowschemas": true, "flowcontrol.apiserver.k8s.io/prioritylevelconfigurations": true,
		"admissionregistration.k8s.io/validatingadmissionpolicies": true, "resource.k8s.io/resourceclaims": true,
		"internal.apiserver.k8s.io/storageversions": true,
	}
)

// hasStatus tells whether a resource has a status subresource: configmaps, secrets
// or events have none, and a rule for "configmaps/status" grants nothing.
func hasStatus(group, plural string) bool {
	if !slices.Contains(builtinGroups, group) {
		return true
	}
	return withStatus[group+"/"+plural]
}

// pluralOf turns a resource string's last part or a kind into a plural resource.
func pluralOf(gv schema.GroupVersion, name string) string {
	if p, ok := builtinShortNames[name]; ok {
		return p
	}
	if name != strings.ToLower(name) { // a kind
		plural, _ := meta.UnsafeGuessKindToResource(gv.WithKind(name))
		return plural.Resource
	}
	return name
}

var verbOrder = []string{"get", "list", "watch", "create", "patch", "update", "delete"}

type rbacRule struct {
	group, resource string
	verbs           map[string]bool
	sources         []string
}

type ruleSet map[[2]string]*rbacRule

func (rs ruleSet) add(group, resource, source string, verbs ...string) {
	k := [2]string{group, resource}
	r := rs[k]
	if r == nil {
		r = &rbacRule{group: group, resource: resource, verbs: map[string]bool{}}
		rs[k] = r
	}
	for _, v := range verbs {
		r.verbs[v] = true
	}
	if source != "" && !slices.Contains(r.sources, source) {
		r.sources = append(r.sources, source)
	}
}

// generateRBAC makes the RBAC of the scripts of dir: the rules their handlers and
// luaop.kube calls need, in a ClusterRole or one Role per namespace, then the roles
// of the operator's own machinery (rbacSections), each with its binding to the
// ServiceAccount. It returns the YAML and the warnings for standard error.
func generateRBAC(cmd *cobra.Command, dir string, o rbacOptions) (string, []string, error) {
	scripts, err := scriptsource.ReadDir(dir)
	if err != nil {
		return "", nil, err
	}
	if len(scripts) == 0 {
		return "", nil, fmt.Errorf("no *.lua files in %s", dir)
	}
	saNS, saName, ok := strings.Cut(o.ServiceAccount, "/")
	if !ok || saNS == "" || saName == "" {
		return "", nil, fmt.Errorf("--service-account=%q: write it as namespace/name", o.ServiceAccount)
	}
	rt := luabind.New(luabind.Options{Shards: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer rt.Close()
	report, err := rt.Load(cmd.Context(), scripts)
	if err != nil {
		return "", nil, fmt.Errorf("loading the scripts (run luaop check %s): %w", dir, err)
	}
	d := &rbacDoc{o: o, saNS: saNS, saName: saName}
	watched, admissionSources := watchedRules(report.Handlers)
	calls := d.callRules(scriptcheck.Analyze(scripts).KubeCalls)
	fmt.Fprintf(&d.b, "# Least-privilege RBAC of the scripts in %s, generated by\n#   %s\n# Do not edit: run it again when the scripts change.\n", dir, o.command)
	d.writeScriptsRoles(watched, calls)
	if len(admissionSources) == 0 && o.ScriptsWebhook && o.ScriptsConfigMap != "" {
		admissionSources = append(admissionSources, "--scripts-configmap")
	}
	d.admissionSources = admissionSources
	for _, section := range rbacSections {
		if err := section(d); err != nil {
			return "", nil, err
		}
	}
	return d.b.String(), d.warnings, nil
}

// rbacDoc is the RBAC document being written: the options, the ServiceAccount every
// binding names, the YAML so far and the warnings.
type rbacDoc struct {
	o            rbacOptions
	saNS, saName string
	b            strings.Builder
	warnings     []string
	// admissionSources are the files with admission handlers (or
	// "--scripts-configmap" when the operator guards its scripts ConfigMap).
	admissionSources []string
}

// rbacSections write the roles of the operator's own machinery after those of the
// scripts, in this order; each writes nothing when its options do not call for it.
// A new component that needs access of its own adds its section here.
var rbacSections = []func(d *rbacDoc) error{
	(*rbacDoc).writeWebhookRoles,
	(*rbacDoc).writeMetricsAuthRole,
	(*rbacDoc).writeLastGoodRole,
	(*rbacDoc).writePeeringRole,
	(*rbacDoc).writeLeaderElectionRole,
	(*rbacDoc).writeShardingRole,
}

// watchedRules are the rules of the resources the handlers watch, and the files
// with admission handlers (served by the webhook server, not watched).
func watchedRules(handlers []causes.Spec) (ruleSet, []string) {
	watched := ruleSet{}
	var admissionSources []string
	for _, h := range handlers {
		if h.Resource.Resource == "" {
			continue // operator-level hooks
		}
		file, _, _ := strings.Cut(h.Source, ":")
		if h.Kind.IsAdmission() {
			if !slices.Contains(admissionSources, file) {
				admissionSources = append(admissionSources, file)
			}
			continue
		}
		gv := h.Resource.GroupVersion()
		plural := pluralOf(gv, h.Resource.Resource)
		watched.add(gv.Group, plural, file, "get", "list", "watch", "patch")
		if hasStatus(gv.Group, plural) {
			watched.add(gv.Group, plural+"/status", file, "patch")
		}
	}
	return watched, admissionSources
}

// callRules are the rules of the scripts' luaop.kube calls: the verbs scriptapi's
// table gives each function, on the resource of the call's literal apiVersion and
// kind. Calls it cannot resolve become a warning.
func (d *rbacDoc) callRules(kubeCalls []scriptcheck.KubeCall) ruleSet {
	calls := ruleSet{}
	var unresolved []string
	for _, c := range kubeCalls {
		where := fmt.Sprintf("%s:%d", c.File, c.Line)
		if !c.Resolved {
			unresolved = append(unresolved, fmt.Sprintf("%s: luaop.kube.%s", where, c.Verb))
			continue
		}
		gv, err := schema.ParseGroupVersion(c.APIVersion)
		if err != nil {
			d.warnings = append(d.warnings, fmt.Sprintf("%s: luaop.kube.%s: apiVersion %q does not parse", where, c.Verb, c.APIVersion))
			continue
		}
		access := c.Function().Access
		resource := pluralOf(gv, c.Kind)
		if access.Subresource != "" {
			resource += "/" + access.Subresource
		}
		calls.add(gv.Group, resource, where+" "+c.Verb, access.Verbs...)
	}
	if len(unresolved) > 0 {
		d.warnings = append(d.warnings, fmt.Sprintf("%d luaop.kube call(s) whose apiVersion or kind is not a literal; grant their resources by hand:\n  %s",
			len(unresolved), strings.Join(unresolved, "\n  ")))
	}
	return calls
}

// writeScriptsRoles writes what the scripts need (watched resources, luaop.kube
// calls, Events) as a ClusterRole, or as one Role per namespace when --namespaces
// names namespaces only, with their bindings.
func (d *rbacDoc) writeScriptsRoles(watched, calls ruleSet) {
	o := d.o
	var rules strings.Builder
	writeRules(&rules, "# Watched by the handlers: list/watch for the informers, get for re-reads, patch for\n# progress, finalizers and results (the status subresource).\n", watched)
	writeRules(&rules, "# The scripts' luaop.kube calls.\n", calls)
	rules.WriteString("# Events: handler outcomes and luaop.info/warn/exception (the recorder creates, then\n# patches repeats).\n- apiGroups: [\"\"]\n  resources: [events]\n  verbs: [create, patch]\n")

	exact := len(o.Namespaces) > 0
	for _, ns := range o.Namespaces {
		if ns == "" || strings.ContainsAny(ns, "*?[!") {
			exact = false
			d.warnings = append(d.warnings, fmt.Sprintf("--namespaces %q is a pattern: the operator watches cluster-wide and filters, so it needs a ClusterRole", ns))
		}
	}
	if !exact {
		rules.WriteString("# CustomResourceDefinitions: read to choose where progress is kept (status when the schema\n# keeps it: one write per handled change; annotations otherwise).\n- apiGroups: [apiextensions.k8s.io]\n  resources: [customresourcedefinitions]\n  verbs: [get]\n")
		d.writeRole("", o.Name, "", rules.String(), true)
		return
	}
	d.warnings = append(d.warnings, "with Roles only, the operator cannot read CustomResourceDefinitions (cluster-scoped): "+
		"it keeps progress in annotations (two writes per handled change); grant get on customresourcedefinitions "+
		"in a ClusterRole to let it use status storage (one write)")
	for i, ns := range o.Namespaces {
		d.writeRole("", o.Name, ns, rules.String(), i == 0)
	}
}

// writeRole writes a Role in ns (a ClusterRole when ns is ""), after comment, and its
// binding (of the same name) to the ServiceAccount. The first document of the output
// has no separator before it.
func (d *rbacDoc) writeRole(comment, name, ns, rules string, first bool) {
	kind, namespace := "ClusterRole", ""
	if ns != "" {
		kind, namespace = "Role", "  namespace: "+ns+"\n"
	}
	if !first {
		d.b.WriteString("---\n")
	}
	fmt.Fprintf(&d.b, "%sapiVersion: rbac.authorization.k8s.io/v1\nkind: %s\nmetadata:\n  name: %s\n%srules:\n%s", comment, kind, name, namespace, rules)
	fmt.Fprintf(&d.b, "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: %sBinding\nmetadata:\n  name: %s\n%sroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: %s\n  name: %s\nsubjects:\n- kind: ServiceAccount\n  name: %s\n  namespace: %s\n",
		kind, name, namespace, kind, name, d.saName, d.saNS)
}

// writeWebhookRoles writes, when the scripts have admission handlers (or the
// operator guards its scripts ConfigMap), the ClusterRole of the webhook
// configurations, the Role of the webhook certificate's Secret and what the
// reachability probe needs.
func (d *rbacDoc) writeWebhookRoles() error {
	admissionSources := d.admissionSources
	if len(admissionSources) == 0 {
		return nil
	}
	o := d.o
	// Webhook configurations are cluster-scoped: a ClusterRole of their own,
	// whether the rest is a ClusterRole or Roles.
	name := o.Name + "-webhooks"
	vname, mname := admission.ConfigurationNames(o.Prefix)
	pname := admission.ProbeConfigurationName(o.Prefix)
	d.writeRole(fmt.Sprintf("# Admission webhooks (luaop.on.validate, luaop.on.mutate in %s): the operator writes\n# the configurations %s, %s and %s (the reachability\n# probe's; --prefix %s) and no other; creating cannot be narrowed to a name\n# (Kubernetes authorizes a create before the object has one).\n",
		strings.Join(admissionSources, ", "), vname, mname, pname, o.Prefix), name, "",
		fmt.Sprintf("- apiGroups: [admissionregistration.k8s.io]\n  resources: [mutatingwebhookconfigurations, validatingwebhookconfigurations]\n  verbs: [create]\n- apiGroups: [admissionregistration.k8s.io]\n  resources: [validatingwebhookconfigurations]\n  resourceNames: [%s, %s]\n  verbs: [get, update, delete]\n- apiGroups: [admissionregistration.k8s.io]\n  resources: [mutatingwebhookconfigurations]\n  resourceNames: [%s]\n  verbs: [get, update, delete]\n",
			vname, pname, mname), false)
	secretNS, secret := d.saNS, o.WebhookService
	if ns, n, ok := strings.Cut(o.WebhookService, "/"); ok {
		secretNS, secret = ns, n
	}
	secret += "-tls"
	// The reachability probe dry-runs the create of a Lease in the operator's own
	// namespace (--standalone and another --peering-namespace too).
	const probeRule = "- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [create]\n"
	probeNote, secretProbeRule := ";\n# the reachability probe: a dry run of a Lease created here", probeRule
	if secretNS != d.saNS {
		probeNote, secretProbeRule = "", ""
	}
	d.writeRole(fmt.Sprintf("# The webhook's certificate: generated and kept in the Secret %s of the operator's\n# namespace (--webhook-service without --webhook-cert-dir), shared by the replicas, renewed\n# before it expires (update); no other Secret is readable%s.\n", secret, probeNote),
		name, secretNS,
		fmt.Sprintf("- apiGroups: [\"\"]\n  resources: [secrets]\n  verbs: [create]\n- apiGroups: [\"\"]\n  resources: [secrets]\n  resourceNames: [%s]\n  verbs: [get, update]\n%s", secret, secretProbeRule), false)
	if secretNS != d.saNS {
		d.writeRole("# The webhooks' reachability probe: a dry run of a Lease created in the operator's namespace.\n", name+"-probe", d.saNS, probeRule, false)
	}
	return nil
}

// writeMetricsAuthRole writes, with --metrics-auth, the ClusterRole with which
// --metrics-secure authenticates and authorizes the clients of /metrics.
func (d *rbacDoc) writeMetricsAuthRole() error {
	if !d.o.MetricsAuth {
		return nil
	}
	d.writeRole("# Secure metrics (--metrics-secure, luaop run's default): the bearer token of a client of\n# /metrics is authenticated with a TokenReview and authorized with a SubjectAccessReview\n# (get on the non-resource URL /metrics), as controller-runtime's secure metrics do.\n",
		d.o.Name+"-metrics-auth", "",
		"- apiGroups: [authentication.k8s.io]\n  resources: [tokenreviews]\n  verbs: [create]\n- apiGroups: [authorization.k8s.io]\n  resources: [subjectaccessreviews]\n  verbs: [create]\n", false)
	return nil
}

// writeLastGoodRole writes, with --scripts-configmap, the Role of the ConfigMap where
// the operator keeps the last scripts that loaded.
func (d *rbacDoc) writeLastGoodRole() error {
	o := d.o
	if o.ScriptsConfigMap == "" {
		return nil
	}
	ns, cm, ok := strings.Cut(o.ScriptsConfigMap, "/")
	if !ok {
		ns, cm = d.saNS, o.ScriptsConfigMap
	}
	if ns == "" || cm == "" {
		return fmt.Errorf("--scripts-configmap=%q: write it as [namespace/]name", o.ScriptsConfigMap)
	}
	d.writeRole(fmt.Sprintf("# The last good scripts: the operator keeps the last scripts that loaded in the ConfigMap\n# %s-last-good next to its scripts ConfigMap %s, and serves them when it starts on scripts\n# that do not load (--scripts-configmap).\n", cm, cm),
		o.Name+"-last-good", ns,
		fmt.Sprintf("- apiGroups: [\"\"]\n  resources: [configmaps]\n  verbs: [create]\n- apiGroups: [\"\"]\n  resources: [configmaps]\n  resourceNames: [%s-last-good]\n  verbs: [get, update]\n", cm), false)
	return nil
}

// orOwnNamespace is ns, or the ServiceAccount's namespace when ns is "".
func (d *rbacDoc) orOwnNamespace(ns string) string {
	if ns == "" {
		return d.saNS
	}
	return ns
}

// writePeeringRole writes, unless --standalone or --shard-across-replicas, the Role
// of the peering Leases: luaop run turns peering off when it shards (the replicas
// of a group split the objects instead of pausing each other), whatever
// --standalone says, so the Role would grant what nothing uses.
func (d *rbacDoc) writePeeringRole() error {
	if d.o.Shard.On && d.o.PeeringNamespace != "" {
		return errors.New("--peering-namespace with --shard-across-replicas: a sharded operator does not peer (luaop run turns peering off), so it needs no peering Leases; drop --peering-namespace")
	}
	if d.o.Standalone || d.o.Shard.On {
		return nil
	}
	d.writeRole("# Peering: the operator's own Lease and those of the other operators of its prefix\n# (luaop dev pauses it), in the namespace of --peering-namespace; creates there are\n# also the webhooks' reachability probe (a dry run). Omit with --standalone.\n",
		d.o.Name+"-peering", d.orOwnNamespace(d.o.PeeringNamespace), "- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [get, list, watch, create, update, delete]\n", false)
	return nil
}

// writeLeaderElectionRole writes, with --leader-elect, the Role of the Lease.
func (d *rbacDoc) writeLeaderElectionRole() error {
	if !d.o.LeaderElect {
		return nil
	}
	d.writeRole("# Leader election: the Lease lives in the operator's own namespace only (watch: a\n# standby sees a release at once and takes over without waiting for its next try).\n",
		d.o.Name+"-leader-election", d.orOwnNamespace(d.o.LeaderNamespace), "- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [get, watch, create, update]\n", false)
	return nil
}

// writeRules writes a rule set as RBAC rules: one rule per API group and set of
// verbs, resources sorted, with where each comes from.
func writeRules(b *strings.Builder, comment string, rs ruleSet) {
	if len(rs) == 0 {
		return
	}
	type group struct {
		apiGroup, verbs string
		resources       []string
		sources         []string
	}
	groups := map[[2]string]*group{}
	for _, r := range rs {
		var verbs []string
		for _, v := range verbOrder {
			if r.verbs[v] {
				verbs = append(verbs, v)
			}
		}
		k := [2]string{r.group, strings.Join(verbs, ", ")}
		g := groups[k]
		if g == nil {
			g = &group{apiGroup: r.group, verbs: k[1]}
			groups[k] = g
		}
		g.resources = append(g.resources, r.resource)
		for _, s := range r.sources {
			if !slices.Contains(g.sources, s) {
				g.sources = append(g.sources, s)
			}
		}
	}
	keys := make([][2]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		if len(keys[i][1]) != len(keys[j][1]) {
			return len(keys[i][1]) > len(keys[j][1])
		}
		return keys[i][1] < keys[j][1] // one order, whatever the map's
	})
	b.WriteString(comment)
	for _, k := range keys {
		g := groups[k]
		sort.Strings(g.resources)
		sort.Slice(g.sources, func(i, j int) bool { return sourceLess(g.sources[i], g.sources[j]) })
		apiGroup := g.apiGroup
		if apiGroup == "" {
			apiGroup = `""`
		}
		fmt.Fprintf(b, "#   from %s\n- apiGroups: [%s]\n  resources: [%s]\n  verbs: [%s]\n", strings.Join(g.sources, ", "), apiGroup, strings.Join(g.resources, ", "), g.verbs)
	}
}

// sourceLess orders "file:line ..." by file, then line number.
func sourceLess(a, b string) bool {
	fa, la, _ := strings.Cut(a, ":")
	fb, lb, _ := strings.Cut(b, ":")
	if fa != fb {
		return fa < fb
	}
	var na, nb int
	fmt.Sscan(la, &na)
	fmt.Sscan(lb, &nb)
	return na < nb
}

// rbacCommandLine is the command that makes the output, for its header.
func rbacCommandLine(dir string, o rbacOptions) string {
	args := []string{"luaop", "rbac"}
	if o.Name != "luaop" {
		args = append(args, "--name", o.Name)
	}
	if o.ServiceAccount != "luaop-system/luaop" {
		args = append(args, "--service-account", o.ServiceAccount)
	}
	if o.LeaderElect {
		args = append(args, "--leader-elect")
	}
	if o.LeaderNamespace != "" {
		args = append(args, "--leader-election-namespace", o.LeaderNamespace)
	}
	if len(o.Namespaces) > 0 {
		args = append(args, "--namespaces", strings.Join(o.Namespaces, ","))
	}
	if o.ScriptsConfigMap != "" {
		args = append(args, "--scripts-configmap", o.ScriptsConfigMap)
	}
	if o.ScriptsWebhook {
		args = append(args, "--scripts-webhook")
	}
	if o.Prefix != "" && o.Prefix != "luaop.dev" {
		args = append(args, "--prefix", o.Prefix)
	}
	if o.WebhookService != "" && o.WebhookService != "luaop-webhook" {
		args = append(args, "--webhook-service", o.WebhookService)
	}
	if !o.MetricsAuth {
		args = append(args, "--metrics-auth=false")
	}
	if o.Standalone {
		args = append(args, "--standalone")
	}
	if o.PeeringNamespace != "" {
		args = append(args, "--peering-namespace", o.PeeringNamespace)
	}
	args = append(args, o.Shard.args()...)
	return strings.Join(append(args, dir), " ")
}
