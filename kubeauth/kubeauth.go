package kubeauth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Options configure a Filter.
type Options struct {
	// Client makes the reviews (its identity needs create on tokenreviews and
	// subjectaccessreviews).
	Client kubernetes.Interface
	// AllowedTTL and DeniedTTL are how long a decision is reused for the same
	// token, verb and path. Default 1 minute and 10 seconds (controller-runtime's
	// delegating authenticator caches 2 minutes and 10 seconds).
	AllowedTTL, DeniedTTL time.Duration
	// Logger receives the failed reviews. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock (tests). Defaults to time.Now.
	Now func() time.Time
}

// Filter guards handlers.
type Filter struct {
	opts Options

	mu    sync.Mutex // a leaf: guards cache, never held while reviewing
	cache map[[32]byte]decision
}

type decision struct {
	code    int // 0: allowed; else 401 or 403
	message string
	until   time.Time
}

// maxCached bounds the cache: past it, it is emptied (tokens of a scraper are few).
const maxCached = 1024

// New makes a Filter.
func New(opts Options) *Filter {
	if opts.AllowedTTL <= 0 {
		opts.AllowedTTL = time.Minute
	}
	if opts.DeniedTTL <= 0 {
		opts.DeniedTTL = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Filter{opts: opts, cache: map[[32]byte]decision{}}
}

// Wrap serves next only to requests whose bearer token the API server
// authenticates and whose user may do the request's verb on its path: 401
// without a valid token, 403 when not allowed.
func (f *Filter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="luaop"`)
			http.Error(w, "Unauthorized: give a bearer token (a ServiceAccount's) allowed get on "+r.URL.Path, http.StatusUnauthorized)
			return
		}
		verb := verbOf(r.Method)
		d := f.decide(r.Context(), token, verb, r.URL.Path)
		if d.code != 0 {
			if d.code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="luaop"`)
			}
			http.Error(w, d.message, d.code)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	token = strings.TrimSpace(token)
	return token, ok && token != ""
}

// verbOf is the authorization verb of an HTTP method, as the API server's.
func verbOf(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "post"
	case http.MethodPut:
		return "put"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(method)
}

func (f *Filter) decide(ctx context.Context, token, verb, path string) decision {
	key := sha256.Sum256([]byte(token + "\x00" + verb + "\x00" + path))
	now := f.opts.Now()
	f.mu.Lock()
	d, ok := f.cache[key]
	f.mu.Unlock()
	if ok && now.Before(d.until) {
		return d
	}
	d = f.review(ctx, token, verb, path)
	if d.code == http.StatusInternalServerError {
		return d // the API server failed: not cached, asked again next time
	}
	ttl := f.opts.AllowedTTL
	if d.code != 0 {
		ttl = f.opts.DeniedTTL
	}
	d.until = now.Add(ttl)
	f.mu.Lock()
	if len(f.cache) >= maxCached {
		clear(f.cache)
	}
	f.cache[key] = d
	f.mu.Unlock()
	return d
}

func (f *Filter) review(ctx context.Context, token, verb, path string) decision {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr, err := f.opts.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		f.opts.Logger.Error("authenticating a request with a TokenReview failed (the operator needs create on tokenreviews)", "path", path, "error", err)
		return decision{code: http.StatusInternalServerError, message: "cannot authenticate the request: the TokenReview failed"}
	}
	if !tr.Status.Authenticated {
		return decision{code: http.StatusUnauthorized, message: "Unauthorized: the API server does not accept the bearer token"}
	}
	u := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := f.opts.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb}}}, metav1.CreateOptions{})
	if err != nil {
		f.opts.Logger.Error("authorizing a request with a SubjectAccessReview failed (the operator needs create on subjectaccessreviews)", "path", path, "error", err)
		return decision{code: http.StatusInternalServerError, message: "cannot authorize the request: the SubjectAccessReview failed"}
	}
	if !sar.Status.Allowed {
		return decision{code: http.StatusForbidden, message: fmt.Sprintf("Forbidden: %s may not %s %s (grant it with a ClusterRole of nonResourceURLs: [%q], verbs: [%q])", u.Username, verb, path, path, verb)}
	}
	return decision{}
}
