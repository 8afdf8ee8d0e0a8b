// Package kubeauth authenticates and authorizes HTTP requests with the Kubernetes
// API server, as controller-runtime's secure metrics (and kube-rbac-proxy) do: the
// request's bearer token is reviewed with a TokenReview, and the user it names must
// be allowed, by a SubjectAccessReview, the request's verb on its path as a
// non-resource URL (get /metrics). Answers are cached for a short time, so that a
// scrape every 15 seconds costs the API server two reviews a minute at most.
//
// It imports no luaop package and must stay a leaf: cmd/luaop puts it in front of
// /metrics. Its cache is behind a leaf mutex, never held while a review is sent.
package kubeauth
