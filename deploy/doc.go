// Package deploy holds luaop's Kubernetes manifests, as kustomize folders: base/
// (the operator without scripts), examples/ (an overlay with the example scripts and
// CRDs, what `kubectl apply -k deploy/examples` installs), my-scripts/ (the template
// of a user's own overlay), components/ (ServiceMonitor, cert-manager, sharding) and
// ci/ (CI recipes for a repository of scripts: a GitHub Actions workflow, pre-commit
// hooks).
// README.md says how to use them.
//
// The package has no code outside its tests (package deploy_test): they render the
// folders with kubectl kustomize and check what a deployment needs, and a server-side
// dry run has the API server accept them. They read the manifests and the scripts
// as files, load the scripts through luabind as the mounted folder would be, check
// the series the monitoring queries name against metrics' Names, and must not run
// an operator: e2e/node deploys these manifests on a real node.
package deploy
