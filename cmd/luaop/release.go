package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptsource"
	"github.com/luaop/luaop/sharding"
	"github.com/luaop/luaop/state"
)

func newReleaseCommand(v *viper.Viper) *cobra.Command {
	var o releaseOptions
	cmd := &cobra.Command{
		Use:   "release [DIR]",
		Short: "Remove luaop's finalizer (and with --purge its annotations and status field) from every object the scripts of DIR handle",
		Long: `Remove the operator's finalizer (<prefix>/finalizer) from every object of the
resources the scripts of DIR watch (and of the resources given with --resource), so
that nothing stays stuck in deletion once the operator is gone: the step before
uninstalling, or after scripts that needed a finalizer (delete handlers, daemons,
timers) stopped handling a resource.

With --purge it also removes the operator's annotations (<prefix>/*: handler progress,
the last handled state, a sharding handover), the label <prefix>/shard (the replica
an object is assigned to, --shard-across-replicas) and its status field (status.<prefix with dots as
underscores>), so that a later install handles every object as new. Handler results
(status.<handler id>) are the scripts' data and stay.

Stop the operator first (kubectl scale deployment/luaop --replicas=0): a running
operator puts its finalizer back. luaop release refuses while the operator's leader
Lease (--leader-elect; --leader-election-name and -namespace as for luaop run) is held
and renewed, or while a replica of a sharded operator (--shard-across-replicas, of
--shard-group) holds its membership Lease, unless --force; an operator without leader
election or sharding cannot be seen. Objects already being deleted are deleted by the API
server as soon as the finalizer is gone, without their delete handlers.

--prefix, --namespaces (-n, -A) and the kubeconfig are read as by luaop run (flags,
LUAOP_* variables, --config). --dry-run sends every change as a server-side dry run
and prints it: nothing is written.`,
		Example: `  luaop release /scripts                       # every namespace
  luaop release -n team-a --dry-run scripts/   # what would change in team-a
  luaop release --purge --prefix ops.example.com scripts/
  luaop release --resource example.com/v1/widgets`,
		Args: usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := loadSubsetSettings(cmd, v)
			if err != nil {
				return err
			}
			for _, w := range s.Warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			if len(args) == 0 && len(o.resources) == 0 {
				return usageError(errors.New("give the scripts' folder (luaop release DIR) or the resources (--resource group/version/plural)"))
			}
			if len(args) == 1 {
				o.dir = args[0]
			}
			cfg, err := restConfig(s)
			if err != nil {
				return err
			}
			if err := checkReachable(cfg); err != nil {
				return err
			}
			kc, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			if err := checkOperatorStopped(cmd.Context(), kc, s, o.force, time.Now(), cmd.ErrOrStderr()); err != nil {
				return err
			}
			if err := checkShardMembersStopped(cmd.Context(), kc, o.shardGroup, o.force || s.DryRun, time.Now(), cmd.ErrOrStderr()); err != nil {
				return err
			}
			_, err = release(cmd.Context(), cfg, s, o, cmd.OutOrStdout())
			return err
		},
	}
	fs := cmd.Flags()
	addClusterFlags(fs)
	fs.String("prefix", "luaop.dev", "the operator's prefix (luaop run --prefix): its finalizer is <prefix>/finalizer")
	fs.Bool("dry-run", false, "print what would change and send it as a server-side dry run: nothing is written")
	fs.BoolVar(&o.purge, "purge", false, "also remove the operator's annotations (<prefix>/*), its shard label (<prefix>/shard) and its status field (status.<prefix_with_underscores>)")
	fs.String("leader-election-namespace", "", "namespace of the operator's leader Lease (luaop run --leader-election-namespace; default: looked for in every namespace)")
	fs.String("leader-election-name", "luaop", "name of the operator's leader Lease (luaop run --leader-election-name)")
	fs.StringVar(&o.shardGroup, "shard-group", sharding.DefaultGroup, "the operator's --shard-group (with --shard-across-replicas): luaop release refuses while a replica of the group holds its membership Lease, in any namespace")
	fs.BoolVar(&o.force, "force", false, "release even while the operator's leader Lease is held and renewed (the running operator puts its finalizer back)")
	fs.StringSliceVar(&o.resources, "resource", nil, "a resource to release besides those of DIR, as scripts write it (group/version/plural, v1/plural); repeatable")
	return cmd
}

type releaseOptions struct {
	dir       string
	resources []string
	purge     bool
	force     bool
	// shardGroup is luaop run's --shard-group: its members' Leases say whether a
	// sharded operator runs.
	shardGroup string
}

// checkOperatorStopped refuses to release while the operator runs: its leader Lease
// (with --leader-elect) is held and was renewed within its duration. A dry run and
// --force only warn. An operator running without --leader-elect holds no Lease and
// cannot be seen.
func checkOperatorStopped(ctx context.Context, kc kubernetes.Interface, s settings, force bool, now time.Time, warn io.Writer) error {
	name := s.LeaderName
	if name == "" {
		name = "luaop"
	}
	var leases []coordinationv1.Lease
	if s.LeaderNamespace != "" {
		l, err := kc.CoordinationV1().Leases(s.LeaderNamespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			leases = append(leases, *l)
		case apierrors.IsNotFound(err):
		default:
			fmt.Fprintf(warn, "warning: cannot read the operator's Lease %s/%s to check that it is stopped: %v\n", s.LeaderNamespace, name, err)
		}
	} else {
		list, err := kc.CoordinationV1().Leases(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			fmt.Fprintf(warn, "warning: cannot list the Leases named %s to check that the operator is stopped (%v); give --leader-election-namespace\n", name, err)
		} else {
			for _, l := range list.Items {
				if l.Name == name {
					leases = append(leases, l)
				}
			}
		}
	}
	for _, l := range leases {
		holder, renewed, d, ok := leaseHeld(&l, now)
		if !ok {
			continue
		}
		deployment := holder
		if host, _, found := strings.Cut(holder, "_"); found {
			deployment = host
		}
		if parts := strings.Split(deployment, "-"); len(parts) > 2 {
			deployment = strings.Join(parts[:len(parts)-2], "-") // <deployment>-<replicaset hash>-<pod hash>
		}
		msg := fmt.Sprintf("the operator is running: its leader Lease %s/%s is held by %s, renewed %s ago (it expires after %s without renewal); "+
			"a running operator puts its finalizer back. Stop it first (kubectl -n %s scale deployment/%s --replicas=0), then run luaop release again",
			l.Namespace, l.Name, holder, now.Sub(renewed).Round(time.Second), d, l.Namespace, deployment)
		if force || s.DryRun {
			fmt.Fprintln(warn, "warning:", msg)
			continue
		}
		return errors.New(msg + "; --force releases anyway")
	}
	return nil
}

// checkShardMembersStopped refuses to release while a replica of a sharded
// operator (--shard-across-replicas, of the given --shard-group) runs: its
// membership Lease, labelled with the group, is held and was renewed within its
// duration. A running replica puts the finalizer back and its coordinator the
// shard label. A clean stop deletes the Lease; a killed replica's expires. warnOnly
// (--force, --dry-run) only warns.
func checkShardMembersStopped(ctx context.Context, kc kubernetes.Interface, group string, warnOnly bool, now time.Time, warn io.Writer) error {
	list, err := kc.CoordinationV1().Leases(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: sharding.GroupLabel + "=" + group})
	if err != nil {
		fmt.Fprintf(warn, "warning: cannot list the membership Leases of the shard group %s to check that the operator is stopped: %v\n", group, err)
		return nil
	}
	var live []string
	namespace := ""
	for i := range list.Items {
		l := &list.Items[i]
		if holder, renewed, _, ok := leaseHeld(l, now); ok {
			live = append(live, fmt.Sprintf("%s (renewed %s ago)", holder, now.Sub(renewed).Round(time.Second)))
			namespace = l.Namespace
		}
	}
	if len(live) == 0 {
		return nil
	}
	msg := fmt.Sprintf("the sharded operator is running: %d replica(s) of the shard group %s hold their membership Lease in namespace %s: %s; "+
		"a running operator puts its finalizer and shard label back. Stop it first (kubectl -n %s scale deployment/<the operator> --replicas=0), then run luaop release again",
		len(live), group, namespace, strings.Join(live, ", "), namespace)
	if warnOnly {
		fmt.Fprintln(warn, "warning:", msg)
		return nil
	}
	return errors.New(msg + "; --force releases anyway")
}

// leaseHeld tells whether a Lease has a holder that renewed it within its duration.
func leaseHeld(l *coordinationv1.Lease, now time.Time) (holder string, renewed time.Time, d time.Duration, ok bool) {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.LeaseDurationSeconds == nil {
		return "", time.Time{}, 0, false
	}
	switch {
	case l.Spec.RenewTime != nil:
		renewed = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		renewed = l.Spec.AcquireTime.Time
	default:
		return "", time.Time{}, 0, false
	}
	d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	return *l.Spec.HolderIdentity, renewed, d, now.Before(renewed.Add(d))
}

// rbacHint adds to a Forbidden error what luaop release needs.
func rbacHint(err error, verb string, res processing.ResolvedResource, purge bool) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	need := "list and patch"
	if purge && res.StatusSubresource {
		need += " (and patch on " + res.GVR.Resource + "/status, for --purge)"
	}
	return fmt.Errorf("%s: %w; luaop release needs %s on %s in group %q: run it with the credentials of a cluster admin, "+
		"or grant them with a (Cluster)Role and a binding (luaop rbac prints the operator's, which has them)", verb, err, need, res.GVR.Resource, res.GVR.Group)
}

// versionTestFailed tells whether a patch answered 422 Invalid failed on its test
// of metadata.resourceVersion, i.e. the object changed meanwhile, and returns the
// object as it is now. The API server's answer does not say which operation failed
// (its message is generic), so the object is read again: the same resourceVersion
// means the patch itself was refused (a schema, a missing path), which a retry would
// not fix.
func versionTestFailed(ctx context.Context, client dynamic.ResourceInterface, obj *unstructured.Unstructured, err error) (*unstructured.Unstructured, bool, error) {
	if !apierrors.IsInvalid(err) {
		return nil, false, nil
	}
	fresh, getErr := client.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if getErr != nil {
		return nil, false, getErr
	}
	return fresh, fresh.GetResourceVersion() != obj.GetResourceVersion(), nil
}

// releaseCount is what release did.
type releaseCount struct {
	objects, changed, failed int
}

// release removes the operator's finalizer (and with purge its annotations and status
// field) from every object of the resources, printing a line per changed object and
// per resource.
func release(ctx context.Context, cfg *rest.Config, s settings, o releaseOptions, out io.Writer) (releaseCount, error) {
	var total releaseCount
	spellings, err := releaseResources(ctx, o)
	if err != nil {
		return total, err
	}
	allows, exact, err := processing.NamespaceMatcher(s.Namespaces)
	if err != nil {
		return total, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return total, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return total, err
	}
	r := releaser{
		dyn:         dyn,
		finalizer:   processing.Finalizer(s.Prefix),
		annotations: s.Prefix + "/",
		shardLabel:  state.ShardLabel(s.Prefix),
		statusField: statusField(s.Prefix),
		purge:       o.purge,
		dryRun:      s.DryRun,
		out:         out,
	}
	what := "finalizer " + r.finalizer
	if o.purge {
		what += ", annotations " + r.annotations + "*, label " + r.shardLabel + ", status." + r.statusField
	}
	if s.DryRun {
		fmt.Fprintf(out, "releasing %d resource(s) (dry run: nothing is written): would remove %s\n", len(spellings), what)
	} else {
		fmt.Fprintf(out, "releasing %d resource(s): removing %s\n", len(spellings), what)
	}
	seen := map[string]bool{}
	var errs []error
	for _, sp := range spellings {
		res, err := processing.ResolveResource(disco, sp)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sp, err))
			fmt.Fprintf(out, "%s: skipped: %v\n", sp, err)
			continue
		}
		if seen[res.GVR.String()] {
			continue
		}
		seen[res.GVR.String()] = true
		c, err := r.releaseResource(ctx, res, allows, exact)
		total.objects += c.objects
		total.changed += c.changed
		total.failed += c.failed
		verb := "released"
		if s.DryRun {
			verb = "would be released"
		}
		fmt.Fprintf(out, "%s: %d object(s), %d %s", resourceString(res), c.objects, c.changed, verb)
		if c.failed > 0 {
			fmt.Fprintf(out, ", %d failed", c.failed)
		}
		fmt.Fprintln(out)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", resourceString(res), err))
		}
	}
	if total.failed > 0 {
		errs = append(errs, fmt.Errorf("%d object(s) could not be released; run luaop release again", total.failed))
	}
	return total, errors.Join(errs...)
}

// releaseResources are the resources the scripts of o.dir watch, and o.resources.
func releaseResources(ctx context.Context, o releaseOptions) ([]causes.Resource, error) {
	var out []causes.Resource
	for _, r := range o.resources {
		res, err := luabind.ParseResource(r)
		if err != nil {
			return nil, fmt.Errorf("--resource: %w", err)
		}
		out = append(out, res)
	}
	if o.dir == "" {
		return out, nil
	}
	scripts, err := scriptsource.ReadDir(o.dir)
	if err != nil {
		return nil, err
	}
	if len(scripts) == 0 {
		return nil, fmt.Errorf("no *.lua files in %s", o.dir)
	}
	rt := luabind.New(luabind.Options{Shards: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer rt.Close()
	report, err := rt.Load(ctx, scripts)
	if err != nil {
		return nil, fmt.Errorf("loading the scripts (run luaop check %s), or name the resources with --resource: %w", o.dir, err)
	}
	for _, h := range report.Handlers {
		if h.Resource.Resource != "" && !slices.Contains(out, h.Resource) {
			out = append(out, h.Resource)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

func resourceString(r processing.ResolvedResource) string {
	return causes.Resource{GroupVersionResource: r.GVR}.String()
}

type releaser struct {
	dyn         dynamic.Interface
	finalizer   string
	annotations string // the annotations' prefix: "luaop.dev/"
	shardLabel  string // --shard-across-replicas's label: "luaop.dev/shard"
	statusField string
	purge       bool
	dryRun      bool
	out         io.Writer
}

// releaseResource releases the objects of one resource, page by page.
func (r releaser) releaseResource(ctx context.Context, res processing.ResolvedResource, allows func(string) bool, exact []string) (releaseCount, error) {
	var c releaseCount
	namespaces := []string{metav1.NamespaceAll}
	if res.Namespaced && exact != nil {
		namespaces = exact
	}
	for _, ns := range namespaces {
		client := r.dyn.Resource(res.GVR).Namespace(ns)
		opts := metav1.ListOptions{Limit: 500}
		for {
			list, err := client.List(ctx, opts)
			if err != nil {
				return c, rbacHint(err, "listing", res, r.purge)
			}
			for i := range list.Items {
				obj := &list.Items[i]
				if res.Namespaced && !allows(obj.GetNamespace()) {
					continue
				}
				c.objects++
				changed, err := r.releaseObject(ctx, res, obj)
				switch {
				case err != nil:
					c.failed++
					fmt.Fprintf(r.out, "%s %s: failed: %v\n", resourceString(res), objectName(obj), err)
				case changed != "":
					c.changed++
					fmt.Fprintf(r.out, "%s %s: %s\n", resourceString(res), objectName(obj), changed)
				}
			}
			if opts.Continue = list.GetContinue(); opts.Continue == "" {
				break
			}
		}
	}
	return c, nil
}

func objectName(obj *unstructured.Unstructured) string {
	if obj.GetNamespace() == "" {
		return obj.GetName()
	}
	return obj.GetNamespace() + "/" + obj.GetName()
}

// releaseObject removes what the operator left on one object, re-reading it and
// trying again when it changed meanwhile; it says what it removed ("" for nothing),
// or, in a dry run (where the server stored nothing), what it would remove.
func (r releaser) releaseObject(ctx context.Context, res processing.ResolvedResource, obj *unstructured.Unstructured) (string, error) {
	client := r.dyn.Resource(res.GVR).Namespace(obj.GetNamespace())
	var opts metav1.PatchOptions
	if r.dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for attempt := 0; ; attempt++ {
		metaPatch, statusPatch, removed := r.patches(obj, res.StatusSubresource)
		if len(removed) == 0 {
			return "", nil
		}
		var err error
		metaDone := false
		if metaPatch != nil {
			_, err = client.Patch(ctx, obj.GetName(), types.JSONPatchType, metaPatch, opts)
			metaDone = err == nil
		}
		if err == nil && statusPatch != nil {
			_, err = client.Patch(ctx, obj.GetName(), types.JSONPatchType, statusPatch, opts, "status")
		}
		switch {
		case err == nil, metaDone && apierrors.IsNotFound(err):
			// (Gone after its finalizer was removed: it was being deleted.)
			if r.dryRun {
				return "would remove " + strings.Join(removed, ", "), nil
			}
			return "removed " + strings.Join(removed, ", "), nil
		case apierrors.IsNotFound(err):
			return "", nil // deleted meanwhile
		case apierrors.IsForbidden(err):
			return "", rbacHint(err, "patching", res, r.purge)
		case apierrors.IsInvalid(err) && attempt < 5:
			fresh, changed, getErr := versionTestFailed(ctx, client, obj, err)
			switch {
			case apierrors.IsNotFound(getErr):
				return "", nil
			case getErr != nil:
				return "", getErr
			case !changed:
				return "", fmt.Errorf("the API server refused the patch (%w); the object did not change meanwhile, so trying again would not help", err)
			}
			obj = fresh // the resourceVersion test failed: the object changed
		case apierrors.IsConflict(err) && attempt < 5:
			// The object changed; read it again.
			if obj, err = client.Get(ctx, obj.GetName(), metav1.GetOptions{}); err != nil {
				if apierrors.IsNotFound(err) {
					return "", nil
				}
				return "", err
			}
		default:
			return "", err
		}
	}
}

// patches are the JSON patches that release obj: one of the object (finalizer,
// annotations, and the status field when status is not a subresource) and one of its
// status subresource, each tested against the object's resourceVersion so that a
// concurrent change (another controller's finalizer) is never lost.
func (r releaser) patches(obj *unstructured.Unstructured, statusSubresource bool) (metaPatch, statusPatch []byte, removed []string) {
	test := map[string]any{"op": "test", "path": "/metadata/resourceVersion", "value": obj.GetResourceVersion()}
	ops := []map[string]any{test}
	finalizers := obj.GetFinalizers()
	if kept := slices.DeleteFunc(slices.Clone(finalizers), func(f string) bool { return f == r.finalizer }); len(kept) != len(finalizers) {
		ops = append(ops, map[string]any{"op": "replace", "path": "/metadata/finalizers", "value": kept})
		removed = append(removed, "finalizer")
	}
	if r.purge {
		var keys []string
		for k := range obj.GetAnnotations() {
			if strings.HasPrefix(k, r.annotations) {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			ops = append(ops, map[string]any{"op": "remove", "path": "/metadata/annotations/" + state.EscapePointerToken(k)})
		}
		if len(keys) > 0 {
			removed = append(removed, fmt.Sprintf("%d annotation(s)", len(keys)))
		}
		// The shard label (--shard-across-replicas; its handover annotation is one
		// of the annotations above): a later install without sharding would keep
		// it, and a sharded one assigns the objects again.
		if _, ok := obj.GetLabels()[r.shardLabel]; ok {
			ops = append(ops, map[string]any{"op": "remove", "path": "/metadata/labels/" + state.EscapePointerToken(r.shardLabel)})
			removed = append(removed, "label "+r.shardLabel)
		}
	}
	if len(ops) > 1 {
		metaPatch, _ = json.Marshal(ops)
	}
	if r.purge {
		if _, found, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", r.statusField); found {
			op := map[string]any{"op": "remove", "path": "/status/" + state.EscapePointerToken(r.statusField)}
			removed = append(removed, "status."+r.statusField)
			if statusSubresource {
				// Tested against the version the object patch (if any) produced is not
				// known here; the status patch removes one field only the operator writes.
				statusPatch, _ = json.Marshal([]map[string]any{op})
			} else {
				ops = append(ops, op)
				metaPatch, _ = json.Marshal(ops)
			}
		}
	}
	return metaPatch, statusPatch, removed
}
