// Package admission serves the operator's admission webhooks: the validate and
// mutate handlers of the Lua scripts (luaop.on.validate, luaop.on.mutate) and any
// validator or mutator registered from Go.
//
// # Parts
//
//   - Server (server.go) is the http.Handler of the admission reviews: one path per
//     handler (/validate/<id>, /mutate/<id>; the configurations give the API
//     server that path behind the failure policy, /fail/validate/<id> or
//     /ignore/validate/<id>). It looks the handler up at every request (a reload
//     swaps the Lua handlers atomically: a request runs the handler of the
//     generation current when it arrives; a request for a handler removed by a
//     reload, or of a stale configuration, is answered per the policy in its path
//     until the configurations follow), runs it under a deadline below the
//     webhook's timeoutSeconds (whole seconds), and turns the verdict
//     into an AdmissionReview response: a rejection's message and code, warnings,
//     and for mutate handlers a JSON patch computed from what the handler wrote
//     into ctx.patch (patch.go).
//   - Certificates (certs.go): tls.crt/tls.key (and ca.crt, the caBundle) read from
//     a folder, as cert-manager or a mounted Secret provide them, and read again
//     when they change; or, without a folder, a CA and a serving certificate made
//     at start (valid for loopback, the Service's DNS names and the --webhook-url
//     host).
//   - Syncer (syncer.go) creates, updates and deletes the
//     ValidatingWebhookConfiguration "<prefix>.validate" and the
//     MutatingWebhookConfiguration "<prefix>.mutate": one webhook per handler, its
//     rules from the handler's resource as discovery resolves it (group, version,
//     plural, scope), operations, failure policy, timeout, side effects, the
//     handler's static label filters as objectSelector (kopf's), a namespaceSelector
//     from plain --namespaces, and the caBundle. It runs after each reload (Webhooks.Resync) and retries resources
//     not served yet (a CRD installed later).
//   - Webhooks (webhooks.go) assembles them for cmd/luaop: listen on
//     --webhook-address, serve, sync, and remove the configurations on request
//     (Webhooks.Remove; `luaop webhooks remove`; `luaop dev` does it at exit).
//     Only the operator that works (peering: Webhooks.SetActive) writes them.
//   - The address (address.go): with neither --webhook-url nor --webhook-service,
//     where the API server can call this machine: the local address on the route to
//     a Node's InternalIP (kind, k3d, minikube), else on the network of one of the
//     API server certificate's addresses, else kopf's ClusterDetector's host names
//     (host.k3d.internal, host.minikube.internal, host.docker.internal), else
//     127.0.0.1 for a control plane on this machine. The certificate covers it.
//   - The reachability probe (probe.go): a webhook of the operator's own
//     ("<prefix>.probe", covering only Leases labelled with its token) and a
//     server-side dry run through it prove that the API server calls the webhook
//     server. Registered by URL, the handlers' webhooks are written only after a
//     probe succeeded and removed when one fails (a Fail webhook nobody answers
//     refuses every request it covers); through a Service the probe only reports.
//     Webhooks.Reachability is the last outcome (/readyz, the metric, the dev view).
//
// # Timeouts and failure policy
//
// A handler runs under a deadline of 4/5 of its webhook's timeoutSeconds (10 s by
// default, 1 to 30), and the Server answers by then whatever the handler does: a
// handler that fails (a Lua error, its deadline, removed by a reload) is answered
// per its failure policy: "Fail" (the default, kopf's) rejects with the reason,
// "Ignore" allows with a warning. The API server never waits past the webhook's
// timeout because of luaop. A rejection by the handler (return false, "message",
// or error(luaop.admission_error(message, code))) is not a failure: it rejects
// whatever the policy.
//
// # Go handlers
//
// Webhooks.Register adds a Handler whose Admit is a Go function (for example a
// validator of the operator's own scripts ConfigMap): it is served and synced like
// the Lua handlers, with the rules it gives (and its own selectors; the operator's
// namespaceSelector is not added). Its path is /<kind>/<ID>: give it an ID no
// script uses (a Go handler wins over a script's handler of the same path).
// Concurrency: the Server and the Syncer
// keep their state behind atomic pointers and one leaf mutex; no lock is held while
// a handler runs or the API server is called.
//
// # Boundaries
//
// It serves what luabind's Runtime holds (the Lua handlers) and resolves resources
// with processing's discovery rules (ResolveResource); it must not import operator,
// devloop or cmd/luaop: whoever loads the scripts tells it (Webhooks.Resync), and
// it never reaches back up into its caller.
package admission
