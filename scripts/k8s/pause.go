//go:build ignore

// Command pause is the pod sandbox ("pause") container of the test cluster
// that scripts/k8s/up.sh starts: it holds the pod's namespaces open, does
// nothing else, reaps the orphans a pod's containers leave behind (it is
// PID 1 when the pod shares its process namespace) and exits on SIGTERM or
// SIGINT. lib.sh builds it as a static binary into a one-file image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Several children may exit for one delivered SIGCHLD.
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
