// Package audit is the frontdoor's audit log: one kube-apiserver audit Event (audit.k8s.io/v1, level
// Metadata) per request frontdoor serves or forwards, as a JSON line, so
// that the pipelines that read kube-apiserver's --audit-log-path read
// Herald's too. Reads served from the cache leave no trace in
// kube-apiserver's log: this is theirs.
//
// As kube-apiserver writes them:
//   - the request's metadata comes from k8s.io/apiserver's request-info
//     resolver (verb, objectRef), the client's source IPs (X-Forwarded-For,
//     X-Real-Ip, then the connection's address) and its User-Agent;
//   - stage ResponseComplete when the request ends; long-running requests
//     (watch, proxy, and the attach, exec, log, portforward and proxy
//     subresources: filters.BasicLongRunningRequestCheck) first get a
//     ResponseStarted event when their response starts;
//   - a request whose credentials fail authentication (401) gets one event,
//     at ResponseStarted, naming the credentials tried
//     (WithFailedAuthenticationAudit);
//   - annotations authorization.k8s.io/decision ("allow", "forbid") and
//     authorization.k8s.io/reason for requests frontdoor authorized; a
//     request forwarded to kube-apiserver is authorized (and audited, under
//     the same audit ID) there, and is marked herald.dev/forwarded.
//
// Writing never holds a request: events queue (--audit-log-buffer-size)
// for one writer; when the queue is full, an event is dropped and counted
// (herald_frontdoor_audit_events_dropped_total). The file is rotated at
// --audit-log-maxsize megabytes, keeping --audit-log-maxbackup old files.
package audit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"herald.dev/services/frontdoor/internal/authn"
	"herald.dev/services/frontdoor/internal/reqinfo"
)

// Config is the audit log's configuration.
type Config struct {
	Path       string
	MaxSizeMB  int
	MaxBackups int
	BufferSize int
}

// RegisterFlags registers the audit-log-* flags, kube-apiserver's names.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Path, "audit-log-path", "", "File to write the audit log to, one audit.k8s.io/v1 Event (JSON) per line, for every request served or forwarded; \"-\": standard output; empty: no audit log.")
	fs.IntVar(&c.MaxSizeMB, "audit-log-maxsize", 100, "Size in megabytes at which the audit log file is rotated (renamed to <path>.1, older ones shifted).")
	fs.IntVar(&c.MaxBackups, "audit-log-maxbackup", 10, "Rotated audit log files kept (<path>.1 ... <path>.N); the oldest is removed.")
	fs.IntVar(&c.BufferSize, "audit-log-buffer-size", 10000, "Audit events queued for the writer; when the queue is full (a slow disk), events are dropped and counted in herald_frontdoor_audit_events_dropped_total, never holding requests.")
}

// Validate reports configuration errors.
func (c Config) Validate() error {
	if c.Path == "" {
		return nil
	}
	var errs []error
	if c.MaxSizeMB < 1 && c.Path != "-" {
		errs = append(errs, errors.New("audit-log-maxsize must be at least 1 (megabyte)"))
	}
	if c.MaxBackups < 0 {
		errs = append(errs, errors.New("audit-log-maxbackup must not be negative"))
	}
	if c.BufferSize < 1 {
		errs = append(errs, errors.New("audit-log-buffer-size must be at least 1"))
	}
	return errors.Join(errs...)
}

// Annotation keys kube-apiserver's authorization filter sets.
const (
	auditDecisionKey = "authorization.k8s.io/decision"
	auditReasonKey   = "authorization.k8s.io/reason"
	auditForwarded   = "herald.dev/forwarded"
	// kube-apiserver's bound on a logged User-Agent.
	maxAuditUserAgent = 1024
)

// Log queues events for its writer.
type Log struct {
	queue   chan []byte
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	log     *slog.Logger
	dropped prometheus.Counter
	failed  prometheus.Counter
	out     auditSink
}

// New opens the audit log; nil when it is off.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Log, error) {
	if cfg.Path == "" {
		return nil, nil
	}
	var out auditSink
	if cfg.Path == "-" {
		out = &streamSink{w: bufio.NewWriterSize(os.Stdout, 64<<10)}
	} else {
		f, err := openRotating(cfg.Path, int64(cfg.MaxSizeMB)<<20, cfg.MaxBackups)
		if err != nil {
			return nil, fmt.Errorf("audit-log-path: %w", err)
		}
		out = f
	}
	f := promauto.With(reg)
	l := &Log{queue: make(chan []byte, cfg.BufferSize), stop: make(chan struct{}), done: make(chan struct{}), log: log, out: out,
		dropped: f.NewCounter(prometheus.CounterOpts{Name: "herald_frontdoor_audit_events_dropped_total",
			Help: "Audit events dropped because the audit log's queue was full (--audit-log-buffer-size): the writer fell behind."}),
		failed: f.NewCounter(prometheus.CounterOpts{Name: "herald_frontdoor_audit_write_errors_total",
			Help: "Failed writes or rotations of the audit log."}),
	}
	go l.run()
	return l, nil
}

// run writes queued events until close, flushing whenever the queue is
// empty.
func (l *Log) run() {
	defer close(l.done)
	write := func(b []byte) {
		if err := l.out.write(b); err != nil {
			l.failed.Inc()
			l.log.Error("audit log write failed", "err", err)
		}
	}
	for {
		select {
		case b := <-l.queue:
			write(b)
			if len(l.queue) == 0 {
				if err := l.out.flush(); err != nil {
					l.failed.Inc()
				}
			}
		case <-l.stop:
			for {
				select {
				case b := <-l.queue:
					write(b)
				default:
					if err := errors.Join(l.out.flush(), l.out.close()); err != nil {
						l.log.Error("audit log close failed", "err", err)
					}
					return
				}
			}
		}
	}
}

// emit queues ev, never waiting.
func (l *Log) emit(ev *auditv1.Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		l.failed.Inc()
		return
	}
	select {
	case l.queue <- append(b, '\n'):
	default:
		l.dropped.Inc()
	}
}

// close writes what is queued and closes the file; events of requests that
// end later are dropped (counted). Safe on nil and more than once.
func (l *Log) Close() {
	if l == nil {
		return
	}
	l.once.Do(func() { close(l.stop) })
	<-l.done
}

// Record is one request's audit event under construction. It keeps
// what it logs, never the request: a detached watch's end runs it.
type Record struct {
	l           *Log
	ae          *Entry
	ev          auditv1.Event
	longRunning bool
	started     bool // the ResponseStarted event was sent
	decision    string
	reason      string
	credentials string // for a 401: the kinds of credentials tried
}

type auditKey struct{}

// Begin starts r's audit event (nil when the audit log is off, or for
// the health probes) and r's context with it, where the
// authorization's decision is recorded (Decision).
func (l *Log) Begin(r *http.Request, auditID string, start time.Time, ae *Entry) (*Record, context.Context) {
	if l == nil {
		return nil, r.Context()
	}
	switch r.URL.Path {
	case "/livez", "/readyz", "/healthz":
		return nil, r.Context()
	}
	a := &Record{l: l, ae: ae, credentials: auditCredentials(r)}
	ev := &a.ev
	ev.TypeMeta = metav1.TypeMeta{Kind: "Event", APIVersion: auditv1.SchemeGroupVersion.String()}
	ev.Level = auditv1.LevelMetadata
	ev.AuditID = types.UID(auditID)
	ev.RequestURI = r.URL.RequestURI()
	ev.RequestReceivedTimestamp = metav1.NewMicroTime(start)
	ua := r.UserAgent()
	if len(ua) > maxAuditUserAgent {
		ua = ua[:maxAuditUserAgent] + "...TRUNCATED"
	}
	ev.UserAgent = ua
	for _, ip := range utilnet.SourceIPs(r) {
		ev.SourceIPs = append(ev.SourceIPs, ip.String())
	}
	if info, err := reqinfo.Infos.NewRequestInfo(r); err == nil {
		ev.Verb = info.Verb
		if info.IsResourceRequest {
			ev.ObjectRef = &auditv1.ObjectReference{Resource: info.Resource, Namespace: info.Namespace, Name: info.Name,
				Subresource: info.Subresource, APIGroup: info.APIGroup, APIVersion: info.APIVersion}
		}
		a.longRunning = reqinfo.IsLongRunning(r, info)
	} else {
		ev.Verb = strings.ToLower(r.Method)
	}
	return a, context.WithValue(r.Context(), auditKey{}, a)
}

// Decision records an authorization decision in the request's audit
// event, as kube-apiserver's authorization filter annotates it.
func Decision(ctx context.Context, allowed bool, reason string) {
	a, _ := ctx.Value(auditKey{}).(*Record)
	if a == nil {
		return
	}
	a.decision, a.reason = "forbid", reason
	if allowed {
		a.decision = "allow"
	}
}

// ResponseStarted is the statusRecorder's hook: the response of a
// long-running request starts with code.
func (a *Record) ResponseStarted(code int) {
	if a == nil || !a.longRunning || a.started {
		return
	}
	a.started = true
	a.fill(code)
	a.send(auditv1.StageResponseStarted)
}

// Complete sends the request's last event: ResponseComplete, or for a
// failed authentication ResponseStarted (kube-apiserver audits those before
// its audit filter, once).
func (a *Record) Complete(code int) {
	if a == nil {
		return
	}
	failedAuthn := a.ae.Who == nil && code == http.StatusUnauthorized
	if failedAuthn {
		if !a.started {
			a.started = true
			a.fill(code)
			a.send(auditv1.StageResponseStarted)
		}
		return
	}
	if a.longRunning && !a.started {
		a.ResponseStarted(code)
	}
	a.fill(code)
	a.send(auditv1.StageResponseComplete)
}

// fill sets what is known once the response starts or ends.
func (a *Record) fill(code int) {
	ev, ae := &a.ev, a.ae
	ev.ResponseStatus = &metav1.Status{Code: int32(code)}
	if ae.Who == nil && code == http.StatusUnauthorized {
		ev.ResponseStatus.Message = a.credentials
	}
	if ae.Who != nil {
		ev.User = auditUser(ae.Who)
	}
	if ae.As != nil && ae.As != ae.Who {
		ev.ImpersonatedUser = new(authnv1.UserInfo)
		*ev.ImpersonatedUser = auditUser(ae.As)
	}
	if a.decision != "" || ae.Forwarded {
		ev.Annotations = map[string]string{}
		if a.decision != "" {
			ev.Annotations[auditDecisionKey] = a.decision
			ev.Annotations[auditReasonKey] = a.reason
		}
		if ae.Forwarded {
			ev.Annotations[auditForwarded] = "true"
		}
	}
}

func (a *Record) send(stage auditv1.Stage) {
	a.ev.Stage = stage
	a.ev.StageTimestamp = metav1.NewMicroTime(time.Now())
	a.l.emit(&a.ev)
}

func auditUser(u *authn.User) authnv1.UserInfo {
	out := authnv1.UserInfo{Username: u.Name, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		out.Extra = make(map[string]authnv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			out.Extra[k] = v
		}
	}
	return out
}

// auditCredentials is kube-apiserver's message for a failed
// authentication: the kinds of credentials the request carried.
func auditCredentials(r *http.Request) string {
	var tried []string
	if _, _, ok := r.BasicAuth(); ok {
		tried = append(tried, "basic")
	}
	if parts := strings.Split(strings.TrimSpace(r.Header.Get("Authorization")), " "); len(parts) > 1 && strings.ToLower(parts[0]) == "bearer" {
		tried = append(tried, "bearer")
	}
	if r.URL.Query().Get("access_token") != "" {
		tried = append(tried, "access_token")
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		tried = append(tried, "x509")
	}
	if len(tried) == 0 {
		return "Authentication failed, no credentials provided"
	}
	return "Authentication failed, attempted: " + strings.Join(tried, ", ")
}

// auditSink is where the writer puts events.
type auditSink interface {
	write([]byte) error
	flush() error
	close() error
}

// streamSink writes to standard output.
type streamSink struct{ w *bufio.Writer }

func (s *streamSink) write(b []byte) error { _, err := s.w.Write(b); return err }
func (s *streamSink) flush() error         { return s.w.Flush() }
func (s *streamSink) close() error         { return nil }

// rotatingFile is a log file renamed to path.1 (path.2, ... shifted, the
// oldest past backups removed) once it would grow past maxBytes.
type rotatingFile struct {
	path     string
	maxBytes int64
	backups  int
	f        *os.File
	w        *bufio.Writer
	size     int64
}

func openRotating(path string, maxBytes int64, backups int) (*rotatingFile, error) {
	r := &rotatingFile{path: path, maxBytes: maxBytes, backups: backups}
	return r, r.open()
}

func (r *rotatingFile) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, st.Size()
	if r.w == nil {
		r.w = bufio.NewWriterSize(f, 64<<10)
	} else {
		r.w.Reset(f)
	}
	return nil
}

func (r *rotatingFile) write(b []byte) error {
	if r.size > 0 && r.size+int64(len(b)) > r.maxBytes {
		if err := r.rotate(); err != nil {
			return err
		}
	}
	n, err := r.w.Write(b)
	r.size += int64(n)
	return err
}

func (r *rotatingFile) rotate() error {
	if err := errors.Join(r.w.Flush(), r.f.Close()); err != nil {
		return err
	}
	if r.backups == 0 {
		if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return r.open()
	}
	os.Remove(fmt.Sprintf("%s.%d", r.path, r.backups))
	for i := r.backups - 1; i >= 1; i-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", r.path, i), fmt.Sprintf("%s.%d", r.path, i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Rename(r.path, r.path+".1"); err != nil {
		return err
	}
	return r.open()
}

func (r *rotatingFile) flush() error { return r.w.Flush() }
func (r *rotatingFile) close() error { return errors.Join(r.w.Flush(), r.f.Close()) }

// Entry is what the audit line says about one request; the filters fill
// it in as they learn it.
type Entry struct {
	User, Authn, Verb, Resource, Namespace, Reason string
	// Forwarded: answered by kube-apiserver (cluster mode). Resource is
	// then a metric label only for resources frontdoor knows; the audit
	// line names the request's own, UpstreamResource, when set.
	Forwarded        bool
	UpstreamResource string
	// Who: the authenticated user; As: the user it impersonates, in
	// cluster mode (the audit event).
	Who, As *authn.User
}
