package processing

import (
	"testing"

	"github.com/luaop/luaop/processing/causes"
)

func TestServesCause(t *testing.T) {
	create := causes.Spec{ID: "c", Kind: causes.KindChange, Reasons: []causes.Reason{causes.Create}}
	resume := causes.Spec{ID: "r", Kind: causes.KindChange, Reasons: []causes.Reason{causes.Resume}}
	resumeDeleted := resume
	resumeDeleted.Deleted = true
	initial := objectFacts{noticedByListing: true}
	handledSinceStart := objectFacts{noticedByListing: true, resumeIsHandled: true}
	tests := []struct {
		name   string
		spec   causes.Spec
		reason causes.Reason
		facts  objectFacts
		want   bool
	}{
		{"create handler on create", create, causes.Create, objectFacts{}, true},
		{"create handler not on update", create, causes.Update, initial, false},
		{"resume handler on resume", resume, causes.Resume, initial, true},
		{"resume handler never joins a creation, not even of a listed object (kopf)", resume, causes.Create, initial, false},
		{"resume handler joins the first update after start", resume, causes.Update, initial, true},
		{"resume handler not on objects created after start", resume, causes.Create, objectFacts{}, false},
		{"resume handler only once per start", resume, causes.Update, handledSinceStart, false},
		{"resume handler not on deletion by default", resume, causes.Delete, initial, false},
		{"resume handler on deletion with deleted=true", resumeDeleted, causes.Delete, initial, true},
		{"resume handler never on noop", resume, causes.Noop, initial, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := servesCause(tt.spec, tt.reason, tt.facts); got != tt.want {
				t.Errorf("servesCause = %v, want %v", got, tt.want)
			}
		})
	}
}
