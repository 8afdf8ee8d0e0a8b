package admission

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The reachability probe proves that the API server calls this operator's webhook
// server, end to end (its network, the address, the certificate): a webhook of the
// operator's own, in the ValidatingWebhookConfiguration "<prefix>.probe", covers the
// creation of Leases that carry the probe's label in one namespace, and only those;
// the probe asks the API server for a server-side dry run of such a Lease. Nothing
// is stored. The webhook (served at /probe/reachability, by any replica) rejects it
// with the probe's token; the API server's answer then is one of:
//   - "denied the request: luaop webhook probe <token>": reached;
//   - "failed calling webhook ...": not reached, with the API server's reason
//     (connection refused, no route to host, a certificate error, a timeout);
//   - created (the dry run passed): the API server has not seen the probe's
//     configuration yet (it reads configurations through a watch): asked again.
// A probe webhook left behind (a killed dev session, a test's operator) covers
// nothing but its own prefix's probes: its failure policy rejects nothing else, and
// another operator's probe (another prefix: another ProbeOwnerLabel) goes past it.

// probePath is where the webhook server answers the probe.
const probePath = "/probe/reachability"

// ProbeLabel carries the probe's token on the dry-run Lease; the probe webhook's
// objectSelector requires it.
const ProbeLabel = "probe.luaop.dev/token"

// ProbeOwnerLabel names, on the dry-run Lease, the prefix whose probe it is (as
// probeOwner's hash: a prefix may be longer than a label value); the probe
// webhook's objectSelector requires its own, so that a configuration left behind
// by an operator of another prefix, answered by nobody, never fails this one's probe.
const ProbeOwnerLabel = "probe.luaop.dev/of"

// probeOwner is ProbeOwnerLabel's value for prefix.
func probeOwner(prefix string) string {
	sum := sha256.Sum256([]byte(prefix))
	return hex.EncodeToString(sum[:10])
}

// probeMessage is the probe webhook's rejection of a probe with token.
func probeMessage(token string) string { return "luaop webhook probe " + token }

// ProbeConfigurationName is the name of the probe's ValidatingWebhookConfiguration.
func ProbeConfigurationName(prefix string) string { return prefix + ".probe" }

// Reachability is the outcome of the last probe.
type Reachability struct {
	// Checked: a probe ran (false before the first, or when the configurations are
	// not written: --dry-run, a remote cluster and loopback).
	Checked bool `json:"checked"`
	// Reachable: the API server called the webhook server.
	Reachable bool `json:"reachable"`
	// URL is the base address the API server was given ("" with a Service).
	URL string `json:"url,omitempty"`
	// Service is "namespace/name" when the API server calls through a Service.
	Service string `json:"service,omitempty"`
	// Error is why not, with what to do.
	Error string    `json:"error,omitempty"`
	At    time.Time `json:"at"`
	// Took is how long the probe took.
	Took time.Duration `json:"took"`
}

// answerProbe is the probe webhook: it rejects the probe with its token.
func answerProbe(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	data, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes))
	if err != nil || json.Unmarshal(data, &review) != nil || review.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	var obj struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	_ = json.Unmarshal(review.Request.Object.Raw, &obj)
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: false,
		Result: &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Message: probeMessage(obj.Metadata.Labels[ProbeLabel])}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Response: resp})
}

// prober runs probes for one operator.
type prober struct {
	client    kubernetes.Interface
	prefix    string
	namespace string
	// clientConfig is how the API server reaches probePath, caBundle included.
	clientConfig func() admissionregistrationv1.WebhookClientConfig
	// budget bounds one probe; retryEvery spaces its attempts.
	budget, retryEvery time.Duration
}

// probeTimeout is the probe webhook's timeoutSeconds: an address that drops packets
// fails an attempt within it.
const probeTimeout int32 = 2

// probeTries is how many failures to call the webhook in a row end a probe.
const probeTries = 3

// defaultProbeBudget bounds one probe ("within a few seconds").
const defaultProbeBudget = 6 * time.Second

// configuration is the probe's ValidatingWebhookConfiguration.
func (p *prober) configuration() *admissionregistrationv1.ValidatingWebhookConfiguration {
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	equivalent := admissionregistrationv1.Equivalent
	scope := admissionregistrationv1.NamespacedScope
	timeout := probeTimeout
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ProbeConfigurationName(p.prefix), Labels: map[string]string{ManagedByLabel: "luaop"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "reachability.probe." + p.prefix,
			ClientConfig: p.clientConfig(),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{coordinationv1.GroupName}, APIVersions: []string{"v1"},
					Resources: []string{"leases"}, Scope: &scope},
			}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{p.namespace}}}},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{ProbeOwnerLabel: probeOwner(p.prefix)},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: ProbeLabel, Operator: metav1.LabelSelectorOpExists}}},
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout, MatchPolicy: &equivalent,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// ensure writes the probe's configuration when it is missing or different. Every
// replica writes the same one, and replicas start together (a Deployment's, three
// with deploy/components/sharding): a create or update that loses the race to
// another (AlreadyExists, Conflict) reads the winner's copy and compares again,
// instead of failing the probe (seen on a node: the replica's webhooks reported not
// reached until the next resync).
func (p *prober) ensure(ctx context.Context) error {
	return againIfRaced(func() error { return p.ensureOnce(ctx) })
}

func (p *prober) ensureOnce(ctx context.Context) error {
	api := p.client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	want := p.configuration()
	cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, want, metav1.CreateOptions{})
		return wrap(err, "creating", want.Name)
	case err != nil:
		return wrap(err, "reading", want.Name)
	case equality.Semantic.DeepEqual(cur.Webhooks, want.Webhooks):
		return nil
	}
	cur.Webhooks = want.Webhooks
	_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
	return wrap(err, "updating", want.Name)
}

// remove deletes the probe's configuration.
func (p *prober) remove(ctx context.Context) error {
	name := ProbeConfigurationName(p.prefix)
	return wrap(ignoreNotFound(p.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})), "deleting", name)
}

// errNotReached is wrapped by a probe's error when the API server answered that it
// could not call the webhook (as opposed to the probe itself failing).
var errNotReached = errors.New("the API server cannot call the webhook server")

// run probes once: nil when the API server called the webhook server.
func (p *prober) run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.budget)
	defer cancel()
	if err := p.ensure(ctx); err != nil {
		return fmt.Errorf("writing the probe's webhook configuration: %w", err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "luaop-webhook-probe-" + token, Namespace: p.namespace,
		Labels: map[string]string{ProbeLabel: token, ProbeOwnerLabel: probeOwner(p.prefix)}}}
	var last error
	notSeen := false
	// notReached counts the API server's failures to call the webhook in a row: a
	// refused connection or a missing route does not heal within a probe, so a few
	// say enough (a timeout takes probeTimeout each).
	notReached := 0
	for {
		_, err := p.client.CoordinationV1().Leases(p.namespace).Create(ctx, lease, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil:
			notSeen = true // the API server has not read the probe's configuration yet
		case strings.Contains(err.Error(), probeMessage(token)):
			return nil
		case strings.Contains(err.Error(), `failed calling webhook "reachability.probe.`+p.prefix+`"`):
			reason := apiReason(err)
			if i := strings.Index(reason, "failed calling webhook"); i > 0 {
				reason = reason[i:] // without "Internal error occurred: "
			}
			last = fmt.Errorf("%w: %s", errNotReached, reason)
			if notReached++; notReached >= probeTries {
				return last
			}
		case apierrors.IsForbidden(err):
			return fmt.Errorf("the probe's dry run of a Lease in namespace %s is forbidden (%v): grant create of leases there (luaop rbac)", p.namespace, err)
		case apierrors.IsNotFound(err):
			return fmt.Errorf("the probe's namespace %s: %v", p.namespace, err)
		default:
			last = err
		}
		t := time.NewTimer(p.retryEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			if last == nil && notSeen {
				last = fmt.Errorf("the API server did not apply the probe's webhook configuration within %s", p.budget)
			}
			if last == nil {
				last = ctx.Err()
			}
			return last
		case <-t.C:
		}
	}
}

// apiReason is the message of an API error without its Kubernetes wrapping.
func apiReason(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	return err.Error()
}
