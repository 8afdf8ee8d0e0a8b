package main

import (
	"fmt"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/devloop"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/metrics"
)

func newWebhooksCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Manage the admission webhook configurations luaop writes",
	}
	var s settings
	remove := &cobra.Command{
		Use:   "remove",
		Short: "Delete the ValidatingWebhookConfiguration and MutatingWebhookConfiguration of an operator (by --prefix)",
		Long: `Delete the ValidatingWebhookConfiguration "<prefix>.validate" and the
MutatingWebhookConfiguration "<prefix>.mutate" that luaop run/dev wrote for the
validate and mutate handlers. Use it after uninstalling an operator, or after a
luaop dev session that was killed before it could remove them: a webhook nobody
answers rejects every request it covers (failure_policy "Fail").`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := restConfig(s)
			if err != nil {
				return err
			}
			if err := checkReachable(cfg); err != nil { // exit status 5, as every command reaching the cluster
				return err
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			syncer := &admission.Syncer{Client: client, Prefix: s.Prefix}
			if err := syncer.Remove(cmd.Context()); err != nil {
				return err
			}
			probe := admission.ProbeConfigurationName(s.Prefix)
			if err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(cmd.Context(), probe, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting the webhook configuration %s: %w", probe, err)
			}
			v, m := admission.ConfigurationNames(s.Prefix)
			fmt.Fprintf(cmd.OutOrStdout(), "removed ValidatingWebhookConfigurations %s and %s and MutatingWebhookConfiguration %s (when present)\n", v, probe, m)
			return nil
		},
	}
	remove.Flags().StringVar(&s.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	remove.Flags().StringVar(&s.Context, "context", "", "kubeconfig context to use")
	remove.Flags().StringVar(&s.Prefix, "prefix", "luaop.dev", "the operator's --prefix")
	cmd.AddCommand(remove)
	return cmd
}

// probeNamespace is where the reachability probe dry-runs its Lease: an existing
// namespace the operator may create Leases in: the pod's own, else the one
// namespace of -n, else "default".
func probeNamespace(s settings) string {
	if ns := podNamespace(); ns != "" {
		return ns
	}
	if len(s.Namespaces) == 1 && !strings.ContainsAny(s.Namespaces[0], "*?[!") {
		return s.Namespaces[0]
	}
	return "default"
}

// reachabilityReport tells the metrics, and the dev view when the outcome
// changed, about each reachability probe.
func reachabilityReport(m *metrics.Metrics, view *devloop.View, rt func() *luabind.Runtime) func(admission.Reachability) {
	var mu sync.Mutex
	last := ""
	return func(r admission.Reachability) {
		m.WebhookReachable(r.Reachable)
		if view == nil {
			return
		}
		note := "reached"
		if !r.Reachable {
			note = r.Error
		}
		mu.Lock()
		changed := note != last
		last = note
		mu.Unlock()
		if !changed {
			return
		}
		if !r.Reachable {
			view.Note(false, "webhooks: "+r.Error)
			return
		}
		where := r.URL
		if r.Service != "" {
			where = "Service " + r.Service
		}
		view.Note(true, fmt.Sprintf("webhooks: %d admission handler(s) at %s: the API server reaches them (probe %s)",
			len(rt().AdmissionHandlers()), where, r.Took.Round(1e6)))
	}
}
