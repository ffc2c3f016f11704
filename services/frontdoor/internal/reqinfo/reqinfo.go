// Package reqinfo reads requests as kube-apiserver's handler chain does:
// their verb and resource (its RequestInfoFactory), and whether they are
// long-running (its LongRunningFunc).
package reqinfo

import (
	"net/http"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/filters"
)

// Infos reads a request's verb and resource as kube-apiserver's handler
// chain does.
var Infos = &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}

// IsLongRunning is kube-apiserver's long-running check, with the verbs and
// subresources kube-apiserver configures it with (watch and proxy; exec,
// attach, log, portforward): no short-request deadline applies to them.
var IsLongRunning = filters.BasicLongRunningRequestCheck(
	sets.NewString("watch", "proxy"),
	sets.NewString("attach", "exec", "proxy", "log", "portforward"),
)

// LongRunning reports whether kube-apiserver treats r as long-running.
func LongRunning(r *http.Request) bool {
	info, err := Infos.NewRequestInfo(r)
	return err == nil && IsLongRunning(r, info)
}
