package peering

import (
	"strings"
	"testing"
	"time"
)

func TestScopesConflict(t *testing.T) {
	widgets := []string{"widgets.example.com"}
	for _, tc := range []struct {
		name string
		a, b Scope
		want bool
	}{
		{"same resource, both cluster-wide", Scope{Resources: widgets}, Scope{Resources: widgets}, true},
		{"no resource in common", Scope{Resources: widgets}, Scope{Resources: []string{"gadgets.example.com"}}, false},
		{"no resources at all", Scope{}, Scope{Resources: widgets}, false},
		{"cluster-wide and one namespace", Scope{Resources: widgets}, Scope{Resources: widgets, Namespaces: []string{"a"}}, true},
		{"disjoint plain namespaces", Scope{Resources: widgets, Namespaces: []string{"a"}}, Scope{Resources: widgets, Namespaces: []string{"b", "c"}}, false},
		{"a namespace in common", Scope{Resources: widgets, Namespaces: []string{"a", "b"}}, Scope{Resources: widgets, Namespaces: []string{"b"}}, true},
		{"a glob may overlap", Scope{Resources: widgets, Namespaces: []string{"team-*"}}, Scope{Resources: widgets, Namespaces: []string{"b"}}, true},
		{"an exclusion may overlap", Scope{Resources: widgets, Namespaces: []string{"!kube-system"}}, Scope{Resources: widgets, Namespaces: []string{"b"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.a.Conflicts(tc.b); got != tc.want {
				t.Errorf("Conflicts = %v, want %v", got, tc.want)
			}
			if got := tc.b.Conflicts(tc.a); got != tc.want {
				t.Errorf("Conflicts (swapped) = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	scope := Scope{Resources: []string{"widgets.example.com"}}
	peer := func(id string, prio int, seenAgo time.Duration, paused bool) Peer {
		return Peer{Identity: id, Priority: prio, Mode: "run", Host: "h", Scope: scope, Paused: paused, Lease: "lease-" + id,
			LeaseDuration: 15 * time.Second, ObservedAt: now.Add(-seenAgo)}
	}
	self := func(prio int) Self {
		return Self{Identity: "me", Priority: prio, Scope: scope, WaitForLower: 15 * time.Second}
	}
	for _, tc := range []struct {
		name         string
		self         Self
		peers        []Peer
		waitingSince time.Time
		pause        bool
		reason       string // a part of it
		warning      string // a part of it; "" none
		recheck      time.Time
		dead         int
	}{
		{name: "alone", self: self(0)},
		{name: "itself only", self: self(0), peers: []Peer{peer("me", 0, 0, false)}},
		{name: "a higher peer", self: self(0), peers: []Peer{peer("dev", 666, 5*time.Second, false)},
			pause: true, reason: "paused in favour of dev (priority 666, luaop run on h)", recheck: now.Add(10 * time.Second)},
		{name: "a higher peer whose lease expired", self: self(0), peers: []Peer{peer("dev", 666, 16*time.Second, false)}},
		{name: "a peer gone for two lease durations is dead", self: self(0), peers: []Peer{peer("dev", 666, 30*time.Second, false)}, dead: 1},
		{name: "same priority: both pause, with a warning", self: self(0), peers: []Peer{peer("other", 0, 0, false)},
			pause: true, reason: "other (priority 0, luaop run on h) serves the same resources with the same priority",
			warning: "both pause until one of them stops", recheck: now.Add(15 * time.Second)},
		{name: "a lower peer that has paused", self: self(666), peers: []Peer{peer("run", 0, 0, true)}},
		{name: "a lower peer not paused yet: wait", self: self(666), peers: []Peer{peer("run", 0, 2*time.Second, false)},
			pause: true, reason: "waiting for run (priority 0, luaop run on h) to pause", recheck: now.Add(13 * time.Second)},
		{name: "a lower peer not paused yet, waited a while", self: self(666), peers: []Peer{peer("run", 0, 0, false)},
			waitingSince: now.Add(-5 * time.Second), pause: true, reason: "waiting for", recheck: now.Add(10 * time.Second)},
		{name: "a lower peer that never confirms: work anyway", self: self(666), peers: []Peer{peer("run", 0, 0, false)},
			waitingSince: now.Add(-15 * time.Second), warning: "did not say it paused within 15s"},
		{name: "higher wins over lower", self: self(5), peers: []Peer{peer("run", 0, 0, false), peer("dev", 666, 0, false)},
			pause: true, reason: "paused in favour of dev", recheck: now.Add(15 * time.Second)},
		{name: "a higher peer serving other resources", self: self(0),
			peers: []Peer{{Identity: "dev", Priority: 666, Scope: Scope{Resources: []string{"gadgets"}}, LeaseDuration: 15 * time.Second, ObservedAt: now}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.self, tc.peers, now, tc.waitingSince)
			if d.Pause != tc.pause {
				t.Errorf("Pause = %v, want %v (reason %q)", d.Pause, tc.pause, d.Reason)
			}
			if !strings.Contains(d.Reason, tc.reason) || (tc.reason == "" && d.Reason != "") {
				t.Errorf("Reason = %q, want it to contain %q", d.Reason, tc.reason)
			}
			if (tc.warning == "") != (d.Warning == "") || !strings.Contains(d.Warning, tc.warning) {
				t.Errorf("Warning = %q, want %q", d.Warning, tc.warning)
			}
			if !d.Recheck.Equal(tc.recheck) {
				t.Errorf("Recheck = %v, want %v", d.Recheck, tc.recheck)
			}
			if len(d.Dead) != tc.dead {
				t.Errorf("Dead = %v, want %d", d.Dead, tc.dead)
			}
		})
	}
}
