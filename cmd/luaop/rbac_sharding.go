package main

import (
	"errors"

	"github.com/spf13/pflag"
)

// `luaop rbac --shard-across-replicas`: what a sharded Deployment (luaop run
// --shard-across-replicas, deploy/components/sharding) needs beyond the unsharded
// one, as one step of its own after the others (generateRBAC calls it last).
//
// The shard label (<prefix>/shard) and the handover annotation are written with a
// patch of the watched objects' metadata, and the coordinator lists and watches
// their metadata: the watched resources' rule (get, list, watch, patch) has it
// already. What sharding adds is Leases in the namespace of --shard-namespace:
// each replica's membership Lease <group>-member-<replica> (created at start,
// renewed with get and update, deleted at a clean stop; every replica lists and
// watches the group's), and the coordinator's election on <group>-coordinator
// (get, watch, create, update). Member names are chosen when a replica starts, so
// the Leases cannot be granted by name. Whether a resource may be labelled is asked
// with a SelfSubjectAccessReview, which every authenticated user may create.

// rbacShardOptions are luaop rbac's flags for sharding.
type rbacShardOptions struct {
	On bool
	// Namespace is luaop run's --shard-namespace (default: the ServiceAccount's,
	// where the operator's pods run).
	Namespace string
}

func addRBACShardFlags(fs *pflag.FlagSet, o *rbacShardOptions) {
	fs.BoolVar(&o.On, "shard-across-replicas", false, "the operator runs with --shard-across-replicas (deploy/components/sharding): add the Role for the membership and coordinator Leases")
	fs.StringVar(&o.Namespace, "shard-namespace", "", "the operator's --shard-namespace (default: the ServiceAccount's)")
}

// args are the flags as given, for the output's header.
func (o rbacShardOptions) args() []string {
	var args []string
	if o.On {
		args = append(args, "--shard-across-replicas")
	}
	if o.Namespace != "" {
		args = append(args, "--shard-namespace", o.Namespace)
	}
	return args
}

// writeShardingRole writes, with --shard-across-replicas, the Role and RoleBinding of
// the sharding Leases.
func (d *rbacDoc) writeShardingRole() error {
	o, sh := d.o, d.o.Shard
	if !sh.On {
		if sh.Namespace != "" {
			return errors.New("--shard-namespace without --shard-across-replicas: give both, or neither")
		}
		return nil
	}
	if o.LeaderElect {
		return errors.New("--shard-across-replicas and --leader-elect exclude each other (as for luaop run: sharding makes every replica active); give one of them")
	}
	d.writeRole("# Sharding across replicas (--shard-across-replicas): each replica's membership Lease\n# (<group>-member-<replica>, named when it starts) and the coordinator's election\n# (<group>-coordinator), in the namespace of --shard-namespace. The shard label on the\n# objects is written with the patch of the watched resources above.\n",
		o.Name+"-sharding", d.orOwnNamespace(sh.Namespace), "- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [get, list, watch, create, update, delete]\n", false)
	return nil
}
