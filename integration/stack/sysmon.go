package stack

import (
	"strings"

	"herald.dev/libs/service"
)

// SysmonEnv returns environ (os.Environ's form) for a server process: with
// awake, service.SysmonAwakeEnv's (as make run and the manifests start
// Herald's services); without, the Go runtime's default sysmon: any
// schedtrace setting removed from GODEBUG, and GODEBUG dropped if nothing
// else is left in it. The load benchmark runs a system either way
// (herald-load -godebug) to tell what the setting does to it.
func SysmonEnv(environ []string, awake bool) []string {
	if awake {
		return service.SysmonAwakeEnv(environ)
	}
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		var keep []string
		for _, field := range strings.Split(v, ",") {
			if k, _, _ := strings.Cut(field, "="); strings.TrimSpace(k) != "schedtrace" && field != "" {
				keep = append(keep, field)
			}
		}
		if len(keep) > 0 {
			out = append(out, "GODEBUG="+strings.Join(keep, ","))
		}
	}
	return out
}
