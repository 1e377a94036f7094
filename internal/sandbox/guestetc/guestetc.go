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
// including empty mount points for the entries of HostBinds that exist on
// the host: the directory itself is bound read-only, so a runtime could not
// create them inside. It returns the names of those entries, for the
// runtime to bind /etc/<name> read-only over them.
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
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("write etc/%s: %w", name, err)
		}
	}
	var binds []string
	for _, name := range HostBinds {
		st, err := os.Stat(filepath.Join("/etc", name))
		if err != nil {
			continue
		}
		mp := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(mp), 0o755); err != nil {
			return nil, fmt.Errorf("create etc mount point %s: %w", name, err)
		}
		if st.IsDir() {
			err = os.Mkdir(mp, 0o755)
		} else {
			err = os.WriteFile(mp, nil, 0o644)
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create etc mount point %s: %w", name, err)
		}
		binds = append(binds, name)
	}
	return binds, nil
}
