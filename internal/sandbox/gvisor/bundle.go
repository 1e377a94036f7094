//go:build linux

package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/guestetc"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
)

// validateSpec returns every problem with spec at once: Spec.Validate's,
// the id runsc (runsc's own directory in StateDir), mounts over /sys
// (which runsc sets up) and mount sources that do not exist.
func validateSpec(spec sandbox.Spec, root string) error {
	errs := []error{spec.Validate()}
	resolved := spec.Resolve(root)
	if spec.ID == "runsc" {
		errs = append(errs, errdefs.Field("id", "runsc is reserved"))
	}
	for i, m := range resolved.Mounts {
		f := fmt.Sprintf("mounts[%d]", i)
		if sandbox.CleanAbs(m.Target) && (m.Target == "/sys" || strings.HasPrefix(m.Target, "/sys/")) {
			errs = append(errs, errdefs.Field(f+".target", "must not replace a system directory"))
		}
		if filepath.IsLocal(filepath.FromSlash(spec.Mounts[i].Source)) {
			if _, err := os.Stat(m.Source); err != nil {
				errs = append(errs, errdefs.Field(f+".source", "does not exist"))
			}
		}
	}
	return errors.Join(errs...)
}

// The parts of the OCI runtime spec (1.0) Corral writes. runsc reads only
// what it knows; omitted fields take the spec's defaults.
type (
	ociSpec struct {
		OCIVersion string      `json:"ociVersion"`
		Process    *ociProcess `json:"process,omitempty"`
		Root       ociRoot     `json:"root"`
		Hostname   string      `json:"hostname"`
		Mounts     []ociMount  `json:"mounts"`
		Linux      ociLinux    `json:"linux"`
	}
	ociProcess struct {
		Terminal        bool        `json:"terminal"`
		User            ociUser     `json:"user"`
		Args            []string    `json:"args"`
		Env             []string    `json:"env"`
		Cwd             string      `json:"cwd"`
		Capabilities    ociCaps     `json:"capabilities"`
		Rlimits         []ociRlimit `json:"rlimits,omitempty"`
		NoNewPrivileges bool        `json:"noNewPrivileges"`
	}
	ociUser struct {
		UID uint32 `json:"uid"`
		GID uint32 `json:"gid"`
	}
	// ociCaps empty (an empty object) is no capabilities at all. Its
	// sets are left out when empty, never written as []: runsc keeps the
	// spec in a checkpoint encoded with omitempty, and one of 2025
	// refuses a restore whose spec's sets are [] where the checkpoint's
	// are absent ("Capabilities does not match across checkpoint
	// restore", TestCheckpointRestore/systrap).
	ociCaps struct {
		Bounding    []string `json:"bounding,omitempty"`
		Effective   []string `json:"effective,omitempty"`
		Inheritable []string `json:"inheritable,omitempty"`
		Permitted   []string `json:"permitted,omitempty"`
		Ambient     []string `json:"ambient,omitempty"`
	}
	ociRlimit struct {
		Type string `json:"type"`
		Hard uint64 `json:"hard"`
		Soft uint64 `json:"soft"`
	}
	ociRoot struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	}
	ociMount struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type"`
		Source      string   `json:"source"`
		Options     []string `json:"options,omitempty"`
	}
	ociLinux struct {
		CgroupsPath string        `json:"cgroupsPath,omitempty"`
		Resources   *ociResources `json:"resources,omitempty"`
		Namespaces  []ociNS       `json:"namespaces"`
		Seccomp     *ociSeccomp   `json:"seccomp,omitempty"`
	}
	ociResources struct {
		Memory *struct {
			Limit int64 `json:"limit"`
		} `json:"memory,omitempty"`
		CPU *struct {
			Quota  int64  `json:"quota"`
			Period uint64 `json:"period"`
		} `json:"cpu,omitempty"`
		Pids *struct {
			Limit int64 `json:"limit"`
		} `json:"pids,omitempty"`
	}
	ociNS struct {
		Type string `json:"type"`
	}
	ociSeccomp struct {
		DefaultAction string           `json:"defaultAction"`
		Architectures []string         `json:"architectures"`
		Syscalls      []ociSyscallRule `json:"syscalls"`
	}
	ociSyscallRule struct {
		Names    []string        `json:"names"`
		Action   string          `json:"action"`
		ErrnoRet *uint           `json:"errnoRet,omitempty"`
		Args     []ociSeccompArg `json:"args,omitempty"`
	}
	ociSeccompArg struct {
		Index    uint   `json:"index"`
		Value    uint64 `json:"value"`
		ValueTwo uint64 `json:"valueTwo"`
		Op       string `json:"op"`
	}
)

// newProcess is the OCI process for argv: the sandbox user, no
// capabilities, no_new_privs, the rlimits every sandbox process gets.
func newProcess(argv, env []string, dir string, o Options, pids int64) *ociProcess {
	if dir == "" {
		dir = "/tmp"
	}
	p := &ociProcess{
		User:            ociUser{UID: uint32(o.Host.UID), GID: uint32(o.Host.GID)},
		Args:            argv,
		Env:             sandbox.DefaultEnv(env),
		Cwd:             dir,
		Capabilities:    ociCaps{},
		NoNewPrivileges: true,
		Rlimits: []ociRlimit{
			{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
			{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536},
		},
	}
	if pids > 0 {
		// The sentry counts the tasks of the sandbox user, the only
		// non-root user in the sandbox: this is the sandbox's pids limit.
		p.Rlimits = append(p.Rlimits, ociRlimit{Type: "RLIMIT_NPROC", Hard: uint64(pids), Soft: uint64(pids)})
	}
	return p
}

// writeBundle writes an OCI bundle for spec into dir: config.json (0600: it
// holds spec.Env) and rootfs/ with /etc and the mount points. cgroupsPath
// is the sandbox's cgroup ("" for none).
func writeBundle(dir string, spec sandbox.Spec, o Options, cgroupsPath string) error {
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return fmt.Errorf("create bundle rootfs: %w", err)
	}
	// The directory holding config.json must be readable by runsc only;
	// the rootfs is walked by the gofer, which runs as root.
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("chmod bundle: %w", err)
	}
	for _, d := range []string{"proc", "dev", "tmp", "sys", "usr", "etc"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return fmt.Errorf("create rootfs/%s: %w", d, err)
		}
	}
	sc, err := seccompProfile()
	if err != nil {
		return err
	}
	s := ociSpec{
		OCIVersion: "1.0.2",
		Process:    newProcess(spec.Command, spec.Env, spec.Dir, o, spec.Limits.Pids),
		Root:       ociRoot{Path: "rootfs", Readonly: true},
		Hostname:   "corral",
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(o.TmpSize, 10)}},
			{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}},
		},
		Linux: ociLinux{
			CgroupsPath: cgroupsPath,
			Namespaces:  []ociNS{{"pid"}, {"network"}, {"ipc"}, {"uts"}, {"mount"}},
			Seccomp:     sc,
		},
	}
	// /bin, /sbin, /lib*: the host's symlinks into /usr, or read-only
	// binds where they are directories.
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"} {
		fi, err := os.Lstat(d)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(d)
			if err != nil {
				continue
			}
			if err := os.Symlink(target, filepath.Join(rootfs, d)); err != nil {
				return fmt.Errorf("create rootfs%s: %w", d, err)
			}
			continue
		}
		if fi.IsDir() {
			if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
				return fmt.Errorf("create rootfs%s: %w", d, err)
			}
			s.Mounts = append(s.Mounts, ociMount{Destination: d, Type: "bind", Source: d, Options: []string{"rbind", "ro"}})
		}
	}
	binds, err := guestetc.Write(filepath.Join(rootfs, "etc"), guestetc.Options{UID: o.Host.UID, GID: o.Host.GID})
	if err != nil {
		return err
	}
	for _, name := range binds {
		p := filepath.Join("/etc", name)
		s.Mounts = append(s.Mounts, ociMount{Destination: p, Type: "bind", Source: p, Options: []string{"rbind", "ro"}})
	}
	for _, m := range spec.Mounts {
		if err := mountPoint(rootfs, m); err != nil {
			return err
		}
		opt := "rw"
		if m.ReadOnly {
			opt = "ro"
		}
		s.Mounts = append(s.Mounts, ociMount{Destination: m.Target, Type: "bind", Source: m.Source, Options: []string{"rbind", opt}})
	}
	if res := resources(spec.Limits); res != nil && cgroupsPath != "" {
		// The cgroups exist already with the host limits, so runsc does
		// not apply these; it sizes the sandbox's view (/proc/meminfo,
		// CPU count) from them.
		s.Linux.Resources = res
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode bundle config: %w", err)
	}
	if err := statedir.WriteFileAtomic(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write bundle config: %w", err)
	}
	return nil
}

// resources is the OCI form of lim, or nil if it sets nothing.
func resources(lim sandbox.Limits) *ociResources {
	var res ociResources
	set := false
	if lim.MemoryBytes > 0 {
		res.Memory = &struct {
			Limit int64 `json:"limit"`
		}{lim.MemoryBytes}
		set = true
	}
	if lim.CPUMillis > 0 {
		res.CPU = &struct {
			Quota  int64  `json:"quota"`
			Period uint64 `json:"period"`
		}{lim.CPUMillis * cgroups.PeriodUs / 1000, cgroups.PeriodUs}
		set = true
	}
	if lim.Pids > 0 {
		res.Pids = &struct {
			Limit int64 `json:"limit"`
		}{lim.Pids}
		set = true
	}
	if !set {
		return nil
	}
	return &res
}

// mountPoint creates the mount point for m in rootfs: a directory, or an
// empty file when the source is a file, with its parent directories.
func mountPoint(rootfs string, m sandbox.Mount) error {
	fi, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("stat mount source %s: %w", m.Source, err)
	}
	p := filepath.Join(rootfs, m.Target)
	if fi.IsDir() {
		err = os.MkdirAll(p, 0o755)
	} else if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
		err = os.WriteFile(p, nil, 0o644)
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create mount point %s: %w", m.Target, err)
	}
	return nil
}
