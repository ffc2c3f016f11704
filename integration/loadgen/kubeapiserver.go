package loadgen

import (
	"context"
	"net/http"

	"herald.dev/integration/stack"
)

// KubeAPIServer is a kube-apiserver process started as the baseline.
type KubeAPIServer = stack.KubeAPIServer

// StartKubeAPIServer starts bin (an unmodified kube-apiserver) against etcd
// with JSON storage (protobuf: its default, protobuf storage), serving on 127.0.0.1 with certFile/keyFile (also its
// service-account key), static tokens from tokenFile and no authorization
// checks (the load client is an admin; Herald's frontdoor runs its users in
// system:masters too). Its log goes to dir/kube-apiserver.log. It returns
// once /readyz answers 200 with adminToken. It runs on cpus' server CPUs.
func StartKubeAPIServer(ctx context.Context, cpus CPUPlan, bin, dir, etcd, certFile, keyFile, tokenFile, adminToken string, protobuf bool, c *http.Client) (*KubeAPIServer, error) {
	media := "application/json"
	if protobuf {
		media = "" // kube-apiserver's default: application/vnd.kubernetes.protobuf
	}
	return stack.StartKubeAPIServer(ctx, stack.KubeAPIServerOptions{
		Bin: bin, Dir: dir, Etcd: etcd, CertFile: certFile, KeyFile: keyFile,
		TokenFile: tokenFile, AdminToken: adminToken, Client: c,
		StorageMediaType: media, Authorization: "AlwaysAllow", Start: cpus.StartServer,
	})
}
