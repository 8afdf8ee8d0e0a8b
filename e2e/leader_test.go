package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/luaop/luaop/leader"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// The instance's name is baked into its script: "HANDLED <object> by <instance>"
// in the log, and the instance's name in status.greet.
const leaderScript = `
	local luaop = require("luaop")
	luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("HANDLED " .. ctx.name .. " by %[1]s")
		return "%[1]s"
	end, { id = "greet" })
`

const leaseName = "luaop-e2e"

// electedInstance is one replica: an operator wrapped in leader.Run.
type electedInstance struct {
	name    string
	log     *testcluster.LogBuffer
	stop    context.CancelFunc
	done    chan error
	stopped time.Time // when Run returned
}

// startElected starts a replica as `luaop run` with leader election would, with
// short durations, the lease in the test's namespace.
func startElected(t *testing.T, ns, name string, keepLease bool) *electedInstance {
	t.Helper()
	return startElectedFor(t, ns, name, keepLease, 2*time.Second)
}

// startElectedFor is startElected with the duration of the leases it takes.
func startElectedFor(t *testing.T, ns, name string, keepLease bool, lease time.Duration) *electedInstance {
	t.Helper()
	in := &electedInstance{name: name, log: &testcluster.LogBuffer{}, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(in.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	postEvents := false
	op, err := operator.New(env.Config, operator.Options{
		Scripts: script(fmt.Sprintf(leaderScript, name)),
		Processing: processing.Options{
			Namespaces:         []string{ns},
			PostEvents:         &postEvents,
			ConsistencyTimeout: 5 * time.Second,
		},
		Logger: log,
	})
	if err != nil {
		t.Fatalf("creating operator %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	in.stop = cancel
	opts := leader.Options{
		Namespace: ns, Name: leaseName, Identity: name,
		LeaseDuration: lease, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 300 * time.Millisecond,
		KeepLeaseOnStop: keepLease,
		Logger:          log,
	}
	go func() { in.done <- leader.Run(ctx, env.Config, opts, op.Start) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-in.done:
		case <-time.After(30 * time.Second):
			t.Errorf("instance %s did not stop", name)
		}
		if t.Failed() {
			t.Logf("log of instance %s:\n%s", name, in.log.String())
		}
	})
	return in
}

// wait waits for Run to return and gives what it returned.
func (in *electedInstance) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-in.done:
		in.stopped = time.Now()
		in.done <- err
		return err
	case <-time.After(timeout):
		t.Fatalf("instance %s: Run did not return within %s", in.name, timeout)
		return nil
	}
}

func (in *electedInstance) waitLog(t *testing.T, timeout time.Duration, text string) {
	t.Helper()
	testcluster.Eventually(t, timeout, func() (bool, string) {
		return strings.Contains(in.log.String(), text), fmt.Sprintf("instance %s has not logged %q", in.name, text)
	})
}

func leaseHolder(t *testing.T, ns string) string {
	t.Helper()
	lease, err := env.Kube.CoordinationV1().Leases(ns).Get(t.Context(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting the lease: %v", err)
	}
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

func createWidgets(t *testing.T, ns string, names ...string) {
	t.Helper()
	for _, n := range names {
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: %s}, spec: {size: 1}}", n))
	}
}

// Of several replicas only the lease holder handles objects; a stopped leader hands
// over at once (the lease is released), a vanished one when its lease expires, and
// one whose lease is taken stops; no object is handled twice across the handovers.
func TestLeaderElectionHandover(t *testing.T) {
	ns := env.Namespace(t)

	// a's lease lasts a minute: the test gives up on b long before it could
	// expire, so b taking over at all proves a released it.
	a := startElectedFor(t, ns, "a", false, time.Minute)
	a.waitLog(t, 10*time.Second, "became leader")
	b := startElected(t, ns, "b", true)
	b.waitLog(t, 5*time.Second, "standing by; leader is a")

	createWidgets(t, ns, "w1", "w2")
	waitField(t, widgets, ns, "w1", "status.greet", "a")
	waitField(t, widgets, ns, "w2", "status.greet", "a")

	// A stopped leader finishes its work, then releases the lease: the standby
	// takes over without waiting for it to expire.
	a.stop()
	if err := a.wait(t, 25*time.Second); err != nil {
		t.Errorf("Run of the stopped leader a: %v, want nil", err)
	}
	b.waitLog(t, 30*time.Second, "became leader")
	t.Logf("b took over %s after a stopped (lease released)", time.Since(a.stopped).Round(time.Millisecond))
	if h := leaseHolder(t, ns); h != "b" {
		t.Errorf("lease holder %q, want b", h)
	}
	createWidgets(t, ns, "w3", "w4")
	waitField(t, widgets, ns, "w3", "status.greet", "b")
	waitField(t, widgets, ns, "w4", "status.greet", "b")

	// A leader that goes away without releasing the lease (b keeps it, as a
	// crashed process would): the standby waits for the lease to expire. Objects
	// created meanwhile wait for the new leader.
	c := startElected(t, ns, "c", false)
	c.waitLog(t, 5*time.Second, "standing by; leader is b")
	b.stop()
	if err := b.wait(t, 25*time.Second); err != nil {
		t.Errorf("Run of the stopped leader b: %v, want nil", err)
	}
	if h := leaseHolder(t, ns); h != "b" {
		t.Errorf("lease holder %q after a stop that keeps the lease, want b", h)
	}
	createWidgets(t, ns, "w5", "w6")
	c.waitLog(t, 20*time.Second, "became leader")
	took := time.Since(b.stopped)
	t.Logf("c took over %s after b stopped (lease expired)", took.Round(time.Millisecond))
	// A lower bound only, and a sure one however loaded the machine: b renewed
	// within its renew deadline (1.5s) before it stopped, or stopped leading, and c
	// waits the lease's 2s from the last renewal it saw.
	if took < 500*time.Millisecond {
		t.Errorf("c took over %s after b stopped, before b's lease (2s) could expire", took)
	}
	waitField(t, widgets, ns, "w5", "status.greet", "c")
	waitField(t, widgets, ns, "w6", "status.greet", "c")

	// Another instance takes the lease: c cannot renew, stops its operator, and
	// Run tells the process to exit.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := env.Kube.CoordinationV1().Leases(ns).Get(t.Context(), leaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		holder, seconds, now := "intruder", int32(60), metav1.NewMicroTime(time.Now())
		lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = &holder, &seconds, &now
		_, err = env.Kube.CoordinationV1().Leases(ns).Update(t.Context(), lease, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("taking the lease: %v", err)
	}
	if err := c.wait(t, 10*time.Second); !errors.Is(err, leader.ErrLeadershipLost) {
		t.Errorf("Run of c after its lease was taken: %v, want ErrLeadershipLost", err)
	}
	if h := leaseHolder(t, ns); h != "intruder" {
		t.Errorf("lease holder %q, want intruder: the lost lease was written", h)
	}

	// Every object was handled exactly once, by the leader of its time.
	logs := a.log.String() + b.log.String() + c.log.String()
	want := map[string]string{"w1": "a", "w2": "a", "w3": "b", "w4": "b", "w5": "c", "w6": "c"}
	for obj, by := range want {
		if n := strings.Count(logs, "HANDLED "+obj+" by "); n != 1 {
			t.Errorf("%s was handled %d times across the instances, want once", obj, n)
		}
		if !strings.Contains(logs, "HANDLED "+obj+" by "+by) {
			t.Errorf("%s was not handled by %s", obj, by)
		}
	}
}
