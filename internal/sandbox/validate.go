package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ValidateID checks a sandbox id: 1 to 63 lowercase letters, digits and
// hyphens, so that it can name a directory, a cgroup and a container.
func ValidateID(id string) error {
	if id == "" || len(id) > 63 {
		return errdefs.Field("id", "must be 1 to 63 characters")
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return errdefs.Field("id", "must contain only lowercase letters, digits and hyphens")
		}
	}
	return nil
}

// systemDirs are the directories a host runtime sets up itself in every
// sandbox; Validate refuses a mount at or under any of them.
var systemDirs = []string{"/usr", "/proc", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}

// Validate returns every problem with s that shows without looking at the
// host, at once, as errdefs.FieldErrors joined: the id, the command, the
// working directory, the environment, the mounts' targets (absolute, clean,
// not / and not over /usr, /proc, /dev, /etc, /bin, /sbin or /lib*) and sources (absolute), the limits and
// the network. Whether a mount's source exists is for the runtime to check.
func (s Spec) Validate() error {
	var errs []error
	if err := ValidateID(s.ID); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, checkCommand(s.Command, s.Dir, s.Env))
	for i, m := range s.Mounts {
		f := fmt.Sprintf("mounts[%d]", i)
		if !CleanAbs(m.Target) || m.Target == "/" {
			errs = append(errs, errdefs.Field(f+".target", "must be an absolute, clean path other than /"))
		} else if underAny(m.Target, systemDirs) {
			errs = append(errs, errdefs.Field(f+".target", "must not replace a system directory"))
		}
		switch {
		case m.HostDir:
			if !CleanAbs(m.Source) || m.Source == "/" {
				errs = append(errs, errdefs.Field(f+".source", "must be an absolute, clean host path other than / (a host directory)"))
			}
		case !filepath.IsLocal(filepath.FromSlash(m.Source)) || strings.ContainsRune(m.Source, 0):
			errs = append(errs, errdefs.Field(f+".source", "must be a path within the data root (relative, no ..)"))
		}
	}
	if s.Limits.MemoryBytes < 0 || s.Limits.CPUMillis < 0 || s.Limits.Pids < 0 || s.Limits.WallClock < 0 {
		errs = append(errs, errdefs.Field("limits", "must not be negative"))
	}
	switch s.Network {
	case "", NetworkNone, NetworkEgress:
	default:
		errs = append(errs, errdefs.Field("network", "must be none or egress"))
	}
	return errors.Join(errs...)
}

// Validate returns every problem with an exec's command, working
// directory and environment, as Spec.Validate does for a sandbox's.
func (r ExecRequest) Validate() error { return checkCommand(r.Command, r.Dir, r.Env) }

// checkCommand checks a command, its working directory and environment.
func checkCommand(argv []string, dir string, env []string) error {
	var errs []error
	if len(argv) == 0 || argv[0] == "" {
		errs = append(errs, errdefs.Field("command", "must not be empty"))
	}
	if dir != "" && !CleanAbs(dir) {
		errs = append(errs, errdefs.Field("dir", "must be an absolute, clean path"))
	}
	for i, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			errs = append(errs, errdefs.Field(fmt.Sprintf("env[%d]", i), "must be KEY=VALUE"))
		}
	}
	return errors.Join(errs...)
}

// CleanAbs reports whether p is an absolute, clean path without NUL bytes.
func CleanAbs(p string) bool {
	return filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}

// underAny reports whether p is one of dirs or lies under one of them.
func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if Within(p, d) {
			return true
		}
	}
	return false
}

// Within reports whether the clean path p is dir or lies under it.
func Within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}
