package kubeauth

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// Decisions are cached per token, verb and path: a scraper costs the API server two
// reviews per AllowedTTL, a denied one per DeniedTTL; the answers are 401 and 403 as
// a client expects them.
func TestFilterReviewsAndCaches(t *testing.T) {
	client := fake.NewClientset()
	reviews := 0
	client.PrependReactor("create", "tokenreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		reviews++
		tr := a.(clienttesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		if tr.Spec.Token == "good" || tr.Spec.Token == "other" {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "system:serviceaccount:mon:" + tr.Spec.Token}}
		}
		return true, tr, nil
	})
	client.PrependReactor("create", "subjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		reviews++
		sar := a.(clienttesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = sar.Spec.User == "system:serviceaccount:mon:good" && sar.Spec.NonResourceAttributes.Path == "/metrics" && sar.Spec.NonResourceAttributes.Verb == "get"
		return true, sar, nil
	})
	now := time.Unix(1000, 0)
	f := New(Options{Client: client, Now: func() time.Time { return now }})
	h := f.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	do := func(token string) int {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for _, tt := range []struct {
		token string
		code  int
	}{{"", 401}, {"bad", 401}, {"other", 403}, {"good", 200}} {
		if got := do(tt.token); got != tt.code {
			t.Errorf("token %q: %d, want %d", tt.token, got, tt.code)
		}
	}
	before := reviews
	for i := 0; i < 4; i++ { // a scrape every 15 s for a minute
		now = now.Add(15 * time.Second)
		if do("good") != 200 {
			t.Fatal("a cached allowed token is refused")
		}
	}
	if n := reviews - before; n != 2 {
		t.Errorf("%d reviews for a minute of scrapes, want 2 (one TokenReview and one SubjectAccessReview once the cache expired)", n)
	}
}
