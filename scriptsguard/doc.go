// Package scriptsguard is the validating webhook that guards the operator's own
// scripts ConfigMap (--scripts-configmap, issue 21): [ScriptsGuard] rejects an
// update whose scripts do not load, with the file:line of the error, checked in a
// throwaway runtime under the operator's Lua options (scriptcheck.CheckLoad).
//
// It owns that webhook's rule, its answer and its failure policy, nothing else: the
// keys a ConfigMap's scripts are read from are scriptsource's (ScriptsOfConfigMap),
// serving the webhook is admission's, and keeping the last good scripts is
// reloading's. It is a leaf below cmd/: cmd/luaop registers it with the operator's
// webhooks; reloading, and through it devloop, do not import it (nor admission).
package scriptsguard
