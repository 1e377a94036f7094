//go:build linux

package gvisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/sandbox/seccomp"
)

func TestSeccompProfile(t *testing.T) {
	p, err := seccompProfile()
	if err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != "SCMP_ACT_ALLOW" || len(p.Architectures) != 1 || p.Architectures[0] != seccompArch[runtime.GOARCH] {
		t.Errorf("profile header %q %v", p.DefaultAction, p.Architectures)
	}
	var plain []string
	conds := map[string]int{}
	for _, r := range p.Syscalls {
		if r.Action != "SCMP_ACT_ERRNO" || r.ErrnoRet == nil || *r.ErrnoRet != uint(unix.EPERM) {
			t.Errorf("rule %v: action %s, want ERRNO EPERM", r.Names, r.Action)
		}
		if len(r.Args) == 0 {
			plain = append(plain, r.Names...)
			continue
		}
		if len(r.Names) != 1 || len(r.Args) != 1 || r.Args[0].Op != "SCMP_CMP_MASKED_EQ" || r.Args[0].ValueTwo&^r.Args[0].Value != 0 {
			t.Errorf("conditional rule %+v: want one name, one masked condition that can hold", r)
		}
		conds[r.Names[0]]++
	}
	if diff := cmp.Diff(seccomp.Denied(), plain); diff != "" {
		t.Errorf("unconditional names (-Denied +profile):\n%s", diff)
	}
	// Seven namespace flags, 32 neighbouring bit pairs, two families; no
	// clone3 (this runsc would answer EPERM, not ENOSYS).
	if diff := cmp.Diff(map[string]int{"clone": 7, "personality": 32, "socket": 2}, conds); diff != "" {
		t.Errorf("conditional rules per name (-want +got):\n%s", diff)
	}

	dir := t.TempDir()
	if err := writeBundle(dir, sandbox.Spec{ID: "x", Command: []string{"/bin/true"}}, Options{TmpSize: 1 << 20}, ""); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s ociSpec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p, s.Linux.Seccomp); diff != "" {
		t.Errorf("bundle's linux.seccomp (-want +got):\n%s", diff)
	}
	if !bytes.Contains(b, []byte(`"errnoRet": 1`)) || !bytes.Contains(b, []byte(`"valueTwo": 131072`)) {
		t.Errorf("config.json lacks the OCI field names:\n%s", b)
	}
}

// seccompChecks are the calls TestHelperSeccomp makes and the errno each
// must end in under the filter ("ok" for success).
var seccompChecks = map[string]string{
	"ptrace traceme":      "operation not permitted",
	"keyctl":              "operation not permitted",
	"mount":               "operation not permitted",
	"unshare user":        "operation not permitted",
	"clone new user":      "operation not permitted",
	"clone new net":       "operation not permitted",
	"personality no aslr": "operation not permitted",
	"socket vsock":        "operation not permitted",
	"bpf":                 "operation not permitted",
	"clone3":              "function not implemented",
	"plain fork and exec": "ok",
	"socket unix":         "ok",
	"personality query":   "not refused",
	"personality default": "not refused",
}

// TestSeccompEnforced runs TestHelperSeccomp as a sandbox's main process
// and checks every call's result: the bundle's profile is in force. (Not
// through Exec: runsc exec does not apply it, see Exec.)
func TestSeccompEnforced(t *testing.T) {
	r, _ := MustNew(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	es, out := run(t, r, `/run/probe/helper -test.run='^TestHelperSeccomp$' > out 2>&1`, func(sp *sandbox.Spec) {
		sp.Env = []string{"CORRAL_GVISOR_SECCOMP=1"}
		sp.Mounts = append(sp.Mounts, sandbox.Mount{Source: sandboxtest.MountSource(self), Target: "/run/probe/helper", ReadOnly: true})
	})
	if es.Code != 0 {
		t.Fatalf("helper exit %d: %s", es.Code, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && strings.HasPrefix(k, "check ") {
			got[strings.TrimPrefix(k, "check ")] = v
		}
	}
	if diff := cmp.Diff(seccompChecks, got); diff != "" {
		t.Errorf("system calls in the sandbox (-want +got):\n%s\noutput:\n%s", diff, out)
	}
}

// TestHelperSeccomp runs inside the sandbox for TestSeccompEnforced and
// prints "check NAME: RESULT" lines.
func TestHelperSeccomp(t *testing.T) {
	if os.Getenv("CORRAL_GVISOR_SECCOMP") == "" {
		t.Skip("helper for TestSeccompEnforced")
	}
	res := func(err error) string {
		if err == nil {
			return "ok"
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "ok" // the child ran
		}
		var en syscall.Errno
		if errors.As(err, &en) {
			return en.Error()
		}
		return err.Error()
	}
	raw := func(nr uintptr, args ...uintptr) error {
		a := make([]uintptr, 6)
		copy(a, args)
		if _, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]); e != 0 {
			return e
		}
		return nil
	}
	persona := func(p uintptr) string {
		if err := raw(unix.SYS_PERSONALITY, p); errors.Is(err, unix.EPERM) {
			return err.Error()
		}
		return "not refused"
	}
	child := func(flags uintptr) error {
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
		return cmd.Run()
	}
	// ptrace last: were it allowed, a later fork and exec would stop.
	fmt.Printf("check keyctl: %s\n", res(func() error {
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
		return err
	}()))
	fmt.Printf("check mount: %s\n", res(unix.Mount("tmpfs", "/tmp", "tmpfs", 0, "")))
	fmt.Printf("check unshare user: %s\n", res(raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER)))
	fmt.Printf("check clone new user: %s\n", res(child(unix.CLONE_NEWUSER)))
	fmt.Printf("check clone new net: %s\n", res(child(unix.CLONE_NEWNET)))
	fmt.Printf("check personality no aslr: %s\n", persona(0x0040000))
	fmt.Printf("check personality query: %s\n", persona(0xffffffff))
	fmt.Printf("check personality default: %s\n", persona(0))
	fmt.Printf("check socket vsock: %s\n", res(raw(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM)))
	fmt.Printf("check bpf: %s\n", res(raw(unix.SYS_BPF, 0, 0, 0)))
	fmt.Printf("check clone3: %s\n", res(raw(unix.SYS_CLONE3, 0, 0)))
	fmt.Printf("check plain fork and exec: %s\n", res(child(0)))
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.Close(fd)
	}
	fmt.Printf("check socket unix: %s\n", res(err))
	fmt.Printf("check ptrace traceme: %s\n", res(raw(unix.SYS_PTRACE, unix.PTRACE_TRACEME)))
}
