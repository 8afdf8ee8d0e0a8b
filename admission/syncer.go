package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"

	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/processing/causes"
)

// Syncer keeps the ValidatingWebhookConfiguration and the
// MutatingWebhookConfiguration of one operator (by prefix) equal to its handlers.
type Syncer struct {
	Client    kubernetes.Interface
	Discovery discovery.DiscoveryInterface
	// Prefix is the operator's --prefix: the configurations are "<prefix>.validate"
	// and "<prefix>.mutate", their webhooks "<id>.<kind>.<prefix>".
	Prefix string
	// ClientConfig tells how the API server reaches a path (URL or Service),
	// without the caBundle; CABundle gives that.
	ClientConfig func(path string) admissionregistrationv1.WebhookClientConfig
	CABundle     func() []byte
	Log          *slog.Logger
	// Namespaces are the operator's --namespaces: when all are plain names (or
	// plain "!name" exclusions) the webhooks of Lua handlers get a namespaceSelector
	// sending only requests of those namespaces (globs cannot be expressed: all).
	Namespaces []string
}

// ManagedByLabel marks the configurations luaop writes.
const ManagedByLabel = "app.kubernetes.io/managed-by"

// ConfigurationNames are the names of the two configurations of a prefix.
func ConfigurationNames(prefix string) (validating, mutating string) {
	return prefix + ".validate", prefix + ".mutate"
}

// Sync writes the configurations for handlers: created when missing, updated when
// different, deleted when no handler of their kind is left. Handlers whose
// resource the server does not serve (yet) are left out and named in unresolved.
func (s *Syncer) Sync(ctx context.Context, handlers []Handler) (unresolved []string, err error) {
	var validating []admissionregistrationv1.ValidatingWebhook
	var mutating []admissionregistrationv1.MutatingWebhook
	names := map[string]bool{}
	// keep names the webhooks of handlers whose resource discovery failed to
	// resolve for another reason than "not served": their webhook in the current
	// configuration stays as it is (dropping it would let through what a Fail
	// handler must reject), and the sync is retried.
	keep := map[string]bool{}
	var discoveryErrs []error
	for _, h := range handlers {
		name := webhookName(h, s.Prefix, names)
		rules := h.Rules
		if len(rules) == 0 {
			rule, err := s.rule(h)
			if errors.Is(err, processing.ErrResourceNotServed) {
				unresolved = append(unresolved, fmt.Sprintf("%s (%s): %v", h.ID, h.Source, err))
				continue
			}
			if err != nil {
				discoveryErrs = append(discoveryErrs, fmt.Errorf("admission handler %s (%s): resolving %s: %w; its webhook is kept as it is", h.ID, h.Source, h.Resource, err))
				keep[name] = true
				switch h.Kind {
				case causes.KindValidate:
					validating = append(validating, admissionregistrationv1.ValidatingWebhook{Name: name})
				case causes.KindMutate:
					mutating = append(mutating, admissionregistrationv1.MutatingWebhook{Name: name})
				}
				continue
			}
			rules = []admissionregistrationv1.RuleWithOperations{rule}
		}
		cc := s.ClientConfig(h.WebhookPath())
		cc.CABundle = s.CABundle()
		fp := admissionregistrationv1.Fail
		if h.ignore() {
			fp = admissionregistrationv1.Ignore
		}
		se := admissionregistrationv1.SideEffectClassNone
		if h.SideEffects {
			se = admissionregistrationv1.SideEffectClassNoneOnDryRun
		}
		timeout := int32(h.timeout().Seconds())
		match := admissionregistrationv1.Equivalent
		objSel, nsSel := h.ObjectSelector, h.NamespaceSelector
		if objSel == nil {
			objSel = &metav1.LabelSelector{}
		}
		if nsSel == nil && len(h.Rules) == 0 {
			nsSel = namespaceSelector(s.Namespaces)
		}
		if nsSel == nil {
			nsSel = &metav1.LabelSelector{}
		}
		versions := []string{"v1"}
		switch h.Kind {
		case causes.KindValidate:
			validating = append(validating, admissionregistrationv1.ValidatingWebhook{Name: name, ClientConfig: cc, Rules: rules,
				FailurePolicy: &fp, SideEffects: &se, TimeoutSeconds: &timeout, AdmissionReviewVersions: versions,
				MatchPolicy: &match, ObjectSelector: objSel, NamespaceSelector: nsSel})
		case causes.KindMutate:
			never := admissionregistrationv1.NeverReinvocationPolicy
			mutating = append(mutating, admissionregistrationv1.MutatingWebhook{Name: name, ClientConfig: cc, Rules: rules,
				FailurePolicy: &fp, SideEffects: &se, TimeoutSeconds: &timeout, AdmissionReviewVersions: versions,
				MatchPolicy: &match, ObjectSelector: objSel, NamespaceSelector: nsSel, ReinvocationPolicy: &never})
		}
	}
	vname, mname := ConfigurationNames(s.Prefix)
	errV := againIfRaced(func() error { return s.syncValidating(ctx, vname, validating, keep) })
	errM := againIfRaced(func() error { return s.syncMutating(ctx, mname, mutating, keep) })
	return unresolved, errors.Join(append(discoveryErrs, errV, errM)...)
}

// againIfRaced runs write, a read-compare-write of one configuration, again when it
// lost the race to another replica's (AlreadyExists, Conflict): the replicas of a
// Deployment start together and write the same configurations, and a lost race is
// not an error (it was one for the next retry, 10 s later, logged as such).
func againIfRaced(write func() error) error {
	var err error
	for range 3 {
		if err = write(); !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

// keepCurrent replaces the placeholders of hooks named in keep by the webhook of
// that name in the current configuration (cur), dropping those it does not have.
func keepCurrent[W any](hooks, cur []W, name func(*W) string, keep map[string]bool) []W {
	if len(keep) == 0 {
		return hooks
	}
	out := make([]W, 0, len(hooks))
	for _, h := range hooks {
		if !keep[name(&h)] {
			out = append(out, h)
			continue
		}
		for _, c := range cur {
			if name(&c) == name(&h) {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// rule resolves a Lua handler's resource into its webhook rule.
func (s *Syncer) rule(h Handler) (admissionregistrationv1.RuleWithOperations, error) {
	rr, err := processing.ResolveResource(s.Discovery, h.Resource)
	if err != nil {
		return admissionregistrationv1.RuleWithOperations{}, err
	}
	gvr, namespaced := rr.GVR, rr.Namespaced
	ops := []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll}
	if len(h.Operations) > 0 {
		ops = ops[:0]
		for _, o := range h.Operations {
			ops = append(ops, admissionregistrationv1.OperationType(o))
		}
	}
	scope := admissionregistrationv1.ClusterScope
	if namespaced {
		scope = admissionregistrationv1.NamespacedScope
	}
	res := gvr.Resource
	if h.Subresource != "" {
		res += "/" + h.Subresource
	}
	return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{
		APIGroups: []string{gvr.Group}, APIVersions: []string{gvr.Version}, Resources: []string{res}, Scope: &scope}}, nil
}

var nonName = regexp.MustCompile(`[^a-z0-9.-]+`)

// maxIDLabel and maxID bound the id's part of a webhook name: a DNS label is at
// most 63 characters (room left for a "-<n>" number), the name at most 253.
const maxIDLabel, maxID = 60, 100

// webhookName is "<id>.<kind>.<prefix>" made a DNS name (lower case; other
// characters as '-'; the dot-separated labels trimmed of '-', empty ones dropped;
// a label or id too long shortened with a hash of the id), numbered when two ids
// end up the same.
func webhookName(h Handler, prefix string, taken map[string]bool) string {
	id := dnsID(h.ID)
	base := id + "." + string(h.Kind) + "." + prefix
	name := base
	for n := 2; taken[name]; n++ {
		name = fmt.Sprintf("%s-%d.%s.%s", id, n, h.Kind, prefix)
	}
	taken[name] = true
	return name
}

// dnsID is a handler id as DNS labels (see webhookName).
func dnsID(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	hash := hex.EncodeToString(sum[:4])
	var labels []string
	for _, l := range strings.Split(nonName.ReplaceAllString(strings.ToLower(raw), "-"), ".") {
		l = strings.Trim(l, "-")
		if len(l) > maxIDLabel {
			l = strings.TrimRight(l[:maxIDLabel-len(hash)-1], "-") + "-" + hash
		}
		if l != "" {
			labels = append(labels, l)
		}
	}
	id := strings.Join(labels, ".")
	if len(id) > maxID {
		id = strings.TrimRight(id[:maxID-len(hash)-1], "-.") + "-" + hash
	}
	if id == "" {
		id = "handler"
	}
	return id
}

func (s *Syncer) meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{ManagedByLabel: "luaop"}}
}

func (s *Syncer) syncValidating(ctx context.Context, name string, hooks []admissionregistrationv1.ValidatingWebhook, keep map[string]bool) error {
	api := s.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cur, err := api.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		hooks = keepCurrent(hooks, cur.Webhooks, func(w *admissionregistrationv1.ValidatingWebhook) string { return w.Name }, keep)
	} else {
		hooks = keepCurrent(hooks, nil, func(w *admissionregistrationv1.ValidatingWebhook) string { return w.Name }, keep)
	}
	switch {
	case apierrors.IsNotFound(err):
		if len(hooks) == 0 {
			return nil
		}
		_, err = api.Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: s.meta(name), Webhooks: hooks}, metav1.CreateOptions{})
		s.logged("created", "ValidatingWebhookConfiguration", name, len(hooks), err)
		return wrap(err, "creating", name)
	case err != nil:
		return wrap(err, "reading", name)
	case len(hooks) == 0:
		err = api.Delete(ctx, name, metav1.DeleteOptions{})
		s.logged("deleted", "ValidatingWebhookConfiguration", name, 0, err)
		return wrap(ignoreNotFound(err), "deleting", name)
	case equality.Semantic.DeepEqual(cur.Webhooks, hooks):
		return nil
	}
	cur.Webhooks = hooks
	_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
	s.logged("updated", "ValidatingWebhookConfiguration", name, len(hooks), err)
	return wrap(err, "updating", name)
}

func (s *Syncer) syncMutating(ctx context.Context, name string, hooks []admissionregistrationv1.MutatingWebhook, keep map[string]bool) error {
	api := s.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	cur, err := api.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		hooks = keepCurrent(hooks, cur.Webhooks, func(w *admissionregistrationv1.MutatingWebhook) string { return w.Name }, keep)
	} else {
		hooks = keepCurrent(hooks, nil, func(w *admissionregistrationv1.MutatingWebhook) string { return w.Name }, keep)
	}
	switch {
	case apierrors.IsNotFound(err):
		if len(hooks) == 0 {
			return nil
		}
		_, err = api.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: s.meta(name), Webhooks: hooks}, metav1.CreateOptions{})
		s.logged("created", "MutatingWebhookConfiguration", name, len(hooks), err)
		return wrap(err, "creating", name)
	case err != nil:
		return wrap(err, "reading", name)
	case len(hooks) == 0:
		err = api.Delete(ctx, name, metav1.DeleteOptions{})
		s.logged("deleted", "MutatingWebhookConfiguration", name, 0, err)
		return wrap(ignoreNotFound(err), "deleting", name)
	case equality.Semantic.DeepEqual(cur.Webhooks, hooks):
		return nil
	}
	cur.Webhooks = hooks
	_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
	s.logged("updated", "MutatingWebhookConfiguration", name, len(hooks), err)
	return wrap(err, "updating", name)
}

// Remove deletes both configurations of the prefix (absent ones are fine).
func (s *Syncer) Remove(ctx context.Context) error {
	vname, mname := ConfigurationNames(s.Prefix)
	errV := ignoreNotFound(s.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, vname, metav1.DeleteOptions{}))
	errM := ignoreNotFound(s.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, mname, metav1.DeleteOptions{}))
	return errors.Join(wrap(errV, "deleting", vname), wrap(errM, "deleting", mname))
}

func (s *Syncer) logged(what, kind, name string, webhooks int, err error) {
	if err == nil && s.Log != nil {
		s.Log.Info("webhook configuration "+what, "kind", kind, "name", name, "webhooks", webhooks)
	}
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func wrap(err error, verb, name string) error {
	if err == nil {
		return nil
	}
	if apierrors.IsForbidden(err) {
		return newForbiddenError(err, verb, name)
	}
	return fmt.Errorf("%s the webhook configuration %s: %w", verb, name, err)
}

// ForbiddenError is the API server's refusal (403) of one request on a webhook
// configuration: it names the RBAC rule the operator lacks, exactly (the verb and
// the resource refused), so that the fix is one line of its ClusterRole.
type ForbiddenError struct {
	// Verb is the RBAC verb refused (get, create, update, delete); Resource the
	// resource (validatingwebhookconfigurations, mutatingwebhookconfigurations) and
	// Name the configuration.
	Verb, Resource, Name string
	Err                  error
}

// rbacVerbs are the RBAC verbs of wrap's verbs.
var rbacVerbs = map[string]string{"reading": "get", "creating": "create", "updating": "update", "deleting": "delete"}

func newForbiddenError(err error, verb, name string) *ForbiddenError {
	fe := &ForbiddenError{Verb: rbacVerbs[verb], Name: name, Err: err}
	if fe.Verb == "" {
		fe.Verb = verb
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		fe.Resource = status.Status().Details.Kind
	}
	if fe.Resource == "" {
		fe.Resource = "validatingwebhookconfigurations" // the probe's and the validating configuration's
		if strings.HasSuffix(name, ".mutate") {
			fe.Resource = "mutatingwebhookconfigurations"
		}
	}
	return fe
}

// Rule is the missing rule, as a ClusterRole lists it.
func (e *ForbiddenError) Rule() string {
	return fmt.Sprintf("{apiGroups: [admissionregistration.k8s.io], resources: [%s], verbs: [%s]}", e.Resource, e.Verb)
}

func (e *ForbiddenError) Error() string {
	return fmt.Sprintf("the operator may not %s the %s %s: its ClusterRole lacks the rule %s "+
		"(luaop rbac DIR prints every rule the scripts' admission handlers need: get, create, update and delete of "+
		"validatingwebhookconfigurations and mutatingwebhookconfigurations); the API server said: %v",
		e.Verb, strings.TrimSuffix(e.Resource, "s"), e.Name, e.Rule(), e.Err)
}

func (e *ForbiddenError) Unwrap() error { return e.Err }

// namespaceSelector expresses plain namespace names and exclusions as a selector on
// the kubernetes.io/metadata.name label; nil when there are none or a glob.
func namespaceSelector(patterns []string) *metav1.LabelSelector {
	var in, out []string
	for _, p := range patterns {
		name, excluded := strings.CutPrefix(p, "!")
		if name == "" || strings.ContainsAny(name, "*?[") {
			return nil
		}
		if excluded {
			out = append(out, name)
		} else {
			in = append(in, name)
		}
	}
	sel := &metav1.LabelSelector{}
	if len(in) > 0 {
		sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: in})
	}
	if len(out) > 0 {
		sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: out})
	}
	if len(sel.MatchExpressions) == 0 {
		return nil
	}
	return sel
}
