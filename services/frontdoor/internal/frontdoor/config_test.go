package frontdoor

import (
	"strings"
	"testing"

	"herald.dev/libs/service"
)

// --fanout.tls.* with an http:// fanout address is a configuration error:
// the client certificate would go unused and the identity headers travel in
// plaintext, while the operator believes the hop is mutual TLS.
func TestRefusesFanoutTLSOverHTTP(t *testing.T) {
	const base, tls = "--tls.cert-file=c --tls.key-file=k --token-auth-file=t ", " --fanout.tls.ca-file=ca --fanout.tls.cert-file=c --fanout.tls.key-file=k"
	for args, want := range map[string]string{ // "": starts
		"": "",
		"--fanout.addrs=https://herald-fanout:7200" + tls: "",
		tls: "fanout.addrs: http://127.0.0.1:7200 is not https:// but fanout.tls.* is set",
		"--fanout.addrs=https://10.0.0.1:7200,http://10.0.0.2:7200" + tls:  "fanout.addrs: http://10.0.0.2:7200 is not https://",
		"--fanout.addrs=http://herald-fanout:7200 --fanout.tls.ca-file=ca": "fanout.addrs: http://herald-fanout:7200 is not https://",
	} {
		if _, err := service.Configure("frontdoor", &Config{}, strings.Fields(base+args)); (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", args, err, want)
		}
	}
}

// In cluster mode identities and decisions are the cluster's: local tokens,
// service-account keys and RBAC are refused at start, not silently used (a
// static admin token would be forwarded as system:masters).
func TestClusterModeRefusesLocalIdentities(t *testing.T) {
	const base = "--tls.cert-file=c --tls.key-file=k --upstream.kubeconfig=kc "
	for args, want := range map[string]string{ // "": starts
		"--client-ca-file=ca":          "",
		"--token-auth-file=t":          "token-auth-file cannot be used with upstream.kubeconfig",
		"--service-account-key-file=k": "service-account-key-file cannot be used with upstream.kubeconfig",
		"--authorization.rbac-dir=d":   "authorization.rbac-dir cannot be used with upstream.kubeconfig",
	} {
		if _, err := service.Configure("frontdoor", &Config{}, strings.Fields(base+args)); (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", args, err, want)
		}
	}
}
