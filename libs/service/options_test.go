package service

import (
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sourceConfig is a SourceConfig as the flags make it.
func sourceConfig(t *testing.T, args ...string) *SourceConfig {
	t.Helper()
	var c SourceConfig
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs, "")
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &c
}

// Every refused etcd or NATS setting says which flag is wrong and why.
func TestSourceConfigRefusesUnsafeSettings(t *testing.T) {
	tls := []string{"--etcd.tls.ca-file=ca", "--etcd.tls.cert-file=c", "--etcd.tls.key-file=k"}
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"defaults", nil, ""},
		{"etcd TLS on https", append([]string{"--etcd.endpoints=https://a:2379,https://b:2379"}, tls...), ""},
		{"etcd TLS on http", append([]string{"--etcd.endpoints=https://a:2379,http://b:2379"}, tls...), "etcd.endpoints: http://b:2379 is plaintext but etcd.tls.* is set"},
		{"etcd TLS on the default endpoint", tls, "etcd.endpoints: http://127.0.0.1:2379 is plaintext"},
		{"etcd client cert without key", []string{"--etcd.endpoints=https://a:2379", "--etcd.tls.ca-file=ca", "--etcd.tls.cert-file=c"}, "etcd.tls.cert-file and etcd.tls.key-file go together"},
		{"etcd client cert without CA", []string{"--etcd.endpoints=https://a:2379", "--etcd.tls.cert-file=c", "--etcd.tls.key-file=k"}, "etcd.tls.ca-file is required with etcd.tls.cert-file"},
		{"NATS TLS and user", []string{"--nats.url=tls://n:4222", "--nats.tls.ca-file=ca", "--nats.tls.cert-file=c", "--nats.tls.key-file=k", "--nats.user=u", "--nats.password-file=p"}, ""},
		{"NATS client cert without CA", []string{"--nats.tls.cert-file=c", "--nats.tls.key-file=k"}, "nats.tls.ca-file is required with nats.tls.cert-file"},
		{"NATS user without password", []string{"--nats.user=u"}, "nats.user and nats.password-file go together"},
		{"NATS password without user", []string{"--nats.password-file=p"}, "nats.user and nats.password-file go together"},
	} {
		err := sourceConfig(t, tc.args...).Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// The NATS password is read at start (a missing file is a configuration
// error) and again on every connect, so a rotated Secret takes effect on the
// next reconnect; a file gone missing later keeps the last password.
func TestNATSSecurity(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	c := sourceConfig(t, "--nats.user=herald-cache", "--nats.password-file="+pw)
	if _, _, err := c.NATSSecurity(log); err == nil || !strings.Contains(err.Error(), "nats.password-file") {
		t.Fatalf("missing password file: %v", err)
	}
	if err := os.WriteFile(pw, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.NATSSecurity(log); err == nil {
		t.Fatal("an empty password was accepted")
	}
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tc, user, err := c.NATSSecurity(log)
	if err != nil || tc != nil || user == nil {
		t.Fatalf("NATSSecurity: %v %v %v", tc, user != nil, err)
	}
	if u, p := user(); u != "herald-cache" || p != "s3cret" {
		t.Errorf("credentials %q %q", u, p)
	}
	if err := os.WriteFile(pw, []byte("rotated"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, p := user(); p != "rotated" {
		t.Errorf("after rotation: %q", p)
	}
	os.Remove(pw)
	if _, p := user(); p != "rotated" {
		t.Errorf("after the file went away: %q, want the last one read", p)
	}

	if tc, user, err := sourceConfig(t).NATSSecurity(log); tc != nil || user != nil || err != nil {
		t.Errorf("no NATS security configured: %v %v %v", tc, user != nil, err)
	}
	ca := newTestCA(t, dir)
	crt, key := ca.issue(t, dir, "client", "herald-cache", 2)
	tc, _, err = sourceConfig(t, "--nats.tls.ca-file="+ca.file, "--nats.tls.cert-file="+crt, "--nats.tls.key-file="+key).NATSSecurity(log)
	if err != nil || tc == nil || tc.RootCAs == nil || tc.GetClientCertificate == nil {
		t.Errorf("NATS TLS: %+v %v", tc, err)
	}
}
