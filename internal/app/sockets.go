package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/connlimit"
	"github.com/corral-dev/corral/internal/lockfile"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// sockets are the unix sockets a host's sandboxes reach the server on
// (workerproto.ServerSocket), in run/sock of the data root, which every
// sandbox has mounted: the replica's own ("<replica>.sock"), which the
// sandboxes it starts dial; and the host's shared one beside it, which one
// replica on the host serves at a time, the one holding its lock file. A sandbox whose replica is gone dials the shared
// one: any replica takes any task's report, and a session's exec agent
// there is adopted with its session. When the shared socket's replica
// stops, the kernel drops its lock and another takes the socket over.
type sockets struct {
	own    net.Listener
	shared net.Listener   // nil while another replica serves it
	lock   *lockfile.File // the shared socket's, while this replica serves it
}

// socketDir is run/sock, where the sockets are.
func (a *App) socketDir() string { return a.data.HostPath(workspace.DirRun, "sock") }

// listenSockets listens on this replica's socket, and on the shared one
// if no other replica of the host serves it. The sockets of replicas gone
// are removed first: their sandboxes dial the shared socket.
func (a *App) listenSockets() error {
	dir := a.socketDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	a.removeSocketsGone()
	own := filepath.Join(dir, a.members.Self()+".sock")
	if len(own) > maxSocketPath {
		return fmt.Errorf("socket path %s is too long for a unix socket (%d bytes, at most %d): use a shorter data root", own, len(own), maxSocketPath)
	}
	var err error
	if a.sockets.own, err = a.listenSocket(own); err != nil {
		return err
	}
	shared := filepath.Join(dir, workerproto.SocketName)
	if a.sockets.lock, err = lockfile.TryAcquire(shared + ".lock"); err != nil || a.sockets.lock == nil {
		return err
	}
	a.sockets.shared, err = a.listenSocket(shared)
	return err
}

// maxSocketPath is the longest path a unix socket's address holds (108
// bytes with the terminating NUL, on Linux).
const maxSocketPath = 107

// listenSocket listens on sock, which every sandbox may dial.
func (a *App) listenSocket(sock string) (net.Listener, error) {
	os.Remove(sock) // a stale socket from a server that died
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("open socket %s to sandboxes: %w", sock, err)
	}
	// Every sandbox reaches it: none may take the server's descriptors.
	return connlimit.Sandboxes(ln, connlimit.PerSandbox, a.log.With("subsystem", "socket")), nil
}

// serveShared serves the shared socket, first waiting for its lock while
// another replica holds it, until ctx ends.
func (a *App) serveShared(ctx context.Context, srv *http.Server) error {
	shared := filepath.Join(a.socketDir(), workerproto.SocketName)
	for a.sockets.shared == nil {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
		l, err := lockfile.TryAcquire(shared + ".lock")
		if err != nil {
			return err
		}
		if l == nil {
			continue
		}
		if a.sockets.shared, err = a.listenSocket(shared); err != nil {
			l.Release()
			return err
		}
		a.sockets.lock = l
		a.log.Info("this replica serves the host's shared socket now", "socket", shared)
	}
	return ignoreClosed(srv.Serve(a.sockets.shared))
}

// removeSocketsGone removes the sockets of replicas that are not alive
// and have not been for a while (a replica makes its socket just after it
// joins, maybe after this one last read who is alive).
func (a *App) removeSocketsGone() {
	ents, err := os.ReadDir(a.socketDir())
	if err != nil {
		return
	}
	live := a.members.Live()
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".sock")
		if _, alive := live[id]; alive || !ok || e.Name() == workerproto.SocketName {
			continue
		}
		if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < 2*cluster.TTL {
			continue
		}
		if err := os.Remove(filepath.Join(a.socketDir(), e.Name())); err != nil {
			a.log.Warn("cannot remove the socket of a replica gone", "replica", id, "err", err)
		}
	}
}
