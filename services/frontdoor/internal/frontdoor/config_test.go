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
	checkConfigure(t, base, map[string]string{ // "": starts
		"": "",
		"--fanout.addrs=https://herald-fanout:7200" + tls: "",
		tls: "fanout.addrs: http://127.0.0.1:7200 is not https:// but fanout.tls.* is set",
		"--fanout.addrs=https://10.0.0.1:7200,http://10.0.0.2:7200" + tls:  "fanout.addrs: http://10.0.0.2:7200 is not https://",
		"--fanout.addrs=http://herald-fanout:7200 --fanout.tls.ca-file=ca": "fanout.addrs: http://herald-fanout:7200 is not https://",
	})
}

// In cluster mode identities and decisions are the cluster's: local tokens,
// service-account keys and RBAC are refused at start, not silently used (a
// static admin token would be forwarded as system:masters).
func TestClusterModeRefusesLocalIdentities(t *testing.T) {
	const base = "--tls.cert-file=c --tls.key-file=k --upstream.kubeconfig=kc "
	checkConfigure(t, base, map[string]string{ // "": starts
		"--client-ca-file=ca":          "",
		"--token-auth-file=t":          "token-auth-file cannot be used with upstream.kubeconfig",
		"--service-account-key-file=k": "service-account-key-file cannot be used with upstream.kubeconfig",
		"--authorization.rbac-dir=d":   "authorization.rbac-dir cannot be used with upstream.kubeconfig",
	})
}

// --fanout.shared-window outside the bounds a session accepts is refused at
// start, not by every replica's session later.
func TestSharedWindowBounds(t *testing.T) {
	const base = "--tls.cert-file=c --tls.key-file=k --token-auth-file=t "
	checkConfigure(t, base, map[string]string{ // "": starts
		"":                                 "",
		"--fanout.shared-window=524288":    "",
		"--fanout.shared-window=268435456": "",
		"--fanout.shared-window=524287":    "fanout.shared-window must be from 524288 to 268435456 bytes",
		"--fanout.shared-window=268435457": "fanout.shared-window must be from 524288 to 268435456 bytes",
		"--fanout.shared-window=0":         "fanout.shared-window must be from",
	})
}

// checkConfigure configures frontdoor with base and each case's arguments:
// it starts where the case wants "", and fails naming the case's error
// otherwise.
func checkConfigure(t *testing.T, base string, cases map[string]string) {
	t.Helper()
	for args, want := range cases {
		if _, err := service.Configure("frontdoor", &Config{}, strings.Fields(base+args)); (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", args, err, want)
		}
	}
}
