package service

import (
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

type testConfig struct {
	AdminConfig
	Name string
}

func (c *testConfig) RegisterFlags(fs *flag.FlagSet) {
	c.AdminConfig.RegisterFlags(fs, "127.0.0.1:0", "")
	fs.StringVar(&c.Name, "name", "", "A name.")
}

func (c *testConfig) Validate() error {
	if c.Name == "" {
		return errors.New("name is empty")
	}
	return nil
}

func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// /readyz passes only while the component is Running and its own checks
// pass; Run returns once the context ends, after stopping the component.
func TestRunReadiness(t *testing.T) {
	ctx, cancel := context.WithCancel(within(t))
	defer cancel()
	var healthy atomic.Bool
	entered, proceed, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	built := make(chan *Process, 1)
	var svc *Service
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, "test", &testConfig{}, []string{"--name=x"}, io.Discard, func(p *Process) (*Service, error) {
			p.Admin.AddReadyCheck("healthy", func() error {
				if !healthy.Load() {
					return errors.New("not yet")
				}
				return nil
			})
			svc = NewService("test", func(ctx context.Context) error {
				close(entered)
				select {
				case <-proceed:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, nil, func(error) error { close(stopped); return nil })
			built <- p
			return svc, nil
		})
	}()
	p := <-built
	// The admin server serves before the component starts.
	<-entered
	if code, body := readyz(t, p.Admin.Addr()); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]lifecycle failed: test is Starting") {
		t.Errorf("while starting: %d %q", code, body)
	}
	close(proceed)
	if err := svc.AwaitRunning(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, p.Admin.Addr()); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]healthy failed") || !strings.Contains(body, "[+]lifecycle ok") {
		t.Errorf("running, unhealthy: %d %q", code, body)
	}
	healthy.Store(true)
	if code, body := readyz(t, p.Admin.Addr()); code != http.StatusOK {
		t.Errorf("running, healthy: %d %q", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	<-stopped
	if svc.State() != Terminated {
		t.Errorf("state after Run: %s", svc.State())
	}
}

func TestRunFailures(t *testing.T) {
	ctx := within(t)
	boom := errors.New("boom")
	build := func(*Process) (*Service, error) {
		return NewService("test", func(context.Context) error { return boom }, nil, nil), nil
	}
	if err := Run(ctx, "test", &testConfig{}, []string{"--name=x"}, io.Discard, build); !errors.Is(err, boom) {
		t.Errorf("failed start: Run returned %v", err)
	}
	if err := Run(ctx, "test", &testConfig{}, nil, io.Discard, build); err == nil || !strings.Contains(err.Error(), "name is empty") {
		t.Errorf("invalid config: Run returned %v", err)
	}
	if err := Run(ctx, "test", &testConfig{}, []string{"--name=x"}, io.Discard, func(*Process) (*Service, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("failed build: Run returned %v", err)
	}
}
