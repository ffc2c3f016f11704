package loadgen

import (
	"context"
	"net/http"

	"herald.dev/integration/stack"
)

// KubeAPIServer is a kube-apiserver process started as the baseline.
type KubeAPIServer = stack.KubeAPIServer

// KubeMode is how the baseline runs.
type KubeMode struct {
	// Protobuf: its default, protobuf storage; otherwise JSON.
	Protobuf bool
	// RBAC: --authorization-mode=RBAC (Workload.Fleet; the admin, in
	// system:masters, is still allowed everything); otherwise AlwaysAllow
	// (the load client is an admin; Herald's frontdoor runs its users in
	// system:masters too).
	RBAC bool
	// SysmonAwake: with the runtime setting Herald's processes get
	// (stack.SysmonEnv); otherwise the runtime's default.
	SysmonAwake bool
}

// StartKubeAPIServer starts bin (an unmodified kube-apiserver) against etcd
// as m says, serving on 127.0.0.1 with certFile/keyFile (also its
// service-account key) and static tokens from tokenFile. Its log goes to
// dir/kube-apiserver.log. It returns once /readyz answers 200 with
// adminToken. It runs on cpus' server CPUs.
func StartKubeAPIServer(ctx context.Context, cpus CPUPlan, bin, dir, etcd, certFile, keyFile, tokenFile, adminToken string, m KubeMode, c *http.Client) (*KubeAPIServer, error) {
	media := "application/json"
	if m.Protobuf {
		media = "" // kube-apiserver's default: application/vnd.kubernetes.protobuf
	}
	authz := "AlwaysAllow"
	if m.RBAC {
		authz = "RBAC"
	}
	return stack.StartKubeAPIServer(ctx, stack.KubeAPIServerOptions{
		Bin: bin, Dir: dir, Etcd: etcd, CertFile: certFile, KeyFile: keyFile,
		TokenFile: tokenFile, AdminToken: adminToken, Client: c,
		StorageMediaType: media, Authorization: authz, Start: cpus.StartServer,
		NoSysmonAwake: !m.SysmonAwake,
	})
}
