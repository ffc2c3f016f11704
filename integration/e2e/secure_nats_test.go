package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"herald.dev/integration/checker"
	"herald.dev/integration/stack"
)

// TestProdNATSPermissions runs the real ingest and cache against a NATS
// that enforces the prod overlay's nats.conf: mutual TLS and one user per
// service with the permissions written there (the manifest test checks
// what they forbid). If ingest or a cache needed a subject the file does
// not grant, the stack would not become ready or the event would not
// arrive. Every other internal hop runs over mutual TLS too, etcd's
// clients included (etcd.tls.*).
func TestProdNATSPermissions(t *testing.T) {
	dir := t.TempDir()
	pki, err := stack.EnsurePKI(filepath.Join(dir, "nats-pki"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "k8s", "overlays", "prod", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	natsCrt, natsKey := pki.Component("herald-nats")
	conf := strings.NewReplacer("/etc/nats/tls/tls.crt", natsCrt, "/etc/nats/tls/tls.key", natsKey,
		"/etc/nats/tls/ca.crt", pki.CAFile).Replace(string(b))
	confFile := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	// As the prod StatefulSet does: passwords in NATS's environment, each
	// service reading its own from a file (deploy/k8s/overlays/prod).
	flags := map[string][]string{}
	for svc, env := range map[string]string{"ingest": "NATS_INGEST_PASSWORD", "cache": "NATS_CACHE_PASSWORD"} {
		pw := "e2e-" + svc + "-password"
		t.Setenv(env, pw)
		file := filepath.Join(dir, svc+"-password")
		if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// NATS maps each service's certificate to its user (verify_and_map).
		crt, key := pki.Component("herald-" + svc)
		flags[svc] = []string{"--nats.user=herald-" + svc, "--nats.password-file=" + file,
			"--nats.tls.ca-file=" + pki.CAFile, "--nats.tls.cert-file=" + crt, "--nats.tls.key-file=" + key}
	}
	e := startStack(t, stack.Options{InternalTLS: true, EtcdTLS: true, NATSConfigFile: confFile, Flags: flags})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	evs, _ := e.watchSeesPut(t, ctx, "secure")
	// The cache follows the stream after a NATS restart too (reconnecting
	// with its credentials, re-creating its consumer).
	if err := e.RestartNATS(); err != nil {
		t.Fatal(err)
	}
	want := e.put(t, ctx, "secure", "p", podJSON("secure", "p", "n", 1), false)
	if got := collect(t, ctx, evs, want.RV); len(got) != 1 || got[0] != want {
		t.Fatalf("watch after a NATS restart: %+v, want %+v", got, want)
	}
}

// watchSeesPut LISTs pods through frontdoor, watches from the list's
// resourceVersion, creates pod ns/p and checks that the watch delivers
// exactly that: the whole path works. It returns the watch and the event.
func (e *env) watchSeesPut(t *testing.T, ctx context.Context, ns string) (<-chan watchEvent, checker.WatchEvent) {
	t.Helper()
	var l podList
	if code := e.get(t, "/api/v1/pods", &l); code != 200 {
		t.Fatalf("LIST through frontdoor: %d", code)
	}
	_, evs := e.openWatch(t, ctx, "/api/v1/pods?watch=true&resourceVersion="+l.Metadata.ResourceVersion)
	want := e.put(t, ctx, ns, "p", podJSON(ns, "p", "n", 0), true)
	if got := collect(t, ctx, evs, want.RV); len(got) != 1 || got[0] != want {
		t.Fatalf("watch through frontdoor: %+v, want %+v", got, want)
	}
	return evs, want
}
