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
	"google.golang.org/grpc/credentials/insecure"

	"herald.dev/integration/stack"
	heraldv1 "herald.dev/libs/proto/herald/v1"
)

// TestInternalMutualTLS runs every internal hop over mutual TLS: clients see
// no difference through frontdoor, while the caches' and fanouts' ports
// refuse anyone without a certificate from the internal CA — which is what
// lets them trust the identity frontdoor passes along.
func TestInternalMutualTLS(t *testing.T) {
	e := startStack(t, stack.Options{InternalTLS: true})
	ctx := testContext(t, time.Minute)

	_, want := e.watchSeesPut(t, ctx, "tls")

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.PKI.CAPEM)
	cacheAddr := e.Proc("cache-0").Addrs["grpc"]
	list := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(cacheAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err = heraldv1.NewCacheClient(conn).List(cctx, &heraldv1.ListRequest{Resource: "pods"})
		return err
	}
	if err := list(insecure.NewCredentials()); err == nil {
		t.Error("the cache answered a plaintext client")
	}
	if err := list(credentials.NewTLS(&tls.Config{RootCAs: pool})); err == nil {
		t.Error("the cache answered a TLS client without a certificate")
	}
	clientCert, err := tls.LoadX509KeyPair(e.PKI.Component("herald-frontdoor"))
	if err != nil {
		t.Fatal(err)
	}
	if err := list(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientCert}})); err != nil {
		t.Errorf("the cache refused the internal client certificate: %v", err)
	}

	fanoutURL := "https://" + e.Proc("fanout-0").Addrs["http"] + "/api/v1/pods?watch=true&timeoutSeconds=1&resourceVersion=" + strconv.FormatInt(want.RV, 10)
	get := func(cfg *tls.Config) (int, error) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
		resp, err := c.Get(fanoutURL)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(&tls.Config{RootCAs: pool}); err == nil {
		t.Errorf("fanout answered %d to a client without a certificate", code)
	}
	if code, err := get(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{clientCert}}); err != nil || code != 200 {
		t.Errorf("fanout refused the internal client certificate: %d %v", code, err)
	}
	if resp, err := http.Get("http://" + e.Proc("fanout-0").Addrs["http"] + "/api/v1/pods?watch=true"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("fanout answered plaintext HTTP")
		}
	}
}
