package admission

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Where the API server can call this operator when neither --webhook-url nor
// --webhook-service says (luaop dev on kind, k3d, minikube): the API server of a
// local cluster is published on this machine's loopback, but it runs in a network of
// its own (a container, a VM), where 127.0.0.1 is its own loopback. It reaches this
// machine through a bridge: the address of this machine on the route to the
// cluster's nodes. Found, in this order:
//  1. the local address on the route to a Node's InternalIP (kind, k3d, minikube's
//     docker driver): the kernel's choice of source address for that destination;
//  2. where Nodes cannot be listed (RBAC) or have no usable address: the local
//     address on a network this machine is directly attached to that holds one of
//     the IP addresses of the API server's certificate (kubeadm puts the node's
//     address there);
//  3. kopf's ClusterDetector: the API server certificate's subject and issuer name
//     the cluster (k3s: host.k3d.internal, minikube: host.minikube.internal,
//     docker-desktop: host.docker.internal), names these clusters resolve to this
//     machine inside; the server listens on every interface then (kopf's way);
//  4. an API server on this machine's loopback with no nodes elsewhere (the
//     project's local control plane): 127.0.0.1.
// The reachability probe then proves the choice (probe.go).

// Endpoint is where the webhook server listens and what the API server is given.
type Endpoint struct {
	// Host is the host of the URL the configurations give the API server.
	Host string
	// Listen is the host to listen on ("" keeps --webhook-address's host; "::"
	// for every interface).
	Listen string
	// How says how Host was found, for the log and the dev view.
	How string
}

// detector holds what detection reads; tests replace its functions.
type detector struct {
	nodes       func(ctx context.Context) ([]corev1.Node, error)
	certificate func(ctx context.Context) (*x509.Certificate, error)
	version     func(ctx context.Context) (string, error)
	// localAddrs are this machine's interface addresses (with their networks).
	localAddrs func() ([]*net.IPNet, error)
	// routeSource is the local address the kernel would send from to ip.
	routeSource func(ip net.IP) (net.IP, error)
	// serverLocal: the API server's address (cfg.Host) is on this machine.
	serverLocal bool
}

func newDetector(cfg *rest.Config, client kubernetes.Interface) *detector {
	return &detector{
		nodes: func(ctx context.Context) ([]corev1.Node, error) {
			list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 50})
			if err != nil {
				return nil, err
			}
			return list.Items, nil
		},
		certificate: func(ctx context.Context) (*x509.Certificate, error) { return serverCertificate(ctx, cfg) },
		version: func(ctx context.Context) (string, error) {
			v, err := client.Discovery().ServerVersion()
			if err != nil {
				return "", err
			}
			return v.GitVersion, nil
		},
		localAddrs:  interfaceNetworks,
		routeSource: routeSource,
		serverLocal: serverOnThisMachine(cfg),
	}
}

// detect finds the Endpoint; ok false when nothing says how the API server can
// reach this machine (the caller then keeps loopback and says why).
func (d *detector) detect(ctx context.Context) (Endpoint, bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nets, _ := d.localAddrs()
	isLocal := func(ip net.IP) bool {
		if ip.IsLoopback() {
			return true
		}
		for _, n := range nets {
			if n.IP.Equal(ip) {
				return true
			}
		}
		return false
	}
	// 1. The route to the nodes.
	if nodes, err := d.nodes(ctx); err == nil {
		slices.SortFunc(nodes, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
		for _, n := range nodes {
			for _, a := range n.Status.Addresses {
				if a.Type != corev1.NodeInternalIP {
					continue
				}
				ip := net.ParseIP(a.Address)
				if ip == nil || ip.IsUnspecified() || isLocal(ip) {
					continue // a node on this machine: the API server shares its network
				}
				src, err := d.routeSource(ip)
				if err != nil || src.IsLoopback() || src.IsUnspecified() {
					continue
				}
				return Endpoint{Host: src.String(), Listen: src.String(),
					How: fmt.Sprintf("this machine's address on the route to node %s (InternalIP %s)", n.Name, ip)}, true
			}
		}
	}
	cert, certErr := d.certificate(ctx)
	// 2. The certificate's addresses on a network this machine is attached to.
	if certErr == nil {
		for _, ip := range cert.IPAddresses {
			if ip.IsLoopback() || ip.IsUnspecified() || isLocal(ip) {
				continue
			}
			for _, n := range nets {
				if n.Contains(ip) && !n.IP.IsLoopback() {
					return Endpoint{Host: n.IP.String(), Listen: n.IP.String(),
						How: fmt.Sprintf("this machine's address on the network of %s, an address of the API server's certificate", ip)}, true
				}
			}
		}
	}
	// 3. kopf's ClusterDetector.
	if host, what := clusterHostName(cert, d.version, ctx); host != "" {
		return Endpoint{Host: host, Listen: "::", How: what}, true
	}
	// 4. A control plane on this machine.
	if d.serverLocal {
		return Endpoint{Host: "127.0.0.1", Listen: "127.0.0.1", How: "the API server runs on this machine"}, true
	}
	return Endpoint{}, false
}

// clusterHostName is kopf's ClusterDetector: the host name a k3d, minikube or
// docker-desktop cluster resolves to this machine, from the API server
// certificate's subject and issuer (or a k3s version), "" for other clusters.
func clusterHostName(cert *x509.Certificate, version func(context.Context) (string, error), ctx context.Context) (host, how string) {
	if cert != nil {
		issuerCN, subjectCN := cert.Issuer.CommonName, cert.Subject.CommonName
		switch {
		case subjectCN == "k3s" || slices.Contains(cert.Subject.Organization, "k3s") || strings.HasPrefix(issuerCN, "k3s-"):
			return "host.k3d.internal", "a k3s/k3d cluster (its API server certificate): host.k3d.internal"
		case subjectCN == "minikube" || issuerCN == "minikubeCA":
			return "host.minikube.internal", "a minikube cluster (its API server certificate): host.minikube.internal"
		case slices.Contains(cert.DNSNames, "docker-for-desktop"):
			return "host.docker.internal", "a docker-desktop cluster (its API server certificate): host.docker.internal"
		}
	}
	if version != nil {
		if v, err := version(ctx); err == nil && strings.Contains(v, "+k3s") {
			return "host.k3d.internal", "a k3s/k3d cluster (its version " + v + "): host.k3d.internal"
		}
	}
	return "", ""
}

// serverCertificate reads the API server's serving certificate (a TLS handshake
// with the client's own TLS settings).
func serverCertificate(ctx context.Context, cfg *rest.Config) (*x509.Certificate, error) {
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Scheme != "https" {
		return nil, fmt.Errorf("the API server %s is not served over https", cfg.Host)
	}
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	if tlsCfg == nil {
		tlsCfg = &tls.Config{}
	}
	tlsCfg = tlsCfg.Clone()
	// Only the certificate is read; the client's own requests verify it.
	tlsCfg.InsecureSkipVerify = true
	tlsCfg.GetClientCertificate, tlsCfg.Certificates = nil, nil
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	dialer := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: tlsCfg}
	conn, err := dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, errors.New("the API server presented no certificate")
	}
	return certs[0], nil
}

// interfaceNetworks are this machine's addresses with their networks.
func interfaceNetworks() ([]*net.IPNet, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []*net.IPNet
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n)
		}
	}
	return out, nil
}

// routeSource asks the kernel which local address it sends from to ip: a UDP
// "connection" sends nothing.
func routeSource(ip net.IP) (net.IP, error) {
	conn, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: ip, Port: 9})
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	return conn.LocalAddr().(*net.UDPAddr).IP, nil
}

// serverOnThisMachine tells whether the API server of cfg is on this machine: on
// loopback, or at one of its interface addresses.
func serverOnThisMachine(cfg *rest.Config) bool {
	host := serverHost(cfg.Host)
	if isLoopbackHost(host) {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	nets, _ := interfaceNetworks()
	for _, n := range nets {
		if n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// serverHost is the host of a rest.Config's Host ("https://h:p", or "h:p").
func serverHost(h string) string {
	u, err := url.Parse(h)
	if err == nil && u.Hostname() != "" {
		return u.Hostname()
	}
	host, _, err := net.SplitHostPort(h)
	if err != nil {
		return h
	}
	return host
}

// ServerOnThisMachine tells whether the API server of cfg runs on this machine (its
// address is loopback or one of this machine's): cmd/luaop's guard of non-local
// clusters uses it.
func ServerOnThisMachine(cfg *rest.Config) bool { return serverOnThisMachine(cfg) }
