// Package node is the deploy suite: luaop's image, built without Docker
// (imagebuild), imported into the containerd of a real node (localcluster/node-up.sh:
// kubelet, kube-proxy, kube-scheduler, containerd, runc) and deployed with
// `kubectl apply -k deploy/examples`, then driven the way an SRE would: admission
// through the Services, ConfigMap edits reaching the pods through the kubelet, leader
// handovers on pod deletion and rolling updates, the kubelet's probes, a memory bomb
// under the pod's limit, an overlay in another namespace, the uninstall, and the
// examples sharded across three replicas (components/sharding: the members' Leases,
// each object labelled and handled once, a pod deleted and replaced). Every
// step is measured (go test -v prints the table) and asserted on what the cluster and
// the kernel show (pods, Leases, objects, /proc of the containers).
//
// It runs where localcluster/with-node.sh has started a node (make test does):
// LUAOP_TEST_NODE_KUBECONFIG and LUAOP_TEST_NODE_DIR. Without them, or where the
// machine cannot run a node (LUAOP_TEST_NODE_SKIP says why), it skips and says why.
// The package has no code outside its tests.
//
// It imports imagebuild (the image) and testcluster (the clients) and must not import
// the operator's packages: the operator under test is the image in its pods.
package node
