package manifests

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"herald.dev/libs/service"
	"herald.dev/libs/stream"
)

// container is one container of a workload of the rendering, by the image
// `make images` builds it from (ingest, cache, ..., etcd, nats-server).
type container struct {
	where string
	pod   corev1.PodSpec
	c     corev1.Container
	args  map[string]string
}

func containersByImage(t *testing.T, r *rendering) map[string][]container {
	t.Helper()
	images := makeImages(t)
	out := map[string][]container{}
	for _, w := range r.workloads() {
		for _, c := range w.pod.Containers {
			if name, ok := heraldImage(c.Image, images); ok {
				out[name] = append(out[name], container{where: w.kind + " " + w.name, pod: w.pod, c: c, args: argMap(c)})
			}
		}
	}
	return out
}

// Client TLS flag groups (service.ClientTLS) and the server side
// (service.ServerTLS): every file must be set.
func clientTLSFlags(prefix string) []string {
	return []string{prefix + ".tls.ca-file", prefix + ".tls.cert-file", prefix + ".tls.key-file"}
}

func serverTLSFlags(prefix string) []string {
	return []string{prefix + ".tls.cert-file", prefix + ".tls.key-file", prefix + ".tls.client-ca-file"}
}

// TestProdInternalsAreSecure checks that the prod overlay runs every
// internal hop over mutual TLS and NATS with per-service credentials: each
// hop's flags are set on both sides, every certificate, key and password
// comes from a mounted Secret, no peer address is plaintext, etcd demands
// client certificates, and the NATS configuration (started for real, see
// checkNATS) enforces TLS and each service's permissions.
func TestProdInternalsAreSecure(t *testing.T) {
	r := render(t, "prod")
	byImage := containersByImage(t, r)
	want := map[string][]string{
		"ingest":    slices.Concat(clientTLSFlags("etcd"), clientTLSFlags("nats"), []string{"nats.user", "nats.password-file"}),
		"cache":     slices.Concat(clientTLSFlags("etcd"), clientTLSFlags("nats"), []string{"nats.user", "nats.password-file"}, serverTLSFlags("grpc"), []string{"grpc.tls.allowed-client-names"}),
		"fanout":    slices.Concat(serverTLSFlags("http"), []string{"http.tls.allowed-client-names"}, clientTLSFlags("cache")),
		"frontdoor": slices.Concat(clientTLSFlags("fanout"), clientTLSFlags("cache")),
	}
	// Plaintext schemes each peer flag must not use.
	schemes := map[string]string{"etcd.endpoints": "https", "nats.url": "tls", "fanout.addrs": "https"}
	natsUsers := map[string]string{} // service -> its NATS user
	for svc, flags := range want {
		if len(byImage[svc]) == 0 {
			t.Errorf("no %s container", svc)
		}
		for _, c := range byImage[svc] {
			for _, f := range flags {
				v := c.args[f]
				if v == "" {
					t.Errorf("%s: --%s must be set", c.where, f)
					continue
				}
				if strings.HasSuffix(f, "-file") {
					if _, _, err := secretFile(c.pod, c.c, v); err != nil {
						t.Errorf("%s: --%s: %v", c.where, f, err)
					}
				}
			}
			for f, scheme := range schemes {
				v, ok := c.args[f]
				if !ok {
					continue
				}
				for _, a := range service.SplitList(v) {
					if u, err := url.Parse(a); err != nil || u.Scheme != scheme {
						t.Errorf("%s: --%s: %s is not %s://", c.where, f, a, scheme)
					}
				}
			}
			if u := c.args["nats.user"]; u != "" {
				if prev, ok := natsUsers[svc]; ok && prev != u {
					t.Errorf("%s: --nats.user=%s, another %s uses %s", c.where, u, svc, prev)
				}
				natsUsers[svc] = u
			}
		}
	}
	if natsUsers["ingest"] != "" && natsUsers["ingest"] == natsUsers["cache"] {
		t.Errorf("ingest and the caches share NATS user %q: the caches could publish", natsUsers["ingest"])
	}
	for _, c := range byImage["etcd"] {
		checkEtcd(t, c)
	}
	if len(byImage["nats-server"]) != 1 || len(byImage["ingest"]) == 0 || len(byImage["cache"]) == 0 {
		t.Fatalf("want one NATS workload, ingest and caches; got %d, %d, %d", len(byImage["nats-server"]), len(byImage["ingest"]), len(byImage["cache"]))
	}
	checkAllowlists(t, byImage)
	checkNATS(t, r, byImage)
}

// checkEtcd: clients and peers over TLS, both with certificates from the
// internal CA (--client-cert-auth, --peer-client-cert-auth).
func checkEtcd(t *testing.T, c container) {
	t.Helper()
	for _, f := range []string{"cert-file", "key-file", "trusted-ca-file", "peer-cert-file", "peer-key-file", "peer-trusted-ca-file"} {
		if c.args[f] == "" {
			t.Errorf("%s: --%s must be set", c.where, f)
		} else if _, _, err := secretFile(c.pod, c.c, c.args[f]); err != nil {
			t.Errorf("%s: --%s: %v", c.where, f, err)
		}
	}
	for _, f := range []string{"client-cert-auth", "peer-client-cert-auth"} {
		if c.args[f] != "true" {
			t.Errorf("%s: --%s=true is required (anyone could connect without a certificate)", c.where, f)
		}
	}
	// Peers are etcd members only: the certificate of etcd's Secret.
	if got := c.args["peer-cert-allowed-hostname"]; got != "herald-etcd" {
		t.Errorf("%s: --peer-cert-allowed-hostname=%q, want herald-etcd (any certificate of the internal CA could join as a member)", c.where, got)
	} else if names := certificateNames(prodCertificates(t), c); !slices.ContainsFunc(slices.Collect(maps.Values(names)), func(n []string) bool { return slices.Contains(n, got) }) {
		t.Errorf("%s: its certificate does not name %s: its peers would refuse it", c.where, got)
	}
	for _, f := range []string{"listen-client-urls", "advertise-client-urls", "listen-peer-urls", "initial-advertise-peer-urls", "initial-cluster"} {
		v := c.args[f]
		if v == "" {
			t.Errorf("%s: --%s must be set", c.where, f)
		}
		for _, a := range service.SplitList(v) {
			if _, u, ok := strings.Cut(a, "="); ok {
				a = u // initial-cluster: name=URL
			}
			if !strings.HasPrefix(a, "https://") {
				t.Errorf("%s: --%s: %s is not https://", c.where, f, a)
			}
		}
	}
}

// secretFile resolves a file a container reads to the Secret and key it
// comes from; a file on no volume, or on a volume that is not a Secret
// (a ConfigMap is readable by anyone who can read the namespace's
// configuration), is an error.
func secretFile(pod corev1.PodSpec, c corev1.Container, path string) (secret, key string, err error) {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, m.MountPath+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.Secret == nil {
				return "", "", fmt.Errorf("%s is on volume %s, which is not a Secret", path, v.Name)
			}
			if len(v.Secret.Items) == 0 {
				return v.Secret.SecretName, rel, nil
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v.Secret.SecretName, it.Key, nil
				}
			}
			return "", "", fmt.Errorf("%s: Secret volume %s projects no %s", path, v.Name, rel)
		}
	}
	return "", "", fmt.Errorf("%s is not on a mounted volume", path)
}

// checkNATS starts a NATS server exactly as the rendered StatefulSet
// configures it (its arguments, its ConfigMap, its environment; Secrets
// replaced by test certificates and passwords; ports moved to loopback, no
// cluster), then connects the way ingest and the caches do, from their
// rendered flags through service.JetStreamConfig, and checks what each may
// do. A password ingest reads from a Secret key NATS does not check for its
// user fails here too.
func checkNATS(t *testing.T, r *rendering, byImage map[string][]container) {
	files := newTestFiles(t)
	n := byImage["nats-server"][0]
	for _, e := range n.c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			t.Setenv(e.Name, files.password(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key))
		case e.ValueFrom == nil:
			t.Setenv(e.Name, e.Value)
		}
	}
	ingest, cache := byImage["ingest"][0], byImage["cache"][0]
	local := files.mount(t, r, n)
	var args []string
	for _, a := range n.c.Args {
		args = append(args, local(strings.ReplaceAll(a, "$(POD_NAME)", "herald-nats-0")))
	}
	opts, err := server.ConfigureOptions(flag.NewFlagSet("nats-server", flag.ContinueOnError), args, nil, nil, nil)
	if err != nil {
		t.Fatalf("%s: nats-server refuses its configuration: %v", n.where, err)
	}
	switch {
	case opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert:
		t.Errorf("%s: client connections must use TLS with verify (client certificates)", n.where)
	case opts.Cluster.TLSConfig == nil || opts.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert:
		t.Errorf("%s: routes must use TLS with verify", n.where)
	case opts.NoAuthUser != "" || opts.Username != "" || opts.Authorization != "" || len(opts.Users) == 0:
		t.Errorf("%s: every client must authenticate as its own user (no no_auth_user, no shared user or token)", n.where)
	}
	for _, u := range opts.Users {
		if u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
			t.Errorf("%s: NATS user %s has no publish and subscribe permissions", n.where, u.Username)
		}
	}
	// A client is the user its certificate names: only the containers
	// running as that user hold a certificate naming it.
	if !opts.TLSMap {
		t.Errorf("%s: clients' certificates must be mapped to their users (tls { verify_and_map: true })", n.where)
	}
	certs := prodCertificates(t)
	for _, u := range opts.Users {
		for image, cs := range byImage {
			for _, c := range cs {
				for secret, names := range certificateNames(certs, c) {
					names := slices.Contains(names, u.Username)
					switch mine := c.args["nats.user"] == u.Username; {
					case mine && !names && secret == mustSecret(t, c, "nats.tls.cert-file"):
						t.Errorf("%s connects to NATS as %s with Secret %s's certificate, which does not name it", c.where, u.Username, secret)
					case !mine && names:
						t.Errorf("%s (%s) holds Secret %s's certificate, which names NATS user %s", c.where, image, secret, u.Username)
					}
				}
			}
		}
	}
	if t.Failed() {
		return
	}

	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.Cluster, opts.Routes, opts.RoutesStr = server.ClusterOpts{}, nil, ""
	opts.StoreDir, opts.NoSigs, opts.NoLog = t.TempDir(), true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	addr := "tls://" + ns.Addr().String()
	connect := func(c container, edit func(map[string]string)) (*nats.Conn, error) {
		args := map[string]string{}
		for k, v := range c.args {
			args[k] = v
		}
		if edit != nil {
			edit(args)
		}
		return files.connectAs(t, r, c, args, addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	wrongPassword := filepath.Join(t.TempDir(), "wrong-password")
	if err := os.WriteFile(wrongPassword, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Who may connect: each service with its certificate and password;
	// nobody without a user, a right password or a client certificate.
	for name, edit := range map[string]func(map[string]string){
		"no user":               func(a map[string]string) { delete(a, "nats.user"); delete(a, "nats.password-file") },
		"wrong password":        func(a map[string]string) { a["nats.password-file"] = wrongPassword },
		"no client certificate": func(a map[string]string) { delete(a, "nats.tls.cert-file"); delete(a, "nats.tls.key-file") },
	} {
		if nc, err := connect(cache, edit); err == nil {
			nc.Close()
			t.Errorf("NATS accepted a client with %s", name)
		}
	}
	inc, err := connect(ingest, nil)
	if err != nil {
		t.Fatalf("%s cannot connect to NATS: %v", ingest.where, err)
	}
	defer inc.Close()
	cnc, err := connect(cache, nil)
	if err != nil {
		t.Fatalf("%s cannot connect to NATS: %v", cache.where, err)
	}
	defer cnc.Close()

	// ingest: creates the stream, publishes revisions and markers, reads
	// its last message back, answers progress requests.
	name := orDefault(ingest.args["stream.name"], "HERALD")
	ijs, _ := jetstream.New(inc)
	ist, err := ijs.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: stream.Subjects(), Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("ingest cannot create the stream: %v", err)
	}
	for _, subj := range []string{stream.SubjectMulti, stream.SubjectProgress} {
		if _, err := ijs.Publish(ctx, subj, []byte("x")); err != nil {
			t.Errorf("ingest cannot publish to %s: %v", subj, err)
		}
	}
	if _, err := ist.GetMsg(ctx, 2); err != nil {
		t.Errorf("ingest cannot read the stream's last message: %v", err)
	}
	progress, err := inc.SubscribeSync(stream.SubjectProgressRequest)
	if err != nil || inc.Flush() != nil {
		t.Fatalf("ingest cannot subscribe to progress requests: %v", err)
	}

	// A cache: reads the stream (info, a message, an ordered consumer as
	// the shard follows it) and asks ingest for progress.
	cjs, _ := jetstream.New(cnc)
	cst, err := cjs.Stream(ctx, name)
	if err != nil {
		t.Fatalf("a cache cannot look the stream up: %v", err)
	}
	if _, err := cst.GetMsg(ctx, 1); err != nil {
		t.Errorf("a cache cannot read a stream message: %v", err)
	}
	cons, err := cst.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: stream.Subjects(), DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 1})
	if err != nil {
		t.Fatalf("a cache cannot create an ordered consumer: %v", err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := it.Next(); got <- err }()
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("a cache cannot consume the stream: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a cache's ordered consumer delivered nothing")
	}
	it.Stop()
	if err := cnc.Publish(stream.SubjectProgressRequest, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := progress.NextMsg(10 * time.Second); err != nil {
		t.Errorf("ingest did not receive a cache's progress request: %v", err)
	}

	// What a cache may not do: write to the stream or change it.
	refused := func(what string, f func(context.Context) error) {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		defer rcancel()
		if err := f(rctx); err == nil {
			t.Errorf("%s was allowed", what)
		}
	}
	for _, subj := range []string{stream.SubjectMulti, stream.SubjectProgress} {
		refused("a cache publishing to "+subj, func(ctx context.Context) error { _, err := cjs.Publish(ctx, subj, []byte("forged")); return err })
		cnc.Publish(subj, []byte("forged")) // core NATS: stored if the server let it through
	}
	refused("a cache purging the stream", func(ctx context.Context) error { return cst.Purge(ctx) })
	refused("a cache deleting the stream", func(ctx context.Context) error { return cjs.DeleteStream(ctx, name) })
	refused("a cache updating the stream", func(ctx context.Context) error {
		_, err := cjs.UpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{">"}, Storage: jetstream.MemoryStorage})
		return err
	})
	refused("ingest deleting the stream", func(ctx context.Context) error { return ijs.DeleteStream(ctx, name) })

	// A certificate names its holder: the caches' certificate with
	// ingest's password does not make a client ingest (a compromised
	// cache pod that learnt the password cannot publish), and NATS's own
	// certificate is no client's, whatever password comes with it.
	dir := t.TempDir()
	secretCopy := func(c container, flag string) string {
		secret, key, err := secretFile(c.pod, c.c, c.args[flag])
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, secret+"-"+key)
		if err := os.WriteFile(file, []byte(files.password(secret, key)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	ingestPassword := secretCopy(ingest, "nats.password-file")
	natsCrt, natsKey := files.pair(t, natsTLSSecret(t, n))
	for _, f := range [][2]string{{"nats.crt", string(natsCrt)}, {"nats.key", string(natsKey)}} {
		if err := os.WriteFile(filepath.Join(dir, f[0]), []byte(f[1]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for what, edit := range map[string]func(map[string]string){
		"the caches' certificate with ingest's user and password": func(a map[string]string) {
			a["nats.user"], a["nats.password-file"] = ingest.args["nats.user"], ingestPassword
		},
		"NATS's certificate with a cache's user and password": func(a map[string]string) {
			a["nats.tls.cert-file"], a["nats.tls.key-file"] = filepath.Join(dir, "nats.crt"), filepath.Join(dir, "nats.key")
		},
	} {
		nc, err := connect(cache, edit)
		if err != nil {
			continue // refused at the connection: right
		}
		js, _ := jetstream.New(nc)
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, perr := js.Publish(pctx, stream.SubjectMulti, []byte("forged"))
		pcancel()
		nc.Close()
		if perr == nil {
			t.Errorf("%s published to the stream", what)
		} else {
			t.Errorf("%s was let in (it could not publish: %v)", what, perr)
		}
	}
	cnc.Flush()
	if info, err := ist.Info(ctx); err != nil || info.State.Msgs != 2 {
		// ingest's 2 messages: nothing forged above was stored.
		t.Errorf("the stream holds %+v (%v), want ingest's 2 messages only", info.State, err)
	}
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// testFiles stands in for the Secrets and ConfigMaps a rendering mounts:
// one test CA, every TLS Secret holding a certificate it issued with the
// names the prod Certificate for that Secret gives (certificates.yaml) and
// 127.0.0.1 (tls.crt, tls.key, ca.crt), every other Secret key a password
// derived from the Secret and key (two keys never share one).
type testFiles struct {
	dir   string
	caPEM []byte
	ca    *x509.Certificate
	caKey ed25519.PrivateKey
	certs map[string]prodCertificate // by Secret
	pairs map[string][2][]byte       // issued, by Secret
}

func newTestFiles(t *testing.T) *testFiles {
	t.Helper()
	now := time.Now()
	caPub, caKey, _ := ed25519.GenerateKey(rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "herald internal CA (test)"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caPub, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	return &testFiles{dir: t.TempDir(), ca: ca, caKey: caKey, certs: prodCertificates(t), pairs: map[string][2][]byte{},
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
}

// pair is the certificate and key of a TLS Secret, issued on first use
// with its Certificate's names.
func (f *testFiles) pair(t *testing.T, secret string) (crt, key []byte) {
	t.Helper()
	if p, ok := f.pairs[secret]; ok {
		return p[0], p[1]
	}
	c, ok := f.certs[secret]
	if !ok {
		t.Fatalf("Secret %s is mounted as a certificate, but certificates.yaml issues none for it", secret)
	}
	now := time.Now()
	pub, k, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(int64(len(f.pairs) + 2)), Subject: pkix.Name{CommonName: c.Spec.CommonName},
		DNSNames: c.Spec.DNSNames, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}, f.ca, pub, f.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalPKCS8PrivateKey(k)
	crt, key = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})
	f.pairs[secret] = [2][]byte{crt, key}
	return crt, key
}

func (f *testFiles) password(secret, key string) string { return "pw-" + secret + "-" + key }

// mount writes what c's volumes hold into a directory per mount and
// returns the function that maps a path in the container (in an argument
// or a mounted configuration file) to the local one.
func (f *testFiles) mount(t *testing.T, r *rendering, c container) func(string) string {
	t.Helper()
	base := filepath.Join(f.dir, strings.ReplaceAll(c.where, " ", "-"), c.c.Name)
	var pairs []string
	for _, m := range c.c.VolumeMounts {
		pairs = append(pairs, m.MountPath+"/", filepath.Join(base, m.Name)+"/")
	}
	local := strings.NewReplacer(pairs...).Replace
	write := func(dir, name string, b []byte) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range c.c.VolumeMounts {
		dir := filepath.Join(base, m.Name)
		for _, v := range c.pod.Volumes {
			switch {
			case v.Name != m.Name:
			case v.Secret != nil && len(v.Secret.Items) > 0:
				for _, it := range v.Secret.Items {
					write(dir, it.Path, []byte(f.password(v.Secret.SecretName, it.Key)+"\n"))
				}
			case v.Secret != nil:
				crt, key := f.pair(t, v.Secret.SecretName)
				write(dir, "tls.crt", crt)
				write(dir, "tls.key", key)
				write(dir, "ca.crt", f.caPEM)
			case v.ConfigMap != nil:
				cm, ok := r.all("ConfigMap")[v.ConfigMap.Name].(*corev1.ConfigMap)
				if !ok {
					t.Fatalf("%s: no ConfigMap %s", c.where, v.ConfigMap.Name)
				}
				for name, data := range cm.Data {
					write(dir, name, []byte(local(data)))
				}
			}
		}
	}
	return local
}

// connectAs connects to NATS at addr the way the Herald container c does
// with the given flags: service.JetStreamConfig from its nats.* flags, its
// files in place.
func (f *testFiles) connectAs(t *testing.T, r *rendering, c container, args map[string]string, addr string) (*nats.Conn, error) {
	t.Helper()
	local := f.mount(t, r, c)
	var jc service.JetStreamConfig
	fs := flag.NewFlagSet(c.where, flag.ContinueOnError)
	jc.RegisterFlags(fs)
	var flags []string
	for k, v := range args {
		if strings.HasPrefix(k, "nats.") {
			flags = append(flags, "--"+k+"="+local(v))
		}
	}
	if err := fs.Parse(flags); err != nil {
		t.Fatal(err)
	}
	if err := jc.Validate(); err != nil {
		return nil, err
	}
	tc, user, err := jc.NATSSecurity(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nats.UserInfoHandler(user), nats.Timeout(5 * time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { t.Logf("%s: %v", c.where, err) })}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	return nats.Connect(addr, opts...)
}

// natsTLSSecret is the Secret NATS's certificate comes from.
func natsTLSSecret(t *testing.T, n container) string {
	t.Helper()
	for _, v := range n.pod.Volumes {
		if v.Secret != nil && len(v.Secret.Items) == 0 {
			return v.Secret.SecretName
		}
	}
	t.Fatalf("%s mounts no certificate", n.where)
	return ""
}

// mustSecret is the Secret the file of c's flag comes from.
func mustSecret(t *testing.T, c container, flag string) string {
	t.Helper()
	secret, _, err := secretFile(c.pod, c.c, c.args[flag])
	if err != nil {
		t.Fatalf("%s: --%s: %v", c.where, flag, err)
	}
	return secret
}
