package frontdoor

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The files frontdoor reloads (certificate, tokens, client CA, keys, RBAC)
// are held by service.Reloadable; this file lists a directory's manifests.

// manifestFiles lists the manifests in dir (not recursive, hidden files and
// Kubernetes' ..data directories skipped), sorted.
func manifestFiles(dir string) func() ([]string, error) {
	return func() ([]string, error) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, e := range ents {
			n := e.Name()
			if strings.HasPrefix(n, ".") {
				continue
			}
			switch strings.ToLower(filepath.Ext(n)) {
			case ".yaml", ".yml", ".json":
				out = append(out, filepath.Join(dir, n))
			}
		}
		sort.Strings(out)
		return out, nil
	}
}
