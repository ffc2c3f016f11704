package fanout

import (
	"strings"
	"testing"

	"herald.dev/libs/service"
)

// fanout's internal HTTP port over TLS without a client CA would serve
// anyone who reaches it as frontdoor, trusting the identity headers it is
// sent: the replica refuses to start, and the error names the flag to set.
func TestRefusesTLSWithoutClientCA(t *testing.T) {
	for args, want := range map[string]string{ // "": starts
		"": "",
		"--http.tls.cert-file=c --http.tls.key-file=k --http.tls.client-ca-file=ca": "",
		"--http.tls.cert-file=c --http.tls.key-file=k":                              "http.tls.client-ca-file is required with http.tls.cert-file",
		"--cache.tls.cert-file=c --cache.tls.key-file=k":                            "cache.tls.ca-file is required with cache.tls.cert-file",
	} {
		if _, err := service.Configure("fanout", &Config{}, strings.Fields(args)); (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", args, err, want)
		}
	}
}
