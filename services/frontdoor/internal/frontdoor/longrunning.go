package frontdoor

import (
	"context"
	"net/http"

	"herald.dev/services/frontdoor/internal/reqinfo"
	"herald.dev/services/frontdoor/internal/upstream"
)

// Long-running forwarded requests (cluster mode; upstream.StreamWriter): watches of what Herald
// does not serve, exec, attach, port-forward, logs and proxy stream for as
// long as the client, kube-apiserver or the kubelet keep them open, so the
// write-timeout that bounds every other response from its first byte
// (statusRecorder) would cut them at their first write after it. They are
// recognized exactly as kube-apiserver recognizes them (its LongRunningFunc,
// pkg/controlplane/apiserver), and bounded by rules of their own:
//
//   - each write (and the flush that sends it) must complete within
//     write-timeout, so a client that stops reading is still cut, however
//     long the stream has run; an idle stream has no deadline (HTTP/2
//     would reset an idle stream at a deadline left armed, so it is
//     cleared after every write);
//   - the whole request lasts at most upstream.long-running-timeout; then
//     the response ends as the upstream's end would (cleanly: a watch
//     client watches again, kubectl logs -f returns), and an upgraded
//     stream (exec, attach, port-forward) is closed.
//
// kube-apiserver's own limits still apply upstream (a watch's timeout,
// the kubelet's streaming idle timeout).

// forward sends r to the upstream as u. w is the request's statusRecorder;
// a long-running request gets its own deadlines (see above) instead of
// the write-timeout from its first byte.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, u *User) {
	rec, ok := w.(*statusRecorder)
	if !ok || !reqinfo.LongRunning(r) {
		s.cluster.up.Serve(w, r, u.Info())
		return
	}
	rec.writeTimeout = 0 // nothing written yet
	sw := upstream.NewStreamWriter(rec, s.cfg.WriteTimeout)
	ctx, cancel := context.WithTimeoutCause(r.Context(), s.cfg.Upstream.LongRunningTimeout, upstream.ErrStreamLifetime)
	defer cancel()
	// Deferred: a stream cut midway ends the handler with a panic
	// (http.ErrAbortHandler, from the proxy), before the audit line.
	defer func() {
		if sw.TimedOut() {
			rec.timedOut = true
		}
	}()
	s.cluster.up.Serve(sw, r.WithContext(ctx), u.Info())
}
