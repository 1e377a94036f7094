package postgrestest

import (
	"cmp"
	"crypto/rand"
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
	DSN string // its postgres database, as its superuser
	// NetworkDSN is DSN over TCP, with the superuser's password, for the
	// clients of NewNetworkServer's network; "" from NewServer.
	NetworkDSN string
	dir        string
	bin        string
	port       int
	host       string   // the TCP address it listens on, "" for none
	as         []string // runuser's prefix when the test runs as root
}

// NewServer makes a cluster in a directory of its own (initdb), starts
// it on a free port with its socket in that directory, and stops it and
// removes the directory when tb ends. It skips tb, or fails it under CI,
// when PostgreSQL's programs are missing. Run as root, the server runs as
// the postgres user, as PostgreSQL refuses root.
func NewServer(tb testing.TB) *Server {
	tb.Helper()
	return NewNetworkServer(tb, "", "")
}

// NewNetworkServer is NewServer listening on TCP too, at host (an address
// of this machine, e.g. the test Kubernetes node's, where pods reach it),
// to clients of network (a CIDR) only, who log in as the superuser with a
// password (scram-sha-256): NetworkDSN. DSN still goes through the socket.
// A host of "" listens on no TCP address, as NewServer.
func NewNetworkServer(tb testing.TB, host, network string) *Server {
	tb.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		testenv.Missing(tb, "PostgreSQL's initdb ("+testenv.PostgresInstall+")")
	}
	slices.Sort(bins)
	s := &Server{bin: filepath.Dir(bins[len(bins)-1]), host: host}
	// Not t.TempDir: its parents are root's alone, and the server runs as
	// postgres.
	dir, err := os.MkdirTemp("", "corral-pg-")
	if err != nil {
		tb.Fatal(err)
	}
	s.dir = dir
	tb.Cleanup(func() { os.RemoveAll(dir) })
	uid, gid := os.Geteuid(), os.Getegid()
	if uid == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Missing(tb, "the postgres user ("+testenv.PostgresInstall+")")
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
		s.as = []string{"runuser", "-u", "postgres", "--"}
	}
	// A port free where it listens on TCP; the socket takes any.
	ln, err := net.Listen("tcp", net.JoinHostPort(cmp.Or(host, "127.0.0.1"), "0"))
	if err != nil {
		tb.Fatal(err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	initdb := []string{"-D", s.data(), "-A", "trust", "-U", "postgres", "--no-sync", "--no-instructions"}
	var password string
	if host != "" {
		// The superuser's password, from a file only the server's user
		// reads, gone once initdb has it.
		password = rand.Text()
		pw := filepath.Join(dir, "pw")
		if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
			tb.Fatal(err)
		}
		if err := os.Lchown(pw, uid, gid); err != nil {
			tb.Fatal(err)
		}
		defer os.Remove(pw)
		initdb = append(initdb, "--pwfile", pw)
	}
	s.run(tb, "initdb", initdb...)
	if host != "" {
		// initdb's trust stays for the socket and loopback; network's
		// clients need the password.
		hba, err := os.OpenFile(filepath.Join(s.data(), "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			tb.Fatal(err)
		}
		_, err = fmt.Fprintf(hba, "host all postgres %s scram-sha-256\n", network)
		if cerr := hba.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			tb.Fatal(err)
		}
		s.NetworkDSN = fmt.Sprintf("host=%s port=%d user=postgres password=%s dbname=postgres sslmode=disable", host, s.port, password)
	}
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
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses='%s'", s.port, s.dir, s.host), "start"); err != nil {
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
