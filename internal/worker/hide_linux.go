package worker

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/workerproto"
)

// secretsFDEnv names, in the process HideFromAgent re-executed, the
// descriptor its secrets come on. It starts with CORRAL_, so no agent
// gets it.
const secretsFDEnv = workerproto.EnvPrefix + "SECRETS_FD"

// maxSecrets bounds what goes through the pipe: all of it is written
// before anyone reads, so it must fit in the pipe's buffer (64 KiB).
const maxSecrets = 16 << 10

// HideFromAgent keeps the secrets this process was started with (the
// variables of environ named) from the agent it will start, which runs
// as the same uid in the same sandbox and could otherwise sign a forged
// webhook with the task's key. It returns the environment to go on with,
// secrets included; the process's own no longer holds them. Call it
// first, before any agent runs.
//
// Two ways in are closed. The memory: the process becomes non-dumpable
// (PR_SET_DUMPABLE 0), after which the kernel lets only a holder of
// CAP_SYS_PTRACE open its /proc/<pid>/mem and environ or ptrace it, and
// no sandbox grants that; execve resets the flag, so the agent is an
// ordinary process. The environment: gVisor serves /proc/<pid>/environ
// to every process, dumpable or not, so there the process executes itself
// once more with the secrets out of its environment, passing them on a
// pipe that it reads and closes at once, unless that environment never
// held them (a warm sandbox's worker, which got its task's later). Linux's own /proc needs no such
// step, which costs a second start of the binary (~7 ms): it is taken
// whenever the kernel does not show itself to be Linux's (environGuarded).
func HideFromAgent(environ []string, names ...string) ([]string, error) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("prctl PR_SET_DUMPABLE: %w", err)
	}
	if fd, ok := lookupEnv(environ, secretsFDEnv); ok {
		return readSecrets(environ, fd)
	}
	if environGuarded() || !execEnvironHolds(names) {
		return environ, nil
	}
	kept, r, w, err := SecretsPipe(environ, names...)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return environ, nil
	}
	w.Close()
	self, err := os.Executable()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	// The read end goes through the execve, at its number. Nothing else
	// runs in the process yet.
	if _, err := unix.FcntlInt(r.Fd(), unix.F_SETFD, 0); err != nil {
		r.Close()
		return nil, fmt.Errorf("pass the secrets' pipe on: %w", err)
	}
	err = unix.Exec(self, os.Args, append(kept, SecretsFDVar(int(r.Fd()))))
	r.Close()
	return nil, fmt.Errorf("execute %s again without the secrets in its environment: %w", self, err)
}

// SecretsPipe splits environ into the variables names and the rest, and
// returns the rest and a pipe holding the named ones, all written (they
// fit in its buffer): for a process started with its read end and
// SecretsFDVar of that descriptor, whose HideFromAgent reads them there,
// up to the end of the pipe, which comes when the caller closes the write
// end. With none of the names in environ the pipe is nil.
func SecretsPipe(environ []string, names ...string) (kept []string, r, w *os.File, err error) {
	var secrets []string
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); slices.Contains(names, k) {
			secrets = append(secrets, kv)
		} else {
			kept = append(kept, kv)
		}
	}
	if len(secrets) == 0 {
		return environ, nil, nil, nil
	}
	payload := strings.Join(secrets, "\x00")
	if len(payload) > maxSecrets {
		return nil, nil, nil, fmt.Errorf("the secrets in the environment take %d bytes, over %d", len(payload), maxSecrets)
	}
	if r, w, err = os.Pipe(); err != nil {
		return nil, nil, nil, fmt.Errorf("pipe: %w", err)
	}
	if _, err = io.WriteString(w, payload); err != nil {
		r.Close()
		w.Close()
		return nil, nil, nil, fmt.Errorf("write the secrets to a pipe: %w", err)
	}
	return kept, r, w, nil
}

// SecretsFDVar is the environment variable that tells a process started
// with SecretsPipe's read end at descriptor fd where its secrets are.
func SecretsFDVar(fd int) string { return secretsFDEnv + "=" + strconv.Itoa(fd) }

// environGuarded reports whether this kernel's /proc/<pid>/environ obeys
// dumpability (a variable, for the tests of the other path): Linux's does (it reads the process's memory through the
// ptrace access check) and its /proc/self/stat says where the environment
// lies (env_start, field 50); gVisor's serves environ to every process and
// reports env_start as 0. Anything that cannot be read counts as not
// guarded.
var environGuarded = func() bool {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return false
	}
	// Fields from the third on follow the command's closing parenthesis
	// (the command may hold spaces and parentheses itself).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return false
	}
	fields := strings.Fields(string(b[i+1:]))
	const envStart = 50 - 3
	if len(fields) <= envStart {
		return false
	}
	n, err := strconv.ParseUint(fields[envStart], 10, 64)
	return err == nil && n != 0
}

// execEnvironHolds reports whether the environment this process was
// started with, which /proc/self/environ shows, holds any of the variables
// names: a warm sandbox's worker got its task's environment later, on its
// start pipe, and has nothing there to hide. Unreadable, it may hold them.
func execEnvironHolds(names []string) bool {
	b, err := os.ReadFile("/proc/self/environ")
	if err != nil {
		return true
	}
	for kv := range strings.SplitSeq(string(b), "\x00") {
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				return true
			}
		}
	}
	return false
}

// readSecrets reads the secrets from the descriptor fd names, closes it,
// and returns environ without secretsFDEnv and with the secrets.
func readSecrets(environ []string, fd string) ([]string, error) {
	n, err := strconv.Atoi(fd)
	if err != nil || n < 3 {
		return nil, fmt.Errorf("%s=%q is not a descriptor", secretsFDEnv, fd)
	}
	f := os.NewFile(uintptr(n), "secrets")
	b, err := io.ReadAll(io.LimitReader(f, maxSecrets))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("read the secrets: %w", err)
	}
	out := slices.DeleteFunc(slices.Clone(environ), func(kv string) bool { return strings.HasPrefix(kv, secretsFDEnv+"=") })
	if len(b) > 0 {
		out = append(out, strings.Split(string(b), "\x00")...)
	}
	return out, nil
}
