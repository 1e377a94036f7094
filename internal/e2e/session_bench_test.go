//go:build integration

package e2e_test

import (
	"bufio"
	"context"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/testenv"
)

// BenchmarkSessionExec times `echo hi` in a running session through the
// API and the session's exec agent (the first byte of output and the whole
// command, as the client sees them), beside the same command entered from
// outside: nsenter into the local session's sandbox, and docker exec into
// the docker session's container. Each round runs every kind once; the
// metrics are medians, and the ratios say how much faster the session is.
//
//	go test -tags integration -run '^$' -bench SessionExec -benchtime 200x ./internal/e2e/
func BenchmarkSessionExec(b *testing.B) {
	testenv.RequireBwrap(b)
	testenv.RequireDocker(b)
	s := startServer(b, []string{}, nil, nil)
	ctx := context.Background()
	local, err := s.client.CreateSession(ctx, session.CreateRequest{Runtime: "local"})
	if err != nil {
		b.Fatal(err)
	}
	dock, err := s.client.CreateSession(ctx, session.CreateRequest{Runtime: "docker"})
	if err != nil {
		b.Fatal(err)
	}
	childPID, _ := localSandboxPID(b, s.data, local.SessionID)
	out, err := exec.Command("docker", "-H", "unix://"+testenv.DockerSocket, "ps", "-q", "--filter", "label=corral.sandbox-id="+dock.SessionID).Output()
	container := strings.TrimSpace(string(out))
	if err != nil || container == "" {
		b.Fatalf("the docker session's container: %v", err)
	}
	nsenter := []string{"nsenter", "--target", strconv.Itoa(childPID), "--user", "--mount", "--pid", "--net", "--ipc", "--uts", "--setuid", "1000", "--setgid", "1000", "--", "echo", "hi"}
	dockerExec := []string{"docker", "-H", "unix://" + testenv.DockerSocket, "exec", container, "echo", "hi"}

	var localFirst, localTotal, dockFirst, dockTotal, nsFirst, nsTotal, dxFirst, dxTotal []time.Duration
	viaAPI := func(id string) (first, total time.Duration) {
		start := time.Now()
		end, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: command("echo", "hi")}, func(ch httpapi.ExecChunk) error {
			if first == 0 {
				first = time.Since(start)
			}
			return nil
		})
		total = time.Since(start)
		if err != nil || end.ExitCode != 0 || first == 0 {
			b.Fatalf("exec in %s: %+v, %v", id, end, err)
		}
		return first, total
	}
	outside := func(argv []string) (first, total time.Duration) {
		start := time.Now()
		cmd := exec.Command(argv[0], argv[1:]...)
		pipe, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		line, err := bufio.NewReader(pipe).ReadString('\n')
		first = time.Since(start)
		if werr := cmd.Wait(); werr != nil || err != nil || line != "hi\n" {
			b.Fatalf("%v: %q, %v, %v", argv, line, err, werr)
		}
		return first, time.Since(start)
	}
	b.ResetTimer()
	for range b.N {
		f, t := viaAPI(local.SessionID)
		localFirst, localTotal = append(localFirst, f), append(localTotal, t)
		f, t = outside(nsenter)
		nsFirst, nsTotal = append(nsFirst, f), append(nsTotal, t)
		f, t = viaAPI(dock.SessionID)
		dockFirst, dockTotal = append(dockFirst, f), append(dockTotal, t)
		f, t = outside(dockerExec)
		dxFirst, dxTotal = append(dxFirst, f), append(dxTotal, t)
	}
	b.StopTimer()
	med := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(localFirst), "local-first-byte-ms")
	b.ReportMetric(med(localTotal), "local-total-ms")
	b.ReportMetric(med(nsFirst), "nsenter-first-byte-ms")
	b.ReportMetric(med(nsTotal), "nsenter-total-ms")
	b.ReportMetric(med(dockFirst), "docker-first-byte-ms")
	b.ReportMetric(med(dockTotal), "docker-total-ms")
	b.ReportMetric(med(dxFirst), "docker-exec-first-byte-ms")
	b.ReportMetric(med(dxTotal), "docker-exec-total-ms")
	b.ReportMetric(med(dxTotal)/med(dockTotal), "docker-exec/session")
	b.ReportMetric(med(nsTotal)/med(localTotal), "nsenter/session")
	b.ReportMetric(0, "ns/op")
}
