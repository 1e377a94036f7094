//go:build linux

// Command probe tries to get out of the sandbox it runs in and reports what
// it could do. The escape tests build it (CGO_ENABLED=0, a static binary),
// run it as a task's command agent under every runtime, and assert from
// outside that every escape failed.
//
// It prints one JSON object to stdout and to --out: for each check,
// {"ok": true} if the escape succeeded (the sandbox failed), with a detail
// (the error, or what it saw). Checks marked "control" are the other way
// round: ok means a protection or an ability the probe relies on is there
// (no_new_privs is set; it can connect to its own loopback listener), so
// that a check which fails for a broken probe, not a closed sandbox, shows.
//
// It really tries: run outside a sandbox, as root, it writes /usr/x,
// /etc/x and /x and mounts a tmpfs. So it refuses to run without
// --sandboxed.
//
//	probe --sandboxed --read /data/corral.db --write /data/tasks/other/x \
//	      --connect 127.0.0.1:8080 --host-marker=MARKER
//
// A process on the host is visible if one of its argv elements equals the
// marker exactly; pass it as --host-marker=MARKER so the probe's own argv
// (and its parents') holds no such element.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// result is one check's outcome.
type result struct {
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
	Control bool   `json:"control,omitempty"`
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

// netTimeout bounds each network attempt.
const netTimeout = 3 * time.Second

func main() {
	var reads, writes, connects list
	flag.Var(&reads, "read", "a path to try to read (repeatable)")
	flag.Var(&writes, "write", "a path to try to create (repeatable)")
	flag.Var(&connects, "connect", "a host:port to try to connect to over TCP (repeatable)")
	marker := flag.String("host-marker", "", "an argv element of a host process that must stay invisible")
	out := flag.String("out", "/task/output/probe.json", "where to write the report too")
	sandboxed := flag.Bool("sandboxed", false, "confirm that this runs inside a sandbox (required)")
	flag.Parse()
	if !*sandboxed {
		fmt.Fprintln(os.Stderr, "probe: refusing to run without --sandboxed: it tries to write /usr, /etc and / and to mount file systems")
		os.Exit(2)
	}

	res := map[string]result{}
	for _, p := range reads {
		res["read "+p] = tryRead(p)
	}
	for _, p := range append([]string{"/workspace/shared/x", "/usr/x", "/etc/x", "/x"}, writes...) {
		res["write "+p] = tryWrite(p)
	}
	res["write /tmp/x"] = control(tryWrite("/tmp/x"))
	for _, a := range connects {
		res["connect "+a] = tryConnect(a)
	}
	res["connect own loopback listener"] = control(ownLoopback())
	res["dns example.com"] = tryDNS()
	res["raw socket AF_PACKET"] = trySocket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	res["raw socket AF_INET"] = trySocket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if len(connects) > 0 {
		res["bash /dev/tcp"] = tryDevTCP(connects[0])
	}
	res["host processes"] = hostProcesses(*marker)
	res["capabilities"] = capabilities()
	res["uid 0"] = result{OK: os.Getuid() == 0 || os.Geteuid() == 0, Detail: fmt.Sprintf("uid %d euid %d gid %d", os.Getuid(), os.Geteuid(), os.Getgid())}
	nnp, detail := statusField("NoNewPrivs")
	res["no_new_privs"] = result{OK: nnp == "1", Detail: detail, Control: true}
	res["ptrace traceme"] = errResult(ptrace(unix.PTRACE_TRACEME, 0))
	res["ptrace attach pid 1"] = errResult(ptraceAttach(1))
	res["open /proc/1/mem"] = tryOpen("/proc/1/mem")
	res["open /proc/1/task/1/mem"] = tryOpen("/proc/1/task/1/mem")
	res["mount tmpfs"] = tryMount()
	res["unshare user namespace"] = tryNamespace(unix.CLONE_NEWUSER)
	res["unshare network namespace"] = tryNamespace(unix.CLONE_NEWNET)
	res["unshare user and network namespaces"] = tryNamespace(unix.CLONE_NEWUSER | unix.CLONE_NEWNET)
	res["keyctl"] = tryKeyctl()
	res["bpf"] = tryBPF()
	res["io_uring_setup"] = tryIOUring()
	res["perf_event_open"] = tryPerf()

	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, "encode report:", err)
		os.Exit(2)
	}
	os.Stdout.Write(append(b, '\n'))
	if *out != "" {
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "write report:", err)
			os.Exit(2)
		}
	}
}

func control(r result) result {
	r.Control = true
	return r
}

// errResult is ok if err is nil: the call that should have failed worked.
func errResult(err error) result {
	if err != nil {
		return result{Detail: err.Error()}
	}
	return result{OK: true, Detail: "succeeded"}
}

func tryRead(p string) result {
	if ents, err := os.ReadDir(p); err == nil {
		return result{OK: true, Detail: fmt.Sprintf("listed %d entries", len(ents))}
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return result{Detail: err.Error()}
	}
	return result{OK: true, Detail: fmt.Sprintf("read %d bytes", len(b))}
}

func tryWrite(p string) result {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return result{Detail: err.Error()}
	}
	_, err = f.WriteString("probe was here\n")
	f.Close()
	if err != nil {
		return result{OK: true, Detail: "created, but write failed: " + err.Error()}
	}
	return result{OK: true, Detail: "created " + p}
}

func tryConnect(addr string) result {
	c, err := net.DialTimeout("tcp", addr, netTimeout)
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer c.Close()
	return result{OK: true, Detail: "connected from " + c.LocalAddr().String()}
}

// ownLoopback connects to a listener of its own: the sandbox's loopback
// works, so a refused host address is the sandbox, not the probe.
func ownLoopback() result {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	return tryConnect(ln.Addr().String())
}

func tryDNS() result {
	ctx, cancel := context.WithTimeout(context.Background(), netTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, "example.com")
	if err != nil {
		return result{Detail: err.Error()}
	}
	return result{OK: true, Detail: strings.Join(addrs, " ")}
}

func trySocket(domain, typ, proto int) result {
	fd, err := unix.Socket(domain, typ, proto)
	if err != nil {
		return result{Detail: err.Error()}
	}
	unix.Close(fd)
	return result{OK: true, Detail: "socket created"}
}

func tryDevTCP(addr string) result {
	bash, err := exec.LookPath("bash")
	if err != nil {
		return result{Detail: "bash not present"}
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return result{Detail: err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*netTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bash, "-c", `exec 3<>"/dev/tcp/$1/$2"`, "bash", host, port).CombinedOutput()
	if err != nil {
		return result{Detail: strings.TrimSpace(string(out)) + ": " + err.Error()}
	}
	return result{OK: true, Detail: "bash opened /dev/tcp/" + host + "/" + port}
}

// hostProcesses lists /proc: ok if a process has an argv element equal to
// marker.
func hostProcesses(marker string) result {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return result{Detail: err.Error()}
	}
	var pids []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		pids = append(pids, e.Name())
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || marker == "" {
			continue
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if arg == marker {
				return result{OK: true, Detail: "pid " + e.Name() + " has the marker: " + strings.ReplaceAll(string(b), "\x00", " ")}
			}
		}
	}
	return result{Detail: fmt.Sprintf("%d processes visible: %s", len(pids), strings.Join(pids, " "))}
}

// statusField returns a field of /proc/self/status.
func statusField(name string) (string, string) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return "", err.Error()
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == name {
			v = strings.TrimSpace(v)
			return v, name + " " + v
		}
	}
	return "", name + " not found"
}

func capabilities() result {
	var held []string
	var seen []string
	for _, name := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		v, d := statusField(name)
		seen = append(seen, d)
		if n, err := strconv.ParseUint(v, 16, 64); err != nil || n != 0 {
			held = append(held, d)
		}
	}
	if len(held) > 0 {
		return result{OK: true, Detail: strings.Join(held, ", ")}
	}
	return result{Detail: strings.Join(seen, ", ")}
}

func ptrace(req int, pid int) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(pid), 0, 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func ptraceAttach(pid int) error {
	if err := ptrace(unix.PTRACE_ATTACH, pid); err != nil {
		return err
	}
	ptrace(unix.PTRACE_DETACH, pid)
	return nil
}

// tryOpen opens p for reading: for /proc/PID/mem, the open is the access
// check (PTRACE_MODE_ATTACH), whatever reading an address would say.
func tryOpen(p string) result {
	f, err := os.Open(p)
	if err != nil {
		return result{Detail: err.Error()}
	}
	f.Close()
	return result{OK: true, Detail: "opened"}
}

func tryMount() result {
	dir, err := os.MkdirTemp("", "probe-mnt-")
	if err != nil {
		return result{Detail: "mkdir: " + err.Error()}
	}
	defer os.Remove(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		return result{Detail: err.Error()}
	}
	unix.Unmount(dir, unix.MNT_DETACH)
	return result{OK: true, Detail: "mounted a tmpfs on " + dir}
}

// tryNamespace starts a child in new namespaces, the way a program would
// (a Go process has threads, so unshare(2) in it fails with EINVAL for
// reasons of its own; the clone of a fork is the real path). A child that
// ran proves the namespaces were created.
func tryNamespace(flags uintptr) result {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	if flags&unix.CLONE_NEWUSER != 0 {
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappingsEnableSetgroups = false
	}
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return result{Detail: err.Error()}
	}
	return result{OK: true, Detail: fmt.Sprintf("a child ran in new namespaces (%#x)", flags)}
}

func tryKeyctl() result {
	id, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 1, 0, 0)
	if err != nil {
		return result{Detail: err.Error()}
	}
	return result{OK: true, Detail: fmt.Sprintf("session keyring %d", id)}
}

func tryBPF() result {
	// BPF_MAP_CREATE of a one-entry array: the least a program needs.
	attr := struct {
		mapType, keySize, valueSize, maxEntries, flags uint32
	}{mapType: 2, keySize: 4, valueSize: 4, maxEntries: 1}
	fd, _, e := unix.Syscall(unix.SYS_BPF, 0, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if e != 0 {
		return result{Detail: e.Error()}
	}
	unix.Close(int(fd))
	return result{OK: true, Detail: "created a bpf map"}
}

func tryIOUring() result {
	var params [120]byte // struct io_uring_params, zeroed
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if e != 0 {
		return result{Detail: e.Error()}
	}
	unix.Close(int(fd))
	return result{OK: true, Detail: "created an io_uring"}
}

func tryPerf() result {
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
	if err != nil {
		return result{Detail: err.Error()}
	}
	unix.Close(fd)
	return result{OK: true, Detail: "opened a perf event"}
}
