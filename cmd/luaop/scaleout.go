package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/sharding"
)

// Sharding across replicas (package sharding): the replicas of one --shard-group
// split the objects, each watching only its own.

type shardSettings struct {
	On            bool
	Group         string
	Namespace     string
	LeaseDuration time.Duration
}

func addShardFlags(fs *pflag.FlagSet) {
	fs.Bool("shard-across-replicas", false, "run several replicas that split the objects: each holds a membership Lease, one of them labels every object with its replica (consistent hashing), each watches only its own; objects move between replicas with a handover (see README: Sharding)")
	fs.String("shard-group", sharding.DefaultGroup, "name of the group of replicas that share the objects (one per operator)")
	fs.String("shard-namespace", "", "namespace of the sharding Leases (default: the pod's own namespace)")
	fs.Duration("shard-lease-duration", sharding.DefaultLeaseDuration, "a killed replica's objects are handled by the others within it: its membership Lease holds about two thirds of it (three fifths to renew, and a margin), the rest is for the move (whole seconds, at least 2s)")
}

func readShardSettings(r *settingsReader) shardSettings {
	if !r.has("shard-across-replicas") {
		return shardSettings{}
	}
	st := shardSettings{
		On:            r.bool("shard-across-replicas"),
		Group:         r.dnsName("shard-group", false),
		Namespace:     r.dnsName("shard-namespace", true),
		LeaseDuration: r.duration("shard-lease-duration", false),
	}
	if st.LeaseDuration < 2*time.Second || st.LeaseDuration%time.Second != 0 {
		r.invalid("shard-lease-duration", st.LeaseDuration.String(), "a whole number of seconds, at least 2s")
	}
	return st
}

// newSharding prepares sharding for `luaop run --shard-across-replicas`; nil when
// off. It cannot be combined with --leader-elect (one active replica) or a dry
// run (which writes no Lease and no label).
func newSharding(cfg *rest.Config, s settings, m *metrics.Metrics, log *slog.Logger) (*sharding.Sharding, error) {
	if !s.ScaleOut.On {
		return nil, nil
	}
	switch {
	case s.LeaderElect:
		return nil, fmt.Errorf("--shard-across-replicas and --leader-elect exclude each other: sharding makes every replica active; give one of them")
	case s.DryRun:
		return nil, fmt.Errorf("--shard-across-replicas with --dry-run: a dry run writes no Lease and no label; run one dry replica without sharding")
	}
	sh, err := sharding.New(cfg, sharding.Options{Namespace: s.ScaleOut.Namespace, Group: s.ScaleOut.Group, Prefix: s.Prefix,
		LeaseDuration: s.ScaleOut.LeaseDuration, Observer: m, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("sharding: %w; give --shard-namespace when running outside a pod", err)
	}
	return sh, nil
}

// printSharding is `luaop status`'s part about sharding.
func printSharding(out io.Writer, st *sharding.State) {
	if st == nil {
		return
	}
	role := "member"
	if st.Coordinator {
		role = "member and coordinator"
	}
	share := "-"
	if n := len(st.Members); n > 0 {
		share = fmt.Sprintf("1/%d", n)
	}
	fmt.Fprintf(out, "sharding: %s %s of group %s/%s; owns %d objects (fair share %s), %d being handed over, %d handed over\n",
		role, st.Member, st.Namespace, st.Group, st.Owned, share, st.Draining, st.Released)
	fmt.Fprintf(out, "  members (%d): %s\n", len(st.Members), strings.Join(st.Members, ", "))
	for _, r := range st.Resources {
		fmt.Fprintf(out, "  %s: %s\n", r.Resource, r.Mode)
	}
}
