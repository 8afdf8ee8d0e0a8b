package admission

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Where the webhooks are registered when nothing says, on the clusters SREs use.
func TestDetectEndpoint(t *testing.T) {
	node := func(name, ip string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	forbidden := errors.New("nodes is forbidden")
	// This machine: loopback, eth0 192.0.2.2/24, a docker bridge 172.18.0.1/16.
	local := []*net.IPNet{
		{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)},
		{IP: net.IPv4(192, 0, 2, 2), Mask: net.CIDRMask(24, 32)},
		{IP: net.IPv4(172, 18, 0, 1), Mask: net.CIDRMask(16, 32)},
	}
	route := func(ip net.IP) (net.IP, error) {
		for _, n := range local[1:] {
			if n.Contains(ip) {
				return n.IP, nil
			}
		}
		return net.IPv4(192, 0, 2, 2), nil // the default route
	}
	kubeadm := &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"}, Issuer: pkix.Name{CommonName: "kubernetes"},
		IPAddresses: []net.IP{net.IPv4(10, 96, 0, 1), net.IPv4(172, 18, 0, 2), net.IPv4(127, 0, 0, 1)}}
	for _, tc := range []struct {
		name        string
		nodes       []corev1.Node
		nodesErr    error
		cert        *x509.Certificate
		version     string
		serverLocal bool
		want        Endpoint
		found       bool
	}{
		{name: "kind: the route to the node's InternalIP", nodes: []corev1.Node{node("kind-control-plane", "172.18.0.2")}, cert: kubeadm, serverLocal: true,
			want: Endpoint{Host: "172.18.0.1", Listen: "172.18.0.1", How: "route to node kind-control-plane (InternalIP 172.18.0.2)"}, found: true},
		{name: "kind, nodes not listable: the certificate's address on the bridge", nodesErr: forbidden, cert: kubeadm, serverLocal: true,
			want: Endpoint{Host: "172.18.0.1", Listen: "172.18.0.1", How: "network of 172.18.0.2"}, found: true},
		{name: "k3d with nodes: the route wins", nodes: []corev1.Node{node("k3d-dev-server-0", "172.18.0.3")},
			cert: &x509.Certificate{Subject: pkix.Name{CommonName: "k3s", Organization: []string{"k3s"}}, Issuer: pkix.Name{CommonName: "k3s-server-ca@1700000000"}},
			want: Endpoint{Host: "172.18.0.1", Listen: "172.18.0.1", How: "route to node k3d-dev-server-0"}, found: true},
		{name: "k3s by its certificate", nodesErr: forbidden,
			cert: &x509.Certificate{Subject: pkix.Name{CommonName: "k3s"}, Issuer: pkix.Name{CommonName: "k3s-server-ca@1700000000"}},
			want: Endpoint{Host: "host.k3d.internal", Listen: "::", How: "k3s/k3d"}, found: true},
		{name: "k3s by its version", nodesErr: forbidden, cert: &x509.Certificate{}, version: "v1.30.2+k3s1",
			want: Endpoint{Host: "host.k3d.internal", Listen: "::", How: "v1.30.2+k3s1"}, found: true},
		{name: "minikube by its issuer", nodesErr: forbidden, cert: &x509.Certificate{Issuer: pkix.Name{CommonName: "minikubeCA"}},
			want: Endpoint{Host: "host.minikube.internal", Listen: "::", How: "minikube"}, found: true},
		{name: "docker-desktop by its names", nodesErr: forbidden, cert: &x509.Certificate{DNSNames: []string{"kubernetes", "docker-for-desktop"}},
			want: Endpoint{Host: "host.docker.internal", Listen: "::", How: "docker-desktop"}, found: true},
		{name: "the project's local control plane: no nodes", cert: &x509.Certificate{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}, serverLocal: true,
			want: Endpoint{Host: "127.0.0.1", Listen: "127.0.0.1", How: "on this machine"}, found: true},
		{name: "a node on this machine itself (a kubelet here)", nodes: []corev1.Node{node("here", "192.0.2.2")}, cert: &x509.Certificate{}, serverLocal: true,
			want: Endpoint{Host: "127.0.0.1", Listen: "127.0.0.1", How: "on this machine"}, found: true},
		{name: "a remote cluster: the route to its nodes (the probe decides)", nodes: []corev1.Node{node("n1", "10.0.5.7")},
			cert: &x509.Certificate{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}},
			want: Endpoint{Host: "192.0.2.2", Listen: "192.0.2.2", How: "route to node n1"}, found: true},
		{name: "a remote cluster, nothing known", nodesErr: forbidden, cert: &x509.Certificate{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &detector{
				nodes: func(context.Context) ([]corev1.Node, error) { return tc.nodes, tc.nodesErr },
				certificate: func(context.Context) (*x509.Certificate, error) {
					if tc.cert == nil {
						return nil, errors.New("no certificate")
					}
					return tc.cert, nil
				},
				version:     func(context.Context) (string, error) { return tc.version, nil },
				localAddrs:  func() ([]*net.IPNet, error) { return local, nil },
				routeSource: route,
				serverLocal: tc.serverLocal,
			}
			got, found := d.detect(t.Context())
			if found != tc.found {
				t.Fatalf("found = %v, want %v (%+v)", found, tc.found, got)
			}
			if got.Host != tc.want.Host || got.Listen != tc.want.Listen || !strings.Contains(got.How, tc.want.How) {
				t.Errorf("detect = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRouteSourceOfLoopback(t *testing.T) {
	ip, err := routeSource(net.IPv4(127, 0, 0, 1))
	if err != nil || !ip.IsLoopback() {
		t.Errorf("routeSource(127.0.0.1) = %v, %v", ip, err)
	}
}
