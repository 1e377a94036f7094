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
// No check can hang it: each has a deadline (checkTimeout), and one that
// does not answer in time is reported as failed the safe way (an escape,
// or a control that does not hold). PTRACE_TRACEME, after which every
// execve of the process stops, runs in a child (the probe re-executed with
// the single argument --ptrace-traceme-child).
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
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/connlimit"
	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/workerproto"
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

// proxiedTimeout bounds a request through the egress proxy's TLS
// interception: two TLS handshakes (the probe's with the proxy, under a
// leaf the proxy makes for the host, and the proxy's with the host), the
// probe's under gVisor's ptrace platform. On a CI machine at a load of 10
// and more the first one took longer than netTimeout (TestEscape/gvisor's
// control "credential added on its rule's path" timed out at 3 s).
const proxiedTimeout = checkTimeout / 2

func main() {
	if len(os.Args) == 2 && os.Args[1] == tracemeArg {
		tracemeChild()
	}
	if len(os.Args) == 2 && os.Args[1] == orphanArg {
		orphanParent()
	}
	if len(os.Args) == 4 && os.Args[1] == handOffArg {
		handOffChild(os.Args[2], os.Args[3])
	}
	if len(os.Args) == 2 && os.Args[1] == orphanSleepArg {
		time.Sleep(100 * time.Millisecond)
		os.Exit(0)
	}
	var reads, writes, connects, egressAs, only list
	flag.Var(&reads, "read", "a path to try to read (repeatable)")
	flag.Var(&writes, "write", "a path to try to create (repeatable)")
	flag.Var(&connects, "connect", "a host:port to try to connect to over TCP (repeatable)")
	marker := flag.String("host-marker", "", "an argv element of a host process that must stay invisible")
	ruled := flag.String("credential-url", "", "an https base URL with an egress credential rule for the path prefix /allowed (see credentialChecks)")
	unruled := flag.String("unruled-url", "", "the same server under a name without a rule")
	out := flag.String("out", "/task/output/probe.json", "where to write the report too")
	sandboxed := flag.Bool("sandboxed", false, "confirm that this runs inside a sandbox (required)")
	egressListener := flag.String("egress-listener", "", "the server's egress listener (host:port) that pods reach (see egressAs)")
	flag.Var(&egressAs, "egress-as", "a task or session whose proxy to try to open on --egress-listener (repeatable)")
	flag.Var(&only, "only", "run only the checks whose names start with this (repeatable; default: every check)")
	flag.Parse()
	if !*sandboxed {
		fmt.Fprintln(os.Stderr, "probe: refusing to run without --sandboxed: it tries to write /usr, /etc and / and to mount file systems")
		os.Exit(2)
	}

	res := map[string]result{}
	// check runs one check under a deadline (see run); control marks the
	// checks where ok means a protection or ability is there.
	wanted := func(name string) bool {
		return len(only) == 0 || slices.ContainsFunc(only, func(p string) bool { return strings.HasPrefix(name, p) })
	}
	check := func(name string, fn func() result) {
		if wanted(name) {
			res[name] = run(fn, false)
		}
	}
	control := func(name string, fn func() result) {
		if wanted(name) {
			res[name] = run(fn, true)
		}
	}
	for _, p := range reads {
		check("read "+p, func() result { return tryRead(p) })
	}
	for _, p := range append([]string{"/workspace/shared/x", "/usr/x", "/etc/x", "/x"}, writes...) {
		check("write "+p, func() result { return tryWrite(p) })
	}
	control("write /tmp/x", func() result { return tryWrite("/tmp/x") })
	for _, a := range connects {
		check("connect "+a, func() result { return tryConnect(a) })
	}
	control("connect own loopback listener", ownLoopback)
	check("dns example.com", tryDNS)
	// The proxy's relay to a model API (egress.ModelHost(0)), which adds
	// its key: this task's agent has none, and a plain request to the
	// name goes to no relay.
	if proxy := os.Getenv("HTTPS_PROXY"); proxy != "" {
		check("relay to a model API the task has not", func() result { return tryProxyConnect(proxy, "model-0.corral.invalid:80") })
		check("plain request to a model API's relay", func() result { return tryProxyGet(proxy, "http://model-0.corral.invalid/v1/messages") })
		if *ruled != "" {
			credentialChecks(check, control, proxy, *ruled, *unruled)
		}
	}
	check("raw socket AF_PACKET", func() result { return trySocket(unix.AF_PACKET, unix.SOCK_RAW, 0) })
	check("raw socket AF_INET", func() result { return trySocket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP) })
	if len(connects) > 0 {
		check("bash /dev/tcp", func() result { return tryDevTCP(connects[0]) })
	}
	check("host processes", func() result { return hostProcesses(*marker) })
	check("capabilities", capabilities)
	check("uid 0", func() result {
		return result{OK: os.Getuid() == 0 || os.Geteuid() == 0, Detail: fmt.Sprintf("uid %d euid %d gid %d", os.Getuid(), os.Geteuid(), os.Getgid())}
	})
	control("no_new_privs", noNewPrivs)
	check("ptrace traceme", tryTraceme)
	check("ptrace attach pid 1", func() result { return errResult(ptraceAttach(1)) })
	check("open /proc/1/mem", func() result { return tryOpenMem("/proc/1/mem") })
	check("open /proc/1/task/1/mem", func() result { return tryOpenMem("/proc/1/task/1/mem") })
	// Run as a task's command agent, the probe is the worker's child: the
	// worker holds the task's webhook key (and a session's token) in its
	// environment and memory; with the key a forged completion would be
	// signed. The control shows whose they are (its command line, which
	// anyone may read).
	ppid := os.Getppid()
	control("read the worker's command line", func() result { return tryReadCmdline(fmt.Sprintf("/proc/%d/cmdline", ppid)) })
	check("read the worker's environment", func() result { return tryReadEnviron(fmt.Sprintf("/proc/%d/environ", ppid)) })
	check("open the worker's memory", func() result { return tryOpenMem(fmt.Sprintf("/proc/%d/mem", ppid)) })
	// The sandbox's pid 1 (bwrap's reaper, docker-init, runsc's first
	// process) was started with the same environment as the worker, and
	// runs as the sandbox's user.
	check("read pid 1's environment", func() result { return tryReadEnviron("/proc/1/environ") })
	check("read pid 1's thread's environment", func() result { return tryReadEnviron("/proc/1/task/1/environ") })
	check("read every process's environment", anyEnviron)
	// Not an escape, but a task's limit spent: a zombie holds one of the
	// sandbox's pids until the sandbox ends.
	check("orphan left a zombie", orphanZombie)
	// A descriptor the launcher, the runtime or the worker left open on a
	// host file (a cgroup's tasks file opened by the server as root, the
	// server's database) is a way out that no mount shows.
	check("descriptor on a file outside the sandbox", outsideDescriptors)
	// The server, which every sandbox reaches where its worker posts (a
	// unix socket, or a worker pod's HTTP listener): connections held
	// open until the server has no descriptor left would stop every other
	// task.
	check(holdCheck, func() result { return holdConnections(webhookOf(ppid), holdConns) })
	// The same, with connections a process dials and hands over before
	// it exits: a peer the server cannot tell any more.
	check(handOffCheck, func() result { return handedOffConnections(webhookOf(ppid), holdConns) })
	// The egress listener every pod reaches: a connection proves its task
	// or session with that one's key before it gets its proxy. The probe
	// tries another's with every key it can find (its own sandbox's, if
	// any process shows it) and with none.
	if *egressListener != "" {
		control("egress listener greets", func() result { return egressGreets(*egressListener) })
		for _, id := range egressAs {
			check("egress listener as "+id, func() result { return tryEgressAs(*egressListener, id) })
		}
	}
	check("mount tmpfs", tryMount)
	check("unshare user namespace", func() result { return tryNamespace(unix.CLONE_NEWUSER) })
	check("unshare network namespace", func() result { return tryNamespace(unix.CLONE_NEWNET) })
	check("unshare user and network namespaces", func() result { return tryNamespace(unix.CLONE_NEWUSER | unix.CLONE_NEWNET) })
	check("clone3 user namespace", func() result { return tryClone3(unix.CLONE_NEWUSER) })
	check("clone3 user and network namespaces", func() result { return tryClone3(unix.CLONE_NEWUSER | unix.CLONE_NEWNET) })
	check("keyctl", tryKeyctl)
	check("bpf", tryBPF)
	check("io_uring_setup", tryIOUring)
	check("perf_event_open", tryPerf)
	// What a host-root mapping of the sandbox user gave away: the host's
	// sysctls (kernel.core_pattern runs a program as host root), its keys,
	// and the kernel's internals in /proc. Opened for writing, never
	// written: a probe that got in must not change the host.
	check("open /proc/sys/kernel/core_pattern for writing", func() result { return tryOpenWrite("/proc/sys/kernel/core_pattern") })
	check("open any /proc/sys entry for writing", writableSysctls)
	check("list /etc/ssl/private", func() result { return tryRead("/etc/ssl/private") })
	for _, p := range procSecrets {
		check("read "+p, func() result { return tryReadSome(p) })
	}
	check("kernel addresses in /proc/kallsyms", kallsymsAddresses)

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

// checkTimeout bounds each check. A check that blocks (a FIFO where a file
// was expected, a child that stops) must not keep the probe from reporting.
const checkTimeout = 20 * time.Second

// run runs fn with checkTimeout. A check that does not answer in time is
// reported the way that fails the escape tests: as an escape, or as a
// control that does not hold. Its goroutine is left behind, blocked.
func run(fn func() result, control bool) result {
	ch := make(chan result, 1)
	go func() { ch <- fn() }()
	var r result
	select {
	case r = <-ch:
	case <-time.After(checkTimeout):
		r = result{OK: !control, Detail: fmt.Sprintf("no answer within %s: inconclusive", checkTimeout)}
	}
	r.Control = control
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

// procSecrets are /proc files a sandbox must not read: the kernel's
// memory, keyrings, timers, slab and scheduler state, and configuration.
var procSecrets = []string{"/proc/keys", "/proc/key-users", "/proc/timer_list", "/proc/slabinfo",
	"/proc/config.gz", "/proc/kcore", "/proc/sched_debug", "/proc/kallsyms"}

// tryReadSome reads up to 4 KiB of p: a file that reads as empty (masked
// with /dev/null) gives nothing away.
func tryReadSome(p string) result {
	f, err := os.Open(p)
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer f.Close()
	n, err := f.Read(make([]byte, 4096))
	if n == 0 {
		return result{Detail: fmt.Sprintf("read nothing (%v)", err)}
	}
	return result{OK: true, Detail: fmt.Sprintf("read %d bytes", n)}
}

// kallsymsAddresses reads /proc/kallsyms: ok if a symbol's address is
// not zero, which locates the kernel (KASLR). Where the file is not
// masked (a runc pod's), the kernel shows a process without CAP_SYSLOG
// zeros (kptr_restrict, perf_event_paranoid), and the names alone locate
// nothing.
func kallsymsAddresses() result {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for ; sc.Scan(); n++ {
		if addr, _, _ := strings.Cut(sc.Text(), " "); strings.Trim(addr, "0") != "" {
			return result{OK: true, Detail: fmt.Sprintf("symbol %d has an address: %s", n+1, sc.Text())}
		}
	}
	if err := sc.Err(); err != nil {
		return result{Detail: fmt.Sprintf("%d symbols read, every address zero, then %v", n, err)}
	}
	return result{Detail: fmt.Sprintf("%d symbols, every address zero", n)}
}

// tryOpenWrite opens p for writing and closes it without writing.
func tryOpenWrite(p string) result {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return result{Detail: err.Error()}
	}
	f.Close()
	return result{OK: true, Detail: "opened for writing"}
}

// writableSysctls opens every file under /proc/sys for writing (closing
// each unwritten) and reports how many opened, and the first few.
func writableSysctls() result {
	var opened []string
	filepath.WalkDir("/proc/sys", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
			opened = append(opened, p)
		}
		return nil
	})
	if len(opened) == 0 {
		return result{Detail: "none of /proc/sys opens for writing"}
	}
	return result{OK: true, Detail: fmt.Sprintf("%d writable, e.g. %s", len(opened), strings.Join(opened[:min(5, len(opened))], " "))}
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

// holdConns is how many connections holdCheck opens: a few times as many
// as the server lets one sandbox hold.
const holdConns = 4 * connlimit.PerSandbox

var holdCheck = fmt.Sprintf("hold %d connections to the server", holdConns)

// webhookOf is the URL the worker, process pid, posts its completion to:
// its --webhook argument, else (a warm sandbox's worker, whose command
// line is the warm sandbox's) the unix socket every sandbox of the other
// runtimes has.
func webhookOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := strings.Split(string(b), "\x00")
	if i := slices.Index(args, "--webhook"); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return "unix://" + workerproto.SocketDir + "/" + workerproto.SocketName
}

// holdConnections opens n connections to the server at webhook (the
// worker's: unix://PATH or http://HOST:PORT), sends a request on each and
// reads its answer, so that each counts only once the server has taken
// it: it holds those answered open together (keep-alive), and the server
// ends those it refused. More than connlimit.PerSandbox held at once is
// an escape.
func holdConnections(webhook string, n int) result {
	network, addr, host, err := serverAddr(webhook)
	if err != nil {
		return result{Detail: err.Error()}
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.DialTimeout(network, addr, netTimeout)
		if err != nil {
			if len(conns) == 0 {
				return result{Detail: err.Error()}
			}
			break
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(checkTimeout / 2))
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	}
	held, refused := answered(conns)
	return result{OK: held > connlimit.PerSandbox, Detail: fmt.Sprintf("%s %s: %d of %d connections answered and held open at once, %d ended by the server", network, addr, held, len(conns), refused)}
}

// handOffArg runs the probe as handOffChild.
const handOffArg = "--hand-off-connections"

var handOffCheck = fmt.Sprintf("hold %d connections dialled by a process that exited", holdConns)

// handOffChild dials n connections to webhook, sends them over fd 3 (a
// socket pair of its parent's) and exits at once.
func handOffChild(webhook, n string) {
	count, _ := strconv.Atoi(n)
	network, addr, _, err := serverAddr(webhook)
	if err != nil {
		os.Exit(1)
	}
	var fds []int
	for range count {
		c, err := net.DialTimeout(network, addr, netTimeout)
		if err != nil {
			break
		}
		f, err := c.(interface{ File() (*os.File, error) }).File()
		if err != nil {
			break
		}
		fds = append(fds, int(f.Fd()))
	}
	for len(fds) > 0 {
		batch := fds[:min(len(fds), 200)] // SCM_MAX_FD is 253
		fds = fds[len(batch):]
		if err := unix.Sendmsg(3, []byte{'c'}, unix.UnixRights(batch...), nil, 0); err != nil {
			os.Exit(1)
		}
	}
	os.Exit(0)
}

// handedOffConnections has a child process dial n connections to the
// server at webhook and hand them over before it exits; it then sends a
// request on each and holds those answered open together. More than
// connlimit.PerSandbox held at once is an escape.
func handedOffConnections(webhook string, n int) result {
	_, _, host, err := serverAddr(webhook)
	if err != nil {
		return result{Detail: err.Error()}
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer unix.Close(pair[0])
	theirs := os.NewFile(uintptr(pair[1]), "pair")
	child := exec.Command("/proc/self/exe", handOffArg, webhook, strconv.Itoa(n))
	child.ExtraFiles = []*os.File{theirs}
	if err := child.Start(); err != nil {
		theirs.Close()
		return result{Detail: err.Error()}
	}
	theirs.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	oob := make([]byte, unix.CmsgSpace(200*4))
	for {
		_, oobn, _, _, err := unix.Recvmsg(pair[0], make([]byte, 1), oob, 0)
		if err != nil || oobn == 0 {
			break
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			break
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				f := os.NewFile(uintptr(fd), "conn")
				c, err := net.FileConn(f)
				f.Close()
				if err == nil {
					conns = append(conns, c)
				}
			}
		}
	}
	child.Wait()
	if len(conns) == 0 {
		return result{Detail: "the child handed over no connection"}
	}
	for _, c := range conns {
		c.SetDeadline(time.Now().Add(checkTimeout / 2))
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	}
	held, refused := answered(conns)
	return result{OK: held > connlimit.PerSandbox, Detail: fmt.Sprintf("%d of %d connections handed over by a process that exited answered and held open at once, %d ended by the server", held, len(conns), refused)}
}

// answered reads an answer on each of conns (each sent a request): those
// answered are held, the others were ended by the server.
func answered(conns []net.Conn) (held, refused int) {
	for _, c := range conns {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			refused++
			continue
		}
		resp.Body.Close()
		held++
	}
	return held, refused
}

// serverAddr is where webhook (unix://PATH or http://HOST:PORT) is
// dialled, and the Host header a request there carries.
func serverAddr(webhook string) (network, addr, host string, err error) {
	if p, ok := strings.CutPrefix(webhook, "unix://"); ok {
		return "unix", p, "corral", nil
	}
	u, err := url.Parse(webhook)
	if err != nil || u.Host == "" {
		return "", "", "", fmt.Errorf("the worker's webhook %q: %v", webhook, err)
	}
	addr = u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	return "tcp", addr, u.Host, nil
}

func tryConnect(addr string) result {
	c, err := net.DialTimeout("tcp", addr, netTimeout)
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer c.Close()
	return result{OK: true, Detail: "connected from " + c.LocalAddr().String()}
}

// tryProxyConnect asks the HTTP proxy at proxyURL for a tunnel to target.
func tryProxyConnect(proxyURL, target string) result {
	u, err := url.Parse(proxyURL)
	if err != nil {
		return result{Detail: err.Error()}
	}
	c, err := net.DialTimeout("tcp", u.Host, netTimeout)
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(netTimeout))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return result{Detail: err.Error()}
	}
	resp.Body.Close()
	return result{OK: resp.StatusCode == http.StatusOK, Detail: resp.Status}
}

// tryProxyGet GETs target through the HTTP proxy at proxyURL.
func tryProxyGet(proxyURL, target string) result {
	u, err := url.Parse(proxyURL)
	if err != nil {
		return result{Detail: err.Error()}
	}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u)}, Timeout: netTimeout}
	resp, err := c.Get(target)
	if err != nil {
		return result{Detail: err.Error()}
	}
	resp.Body.Close()
	return result{OK: resp.StatusCode < 300, Detail: resp.Status}
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

// capabilities asks the kernel (capget, prctl) rather than reading
// /proc/self/status, where gVisor leaves out CapAmb: ok if any set holds a
// capability. The status fields found are in the detail.
func capabilities() result {
	var held []string
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		held = append(held, "capget: "+err.Error())
	} else {
		sets := map[string]uint64{
			"effective":   uint64(data[1].Effective)<<32 | uint64(data[0].Effective),
			"permitted":   uint64(data[1].Permitted)<<32 | uint64(data[0].Permitted),
			"inheritable": uint64(data[1].Inheritable)<<32 | uint64(data[0].Inheritable),
		}
		for name, v := range sets {
			if v != 0 {
				held = append(held, fmt.Sprintf("%s %#x", name, v))
			}
		}
	}
	// The bounding and ambient sets, one capability at a time until the
	// kernel no longer knows the number.
	for c := 0; c < 64; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			break
		}
		if in == 1 {
			held = append(held, fmt.Sprintf("bounding cap %d", c))
		}
	}
	for c := 0; c < 64; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0)
		if err != nil {
			break
		}
		if in == 1 {
			held = append(held, fmt.Sprintf("ambient cap %d", c))
		}
	}
	var seen []string
	for _, name := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		_, d := statusField(name)
		seen = append(seen, d)
	}
	if len(held) > 0 {
		return result{OK: true, Detail: strings.Join(held, ", ")}
	}
	return result{Detail: "capget and prctl: none; " + strings.Join(seen, ", ")}
}

// noNewPrivs asks prctl whether no_new_privs is set (gVisor's
// /proc/self/status has no NoNewPrivs field).
func noNewPrivs() result {
	_, detail := statusField("NoNewPrivs")
	v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return result{Detail: "prctl: " + err.Error() + "; " + detail}
	}
	return result{OK: v == 1, Detail: fmt.Sprintf("prctl says %d; %s", v, detail)}
}

// orphanArg and orphanSleepArg, as the only argument, make the probe
// orphanZombie's child and grandchild.
// outsideDescriptors reports the probe's open descriptors on files, file
// systems' directories and devices that its path for them does not reach
// inside the sandbox (the kernel shows a file outside the sandbox's root,
// or deleted, by a path that leads elsewhere or nowhere). Pipes, sockets
// and anonymous inodes have no path to check.
func outsideDescriptors() result {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return result{Detail: err.Error()}
	}
	var found []string
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			continue // the listing's own descriptor, closed since
		}
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		var in unix.Stat_t
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR, unix.S_IFBLK: // the same device by another node is fine
			if unix.Stat(target, &in) != nil || in.Rdev != st.Rdev {
				found = append(found, fmt.Sprintf("fd %d: %s", fd, target))
			}
		case unix.S_IFREG, unix.S_IFDIR, unix.S_IFLNK:
			if unix.Stat(target, &in) != nil || in.Dev != st.Dev || in.Ino != st.Ino {
				found = append(found, fmt.Sprintf("fd %d: %s", fd, target))
			}
		}
	}
	return result{OK: len(found) > 0, Detail: strings.Join(found, "; ")}
}

const (
	orphanArg      = "--orphan-parent"
	orphanSleepArg = "--orphan-sleep"
)

// orphanZombie orphans a process (its parent exits at once) that exits
// 100 ms later, and reports whether it is still a zombie 5 s after that:
// nothing in the sandbox reaped it.
func orphanZombie() result {
	self, err := os.Executable()
	if err != nil {
		return result{Detail: "find own executable: " + err.Error()}
	}
	out, err := exec.Command(self, orphanArg).Output()
	pid, perr := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || perr != nil {
		return result{OK: true, Detail: fmt.Sprintf("inconclusive: the orphan's parent said %q: %v", out, err)}
	}
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	deadline := time.Now().Add(5100 * time.Millisecond)
	for {
		b, err := os.ReadFile(stat)
		if errors.Is(err, os.ErrNotExist) {
			return result{Detail: fmt.Sprintf("orphan %d reaped", pid)}
		}
		if time.Now().After(deadline) {
			return result{OK: true, Detail: fmt.Sprintf("orphan %d still there 5 s after it exited: %q (%v)", pid, b, err)}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// orphanParent is orphanZombie's child: it starts the grandchild, prints
// its pid and exits without waiting for it.
func orphanParent() {
	self, err := os.Executable()
	if err == nil {
		cmd := exec.Command(self, orphanSleepArg)
		if err = cmd.Start(); err == nil {
			fmt.Println(cmd.Process.Pid)
			os.Exit(0)
		}
	}
	fmt.Println("failed: " + err.Error())
	os.Exit(0)
}

// tracemeArg, as the only argument, makes the probe the traceme child.
const tracemeArg = "--ptrace-traceme-child"

// tryTraceme runs PTRACE_TRACEME in a child: once it succeeds, the process
// that made it stops at its next execve, and a probe that did it itself
// would hang at the first command it starts. The child reports and exits
// at once, execs nothing, and is killed if it does not end in time.
func tryTraceme() result {
	self, err := os.Executable()
	if err != nil {
		return result{Detail: "find own executable: " + err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout/2)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, tracemeArg)
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	switch line := strings.TrimSpace(string(out)); {
	case line == "succeeded":
		return result{OK: true, Detail: "succeeded (in a child)"}
	case strings.HasPrefix(line, "failed: "):
		return result{Detail: strings.TrimPrefix(line, "failed: ")}
	default:
		// No answer: the child could not be run or did not report.
		return result{OK: true, Detail: fmt.Sprintf("inconclusive: child said %q: %v", line, err)}
	}
}

// tracemeChild is the child of tryTraceme: it reports on stdout whether
// PTRACE_TRACEME worked.
func tracemeChild() {
	if err := ptrace(unix.PTRACE_TRACEME, 0); err != nil {
		fmt.Println("failed: " + err.Error())
		os.Exit(0)
	}
	fmt.Println("succeeded")
	os.Exit(0)
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

// tryOpenMem opens a process's memory file: a runtime may mask it with a
// bind of /dev/null (a character device), which opens but holds nothing.
func tryOpenMem(p string) result {
	f, err := os.Open(p)
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		return result{Detail: "masked: opens a character device (/dev/null), not the memory"}
	}
	return result{OK: true, Detail: "opened"}
}

// tryReadCmdline reads a process's command line; the detail is its argv
// joined by spaces.
func tryReadCmdline(p string) result {
	b, err := os.ReadFile(p)
	if err != nil {
		return result{Detail: err.Error()}
	}
	if len(b) == 0 {
		return result{Detail: "empty"}
	}
	return result{OK: true, Detail: strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))}
}

// workerSecrets are the variables of the worker's environment that must
// not reach the agent.
var workerSecrets = []string{workerproto.EnvWebhookKey, workerproto.EnvSessionToken, workerproto.EnvSessionEgressKey}

// tryReadEnviron reads a process's environment: ok if it holds one of
// workerSecrets. (gVisor lets any process read any other's environment,
// so the worker's must hold none.) The detail names the variables found,
// never their values: the report lands in the task's output.
func tryReadEnviron(p string) result {
	b, err := os.ReadFile(p)
	if err != nil {
		return result{Detail: err.Error()}
	}
	var names, found []string
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, _, ok := strings.Cut(kv, "="); ok {
			names = append(names, k)
			if slices.Contains(workerSecrets, k) {
				found = append(found, k)
			}
		}
	}
	if len(found) == 0 {
		return result{Detail: fmt.Sprintf("read %d bytes without %s: %s", len(b), strings.Join(workerSecrets, " or "), strings.Join(names, " "))}
	}
	return result{OK: true, Detail: fmt.Sprintf("read %d bytes with %s: %s", len(b), strings.Join(found, " "), strings.Join(names, " "))}
}

// anyEnviron reads the environment of every process it can see and
// reports one that holds a worker secret.
func anyEnviron() result {
	paths, _ := filepath.Glob("/proc/[0-9]*/environ")
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/environ")
	for _, p := range append(paths, tasks...) {
		if r := tryReadEnviron(p); r.OK {
			r.Detail = p + ": " + r.Detail
			return r
		}
	}
	return result{Detail: fmt.Sprintf("none of %d environments holds %s", len(paths)+len(tasks), strings.Join(workerSecrets, " or "))}
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
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout/2)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/true")
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
	if ctx.Err() != nil {
		return result{OK: true, Detail: fmt.Sprintf("a child started in new namespaces (%#x) but did not end: inconclusive", flags)}
	}
	return result{OK: true, Detail: fmt.Sprintf("a child ran in new namespaces (%#x)", flags)}
}

// tryClone3 makes a child in new namespaces with clone3 itself, whose
// flags a seccomp filter cannot read (they are in memory, not in a
// register): a sandbox must refuse the call (ENOSYS, on which C libraries
// fall back to clone, whose flags a filter sees), or its kernel the
// namespaces. The child is a fork of this thread and exits at once,
// running no Go code.
func tryClone3(flags uint64) result {
	// struct clone_args as of Linux 5.3 (CLONE_ARGS_SIZE_VER0, 64 bytes).
	args := struct{ flags, pidfd, childTID, parentTID, exitSignal, stack, stackSize, tls uint64 }{
		flags: flags, exitSignal: uint64(unix.SIGCHLD),
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, _, errno := unix.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args), 0)
	if errno != 0 {
		return result{Detail: "clone3: " + errno.Error()}
	}
	if pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
	return result{OK: true, Detail: fmt.Sprintf("clone3 made a child in new namespaces (%#x)", flags)}
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

// credentialChecks try to learn the secret of an egress credential rule.
// The server at ruled has a rule for the paths under /allowed: it answers
// /allowed/check with whether the request brought the rule's credential
// ("credential: yes"), redirects /allowed/redirect to unruled's /echo, and
// echoes any other request's Authorization header ("authorization: X"),
// so that a credential the proxy gives where it should not shows there.
func credentialChecks(check, control func(string, func() result), proxy, ruled, unruled string) {
	pu, err := url.Parse(proxy)
	if err != nil {
		check("credential rule checks", func() result { return result{OK: true, Detail: "bad proxy URL: " + err.Error()} })
		return
	}
	// Through the proxy whatever NO_PROXY says; the roots are the
	// system's, which SSL_CERT_FILE (set by the worker) extends.
	trusting := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: proxiedTimeout}
	insecure := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: proxiedTimeout}
	get := func(c *http.Client, target, host string) (string, error) {
		req, err := http.NewRequest("GET", target, nil)
		if err != nil {
			return "", err
		}
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return strings.TrimSpace(string(b)), err
	}
	// leaked: an escape if the echo shows any Authorization at all.
	leaked := func(c *http.Client, target, host string) result {
		body, err := get(c, target, host)
		if err != nil {
			return result{Detail: err.Error()}
		}
		v, ok := strings.CutPrefix(body, "authorization:")
		if !ok {
			return result{Detail: "unexpected answer: " + body}
		}
		return result{OK: strings.TrimSpace(v) != "", Detail: body}
	}
	control("credential added on its rule's path", func() result {
		body, err := get(trusting, ruled+"/allowed/check", "")
		if err != nil {
			return result{Detail: err.Error()}
		}
		return result{OK: body == "credential: yes", Detail: body}
	})
	check("credential on a path outside its rule", func() result { return leaked(trusting, ruled+"/echo", "") })
	check("credential through a dot segment", func() result { return leaked(trusting, ruled+"/allowed/../echo", "") })
	check("credential through an encoded slash", func() result { return leaked(trusting, ruled+"/allowed%2f..%2fecho", "") })
	check("credential through a redirect to a host without a rule", func() result { return leaked(insecure, ruled+"/allowed/redirect", "") })
	rh := strings.TrimPrefix(ruled, "https://")
	check("credential of another host's rule (Host header)", func() result { return leaked(insecure, unruled+"/allowed/x", rh) })
}

// egressGreets connects to the egress listener at addr and reads its
// greeting: the listener is there, so a refusal is the handshake's.
func egressGreets(addr string) result {
	c, err := net.DialTimeout("tcp", addr, netTimeout)
	if err != nil {
		return result{Detail: err.Error()}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(netTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if !strings.HasPrefix(line, "CORRAL-EGRESS/1 ") {
		return result{Detail: fmt.Sprintf("greeting %.40q, %v", line, err)}
	}
	return result{OK: true, Detail: "greeted: " + strings.TrimSpace(line[:16])}
}

// egressKeys are the keys the probe can find: the values of workerSecrets
// in every environment it can read (its own included) that decode as
// hex, and a key of zeros.
func egressKeys() [][]byte {
	keys := [][]byte{make([]byte, 32)}
	envs := []string{strings.Join(os.Environ(), "\x00")}
	paths, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			envs = append(envs, string(b))
		}
	}
	for _, env := range envs {
		for _, kv := range strings.Split(env, "\x00") {
			if k, v, ok := strings.Cut(kv, "="); ok && slices.Contains(workerSecrets, k) {
				if key, err := hex.DecodeString(v); err == nil && len(key) > 0 {
					keys = append(keys, key)
				}
			}
		}
	}
	return keys
}

// tryEgressAs tries to open id's proxy on the egress listener at addr with
// every key egressKeys finds: ok if one opens it.
func tryEgressAs(addr, id string) result {
	keys := egressKeys()
	var errs []string
	for i, key := range keys {
		c, err := egress.DialTask(addr, id, key, netTimeout)
		if err == nil {
			c.Close()
			return result{OK: true, Detail: fmt.Sprintf("key %d of %d opened it", i+1, len(keys))}
		}
		errs = append(errs, err.Error())
	}
	return result{Detail: fmt.Sprintf("refused with each of %d keys: %s", len(keys), strings.Join(slices.Compact(errs), "; "))}
}
