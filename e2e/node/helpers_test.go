package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var metaGet = metav1.GetOptions{}

// run runs a command, returning its stdout, and an error carrying its stderr.
func run(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// kubectl runs the control plane's kubectl on the node's cluster, as a user would.
func (c *nodeCluster) kubectlErr(ctx context.Context, args ...string) (string, error) {
	return run(ctx, nil, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
}

func (c *nodeCluster) mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	out, err := c.kubectlErr(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ctr runs containerd's client on the node's containerd (namespace k8s.io, the CRI's).
func (c *nodeCluster) ctr(ctx context.Context, args ...string) (string, error) {
	return run(ctx, nil, filepath.Join(c.env["NODE_BIN"], "ctr"),
		append([]string{"--address", c.env["NODE_CONTAINERD_SOCKET"], "--namespace", "k8s.io"}, args...)...)
}

const appLabel = "app.kubernetes.io/name=luaop"

// operatorPods are the operator's pods in ns that are not being deleted.
func (c *nodeCluster) operatorPods(t *testing.T, ns string) []corev1.Pod {
	t.Helper()
	list, err := c.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: appLabel})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func restarts(p corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// waitPods waits until exactly n operator pods run in ns, all Ready (and, with
// image, of that image) and none being deleted, and returns them.
func (c *nodeCluster) waitPods(t *testing.T, ns string, n int, image string, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	eventually(t, timeout, func() (bool, string) {
		list, err := c.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: appLabel})
		if err != nil {
			return false, err.Error()
		}
		pods = pods[:0]
		var states []string
		ok := len(list.Items) == n
		for _, p := range list.Items {
			pods = append(pods, p)
			img := ""
			if len(p.Spec.Containers) > 0 {
				img = p.Spec.Containers[0].Image
			}
			states = append(states, fmt.Sprintf("%s %s ready=%v deleting=%v image=%s", p.Name, p.Status.Phase, podReady(p), p.DeletionTimestamp != nil, img))
			if p.Status.Phase != corev1.PodRunning || !podReady(p) || p.DeletionTimestamp != nil || (image != "" && img != image) {
				ok = false
			}
		}
		return ok, fmt.Sprintf("want %d Ready operator pods in %s; have %v", n, ns, states)
	})
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods
}

func (c *nodeCluster) waitNoPods(t *testing.T, ns string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() (bool, string) {
		list, err := c.kube.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: appLabel})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d operator pods left in %s", len(list.Items), ns)
	})
}

// lease is the operator's Lease in ns.
func (c *nodeCluster) lease(t *testing.T, ns string) *coordinationv1.Lease {
	t.Helper()
	l, err := c.kube.CoordinationV1().Leases(ns).Get(t.Context(), "luaop", metaGet)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// podOfIdentity: luaop's holder identity is the pod's name (its host name), "_",
// and a random suffix.
func podOfIdentity(identity string) string {
	if i := strings.LastIndex(identity, "_"); i > 0 {
		return identity[:i]
	}
	return identity
}

// leaderPod waits for the Lease of ns to be held by one of pods and returns it.
func (c *nodeCluster) leaderPod(t *testing.T, ns string, pods []corev1.Pod) corev1.Pod {
	t.Helper()
	var leader corev1.Pod
	eventually(t, 30*time.Second, func() (bool, string) {
		holder := podOfIdentity(holderOf(c.lease(t, ns)))
		for _, p := range pods {
			if p.Name == holder {
				leader = p
				return true, ""
			}
		}
		return false, "the lease is held by " + holder + ", none of the pods"
	})
	return leader
}

// get fetches a pod's endpoint from the host (the host routes the pods' range to
// the node).
func get(ctx context.Context, ip string, port int, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d%s", ip, port, path), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metricSum adds the samples of a metric (any labels) in a /metrics text.
func metricSum(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// readyzHash is the scripts' content hash a pod's /readyz reports ("scripts <hash>").
func readyzHash(body string) string {
	if m := regexp.MustCompile(`(?m)^scripts (\S+)`).FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}

// containerPID is the host PID of the pod's luaop container (containerd's task).
func (c *nodeCluster) containerPID(t *testing.T, p corev1.Pod) int {
	t.Helper()
	if len(p.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s has no container status", p.Name)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := c.ctr(t.Context(), "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no containerd task for the container %s of pod %s:\n%s", id, p.Name, out)
	return 0
}

// procStatus is a field of /proc/PID/status.
func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// rootMountOptions are the mount options of the container's root ("/").
func rootMountOptions(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == "/" {
			return f[5]
		}
	}
	return ""
}

// eventually polls cond every 250 ms until it holds, or fails the test after
// timeout with the last message cond gave.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("cancelled: %s", msg)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// copyTree copies the folder src into dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// report holds the suite's measurements, printed as a table at the end.
type report struct {
	mu   sync.Mutex
	rows [][2]string
}

func (r *report) add(what string, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, [2]string{what, fmt.Sprintf(format, args...)})
}

func (r *report) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	width := 0
	for _, row := range r.rows {
		width = max(width, len(row[0]))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s  %s\n", width, "step", "measured")
	for _, row := range r.rows {
		fmt.Fprintf(&b, "%-*s  %s\n", width, row[0], row[1])
	}
	return b.String()
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

// getMetrics scrapes /metrics as Prometheus does through deploy/'s ServiceMonitor:
// HTTPS (the operator's self-signed certificate, not verified) with a bearer token,
// none when token is empty.
func getMetrics(ctx context.Context, ip string, port int, token string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s:%d/metrics", ip, port), nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// serviceAccountToken creates the ServiceAccount ns/name and returns a token of it
// (the TokenRequest API, as a projected token of a pod).
func (c *nodeCluster) serviceAccountToken(t *testing.T, ns, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := c.kube.CoreV1().ServiceAccounts(ns).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := c.kube.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
