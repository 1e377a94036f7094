package app

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// sandboxIdentity is the host identity sandboxes run as: the configured
// sandbox.host_uid and host_gid, or hostuser.Default().
func sandboxIdentity(cfg *config.Config) (hostuser.Identity, error) {
	id := hostuser.Default()
	if c := cfg.Sandbox; c.HostUID != 0 || c.HostGID != 0 {
		id = hostuser.Identity{UID: c.HostUID, GID: c.HostGID}
		if id.UID == 0 || id.GID == 0 {
			return id, &errdefs.FieldError{Field: "sandbox.host_uid", Err: fmt.Errorf("set host_uid and host_gid together (%s): sandboxes never run as root", id)}
		}
	}
	if err := id.Validate(""); err != nil {
		return id, &errdefs.FieldError{Field: "sandbox.host_uid", Err: err}
	}
	return id, nil
}

// closeDataRoot closes the data root to every host user but the server
// and the sandbox identity: mode 0710 and, under a root server, group the
// sandbox's gid, so the identity (bwrap runs as it and binds task
// directories by path) may pass through it but not list it, and no other
// host user reaches anything a worker left there, a set-uid file
// included. A data root the identity cannot reach is refused when the
// local runtime is the default, with what to do.
func (a *App) closeDataRoot(id hostuser.Identity) error {
	root := a.data.Path()
	if id.Switch() {
		if err := os.Chown(root, 0, id.GID); err != nil {
			return fmt.Errorf("give the data root to the sandbox group: %w", err)
		}
	}
	if err := os.Chmod(root, 0o710); err != nil {
		return fmt.Errorf("close the data root to other users: %w", err)
	}
	if !id.Switch() || a.cfg.Runtime != rtkind.Local {
		return nil
	}
	if err := id.Reach(root, 0o1); err != nil {
		return fmt.Errorf("data root %s: sandboxes run as %s and must reach it (bwrap binds their task directories by path): %v; choose a data root outside it (--data /var/lib/corral) or let others search the directory in the way (chmod o+x)",
			root, id, err)
	}
	return nil
}

// stageBinaries places corral and the corral-worker beside it in run/bin
// of the data root (hard links where the file system allows, else copies)
// and returns that directory: the sandbox identity reaches the data root,
// not necessarily the directory the server was started from (a checkout
// under /root, say). A new binary replaces the old by rename, so running
// sandboxes keep theirs. The two must be one build: a worker from another
// version would not speak this server's protocol.
func (a *App) stageBinaries(corral string) (string, error) {
	worker := filepath.Join(filepath.Dir(corral), workerproto.WorkerName)
	if err := sameBuild(corral, worker); err != nil {
		return "", err
	}
	dir := a.data.HostPath(workspace.DirRun, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("stage the worker binaries: %w", err)
	}
	if err := stageAll(dir, map[string]string{workerproto.CorralName: corral, workerproto.WorkerName: worker}); err != nil {
		return "", err
	}
	return dir, nil
}

// stageAll stages files (name in dir: source) holding dir's lock: the
// replicas of a cluster share the data root and may start together (a
// Deployment's first rollout), and two stagings at once spoil each other,
// one's rename moving the other's half-written copy into place, the
// other's then finding nothing to rename.
func stageAll(dir string, files map[string]string) error {
	lock, err := os.OpenFile(filepath.Join(dir, ".stage.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("stage the worker binaries: %w", err)
	}
	defer lock.Close() // and the flock with it
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("stage the worker binaries: lock %s: %w", lock.Name(), err)
	}
	for name, src := range files {
		if err := stage(src, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// stage places src at dst: a hard link where the file system allows;
// else nothing, when dst holds the same bytes already (a restart of the
// same build, which needs no room for a second copy on a full disk); else
// a copy, renamed over dst.
func stage(src, dst string) error {
	tmp := dst + ".new"
	os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		if same, _ := sameContent(src, dst); same {
			return nil
		}
		if err := copyExecutable(src, tmp); err != nil {
			os.Remove(tmp)
			if errors.Is(err, syscall.ENOSPC) {
				fi, _ := os.Stat(src)
				return fmt.Errorf("stage %s: the data root's file system has no room for a copy of it (%d MiB): free that much there, or keep the data root on the binary's file system, where it is linked: %w", src, fi.Size()>>20, errdefs.ErrNoSpace)
			}
			return fmt.Errorf("stage %s: %w", src, err)
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("stage %s: %w", src, err)
	}
	return nil
}

// sameContent reports whether files a and b hold the same bytes.
func sameContent(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	sa, err := fa.Stat()
	if err != nil {
		return false, err
	}
	sb, err := fb.Stat()
	if err != nil || sa.Size() != sb.Size() || !sb.Mode().IsRegular() {
		return false, err
	}
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		na, erra := io.ReadFull(fa, ba)
		nb, errb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if erra == io.EOF || erra == io.ErrUnexpectedEOF {
			return errb == erra, nil
		}
		if erra != nil || errb != nil {
			return false, errors.Join(erra, errb)
		}
	}
}

// sameBuild checks that worker is corral-worker from corral's build, as
// far as the Go toolchain recorded it: the same module version, source
// revision and toolchain. Two builds of unrecorded source ("devel", no
// revision) look alike.
func sameBuild(corral, worker string) error {
	cb, err := buildinfo.ReadFile(corral)
	if err != nil {
		return fmt.Errorf("read the build of %s: %w", corral, err)
	}
	wb, err := buildinfo.ReadFile(worker)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s is missing: sandboxes run it, and it must be beside %s (build both: go build -o DIR ./cmd/corral ./cmd/corral-worker): %w", worker, corral, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return fmt.Errorf("read the build of %s: %w", worker, err)
	}
	if got, want := buildOf(wb), buildOf(cb); got != want || wb.Path != workerproto.WorkerPackage {
		return fmt.Errorf("%s (%s %s) is not from the build of %s (%s): build both from the same source: %w", worker, wb.Path, got, corral, want, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// buildOf is what says which build a binary is of.
func buildOf(bi *debug.BuildInfo) string {
	s := []string{bi.GoVersion, bi.Main.Path, bi.Main.Version, bi.Main.Sum}
	for _, kv := range bi.Settings {
		if strings.HasPrefix(kv.Key, "vcs.") {
			s = append(s, kv.Key+"="+kv.Value)
		}
	}
	return strings.Join(s, " ")
}

// copyExecutable copies src to dst, mode 0755.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
