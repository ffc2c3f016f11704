package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"herald.dev/integration/stack"
)

// kubectlPath finds kubectl; it is on the development and CI machines, so
// its absence fails under CI=true and skips (loudly) elsewhere.
func kubectlPath(t *testing.T) string {
	p, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kubectl is required under CI=true: %v", err)
		}
		t.Skipf("kubectl not found (%v): install kubectl to run this test", err)
	}
	return p
}

// TestKubectl drives the real kubectl against the stack and checks what it
// prints.
func TestKubectl(t *testing.T) {
	kubectl := kubectlPath(t)
	e := startStack(t, stack.Options{})
	ctx := testContext(t, 2*time.Minute)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	revs := map[string]int64{}
	for i := range 25 {
		ns := []string{"k1", "k2"}[i%2]
		name := fmt.Sprintf("pod-%02d", i)
		ev := e.put(t, ctx, ns, name, labeledPod(ns, name, fmt.Sprintf("node-%d", i%3), []string{"web", "db"}[i%2]), true)
		revs[ns+"/"+name] = ev.RV
	}

	out := run("get", "pods", "-A")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAMESPACE NAME READY STATUS RESTARTS AGE" || len(lines) != 26 {
		t.Fatalf("get pods -A:\n%s", out)
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if _, ok := revs[f[0]+"/"+f[1]]; !ok || f[2] != "1/1" || f[3] != "Running" || f[4] != "0" {
			t.Errorf("unexpected row %q", l)
		}
	}

	out = run("get", "pods", "-A", "-l", "app=web", "-o", "name")
	if n := strings.Count(out, "pod/"); n != 13 || strings.Contains(out, "pod-01") {
		t.Errorf("-l app=web: %d pods\n%s", n, out)
	}
	out = run("get", "pods", "-n", "k1", "--field-selector", "spec.nodeName=node-0", "-o", "name")
	// k1 holds even i; node-0 holds i%3==0: i in {0,6,12,18,24}.
	if want := "pod/pod-00\npod/pod-06\npod/pod-12\npod/pod-18\npod/pod-24\n"; out != want {
		t.Errorf("--field-selector: %q, want %q", out, want)
	}
	out = run("get", "pod", "-n", "k2", "pod-03", "-o", "yaml")
	if !strings.Contains(out, fmt.Sprintf("resourceVersion: \"%d\"", revs["k2/pod-03"])) || !strings.Contains(out, "nodeName: node-0") || !strings.Contains(out, "kind: Pod") {
		t.Errorf("-o yaml:\n%s", out)
	}
	before := metricLabeled(t, e.Proc("frontdoor-0"), "apiserver_request_total", `verb="list",resource="pods"`)
	out = run("get", "pods", "-A", "--chunk-size=10", "-o", "name")
	if n := strings.Count(out, "pod/"); n != 25 {
		t.Errorf("--chunk-size=10 printed %d pods", n)
	}
	if pages := metricLabeled(t, e.Proc("frontdoor-0"), "apiserver_request_total", `verb="list",resource="pods"`) - before; pages != 3 {
		t.Errorf("--chunk-size=10 over 25 pods made %v LIST requests, want 3", pages)
	}
	if out := run("get", "nodes"); !strings.Contains(out, "No resources found") {
		t.Errorf("get nodes: %q", out)
	}

	// -w prints the current pods, then every later change.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	cmd := exec.CommandContext(wctx, kubectl, "--kubeconfig", e.Kubeconfig, "get", "pods", "-n", "k1", "-w", "--output-watch-events")
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	sc := bufio.NewScanner(stdout)
	var seen []string
	wrote := false
	for sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		if !wrote && strings.Contains(line, "pod-24") {
			e.put(t, ctx, "k1", "late", labeledPod("k1", "late", "node-1", "web"), true)
			e.del(t, ctx, "k1", "pod-00")
			wrote = true
		}
		if strings.HasPrefix(strings.TrimSpace(line), "DELETED") && strings.Contains(line, "pod-00") {
			break
		}
	}
	wcancel()
	text := strings.Join(seen, "\n")
	if !wrote || !strings.Contains(text, "ADDED") || !regexpLine(seen, "ADDED", "late") || !regexpLine(seen, "DELETED", "pod-00") {
		t.Fatalf("kubectl -w printed:\n%s", text)
	}
}

func regexpLine(lines []string, typ, name string) bool {
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == typ && f[1] == name {
			return true
		}
	}
	return false
}
