// Package testenv gates tests on the real parts they need (root, bubblewrap,
// runsc, Docker, a kube-apiserver, PostgreSQL, Chromium). Outside CI a missing part
// skips the test; in CI (CI=true) it fails it, so a gate never hides a
// missing install step there.
package testenv

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// InCI reports whether the tests run in CI, where every part must be present.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing skips tb (or fails it in CI) because what is missing.
func Missing(tb testing.TB, what string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("missing in CI: %s", what)
	}
	tb.Skipf("skipped: %s", what)
}

// RequireRoot needs the test to run as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "needs root")
	}
}

// RequireBinary needs name on PATH and returns its path.
func RequireBinary(tb testing.TB, name, install string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(tb, name+" not found on PATH (install: "+install+")")
	}
	return p
}

// RequireBwrap needs root and bubblewrap, and returns bwrap's path.
func RequireBwrap(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	return RequireBinary(tb, "bwrap", "apt-get install -y bubblewrap")
}

// RequireRunsc needs root and gVisor's runsc, and returns runsc's path.
func RequireRunsc(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	return RequireBinary(tb, "runsc", "apt-get install -y runsc")
}

// SystrapRunsc is where scripts/k8s/build.sh puts the runsc it builds
// from gVisor's Go module ($CORRAL_TEST_CACHE/k8s/bin, default
// /var/cache/corral-test), which has the systrap platform and the
// checkpoint flags that Debian's runsc lacks.
func SystrapRunsc() string {
	return filepath.Join(cmp.Or(os.Getenv("CORRAL_TEST_CACHE"), "/var/cache/corral-test"), "k8s", "bin", "runsc")
}

// RequireSystrapRunsc needs root and SystrapRunsc, and returns its path.
func RequireSystrapRunsc(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	p := SystrapRunsc()
	if _, err := os.Stat(p); err != nil {
		Missing(tb, "runsc with systrap: "+p+" (build: scripts/k8s/build.sh)")
	}
	return p
}

// RequireChromium needs Debian's headless-capable Chromium and returns
// its path: the web UI's tests drive it (nothing downloads a browser).
func RequireChromium(tb testing.TB) string {
	tb.Helper()
	return RequireBinary(tb, "chromium", "apt-get install -y chromium")
}

// DockerImage is the image the tests run Docker sandboxes from: a Debian
// 12 minbase root file system that ./scripts/test.sh builds with
// mmdebstrap and imports, since no registry is reachable.
const DockerImage = "corral-test/debian:bookworm"

// DockerPythonImage is DockerImage with Python 3 and matplotlib, for
// code_execute's chart from a CSV (seed 004).
const DockerPythonImage = "corral-test/python:bookworm"

// DockerBusyboxImage holds Debian's static busybox and nothing else (no
// libc, no /usr): the image that shows any image runs a task.
const DockerBusyboxImage = "corral-test/busybox:1"

// DockerSocket is the engine the tests use: $CORRAL_TEST_DOCKER_SOCKET,
// or else the host's own.
var DockerSocket = cmp.Or(os.Getenv(DockerSocketEnv), "/var/run/docker.sock")

// DockerSocketEnv names another engine for the tests (one with
// experimental features on, for its checkpoints, beside a host's engine
// without).
const DockerSocketEnv = "CORRAL_TEST_DOCKER_SOCKET"

// RequireDocker needs root, a Docker engine at DockerSocket, and
// DockerImage on it.
func RequireDocker(tb testing.TB) {
	tb.Helper()
	RequireRoot(tb)
	if _, err := dockerGet("/_ping"); err != nil {
		Missing(tb, "no Docker engine at "+DockerSocket+" ("+err.Error()+"; ./scripts/test.sh installs and starts one)")
	}
	if _, err := dockerGet("/images/" + DockerImage + "/json"); err != nil {
		Missing(tb, "image "+DockerImage+" is not on the Docker engine ("+err.Error()+"; ./scripts/test.sh builds it)")
	}
}

// RequireDockerRuntime needs RequireDocker and the OCI runtime name
// registered with the engine.
func RequireDockerRuntime(tb testing.TB, name string) {
	tb.Helper()
	RequireDocker(tb)
	b, err := dockerGet("/info")
	var info struct{ Runtimes map[string]json.RawMessage }
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	if _, ok := info.Runtimes[name]; !ok {
		Missing(tb, fmt.Sprintf("the Docker engine has no runtime %q (%v; ./scripts/test.sh registers runsc)", name, err))
	}
}

// RequireDockerCheckpoints needs RequireDockerRuntime(runsc) and the
// engine's checkpoints, which need its experimental features on
// ("experimental": true in its daemon.json; scripts/test-docker.sh sets
// it for an engine it starts, and a running one needs a restart).
func RequireDockerCheckpoints(tb testing.TB) {
	tb.Helper()
	RequireDockerRuntime(tb, "runsc")
	b, err := dockerGet("/info")
	var info struct{ ExperimentalBuild bool }
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	if err != nil {
		Missing(tb, fmt.Sprintf("the Docker engine at %s: %v", DockerSocket, err))
	}
	if !info.ExperimentalBuild {
		Missing(tb, fmt.Sprintf("the Docker engine at %s has its experimental features off, which its checkpoints need (scripts/test-docker.sh turns them on for an engine it starts, and a running one needs a restart; or name another engine in $%s)", DockerSocket, DockerSocketEnv))
	}
}

// dockerGet GETs path from the engine's API and returns the body of a 200.
func dockerGet(path string) ([]byte, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", DockerSocket)
		},
	}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://docker" + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// PostgresEnv names the environment variable that gives the tests an admin
// connection string for PostgreSQL (one that may create and drop
// databases), in place of DefaultPostgresDSN.
const PostgresEnv = "CORRAL_TEST_POSTGRES"

// DefaultPostgresDSN reaches Debian's cluster over its unix socket as the
// user running the tests, by peer authentication: no password anywhere.
// ./scripts/test.sh starts the cluster and makes that user a superuser.
const DefaultPostgresDSN = "host=/var/run/postgresql dbname=postgres"

// PostgresInstall is how to get what PostgresDSN needs.
const PostgresInstall = "./scripts/test.sh installs and starts it (apt-get install -y postgresql; " +
	"pg_ctlcluster 15 main start; runuser -u postgres -- createuser -s $USER), or set " + PostgresEnv

// PostgresDSN needs a PostgreSQL server answering at the admin connection
// string in $CORRAL_TEST_POSTGRES, or else DefaultPostgresDSN, and returns
// that string. It only knocks: a server that answers but refuses the
// login is for the caller to report (with Missing and PostgresInstall).
func PostgresDSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(PostgresEnv)
	if dsn == "" {
		dsn = DefaultPostgresDSN
	}
	network, addr := postgresAddr(dsn)
	if err := knockPostgres(network, addr); err != nil {
		Missing(tb, fmt.Sprintf("no PostgreSQL server answers at %s (%v; %s)", addr, err, PostgresInstall))
	}
	return dsn
}

// postgresAddr finds the first host and port of a connection string, in
// either of its forms (host=... port=..., or a postgres:// URL), with
// libpq's defaults: Debian's socket directory and port 5432. A host that
// is a directory means the unix socket in it. Quoted values and the PG*
// environment variables are not read: a DSN that needs them is for
// CORRAL_TEST_POSTGRES with plain values.
func postgresAddr(dsn string) (network, addr string) {
	host, port := "", ""
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		host, port = u.Hostname(), u.Port()
		if h := u.Query().Get("host"); h != "" {
			host = h
		}
	} else {
		for _, f := range strings.Fields(dsn) {
			switch k, v, _ := strings.Cut(f, "="); k {
			case "host":
				host = v
			case "port":
				port = v
			}
		}
	}
	host, _, _ = strings.Cut(host, ",")
	port, _, _ = strings.Cut(port, ",")
	if host == "" {
		host = "/var/run/postgresql"
	}
	if port == "" {
		port = "5432"
	}
	if strings.HasPrefix(host, "/") {
		return "unix", filepath.Join(host, ".s.PGSQL."+port)
	}
	return "tcp", net.JoinHostPort(host, port)
}

// knockPostgres sends the protocol's SSLRequest and reads the one-byte
// answer ('S' or 'N'), which only a PostgreSQL server gives; the server
// logs nothing for a client that then hangs up.
func knockPostgres(network, addr string) error {
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	// Length 8, then the SSLRequest code 1234.5679.
	if _, err := c.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("no answer to an SSLRequest: %w", err)
	}
	if b[0] != 'S' && b[0] != 'N' {
		return fmt.Errorf("answered %q to an SSLRequest: not PostgreSQL", b[0])
	}
	return nil
}

// TempDir is tb.TempDir() opened for sandboxes: a root server runs them as
// an unprivileged host identity, and bwrap, running as it, binds mount
// sources by path, so the test's temporary directory (0700, the test's
// own) must let others pass through (0711). What is in it keeps its mode.
func TempDir(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		tb.Fatalf("open the test's temporary directory to sandboxes: %v", err)
	}
	return dir
}

// MountImage makes a filesystem image of size bytes in a temporary
// directory with mkfs (a program and its arguments; the image's path is
// added last), mounts it through a loop device with the mount options and
// returns the mount point, opened for sandboxes as TempDir is; it is
// unmounted when the test ends. It needs root, the mkfs program and loop
// devices. A mount the kernel refuses (a filesystem feature it was built
// without) is an error for the caller to judge, with the kernel's last
// word on it.
func MountImage(tb testing.TB, size int64, options string, mkfs ...string) (string, error) {
	tb.Helper()
	RequireRoot(tb)
	RequireBinary(tb, mkfs[0], "apt-get install -y e2fsprogs xfsprogs")
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		Missing(tb, "loop devices (/dev/loop-control): "+err.Error())
	}
	img := filepath.Join(tb.TempDir(), "fs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command(mkfs[0], append(mkfs[1:], img)...).CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(mkfs, " "), err, out)
	}
	dir := filepath.Join(TempDir(tb), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop,"+options, img, dir).CombinedOutput(); err != nil {
		kernel, _ := exec.Command("dmesg").Output()
		lines := strings.Split(strings.TrimSpace(string(kernel)), "\n")
		return "", fmt.Errorf("mount -o loop,%s: %v: %s (kernel: %s)", options, err, strings.TrimSpace(string(out)), lines[len(lines)-1])
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			tb.Logf("umount %s: %v: %s; detaching it lazily", dir, err, out)
			exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir, nil
}

// OpenPTY opens a pseudo-terminal and returns its master and its terminal,
// both closed when tb ends.
func OpenPTY(tb testing.TB) (pty, tty *os.File) {
	tb.Helper()
	pty, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		Missing(tb, "a pseudo-terminal (/dev/ptmx): "+err.Error())
	}
	tb.Cleanup(func() { pty.Close() })
	if err := unix.IoctlSetPointerInt(int(pty.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		tb.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(pty.Fd()), unix.TIOCGPTN)
	if err != nil {
		tb.Fatal(err)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tty.Close() })
	return pty, tty
}

// corralBinEnv names, in the environment of a test binary MainWithCorral
// runs, the directory of the binaries it built: the test binary run
// again as a helper (sandboxtest.KilledAt's) uses them, neither building
// its own nor, killed, leaving them behind.
const corralBinEnv = "CORRAL_TEST_BIN_DIR"

// MainWithCorral is a TestMain for packages whose tests run the corral
// binary: it builds it into *bin, with corral-worker beside it (sandboxes
// run that; some tests run corral as the server), runs the tests and
// removes them.
func MainWithCorral(m *testing.M, bin *string) {
	if dir := os.Getenv(corralBinEnv); dir != "" {
		*bin = filepath.Join(dir, "corral")
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "corral-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = filepath.Join(dir, "corral")
	// Static, as a release is: the worker runs from it in any image.
	// corral-worker, which sandboxes run, goes beside it.
	build := exec.Command("go", "build", "-o", dir, "github.com/corral-dev/corral/cmd/corral", "github.com/corral-dev/corral/cmd/corral-worker")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "build corral:", err)
		os.Exit(1)
	}
	os.Setenv(corralBinEnv, dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// SyncBuffer is a bytes.Buffer that a test may read while a process or a
// goroutine writes it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// GeneratedPart checks that the part of the file at path between the
// lines begin and end is part, as a generator says it should be now; with
// update it rewrites that part instead. The test that calls it says, in
// rerun, the command that rewrites it.
func GeneratedPart(tb testing.TB, path, begin, end string, part []byte, update bool, rerun string) {
	tb.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	head, rest, ok := strings.Cut(string(doc), begin)
	_, tail, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		tb.Fatalf("%s has no generated part between %q and %q", path, begin, end)
	}
	want := head + begin + string(part) + end + tail
	if update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			tb.Fatal(err)
		}
		return
	}
	if string(doc) != want {
		tb.Errorf("%s's generated part is out of date: run %s, and commit it", path, rerun)
	}
}
