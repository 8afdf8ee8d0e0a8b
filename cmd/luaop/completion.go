package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/scripttest"
)

// flagValues are the values a flag accepts, completed by the shell (luaop
// completion bash|zsh|fish|powershell).
var flagValues = map[string][]string{
	"log-format":        {"plain", "json"},
	"log-level":         {"debug", "info", "warn", "error"},
	"lifecycle":         {"asap", "one-by-one", "all-at-once"},
	"progress-storage":  {"auto", "annotations", "status"},
	"diffbase-storage":  {"auto", "annotations", "status"},
	"log-events-level":  {"debug", "info", "warning", "error", "none"},
	"lua-memory-budget": {"auto", "off", "256Mi", "512Mi", "1Gi"},
	"verbose":           {"0", "2", "4", "6", "8"},
}

// folderFlags and fileFlags complete as paths.
var (
	folderFlags = []string{"webhook-cert-dir", "metrics-cert-dir", "tests"}
	fileFlags   = []string{"kubeconfig", "config", "apply", "output", "luacheckrc", "luarc", "schema"}
)

// addCompletions registers the shell completion of every command's arguments and
// flag values: folders for DIR, the values of enumerated flags, namespaces and
// kubeconfig contexts read from the cluster and the kubeconfig, test cases for
// luaop test --run.
func addCompletions(root *cobra.Command) {
	for _, cmd := range root.Commands() {
		if strings.Contains(cmd.Use, "DIR") && cmd.ValidArgsFunction == nil {
			cmd.ValidArgsFunction = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
				return nil, cobra.ShellCompDirectiveFilterDirs
			}
		}
		fs := cmd.Flags()
		for name, values := range flagValues {
			if fs.Lookup(name) != nil {
				vals := values
				_ = cmd.RegisterFlagCompletionFunc(name, func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
					return vals, cobra.ShellCompDirectiveNoFileComp
				})
			}
		}
		if f := fs.Lookup("format"); f != nil {
			formats := formatsOf(f.Usage)
			_ = cmd.RegisterFlagCompletionFunc("format", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
				return formats, cobra.ShellCompDirectiveNoFileComp
			})
		}
		for _, name := range folderFlags {
			if fs.Lookup(name) != nil {
				_ = cmd.MarkFlagDirname(name)
			}
		}
		for _, name := range fileFlags {
			if fs.Lookup(name) != nil {
				_ = cmd.MarkFlagFilename(name)
			}
		}
		if fs.Lookup("namespaces") != nil {
			_ = cmd.RegisterFlagCompletionFunc("namespaces", completeNamespaces)
		}
		if fs.Lookup("context") != nil {
			_ = cmd.RegisterFlagCompletionFunc("context", completeContexts)
		}
		if cmd.Name() == "test" {
			_ = cmd.RegisterFlagCompletionFunc("run", completeTestCases)
		}
	}
}

// formatsOf reads the formats a --format flag lists in its usage ("text, json or
// sarif" after "format:").
func formatsOf(usage string) []string {
	_, list, ok := strings.Cut(usage, ": ")
	if !ok {
		return nil
	}
	list, _, _ = strings.Cut(list, " (")
	var out []string
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		if f != "or" {
			out = append(out, f)
		}
	}
	return out
}

// kubeconfigOf is the kubeconfig the command line given so far names.
func kubeconfigOf(cmd *cobra.Command) clientcmd.ClientConfig {
	var s settings
	s.Kubeconfig, _ = cmd.Flags().GetString("kubeconfig")
	s.Context, _ = cmd.Flags().GetString("context")
	return clientConfig(s)
}

// completeNamespaces lists the cluster's namespaces (within 3 seconds; nothing
// when it cannot be reached).
func completeNamespaces(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	cfg, err := kubeconfigOf(cmd).ClientConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	cfg.Timeout = 3 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	list, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for _, ns := range list.Items {
		if strings.HasPrefix(ns.Name, toComplete) {
			names = append(names, ns.Name)
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completeContexts lists the kubeconfig's contexts.
func completeContexts(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
	raw, err := kubeconfigOf(cmd).RawConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for name := range raw.Contexts {
		names = append(names, name)
	}
	slices.Sort(names)
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completeTestCases lists the cases of DIR/tests (or --tests) as FILE/NAME, the form
// --run matches, anchored.
func completeTestCases(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	tests, _ := cmd.Flags().GetString("tests")
	if tests == "" && len(args) > 0 {
		tests = filepath.Join(args[0], "tests")
	}
	if tests == "" {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	files, err := scripttest.Files(tests)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, name := range scripttest.CaseNames(filepath.Base(f), data) {
			names = append(names, "^"+regexpQuote(name)+"$")
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// regexpQuote quotes the characters of a case name that --run's regular expression
// would read as operators.
func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
