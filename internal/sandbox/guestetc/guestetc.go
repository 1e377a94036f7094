// Package guestetc writes the minimal /etc a host-runtime sandbox
// (sandbox/local, sandbox/gvisor) sees instead of the host's: its own
// passwd, group, hosts, hostname and nsswitch.conf, optionally a
// resolv.conf, and empty mount points for the few host entries bound over
// it read-only (CA certificates, the dynamic linker cache, the time zone).
package guestetc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// HostBinds are the host /etc entries a sandbox sees read-only when they
// exist: CA certificates (ssl/certs, never all of ssl/: ssl/private holds
// the host's keys), the dynamic linker cache, time zone, alternatives.
var HostBinds = []string{"alternatives", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "ld.so.cache", "localtime"}

// ResolvConf is the sandbox's resolv.conf when it has a network. The
// sandbox's network namespace has only loopback, and names are resolved by
// the egress proxy, which the agent reaches through HTTP_PROXY; nothing
// answers DNS inside. The file says so explicitly, so a direct lookup fails
// at once with "connection refused" instead of after glibc's 5 s timeout
// times attempts.
const ResolvConf = "# Names are resolved by the egress proxy (HTTP_PROXY); no DNS server answers here.\n" +
	"nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"

// Options says what Write writes.
type Options struct {
	// UID and GID are the sandbox user's ("worker") ids.
	UID, GID int
	// ResolvConf writes resolv.conf (ResolvConf); without it there is
	// none at all.
	ResolvConf bool
}

// Write writes the sandbox's minimal /etc into dir (created if missing),
// then its mount points (MountPoints), and returns the names of the entries
// for the runtime to bind /etc/<name> read-only over them. Each file is
// replaced atomically (a temporary file renamed over it), so that Write
// may refresh a dir that running sandboxes have bound: they see the old
// file or the new one, never a part of one.
func Write(dir string, o Options) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create etc dir: %w", err)
	}
	u, g := strconv.Itoa(o.UID), strconv.Itoa(o.GID)
	files := map[string]string{
		"passwd":        "root:x:0:0:root:/root:/usr/sbin/nologin\nworker:x:" + u + ":" + g + ":worker:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group":         "root:x:0:\nworker:x:" + g + ":\nnogroup:x:65534:\n",
		"hosts":         "127.0.0.1\tlocalhost corral\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"hostname":      "corral\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
	}
	if o.ResolvConf {
		files["resolv.conf"] = ResolvConf
	}
	for name, content := range files {
		if err := replaceFile(dir, name, content); err != nil {
			return nil, fmt.Errorf("write etc/%s: %w", name, err)
		}
	}
	return MountPoints(dir)
}

// replaceFile writes content to dir/name through a temporary file of its
// own (two writers never share one) renamed over it.
func replaceFile(dir, name, content string) error {
	f, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	err = errors.Join(err, f.Chmod(0o644), f.Close())
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// MountPoints makes sure dir holds an empty mount point for each entry of
// HostBinds that exists on the host now (dir itself is bound read-only, so
// a runtime could not create them inside), and returns their names. It
// only looks when they exist already, so a runtime calls it for every
// sandbox, and an entry that appears on the host later is bound from then
// on.
func MountPoints(dir string) ([]string, error) {
	var binds []string
	for _, name := range HostBinds {
		st, err := os.Stat(filepath.Join("/etc", name))
		if err != nil {
			continue
		}
		mp := filepath.Join(dir, name)
		if _, err := os.Lstat(mp); err != nil {
			if err := mountPoint(mp, st.IsDir()); err != nil {
				return nil, fmt.Errorf("create etc mount point %s: %w", name, err)
			}
		}
		binds = append(binds, name)
	}
	return binds, nil
}

// mountPoint creates an empty directory or file at mp; one that exists
// already (made meanwhile by another caller) will do.
func mountPoint(mp string, isDir bool) error {
	if err := os.MkdirAll(filepath.Dir(mp), 0o755); err != nil {
		return err
	}
	var err error
	if isDir {
		err = os.Mkdir(mp, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(mp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
			err = f.Close()
		}
	}
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	return err
}
