package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// deploy/components/sharding runs `luaop run --shard-across-replicas` with the
// defaults of --shard-group and --prefix: the names below.
const (
	shardGroup      = "luaop"
	shardGroupLabel = "luaop.dev/shard-group" // on the membership Leases
	shardLabel      = "luaop.dev/shard"       // on the objects: their member
	shardHandover   = "luaop.dev/shard-handover"
	shardReplicas   = 3  // the component's
	shardObjects    = 90 // Widgets created on the three members
	shardDuring     = 30 // more, created while a member's pod is deleted and replaced
)

// shardCap is the most objects a member holds once the coordinator has placed n
// objects on members members: sharding's Plan, consistent hashing with bounded
// loads at its default tolerance (0.08): ceil((1 + 0.08/(N-1)) × n/N). The others
// being at most at it, none holds less than n - (N-1) × it either.
func shardCap(n, members int) int {
	factor := 1.0
	if members > 1 {
		factor += 0.08 / float64(members-1)
	}
	return max(int(math.Ceil(factor*float64(n)/float64(members))), 1)
}

// podOfMember: a member's name (sharding's default identity) is the pod's host
// name, "-", and a random suffix of 8 hex digits.
func podOfMember(member string) string {
	if i := strings.LastIndex(member, "-"); i > 0 {
		return member[:i]
	}
	return member
}

// sharded: examples + components/sharding, as a user writes it: three pods
// Running and Ready, each a member (its Lease), one coordinator; the Widgets are
// each labelled with a member and handled once, every member holding a share
// within the plan's bound, each pod's own metrics agreeing (as Prometheus scrapes
// them); one pod deleted (its Lease deleted on SIGTERM: the objects move at once),
// the Deployment's replacement joins, the objects are rebalanced onto the three,
// the Widgets created meanwhile are handled, and no handler ran twice. Then the
// uninstall of deploy/README.md. It builds on nothing the steps before it left
// but the image: it adds the counting script itself, in the namespace they freed.
func (s *suite) sharded(t *testing.T) {
	c := s.c
	overlay := s.shardedOverlay(t)
	began := time.Now()
	c.mustKubectl(t, "apply", "-k", overlay)
	pods := c.waitPods(t, operatorNS, shardReplicas, image, 3*time.Minute)
	members, coordinator := s.waitMembers(t, pods, time.Minute)
	s.report.add("  sharded: apply -k (examples + components/sharding) -> 3 pods Ready, 3 members", "%s (coordinator %s)", ms(time.Since(began)), coordinator)
	s.checkShardingDeployment(t)
	if _, err := c.kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objectsNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	scrape := s.shardScraper(t)
	defer scrape.close(t)
	// Every pod sees the three members before the objects come (a member joining
	// later takes its share by handovers: the second half of this step).
	// The handovers so far are the start's (objects left by the steps before, still
	// being deleted, placed as the members joined one by one).
	before := s.checkPodViews(t, scrape, pods, members, coordinator, nil)

	s.mu.Lock()
	s.created = nil
	s.mu.Unlock()
	began = time.Now()
	var names []string
	for i := range shardObjects {
		names = append(names, fmt.Sprintf("shard-%03d", i))
		s.createWidget(t, names[i], nil)
	}
	s.waitCounted(t, names, 2*time.Minute)
	shares := s.waitShares(t, scrape, pods, members, shardObjects, 2*time.Minute)
	s.report.add("  sharded: 90 widgets created -> counted and placed", "%s, shares %s (cap %d)", ms(time.Since(began)), sharesText(shares, members), shardCap(shardObjects, shardReplicas))
	s.checkOnce(t)
	handovers := newSince(before, s.checkPodViews(t, scrape, pods, members, coordinator, shares))
	// No member came or went: a new object moves no other (sharding's Plan; the
	// coordinator counts the labels it wrote but has not seen yet).
	if len(handovers) > 0 {
		t.Errorf("objects were moved while the members stayed the same (luaop_shard_handovers_total): %s", strings.Join(handovers, ", "))
	}
	// Each pod did its part of the work, and together they ran the count handler
	// once per object, as the ConfigMaps say (a run is counted as its cycle ends:
	// soon after its patch, not at once).
	runs := map[string]float64{}
	eventually(t, 30*time.Second, func() (bool, string) {
		var total float64
		ok := true
		for _, p := range pods {
			runs[p.Name] = metricSumWhere(scrape.metrics(t, p), "luaop_handler_runs_total", `handler="count"`, `outcome="success"`)
			total += runs[p.Name]
			ok = ok && runs[p.Name] > 0
		}
		return ok && total == shardObjects, fmt.Sprintf("count handler runs per pod (luaop_handler_runs_total) %s, want each some and %d in all", runsText(runs, pods), shardObjects)
	})
	s.report.add("  sharded: count handler runs per pod; handovers meanwhile", "%v; %s", runsText(runs, pods), orNone(handovers))
	if len(handovers) > 0 {
		// Objects moved while no member came or went: what the coordinator saw.
		t.Logf("the coordinator %s on the members and its moves:\n%s", coordinator,
			grepLines(c.mustKubectl(t, "-n", operatorNS, "logs", "pod/"+coordinator), "shard members", "rebalanc"))
	}

	s.shardMemberDeleted(t, scrape, coordinator, members)
	s.report.add("  sharded: widgets counted, each exactly once", "%d", len(s.createdNames()))
	scrape.close(t) // before the uninstall, which checks that no ClusterRole of luaop is left
	s.uninstall(t, operatorNS, overlay)
}

// shardedOverlay writes the kustomization a user writes to shard the examples:
// the examples overlay (with the counting script) and the sharding component.
func (s *suite) shardedOverlay(t *testing.T) string {
	t.Helper()
	k, err := os.ReadFile(filepath.Join(s.overlay, "examples", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(k), "scripts/e2e-count.lua") {
		s.addCountingScript(t)
	}
	overlay := filepath.Join(s.overlay, "sharded")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	kustomization := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
		"resources:\n- ../examples\ncomponents:\n- ../components/sharding\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	return overlay
}

// checkShardingDeployment: what the component made of the Deployment, as the
// cluster stores it.
func (s *suite) checkShardingDeployment(t *testing.T) {
	d, err := s.c.kube.AppsV1().Deployments(operatorNS).Get(t.Context(), "luaop", metaGet)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["LUAOP_LEADER_ELECT"] != "false" || env["LUAOP_SHARD_ACROSS_REPLICAS"] != "true" || *d.Spec.Replicas != shardReplicas {
		t.Errorf("the sharded Deployment: %d replicas, LUAOP_LEADER_ELECT=%q, LUAOP_SHARD_ACROSS_REPLICAS=%q; want %d, false, true",
			*d.Spec.Replicas, env["LUAOP_LEADER_ELECT"], env["LUAOP_SHARD_ACROSS_REPLICAS"], shardReplicas)
	}
	// No leader election: nobody holds the Lease luaop.
	if l, err := s.c.kube.CoordinationV1().Leases(operatorNS).Get(t.Context(), "luaop", metaGet); err == nil && holderOf(l) != "" {
		t.Errorf("the Lease luaop is held by %s: leader election is on beside sharding", holderOf(l))
	}
}

// waitMembers waits until each of pods, and nothing else, holds a membership Lease
// (<group>-member-<member>, labelled with the group) and one of them the
// coordinator's (<group>-coordinator), and returns pod -> member and the
// coordinator's pod.
func (s *suite) waitMembers(t *testing.T, pods []corev1.Pod, timeout time.Duration) (map[string]string, string) {
	t.Helper()
	var members map[string]string
	var coordinator string
	eventually(t, timeout, func() (bool, string) {
		members = map[string]string{}
		leases, err := s.c.kube.CoordinationV1().Leases(operatorNS).List(t.Context(), metav1.ListOptions{LabelSelector: shardGroupLabel + "=" + shardGroup})
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, l := range leases.Items {
			names = append(names, l.Name)
			member, ok := strings.CutPrefix(l.Name, shardGroup+"-member-")
			if ok && holderOf(&l) == member {
				members[podOfMember(member)] = member
			}
		}
		for _, p := range pods {
			if members[p.Name] == "" {
				return false, fmt.Sprintf("pod %s holds no membership Lease; the group's Leases: %v", p.Name, names)
			}
		}
		if len(members) != len(pods) || len(leases.Items) != len(pods) {
			return false, fmt.Sprintf("the group's Leases %v, want one per pod of %d", names, len(pods))
		}
		l, err := s.c.kube.CoordinationV1().Leases(operatorNS).Get(t.Context(), shardGroup+"-coordinator", metaGet)
		if err != nil {
			return false, "the coordinator's Lease: " + err.Error()
		}
		coordinator = podOfMember(holderOf(l))
		if members[coordinator] != holderOf(l) {
			return false, fmt.Sprintf("the coordinator's Lease is held by %q, none of the members %v", holderOf(l), members)
		}
		return true, ""
	})
	return members, coordinator
}

// shares counts the Widgets of objectsNS per member label; problems lists those
// not (yet) where they belong: unlabelled, labelled for a member not in live,
// being handed over, or without the greet handler's status.
func (s *suite) shares(t *testing.T, live map[string]bool) (map[string]int, []string) {
	t.Helper()
	list, err := s.c.dyn.Resource(widgets).Namespace(objectsNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shares := map[string]int{}
	var problems []string
	for _, w := range list.Items {
		member := w.GetLabels()[shardLabel]
		if msg, _, _ := unstructured.NestedString(w.Object, "status", "greet", "message"); msg != "hello from Lua" {
			problems = append(problems, w.GetName()+" not greeted")
		}
		switch {
		case !live[member]:
			problems = append(problems, fmt.Sprintf("%s on %q", w.GetName(), member))
		case w.GetAnnotations()[shardHandover] != "":
			problems = append(problems, w.GetName()+" being handed over to "+w.GetAnnotations()[shardHandover])
		}
		shares[member]++
	}
	return shares, problems
}

// waitShares waits until the n Widgets are all handled and placed on members
// (pod -> member), each member holding some, and each pod's objects (all it owns,
// of every sharded resource: the examples shard more than Widgets, and the plan
// bounds them together) at most the plan's bound of their total.
func (s *suite) waitShares(t *testing.T, scrape *shardScraper, pods []corev1.Pod, members map[string]string, n int, timeout time.Duration) map[string]int {
	t.Helper()
	live := map[string]bool{}
	for _, m := range members {
		live[m] = true
	}
	var shares map[string]int
	eventually(t, timeout, func() (bool, string) {
		var problems []string
		shares, problems = s.shares(t, live)
		total := 0
		for _, m := range members {
			total += shares[m]
			if shares[m] == 0 {
				problems = append(problems, fmt.Sprintf("member %s holds no widget", m))
			}
		}
		if total != n {
			problems = append(problems, fmt.Sprintf("%d widgets on the members, want %d", total, n))
		}
		owned, all := map[string]float64{}, 0.0
		for _, p := range pods {
			owned[p.Name] = metricSum(scrape.metrics(t, p), "luaop_shard_objects_owned")
			all += owned[p.Name]
		}
		limit := shardCap(int(all), len(members))
		for _, p := range pods {
			if owned[p.Name] > float64(limit) {
				problems = append(problems, fmt.Sprintf("pod %s owns %v objects (luaop_shard_objects_owned), want at most %d of %v", p.Name, owned[p.Name], limit, all))
			}
		}
		return len(problems) == 0, fmt.Sprintf("not placed yet (%d): %v", len(problems), first(problems, 5))
	})
	return shares
}

func sharesText(shares map[string]int, members map[string]string) string {
	var counts []int
	for _, m := range members {
		counts = append(counts, shares[m])
	}
	sort.Ints(counts)
	return strings.Trim(strings.Join(strings.Fields(fmt.Sprint(counts)), "/"), "[]")
}

// shardMemberDeleted: kubectl delete pod of the coordinator while Widgets are being
// created. Its Lease goes with its clean stop; another member coordinates; the
// Deployment's replacement joins and takes its share by handovers; every Widget is
// handled, none twice.
func (s *suite) shardMemberDeleted(t *testing.T, scrape *shardScraper, victim string, members map[string]string) {
	c := s.c
	var wg sync.WaitGroup
	wg.Add(1)
	defer wg.Wait() // a failure below: the creations end before the test does
	var during []string
	go func() {
		defer wg.Done()
		for i := range shardDuring {
			time.Sleep(250 * time.Millisecond)
			name := fmt.Sprintf("shard-move-%03d", i)
			w := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
				"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": int64(3)},
			}}
			if _, err := c.dyn.Resource(widgets).Namespace(objectsNS).Create(t.Context(), w, metav1.CreateOptions{}); err != nil {
				t.Errorf("creating %s: %v", name, err)
				return
			}
			during = append(during, name)
		}
	}()
	// The deleted pod's log to its end (its container gone, the stream ends).
	victimLog := s.followLog(t, victim)
	time.Sleep(time.Second) // some widgets before the deletion
	deleted := time.Now()
	c.mustKubectl(t, "-n", operatorNS, "delete", "pod", victim, "--wait=false")
	eventually(t, time.Minute, func() (bool, string) {
		_, err := c.kube.CoordinationV1().Leases(operatorNS).Get(t.Context(), shardGroup+"-member-"+members[victim], metaGet)
		return apierrors.IsNotFound(err), fmt.Sprintf("the deleted pod's membership Lease: %v", err)
	})
	s.report.add("  sharded: coordinator's pod deleted -> its membership Lease deleted", "%s (%s)", ms(time.Since(deleted)), victim)
	eventually(t, time.Minute, func() (bool, string) {
		list, err := c.dyn.Resource(widgets).Namespace(objectsNS).List(t.Context(), metav1.ListOptions{LabelSelector: shardLabel + "=" + members[victim]})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d widgets still labelled for the deleted pod's member %s", len(list.Items), members[victim])
	})
	s.report.add("  sharded: -> no widget left on its member", "%s", ms(time.Since(deleted)))
	pods := c.waitPods(t, operatorNS, shardReplicas, image, 2*time.Minute)
	replaced, coordinator := s.waitMembers(t, pods, time.Minute)
	s.report.add("  sharded: -> the replacement a member, another coordinator", "%s (coordinator %s)", ms(time.Since(deleted)), coordinator)
	wg.Wait()
	s.mu.Lock()
	s.created = append(s.created, during...)
	s.mu.Unlock()
	all := s.createdNames()
	s.waitCounted(t, all, 2*time.Minute)
	shares := s.waitShares(t, scrape, pods, replaced, len(all), 2*time.Minute)
	s.report.add("  sharded: -> all handled, rebalanced on the 3 members", "%s after the deletion, shares %s (cap %d)", ms(time.Since(deleted)), sharesText(shares, replaced), shardCap(len(all), shardReplicas))
	s.checkOnce(t)
	for _, p := range pods {
		if restarts(p) != 0 {
			t.Errorf("pod %s restarted %d times", p.Name, restarts(p))
		}
	}
	handovers := s.checkPodViews(t, scrape, pods, replaced, coordinator, shares)
	s.report.add("  sharded: handovers in all (luaop_shard_handovers_total)", "%s", orNone(handovers))
	logs := map[string]string{victim + " (deleted)": victimLog()}
	for _, p := range pods {
		logs[p.Name] = c.mustKubectl(t, "-n", operatorNS, "logs", "pod/"+p.Name)
	}
	for pod, text := range logs {
		problems, warnings := logProblems(text)
		if len(problems) > 0 {
			t.Errorf("pod %s logged %d error(s) or refusal(s) by RBAC:\n%s", pod, len(problems), strings.Join(first(problems, 10), "\n"))
		}
		if len(warnings) > 0 {
			t.Logf("pod %s warned: %s", pod, strings.Join(warnings, "; "))
		}
	}
}

// followLog follows a pod's log (kubectl logs -f) until its container ends; the
// function returned waits for that end and returns the log.
func (s *suite) followLog(t *testing.T, pod string) func() string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	var out string
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		out, err = s.c.kubectlErr(ctx, "-n", operatorNS, "logs", "-f", "pod/"+pod)
	}()
	return func() string {
		<-done
		cancel()
		if err != nil {
			t.Errorf("kubectl logs -f pod/%s: %v", pod, err)
		}
		return out
	}
}

// grepLines are the lines of text holding any of words.
func grepLines(text string, words ...string) string {
	var kept []string
	for _, line := range strings.Split(text, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				kept = append(kept, line)
				break
			}
		}
	}
	return strings.Join(kept, "\n")
}

// logProblems reads a pod's JSON log (deploy/base: LUAOP_LOG_FORMAT=json): the
// lines at level ERROR or telling of a refusal by RBAC (the component's Role
// short of a verb: retried, so nothing else would show it), and the distinct
// messages at WARN.
func logProblems(text string) (problems, warnings []string) {
	seen := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch {
		case rec.Level == "ERROR" || strings.Contains(strings.ToLower(line), "forbidden"):
			problems = append(problems, line)
		case rec.Level == "WARN" && !seen[rec.Msg]:
			seen[rec.Msg] = true
			warnings = append(warnings, rec.Msg)
		}
	}
	return problems, warnings
}

// checkPodViews: each pod's own view of its part, as its /metrics (scraped as
// Prometheus does) and `luaop status` show it, agrees with the Widgets' labels
// (shares: member -> Widgets): its member, the three members, the coordinator,
// the objects it owns. It returns the handovers each pod counted.
func (s *suite) checkPodViews(t *testing.T, scrape *shardScraper, pods []corev1.Pod, members map[string]string, coordinator string, shares map[string]int) []string {
	t.Helper()
	var handovers []string
	for _, p := range pods {
		member, want := members[p.Name], shares[members[p.Name]]
		var m, text string
		// The pod's watch delivers the last labels soon after the API server has
		// them, not at once.
		eventually(t, 30*time.Second, func() (bool, string) {
			m = scrape.metrics(t, p)
			owned, seen := metricSum(m, "luaop_shard_objects_owned"), metricSum(m, "luaop_shard_members")
			var st shardStatus
			st, text = s.luaopStatus(t, p.Name)
			ok := owned == float64(want) && seen == shardReplicas &&
				st.Member == member && len(st.Members) == shardReplicas && st.Owned == want && st.Draining == 0 && st.Coordinator == (p.Name == coordinator)
			return ok, fmt.Sprintf("pod %s (member %s, %d Widgets labelled for it, coordinator %v): /metrics luaop_shard_objects_owned %v, luaop_shard_members %v; luaop status: %+v",
				p.Name, member, want, p.Name == coordinator, owned, seen, st)
		})
		if p.Name == coordinator && want > 0 {
			t.Logf("luaop status of the coordinator %s:\n%s", p.Name, text)
		}
		for _, kind := range []string{"reassigned", "marked", "released"} {
			if n := metricSumWhere(m, "luaop_shard_handovers_total", `kind="`+kind+`"`); n > 0 {
				handovers = append(handovers, fmt.Sprintf("%s %s %v", p.Name[len(p.Name)-5:], kind, n))
			}
		}
	}
	return handovers
}

// newSince are the handover counts of now that differ from those of before.
func newSince(before, now []string) []string {
	return slices.DeleteFunc(slices.Clone(now), func(h string) bool { return slices.Contains(before, h) })
}

func runsText(runs map[string]float64, pods []corev1.Pod) string {
	var parts []string
	for _, p := range pods {
		parts = append(parts, fmt.Sprint(runs[p.Name]))
	}
	return strings.Join(parts, "/")
}

func orNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

func (s *suite) createdNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.created...)
}

// shardScraper reads the pods' /metrics as Prometheus does (applyExamples: the
// ClusterRole luaop-metrics-reader bound to a ServiceAccount of objectsNS).
type shardScraper struct {
	s      *suite
	token  string
	closed bool
}

func (s *suite) shardScraper(t *testing.T) *shardScraper {
	t.Helper()
	c := s.c
	c.mustKubectl(t, "apply", "-f", filepath.Join(c.repo, "deploy", "components", "prometheus", "metrics-reader.yaml"))
	c.mustKubectl(t, "create", "clusterrolebinding", "e2e-shard-scraper", "--clusterrole", "luaop-metrics-reader", "--serviceaccount", objectsNS+":e2e-shard-scraper")
	sc := &shardScraper{s: s}
	sc.token = c.serviceAccountToken(t, objectsNS, "e2e-shard-scraper")
	return sc
}

func (sc *shardScraper) metrics(t *testing.T, p corev1.Pod) string {
	t.Helper()
	var text string
	// The RBAC authorizer sees the binding soon, not at once (applyExamples).
	eventually(t, 30*time.Second, func() (bool, string) {
		code, body, err := getMetrics(t.Context(), p.Status.PodIP, 9090, sc.token)
		text = body
		return err == nil && code == 200, fmt.Sprintf("/metrics of %s: %d %v %.200q", p.Name, code, err, body)
	})
	return text
}

// close removes the cluster-wide objects: the uninstall must not find them.
func (sc *shardScraper) close(t *testing.T) {
	if sc.closed {
		return
	}
	sc.closed = true
	c := sc.s.c
	c.mustKubectl(t, "delete", "clusterrolebinding", "e2e-shard-scraper", "--ignore-not-found")
	c.mustKubectl(t, "delete", "-f", filepath.Join(c.repo, "deploy", "components", "prometheus", "metrics-reader.yaml"), "--ignore-not-found")
}

// metricSumWhere adds the samples of a metric whose labels include each of the
// given `name="value"` pairs.
func metricSumWhere(text, name string, labels ...string) float64 {
	var kept []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			kept = append(kept, line)
		}
	}
	return metricSum(strings.Join(kept, "\n"), name)
}

// shardStatus is what `luaop status --json` tells of a pod's part in sharding.
type shardStatus struct {
	Member      string   `json:"member"`
	Members     []string `json:"members"`
	Coordinator bool     `json:"coordinator"`
	Owned       int      `json:"owned"`
	Draining    int      `json:"draining"`
}

// luaopStatus runs `luaop status` on a pod as deploy/README.md says: /debug answers
// loopback clients only, so through `kubectl port-forward` (the API server, the
// kubelet, containerd's port forwarding into the pod's network namespace). It
// returns the sharding part of --json and the text the user reads.
func (s *suite) luaopStatus(t *testing.T, pod string) (shardStatus, string) {
	t.Helper()
	c := s.c
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pf := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.kubeconfig, "-n", operatorNS, "port-forward", "pod/"+pod, ":8080")
	var stderr bytes.Buffer
	pf.Stderr = &stderr
	stdout, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = pf.Wait() }()
	// "Forwarding from 127.0.0.1:PORT -> 8080"
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`127\.0\.0\.1:(\d+) -> 8080`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("kubectl port-forward pod/%s :8080: %q %v %s", pod, line, err, stderr.String())
	}
	address := "127.0.0.1:" + m[1]
	env := []string{"KUBECONFIG=" + c.kubeconfig}
	raw, err := run(ctx, env, s.luaop, "status", "--json", "--address", address)
	if err != nil {
		t.Fatalf("luaop status --json of %s: %v", pod, err)
	}
	var doc struct {
		Sharding *shardStatus `json:"sharding"`
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil || doc.Sharding == nil {
		t.Fatalf("luaop status --json of %s: %v, no sharding in %.300s", pod, err, raw)
	}
	text, err := run(ctx, env, s.luaop, "status", "--address", address)
	if err != nil {
		t.Fatalf("luaop status of %s: %v", pod, err)
	}
	return *doc.Sharding, text
}
