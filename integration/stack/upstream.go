package stack

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Upstream is cluster mode's kube-apiserver, in front of which frontdoor
// runs. Frontdoor then has no identities of its own (it refuses a token
// file in cluster mode): the stack's admin token is not given to it, and
// the kubeconfig the stack writes carries a user of the cluster instead.
type Upstream struct {
	// Kubeconfig holds Herald's own credentials for kube-apiserver
	// (--upstream.kubeconfig; the ClusterRole of deploy/k8s/overlays/cluster).
	Kubeconfig string
	// ClientCAFile is the cluster's client CA (kube-apiserver's
	// --client-ca-file), so that client certificates authenticate through
	// Herald; empty: only bearer tokens (TokenReview) do.
	ClientCAFile string
	// UserKubeconfig's current user is the one the stack's kubeconfig uses
	// (its token, client certificate or exec plugin, with the server
	// replaced by Herald's); empty: Kubeconfig's.
	UserKubeconfig string
}

// flags are frontdoor's authentication flags: the token file standalone,
// the upstream in cluster mode.
func (u Upstream) flags(tokenFile string) []string {
	if u.Kubeconfig == "" {
		return []string{"--token-auth-file=" + tokenFile}
	}
	out := []string{"--upstream.kubeconfig=" + u.Kubeconfig}
	if u.ClientCAFile != "" {
		out = append(out, "--client-ca-file="+u.ClientCAFile)
	}
	return out
}

// writeUpstreamKubeconfig writes the stack's kubeconfig in cluster mode:
// Herald's address and CA, the credentials of UserKubeconfig's current
// user (paths made absolute).
func (s *Stack) writeUpstreamKubeconfig() error {
	src := s.opts.Upstream.UserKubeconfig
	if src == "" {
		src = s.opts.Upstream.Kubeconfig
	}
	in, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return fmt.Errorf("cluster mode kubeconfig: %w", err)
	}
	if err := clientcmd.ResolveLocalPaths(in); err != nil {
		return fmt.Errorf("cluster mode kubeconfig %s: %w", src, err)
	}
	ctx, ok := in.Contexts[in.CurrentContext]
	if !ok {
		return fmt.Errorf("cluster mode kubeconfig %s: no current context", src)
	}
	user, ok := in.AuthInfos[ctx.AuthInfo]
	if !ok {
		return fmt.Errorf("cluster mode kubeconfig %s: context %q names no user", src, in.CurrentContext)
	}
	out := clientcmdapi.NewConfig()
	out.Clusters["herald"] = &clientcmdapi.Cluster{Server: s.FrontdoorURL, CertificateAuthorityData: s.PKI.CAPEM}
	out.AuthInfos[ctx.AuthInfo] = user
	out.Contexts["herald"] = &clientcmdapi.Context{Cluster: "herald", AuthInfo: ctx.AuthInfo, Namespace: ctx.Namespace}
	out.CurrentContext = "herald"
	return clientcmd.WriteToFile(*out, s.Kubeconfig)
}
