package discovery

import (
	"strings"
	"testing"
)

func TestKubernetesVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v0.37.2": "v1.37.2-herald", "v0.38.0-alpha.1": "v1.38.0-herald", "v0.0.0-20260101000000-abcdef012345": "",
		"v1.2.3": "", "": "", "v0.x.1": "",
	} {
		v, ok := kubernetesVersion(in)
		if ok != (want != "") || v.GitVersion != want || (ok && !strings.HasPrefix(want, "v1."+v.Minor+".")) {
			t.Errorf("kubernetesVersion(%q) = %+v, %v; want %q", in, v, ok, want)
		}
	}
}
