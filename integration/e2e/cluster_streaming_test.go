package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
)

// Streaming through Herald in cluster mode (issue 15, acceptance 2). No
// kubelet runs, so the test runs the kubelet's end of kube-apiserver's own
// streaming endpoints: a Node object whose address is a TLS server of this
// test, serving the kubelet API's /exec (with the CRI streaming library the
// container runtimes use: SPDY and WebSocket) and /containerLogs (a chunked
// response the test releases line by line). kubectl exec, kubectl logs -f
// and a raw WebSocket then go client -> Herald -> kube-apiserver -> here.

// fakeKubelet serves the kubelet API's streaming endpoints.
type fakeKubelet struct {
	srv *httptest.Server
	// next releases the log response's next line.
	next chan struct{}
}

func startFakeKubelet(t *testing.T, c *clusterEnv) *fakeKubelet {
	cert, err := tls.LoadX509KeyPair(c.PKI.CertFile, c.PKI.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{next: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		opts, err := remotecommand.NewOptions(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		remotecommand.ServeExec(w, r, catExecutor{}, r.PathValue("pod"), "", r.PathValue("container"), r.URL.Query()["command"],
			opts, 0, 30*time.Second, remotecommandconsts.SupportedStreamingProtocols)
	})
	mux.HandleFunc("/containerLogs/{ns}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "log line %d of %s\n", i, r.PathValue("pod"))
			http.NewResponseController(w).Flush()
			if i == 3 {
				return
			}
			select {
			case <-k.next:
			case <-r.Context().Done():
				return
			}
		}
	})
	k.srv = httptest.NewUnstartedServer(mux)
	k.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	k.srv.StartTLS()
	t.Cleanup(k.srv.Close)
	return k
}

// catExecutor runs every command as cat: stdin comes back on stdout.
type catExecutor struct{}

func (catExecutor) ExecInContainer(_ context.Context, _, _, _ string, cmd []string, in io.Reader, out, _ io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) != 1 || cmd[0] != "cat" || in == nil || out == nil {
		return fmt.Errorf("only cat with stdin and stdout runs here, not %q", cmd)
	}
	_, err := io.Copy(out, in)
	return err
}

// testStreaming registers the fake kubelet as node kubelet-1 with a pod on
// it, then streams exec and logs through Herald.
func testStreaming(t *testing.T, ctx context.Context, c *clusterEnv) {
	k := startFakeKubelet(t, c)
	_, port, _ := net.SplitHostPort(k.srv.Listener.Addr().String())
	if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/nodes", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"kubelet-1"}}`); code != http.StatusCreated {
		t.Fatalf("create node: %d %s", code, clip(body))
	}
	if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPatch, "/api/v1/nodes/kubelet-1/status",
		fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":"127.0.0.1"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":%s}}}}`, port)); code != http.StatusOK {
		t.Fatalf("node status: %d %s", code, clip(body))
	}
	if code, body := c.call(ctx, c.FrontdoorURL, c.Token, http.MethodPost, "/api/v1/namespaces/demo/pods",
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"streamer"},"spec":{"nodeName":"kubelet-1","automountServiceAccountToken":false,
		"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}`); code != http.StatusCreated {
		t.Fatalf("create pod: %d %s", code, clip(body))
	}

	// kubectl exec -i ... -- cat: the bytes go up through Herald and come
	// back, with kubectl speaking WebSocket (its default) and SPDY; the
	// kubelet's end serves whichever kube-apiserver speaks to it.
	payload := bytes.Repeat([]byte("0123456789abcdef through Herald and back\n"), 4096) // 164 KiB
	for _, ws := range []string{"true", "false"} {
		cmd := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.heraldCfg["admin"], "-n", "demo", "exec", "-i", "streamer", "--", "cat")
		cmd.Env = append(os.Environ(), "KUBECTL_REMOTE_COMMAND_WEBSOCKETS="+ws)
		cmd.Stdin = bytes.NewReader(payload)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || !bytes.Equal(out, payload) {
			t.Errorf("kubectl exec -i cat (websockets=%s): %v, %d bytes back of %d, stderr %s", ws, err, len(out), len(payload), stderr.String())
		}
	}

	// kubectl logs -f: each line arrives while the response is still open
	// (the next is written only after the test read this one).
	cmd := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", c.heraldCfg["admin"], "-n", "demo", "logs", "-f", "streamer")
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for i := 1; i <= 3; i++ {
		select {
		case l, ok := <-lines:
			if want := fmt.Sprintf("log line %d of streamer", i); !ok || l != want {
				t.Fatalf("kubectl logs -f: line %q (open %v), want %q; stderr %s", l, ok, want, stderr.String())
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("kubectl logs -f: line %d did not arrive while the response was open", i)
		}
		if i < 3 {
			select {
			case k.next <- struct{}{}:
			case <-time.After(15 * time.Second):
				t.Fatal("the log response ended early")
			}
		}
	}
	if _, ok := <-lines; ok {
		t.Error("kubectl logs -f printed more than the three lines")
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("kubectl logs -f: %v %s", err, stderr.String())
	}

	testWebSocketBearer(t, ctx, c)
}

// testWebSocketBearer: a WebSocket client without an Authorization header
// (a browser) sends its token as the subprotocol
// base64url.bearer.authorization.k8s.io.<token>; Herald authenticates it and
// forwards the exec as that user (the token itself does not go upstream).
func testWebSocketBearer(t *testing.T, ctx context.Context, c *clusterEnv) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.PKI.CAPEM)
	dial := func(token string) (*websocket.Conn, *http.Response, error) {
		d := websocket.Dialer{
			TLSClientConfig:  &tls.Config{RootCAs: pool},
			HandshakeTimeout: 15 * time.Second,
			Subprotocols:     []string{"v5.channel.k8s.io", "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte(token))},
		}
		u := "wss" + strings.TrimPrefix(c.FrontdoorURL, "https") + "/api/v1/namespaces/demo/pods/streamer/exec?command=cat&stdin=true&stdout=true"
		return d.DialContext(ctx, u, nil)
	}
	if conn, resp, err := dial("no-such-token"); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		if conn != nil {
			conn.Close()
		}
		t.Errorf("WebSocket exec with an unknown token: %v %v, want 401", err, resp)
	}
	// alice's token is accepted (no 401) and the cluster refuses her the
	// exec (403): the request reached it as alice.
	if conn, resp, err := dial(tokAlice); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		if conn != nil {
			conn.Close()
		}
		t.Errorf("WebSocket exec as alice: %v %v, want 403", err, resp)
	}
	// The admin's token in the subprotocol: bytes both ways, then stdin is
	// closed (v5's close frame) and the exit status arrives.
	conn, resp, err := dial(c.Token)
	if err != nil {
		t.Fatalf("WebSocket exec with the bearer subprotocol: %v %v", err, resp)
	}
	defer conn.Close()
	if conn.Subprotocol() != "v5.channel.k8s.io" {
		t.Errorf("negotiated subprotocol %q", conn.Subprotocol())
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for _, msg := range []string{"ping over a WebSocket\n", "and pong\n"} {
		if err := conn.WriteMessage(websocket.BinaryMessage, append([]byte{0}, msg...)); err != nil {
			t.Fatal(err)
		}
		var got []byte
		for len(got) < len(msg) {
			_, m, err := conn.ReadMessage()
			if err != nil {
				t.Fatalf("reading stdout: %v (got %q)", err, got)
			}
			if len(m) > 0 && m[0] == 1 {
				got = append(got, m[1:]...)
			}
		}
		if string(got) != msg {
			t.Errorf("stdout %q, want %q", got, msg)
		}
	}
	conn.WriteMessage(websocket.BinaryMessage, []byte{255, 0}) // close stdin
	for {
		_, m, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("no exit status before the connection ended: %v", err)
		}
		if len(m) > 0 && m[0] == 3 {
			var st struct{ Status string }
			if json.Unmarshal(m[1:], &st); st.Status != "Success" {
				t.Errorf("exit status %s", m[1:])
			}
			return
		}
	}
}
