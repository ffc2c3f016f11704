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
	checkConfigure(t, map[string]string{ // "": starts
		"": "",
		"--http.tls.cert-file=c --http.tls.key-file=k --http.tls.client-ca-file=ca": "",
		"--http.tls.cert-file=c --http.tls.key-file=k":                              "http.tls.client-ca-file is required with http.tls.cert-file",
		"--cache.tls.cert-file=c --cache.tls.key-file=k":                            "cache.tls.ca-file is required with cache.tls.cert-file",
	})
}

// Bounded flags: the cache streams' window must be one gRPC uses (at least
// 64 KiB) and no larger than a connection's (a larger one only lets a waiting
// catch-up hold more); a watch's pacing (write-coalesce) is at most a second,
// a connection's (http.write-hold) at most 100ms, neither negative.
func TestFlagBounds(t *testing.T) {
	checkConfigure(t, map[string]string{ // "": accepted
		"":                                     "",
		"--cache.stream-window-bytes=65536":    "",
		"--cache.stream-window-bytes=16777216": "",
		"--cache.stream-window-bytes=65535":    "cache.stream-window-bytes",
		"--cache.stream-window-bytes=16777217": "cache.stream-window-bytes",
		"--watch.write-coalesce=0":             "",
		"--watch.write-coalesce=1s":            "",
		"--watch.write-coalesce=1001ms":        "watch.write-coalesce",
		"--watch.write-coalesce=-1ms":          "watch.write-coalesce",
		"--http.write-hold=0":                  "",
		"--http.write-hold=100ms":              "",
		"--http.write-hold=101ms":              "http.write-hold",
		"--http.write-hold=-1ms":               "http.write-hold",
	})
}

// checkConfigure configures fanout with each case's arguments: want is
// part of the error it must fail with, "" when it must be accepted.
func checkConfigure(t *testing.T, cases map[string]string) {
	t.Helper()
	for args, want := range cases {
		_, err := service.Configure("fanout", &Config{}, strings.Fields(args))
		if (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", args, err, want)
		}
	}
}
