package peering

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Scope is what an operator serves: the resources of its handlers (as
// processing.ControllerName spells them: "widgets.example.com", "configmaps") and
// its --namespaces (empty: cluster-wide).
type Scope struct {
	Resources  []string
	Namespaces []string
}

// Peer is one operator as its Lease describes it.
type Peer struct {
	Identity string `json:"identity"`
	Priority int    `json:"priority"`
	// Mode is "dev" or "run"; Host where it runs (for messages).
	Mode string `json:"mode,omitempty"`
	Host string `json:"host,omitempty"`
	Scope
	// Paused: the peer says its work has stopped (its Pause returned).
	Paused bool `json:"paused"`
	// Lease is the Lease's name.
	Lease string `json:"lease"`
	// LeaseDuration is how long after a renewal the peer counts as alive.
	LeaseDuration time.Duration `json:"-"`
	// ObservedAt is when this operator saw the peer's last renewal (its
	// renewTime for a Lease seen for the first time).
	ObservedAt time.Time `json:"-"`
	// Expires is ObservedAt + LeaseDuration.
	Expires time.Time `json:"expires"`
}

func (p Peer) String() string {
	where := p.Mode
	if where == "" {
		where = "luaop"
	} else {
		where = "luaop " + where
	}
	if p.Host != "" {
		where += " on " + p.Host
	}
	return fmt.Sprintf("%s (priority %d, %s)", p.Identity, p.Priority, where)
}

// alive tells whether the peer's lease has not expired at now.
func (p Peer) alive(now time.Time) bool { return now.Before(p.ObservedAt.Add(p.LeaseDuration)) }

// Conflicts tells whether two scopes overlap: a resource in common and a namespace
// in common. Namespaces overlap unless both operators list plain names only
// (no globs, no exclusions) and none in common; cluster-wide overlaps everything.
func (s Scope) Conflicts(o Scope) bool {
	common := false
	for _, r := range s.Resources {
		if slices.Contains(o.Resources, r) {
			common = true
			break
		}
	}
	if !common {
		return false
	}
	if !plainNames(s.Namespaces) || !plainNames(o.Namespaces) {
		return true
	}
	for _, n := range s.Namespaces {
		if slices.Contains(o.Namespaces, n) {
			return true
		}
	}
	return false
}

// plainNames tells whether namespaces are a non-empty list of exact names.
func plainNames(namespaces []string) bool {
	if len(namespaces) == 0 {
		return false
	}
	for _, n := range namespaces {
		if n == "" || strings.ContainsAny(n, "*?[!") {
			return false
		}
	}
	return true
}

// Self is the operator deciding.
type Self struct {
	Identity string
	Priority int
	Scope
	// WaitForLower bounds the wait for conflicting lower-priority peers to confirm
	// their pause (one lease duration).
	WaitForLower time.Duration
}

// Decision is what an operator should do now.
type Decision struct {
	// Pause: do not work. Reason says why (for the log, the view, /debug).
	Pause  bool
	Reason string
	// Warning, when set, is logged at warning level once (same priorities; a
	// lower-priority peer that did not confirm its pause in time).
	Warning string
	// Higher, Same and Lower are the live conflicting peers by priority.
	Higher, Same, Lower []Peer
	// Unconfirmed are the Lower peers that have not said they paused.
	Unconfirmed []Peer
	// Recheck is when the decision may change without any Lease changing (a
	// blocking peer's lease expires, the wait for lower peers ends); zero: never.
	Recheck time.Time
	// Dead are peers whose lease expired more than a lease duration ago: their
	// Leases may be deleted.
	Dead []Peer
}

// Decide applies the rule of the package (doc.go) at now. waitingSince is when
// this operator started waiting for unconfirmed lower-priority peers (zero when it
// was not waiting): after Self.WaitForLower it works anyway, with a warning.
func Decide(self Self, peers []Peer, now, waitingSince time.Time) Decision {
	var d Decision
	recheck := func(t time.Time) {
		if t.After(now) && (d.Recheck.IsZero() || t.Before(d.Recheck)) {
			d.Recheck = t
		}
	}
	for _, p := range peers {
		if p.Identity == self.Identity {
			continue
		}
		if !p.alive(now) {
			if !now.Before(p.ObservedAt.Add(2 * p.LeaseDuration)) {
				d.Dead = append(d.Dead, p)
			}
			continue
		}
		if !self.Conflicts(p.Scope) {
			continue
		}
		switch {
		case p.Priority > self.Priority:
			d.Higher = append(d.Higher, p)
			recheck(p.ObservedAt.Add(p.LeaseDuration))
		case p.Priority == self.Priority:
			d.Same = append(d.Same, p)
			recheck(p.ObservedAt.Add(p.LeaseDuration))
		default:
			d.Lower = append(d.Lower, p)
			if !p.Paused {
				d.Unconfirmed = append(d.Unconfirmed, p)
			}
		}
	}
	sortPeers(d.Higher)
	sortPeers(d.Same)
	sortPeers(d.Lower)
	sortPeers(d.Unconfirmed)
	switch {
	case len(d.Higher) > 0:
		d.Pause = true
		d.Reason = "paused in favour of " + names(d.Higher)
	case len(d.Same) > 0:
		d.Pause = true
		d.Reason = "paused: " + names(d.Same) + " serves the same resources with the same priority"
		d.Warning = fmt.Sprintf("another operator of the same priority (%d) serves the same resources: %s; both pause until one of them stops: "+
			"stop one, give one another --priority, or --standalone", self.Priority, names(d.Same))
	case len(d.Unconfirmed) > 0:
		until := waitingSince.Add(self.WaitForLower)
		if waitingSince.IsZero() || now.Before(until) {
			d.Pause = true
			d.Reason = "waiting for " + names(d.Unconfirmed) + " to pause"
			if waitingSince.IsZero() {
				until = now.Add(self.WaitForLower)
			}
			recheck(until)
			for _, p := range d.Unconfirmed {
				recheck(p.ObservedAt.Add(p.LeaseDuration))
			}
			break
		}
		d.Warning = fmt.Sprintf("%s did not say it paused within %s; working anyway: objects may be handled by both for a while", names(d.Unconfirmed), self.WaitForLower)
	}
	return d
}

func sortPeers(ps []Peer) {
	slices.SortFunc(ps, func(a, b Peer) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return strings.Compare(a.Identity, b.Identity)
	})
}

func names(ps []Peer) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}
