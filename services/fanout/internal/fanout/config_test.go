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

// The cache streams' window must be one gRPC uses (at least 64 KiB) and no
// larger than a connection's: a larger one only lets a waiting catch-up hold
// more.
func TestCacheStreamWindowBounds(t *testing.T) {
	for arg, ok := range map[string]bool{
		"":                                     true,
		"--cache.stream-window-bytes=65536":    true,
		"--cache.stream-window-bytes=16777216": true,
		"--cache.stream-window-bytes=65535":    false,
		"--cache.stream-window-bytes=16777217": false,
	} {
		_, err := service.Configure("fanout", &Config{}, strings.Fields(arg))
		if (err == nil) != ok || err != nil && !strings.Contains(err.Error(), "cache.stream-window-bytes") {
			t.Errorf("%q: got %v, want ok=%v", arg, err, ok)
		}
	}
}

// The pacing intervals are bounded: a watch's (write-coalesce) by a second,
// a connection's (http.write-hold) by 100ms; neither may be negative.
func TestPacingBounds(t *testing.T) {
	for arg, want := range map[string]string{ // "": accepted
		"--watch.write-coalesce=0":      "",
		"--watch.write-coalesce=1s":     "",
		"--watch.write-coalesce=1001ms": "watch.write-coalesce",
		"--watch.write-coalesce=-1ms":   "watch.write-coalesce",
		"--http.write-hold=0":           "",
		"--http.write-hold=100ms":       "",
		"--http.write-hold=101ms":       "http.write-hold",
		"--http.write-hold=-1ms":        "http.write-hold",
	} {
		_, err := service.Configure("fanout", &Config{}, strings.Fields(arg))
		if (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", arg, err, want)
		}
	}
}
