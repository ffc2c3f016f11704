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
