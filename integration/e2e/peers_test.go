package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"herald.dev/integration/stack"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// TestInternalPortsAdmitOnlyTheirPeers: a certificate of the internal CA
// is not enough to use an internal port; the port checks which component
// the certificate names. Only fanout and frontdoor may read a cache (its
// gRPC port serves decrypted Secrets), only frontdoor may open fanout's
// watch port. The certificates of NATS, etcd and ingest, and a cache's
// own, are refused at the handshake, and each refusal is counted.
func TestInternalPortsAdmitOnlyTheirPeers(t *testing.T) {
	e := startStack(t, stack.Options{InternalTLS: true})
	ctx := testContext(t, time.Minute)
	// The whole path (frontdoor -> cache, frontdoor -> fanout -> cache)
	// works with each component's own certificate.
	_, want := e.watchSeesPut(t, ctx, "peers")

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.PKI.CAPEM)
	cert := func(component string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(e.PKI.Component(component))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cache := e.Proc("cache-0")
	list := func(component string) error {
		tc := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert(component)}}
		conn, err := grpc.NewClient(cache.Addrs["grpc"], grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err = heraldv1.NewCacheClient(conn).List(cctx, &heraldv1.ListRequest{Resource: "secrets"})
		return err
	}
	for _, c := range []string{"herald-nats", "herald-etcd", "herald-ingest", "herald-cache"} {
		if err := list(c); err == nil {
			t.Errorf("the cache's gRPC port served a LIST of secrets to %s's certificate", c)
		}
	}
	for _, c := range []string{"herald-frontdoor", "herald-fanout"} {
		if err := list(c); err != nil {
			t.Errorf("the cache's gRPC port refused %s: %v", c, err)
		}
	}

	fanout := e.Proc("fanout-0")
	watchURL := "https://" + fanout.Addrs["http"] + "/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion=" + strconv.FormatInt(want.RV, 10)
	get := func(component string) (int, error) {
		tc := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert(component)}}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
		defer c.CloseIdleConnections()
		resp, err := c.Get(watchURL)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for _, c := range []string{"herald-nats", "herald-etcd", "herald-ingest", "herald-cache", "herald-fanout"} {
		if code, err := get(c); err == nil {
			t.Errorf("fanout's watch port answered %d to %s's certificate", code, c)
		}
	}
	if code, err := get("herald-frontdoor"); err != nil || code != http.StatusOK {
		t.Errorf("fanout's watch port refused frontdoor: %d %v", code, err)
	}

	// Each refused peer is counted (and logged once).
	if n := metric(t, cache, "herald_tls_refused_peers_total"); n != 4 {
		t.Errorf("the cache counted %v refused peers, want 4", n)
	}
	if n := metric(t, fanout, "herald_tls_refused_peers_total"); n != 5 {
		t.Errorf("fanout counted %v refused peers, want 5", n)
	}
}
