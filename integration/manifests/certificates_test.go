package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"herald.dev/libs/service"
)

// prodCertificate is what the tests read of a cert-manager Certificate in
// deploy/k8s/overlays/prod/certificates.yaml.
type prodCertificate struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		SecretName string   `json:"secretName"`
		CommonName string   `json:"commonName"`
		DNSNames   []string `json:"dnsNames"`
		Usages     []string `json:"usages"`
	} `json:"spec"`
}

// names are the names the internal ports and NATS read from the
// certificate: its DNS names and Common Name (service.PeerNames).
func (c prodCertificate) names() []string {
	out := append([]string(nil), c.Spec.DNSNames...)
	if c.Spec.CommonName != "" {
		out = append(out, c.Spec.CommonName)
	}
	return out
}

// prodCertificates reads certificates.yaml, by the Secret each fills.
func prodCertificates(t *testing.T) map[string]prodCertificate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "k8s", "overlays", "prod", "certificates.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]prodCertificate{}
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var c prodCertificate
		if err := yaml.Unmarshal(doc, &c); err != nil { // the fields above; the others are cert-manager's
			t.Fatal(err)
		}
		if c.Kind == "" {
			continue
		}
		if c.Kind != "Certificate" || c.Spec.SecretName == "" {
			t.Fatalf("certificates.yaml: %s %s fills no Secret", c.Kind, c.Metadata.Name)
		}
		if _, dup := out[c.Spec.SecretName]; dup {
			t.Fatalf("certificates.yaml: two Certificates fill Secret %s", c.Spec.SecretName)
		}
		out[c.Spec.SecretName] = c
	}
}

// certificateNames are the names of every internal certificate container
// c holds (each Secret it mounts that certificates.yaml fills), by Secret.
func certificateNames(certs map[string]prodCertificate, c container) map[string][]string {
	out := map[string][]string{}
	for _, m := range c.c.VolumeMounts {
		for _, v := range c.pod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			if pc, ok := certs[v.Secret.SecretName]; ok {
				out[v.Secret.SecretName] = pc.names()
			}
		}
	}
	return out
}

// checkAllowlists checks each internal port's allowlist against the
// certificates: every component that uses the port (has its client
// flags) presents a certificate naming an allowed peer, and no other
// container of the overlay (NATS, etcd, ingest, a cache, ...) holds a
// certificate naming one. Ports: the caches' gRPC (read by fanout and
// frontdoor through --cache.tls.*), fanout's HTTP (frontdoor,
// --fanout.tls.*), etcd's clients (ingest and the caches, --etcd.tls.*).
func checkAllowlists(t *testing.T, byImage map[string][]container) {
	t.Helper()
	certs := prodCertificates(t)
	for _, port := range []struct{ server, flag, clientPrefix string }{
		{"cache", "grpc.tls.allowed-client-names", "cache"},
		{"fanout", "http.tls.allowed-client-names", "fanout"},
		// etcd's own (etcd matches the names as DNS names of the
		// certificate): its clients, ingest and the caches, and etcd
		// itself (its gRPC gateway dials it with its own certificate).
		{"etcd", "client-cert-allowed-hostname", "etcd"},
	} {
		var allowed []string
		for _, c := range byImage[port.server] {
			names := service.SplitList(c.args[port.flag])
			if allowed != nil && !slices.Equal(names, allowed) {
				t.Errorf("%s: --%s=%s, another %s admits %v", c.where, port.flag, c.args[port.flag], port.server, allowed)
			}
			allowed = names
			if slices.Contains(names, service.AnyPeer) {
				t.Errorf("%s: --%s admits every certificate of the internal CA", c.where, port.flag)
			}
		}
		admits := func(names []string) bool {
			return slices.ContainsFunc(names, func(n string) bool { return slices.Contains(allowed, n) })
		}
		for image, cs := range byImage {
			for _, c := range cs {
				held := certificateNames(certs, c)
				if image == port.server && port.server == "etcd" {
					continue // etcd itself, admitted by name (herald-etcd)
				}
				if f := c.args[port.clientPrefix+".tls.cert-file"]; f != "" {
					secret, _, err := secretFile(c.pod, c.c, f)
					if err != nil {
						t.Errorf("%s: --%s.tls.cert-file: %v", c.where, port.clientPrefix, err)
						continue
					}
					if !admits(held[secret]) {
						t.Errorf("%s reaches the %s port with Secret %s's certificate, named %v: --%s=%v refuses it", c.where, port.server, secret, held[secret], port.flag, allowed)
					}
					continue
				}
				for secret, names := range held {
					if admits(names) {
						t.Errorf("%s (%s) does not use the %s port, but Secret %s's certificate, named %v, would be admitted there (--%s=%v)", c.where, image, port.server, secret, names, port.flag, allowed)
					}
				}
			}
		}
	}
}
