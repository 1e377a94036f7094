package workercmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/sandbox/warmstart"
	"github.com/corral-dev/corral/internal/worker"
	"github.com/corral-dev/corral/internal/workerproto"
)

// warmPodGiveUp is how long a warm pod's worker keeps trying to reach a
// server that does not answer before it takes it for gone and exits.
const warmPodGiveUp = time.Minute

// runWarmPod is `corral worker warm` in a warm pod: it polls the server
// at workerproto.EnvServerURL, as the pod's id and with its token, for
// the task that claims the pod, and runs it as a cold pod would have: its
// environment is the pod's (the operator's Secret of API keys), less
// Corral's variables, with the task's over it. A server that refuses the
// pod (it destroyed the pod, or is a new server that did not make it), or
// that cannot be reached for warmPodGiveUp, means no task will come: the
// worker exits workerproto.ExitNoTask and the pod ends (a claimed pod's
// end then says that its task never started).
func runWarmPod(ctx context.Context, stderr io.Writer) int {
	var id, token, serverURL string
	var base []string
	for _, kv := range os.Environ() {
		switch k, v, _ := strings.Cut(kv, "="); {
		case k == workerproto.EnvWarmID:
			id = v
		case k == workerproto.EnvWarmToken:
			token = v
		case k == workerproto.EnvServerURL:
			serverURL = v
		case !strings.HasPrefix(k, workerproto.EnvPrefix):
			base = append(base, kv)
		}
	}
	// The token is the pod's until its start: nothing of the task sees it.
	os.Unsetenv(workerproto.EnvWarmToken)
	debug.FreeOSMemory()
	st, err := pollWarmStart(ctx, serverURL, id, token, stderr)
	if errors.Is(err, warmstart.ErrNoTask) {
		return workerproto.ExitNoTask
	}
	if err != nil {
		fmt.Fprintf(stderr, "corral worker warm: %v\n", err)
		return worker.ExitSetup
	}
	return runStart(ctx, st, warmstart.Overlay(base, st.Env), stderr)
}

// pollWarmStart polls GET /api/warm/{id}/start until it answers the
// pod's start, or warmstart.ErrNoTask when none will come. A failed poll
// (the server out of reach, or its answer cut short) is tried again.
func pollWarmStart(ctx context.Context, serverURL, id, token string, stderr io.Writer) (warmstart.Start, error) {
	dial, prefix, err := urlDialer(serverURL)
	if err != nil {
		return warmstart.Start{}, err
	}
	// The dialer speaks TLS itself for https: to the transport the
	// connection is plain HTTP.
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
	}}
	target := "http://server" + prefix + "/api/warm/" + id + "/start"
	lastOK := time.Now()
	for wait := 100 * time.Millisecond; ; {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return warmstart.Start{}, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err == nil {
			lastOK = time.Now()
			switch resp.StatusCode {
			case http.StatusOK:
				// A start cut short (the server died while it went
				// out, the connection broke) is never acted on, not
				// even in part: the pod asks again, and the server,
				// this one or the next, answers the same start.
				b, err := io.ReadAll(io.LimitReader(resp.Body, warmstart.MaxBytes+1))
				resp.Body.Close()
				if err == nil {
					return warmstart.Receive(bytes.NewReader(b))
				}
				fmt.Fprintf(stderr, "corral worker warm: its start was cut short (%v); asking again\n", err)
			case http.StatusNoContent:
				resp.Body.Close()
				wait = 100 * time.Millisecond
				continue
			case http.StatusNotFound, http.StatusForbidden, http.StatusUnauthorized:
				resp.Body.Close()
				return warmstart.Start{}, warmstart.ErrNoTask
			}
			resp.Body.Close()
		}
		if ctx.Err() != nil || time.Since(lastOK) > warmPodGiveUp {
			return warmstart.Start{}, warmstart.ErrNoTask
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}
