package postgrestest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/corral-dev/corral/internal/testenv"
)

// Server is a PostgreSQL server of a test's own, which the test may stop
// and start (the shared one, PostgresDSN's, serves every other test).
type Server struct {
	DSN  string // its postgres database, as its superuser
	dir  string
	bin  string
	port int
	as   []string // runuser's prefix when the test runs as root
}

// NewServer makes a cluster in a directory of its own (initdb), starts
// it on a free port with its socket in that directory, and stops it and
// removes the directory when tb ends. It skips tb, or fails it under CI,
// when PostgreSQL's programs are missing. Run as root, the server runs as
// the postgres user, as PostgreSQL refuses root.
func NewServer(tb testing.TB) *Server {
	tb.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		testenv.Missing(tb, "PostgreSQL's initdb ("+testenv.PostgresInstall+")")
	}
	slices.Sort(bins)
	s := &Server{bin: filepath.Dir(bins[len(bins)-1])}
	// Not t.TempDir: its parents are root's alone, and the server runs as
	// postgres.
	dir, err := os.MkdirTemp("", "corral-pg-")
	if err != nil {
		tb.Fatal(err)
	}
	s.dir = dir
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Missing(tb, "the postgres user ("+testenv.PostgresInstall+")")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
		s.as = []string{"runuser", "-u", "postgres", "--"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s.run(tb, "initdb", "-D", s.data(), "-A", "trust", "-U", "postgres", "--no-sync", "--no-instructions")
	s.Start(tb)
	tb.Cleanup(func() { s.pgCtl("-m", "immediate", "stop") })
	s.DSN = fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", dir, s.port)
	return s
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// Start starts the server and waits until it takes connections.
func (s *Server) Start(tb testing.TB) {
	tb.Helper()
	if out, err := s.pgCtl("-w", "-l", filepath.Join(s.dir, "log"),
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=''", s.port, s.dir), "start"); err != nil {
		tb.Fatalf("start PostgreSQL: %v\n%s", err, out)
	}
}

// Stop stops the server at once, as a crash of its machine would: the
// connections it had are cut.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	if out, err := s.pgCtl("-w", "-m", "immediate", "stop"); err != nil {
		tb.Fatalf("stop PostgreSQL: %v\n%s", err, out)
	}
}

func (s *Server) pgCtl(args ...string) ([]byte, error) {
	return s.command("pg_ctl", append([]string{"-D", s.data()}, args...)...).CombinedOutput()
}

func (s *Server) run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := s.command(name, args...).CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	argv := append(append(slices.Clone(s.as), filepath.Join(s.bin, name)), args...)
	return exec.Command(argv[0], argv[1:]...)
}
