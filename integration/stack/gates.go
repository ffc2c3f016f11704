package stack

import clientfeatures "k8s.io/client-go/features"

// WatchListGates overrides client-go's WatchListClient feature (read when
// a reflector is built) and defers every other feature to Default, so that
// one test process can run informers with WatchList on and off.
type WatchListGates struct {
	Default   clientfeatures.Gates
	WatchList bool
}

// Enabled implements clientfeatures.Gates.
func (g WatchListGates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.WatchList
	}
	return g.Default.Enabled(f)
}
