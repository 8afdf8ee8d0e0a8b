package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/luaop/luaop/admission"
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
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			syncer := &admission.Syncer{Client: client, Prefix: s.Prefix}
			if err := syncer.Remove(cmd.Context()); err != nil {
				return err
			}
			v, m := admission.ConfigurationNames(s.Prefix)
			fmt.Fprintf(cmd.OutOrStdout(), "removed ValidatingWebhookConfiguration %s and MutatingWebhookConfiguration %s (when present)\n", v, m)
			return nil
		},
	}
	remove.Flags().StringVar(&s.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	remove.Flags().StringVar(&s.Context, "context", "", "kubeconfig context to use")
	remove.Flags().StringVar(&s.Prefix, "prefix", "luaop.dev", "the operator's --prefix")
	cmd.AddCommand(remove)
	return cmd
}
