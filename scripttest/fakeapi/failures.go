package fakeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Failure is a failure the server injects (a test case's fail:): the calls of Verb
// on Resource named Name (each "" for any) are answered with the error of Code, the
// first Times of them (0: every one).
type Failure struct {
	// Verb: get, list, create, patch, delete or apply ("" or "*": any).
	Verb string `json:"verb,omitempty"`
	// Resource: the plural (configmaps), the kind (ConfigMap), or either after the
	// group ("configmaps", "widgets.examples.luaop.dev", "apps/deployments"); ""
	// or "*": any.
	Resource string `json:"resource,omitempty"`
	// Name is the object's name ("" or "*": any); Namespace its namespace.
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	// Code is the HTTP status of the error: 400, 401, 403, 404, 409, 410, 422, 429,
	// 500, 503, 504, or "timeout" (504, the API server's request timeout).
	Code Code `json:"code"`
	// Times is how many matching calls fail, from the first; 0 (the default): every one.
	Times int `json:"times,omitempty"`
	// Message replaces the error's default message where the error has one of its own.
	Message string `json:"message,omitempty"`
}

// Code is an HTTP status, written as a number or "timeout".
type Code int

// UnmarshalJSON reads 409 or "409" or "timeout".
func (c *Code) UnmarshalJSON(data []byte) error {
	var n int
	if err := json.Unmarshal(data, &n); err == nil {
		*c = Code(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return errors.New("code: a status such as 409, or \"timeout\"")
	}
	if s == "timeout" {
		*c = http.StatusGatewayTimeout
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("code %q: a status such as 409, or \"timeout\"", s)
	}
	*c = Code(n)
	return nil
}

// Codes are the statuses a failure may have.
var Codes = []int{400, 401, 403, 404, 409, 410, 422, 429, 500, 503, 504}

// Verbs are the verbs a failure may name.
var Verbs = []string{"get", "list", "create", "patch", "delete", "apply"}

func (f Failure) check() error {
	if f.Verb != "" && f.Verb != "*" && !slices.Contains(Verbs, f.Verb) {
		return fmt.Errorf("fail: verb %q: use one of %s (or leave it out for any)", f.Verb, strings.Join(Verbs, ", "))
	}
	if !slices.Contains(Codes, int(f.Code)) {
		return fmt.Errorf("fail: code %d: use one of %v or \"timeout\"", f.Code, Codes)
	}
	if f.Times < 0 {
		return fmt.Errorf("fail: times %d: a number of calls (0: every one)", f.Times)
	}
	return nil
}

type failureState struct {
	Failure
	fired int
}

func any_(s string) bool { return s == "" || s == "*" }

// matches tells whether the failure covers a call of verb on k's ns/name.
func (f *failureState) matches(c *Call, k *kind) bool {
	if !any_(f.Verb) && f.Verb != c.Verb {
		return false
	}
	if !any_(f.Name) && f.Name != c.Name || f.Namespace != "" && f.Namespace != c.Namespace {
		return false
	}
	if f.Times > 0 && f.fired >= f.Times {
		return false
	}
	if any_(f.Resource) {
		return true
	}
	group, res, grouped := strings.Cut(f.Resource, "/")
	if !grouped {
		res, group, grouped = f.Resource, "", false
		if r, g, ok := strings.Cut(f.Resource, "."); ok {
			res, group, grouped = r, g, true
		}
	} else if _, r, ok := strings.Cut(res, "/"); ok { // group/version/plural
		res = r
	}
	if grouped && group != k.gvk.Group {
		return false
	}
	return strings.EqualFold(res, k.plural) || res == k.gvk.Kind
}

// inject answers c with the first failure that covers it, counting it.
func (s *Server) inject(c *Call, k *kind) error {
	for _, f := range s.failures {
		if f.matches(c, k) {
			f.fired++
			return injectedError{failureError(f.Failure, c, k)}
		}
	}
	return nil
}

// injectedError is an error of the case's fail: list (Injected tells it).
type injectedError struct{ error }

func (e injectedError) Unwrap() error { return e.error }

// Injected tells whether err was injected by a Failure.
func Injected(err error) bool {
	var ie injectedError
	return errors.As(err, &ie)
}

// failureError is the error of f for the call c, as the API server words it.
func failureError(f Failure, c *Call, k *kind) error {
	gr, name := k.groupResource(), c.Name
	msg := func(def string) string {
		if f.Message != "" {
			return f.Message
		}
		return def
	}
	switch f.Code {
	case 400:
		return apierrors.NewBadRequest(msg("the request is invalid (injected by the test case)"))
	case 401:
		return apierrors.NewUnauthorized(msg("Unauthorized"))
	case 403:
		verb := c.Verb
		if verb == "apply" {
			verb = "patch"
		}
		where := ""
		if k.namespaced && c.Namespace != "" {
			where = fmt.Sprintf(" in the namespace %q", c.Namespace)
		}
		return apierrors.NewForbidden(gr, name, errors.New(msg(fmt.Sprintf("User %q cannot %s resource %q in API group %q%s",
			"system:serviceaccount:luaop-system:luaop", verb, k.plural, k.gvk.Group, where))))
	case 404:
		return apierrors.NewNotFound(gr, name)
	case 409:
		if c.Verb == "create" {
			return apierrors.NewAlreadyExists(gr, name)
		}
		return apierrors.NewConflict(gr, name, errors.New(msg("the object has been modified; please apply your changes to the latest version and try again")))
	case 410:
		return apierrors.NewResourceExpired(msg("too old resource version"))
	case 422:
		return apierrors.NewInvalid(k.gvk.GroupKind(), name, field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), name, msg("rejected (injected by the test case)"))})
	case 429:
		return apierrors.NewTooManyRequests(msg("the server has received too many requests and has asked us to try again later"), 1)
	case 500:
		return apierrors.NewInternalError(errors.New(msg("an error on the server (injected by the test case)")))
	case 503:
		return apierrors.NewServiceUnavailable(msg("the server is currently unable to handle the request"))
	case 504:
		return apierrors.NewTimeoutError(msg("request did not complete within requested timeout - context deadline exceeded"), 0)
	}
	return apierrors.NewGenericServerResponse(int(f.Code), c.Verb, gr, name, msg(""), 0, false)
}
