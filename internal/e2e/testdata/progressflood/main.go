// Command progressflood is built by internal/app's progress flood test and
// run inside a sandbox as a command agent. It reads its task's id and
// webhook key from keyFile in its task directory, which the test writes
// (playing a worker whose key got out: an agent cannot read it), then
// posts signed progress reports of 32 large items, each with a fresh
// webhook id, from 8 goroutines as fast as the server answers, for the
// duration its argument names. It writes how the server answered to
// output/flood.json.
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/webhook"
)

// report is output/flood.json.
type report struct {
	Accepted   int    `json:"accepted"`
	Limited    int    `json:"limited"` // answered 429
	Other      int    `json:"other"`
	FirstError string `json:"first_error,omitempty"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "progressflood:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return errors.New("usage: progressflood DURATION")
	}
	d, err := time.ParseDuration(os.Args[1])
	if err != nil {
		return err
	}
	taskID, key, err := findKey()
	if err != nil {
		return err
	}
	items := make([]webhook.ProgressItem, webhook.MaxProgressItems)
	for i := range items {
		items[i] = webhook.ProgressItem{Kind: "text", Text: strings.Repeat("flood ", 170)}
	}
	var (
		mu  sync.Mutex
		rep report
		wg  sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				err := webhook.PostProgress(context.Background(), "unix:///run/corral/sock/corral.sock", key,
					webhook.ProgressReport{TaskID: taskID, Items: items}, webhook.PostOptions{AttemptTimeout: 5 * time.Second})
				mu.Lock()
				switch {
				case err == nil:
					rep.Accepted++
				case errors.Is(err, errdefs.ErrResourceExhausted):
					rep.Limited++
				default:
					rep.Other++
					if rep.FirstError == "" {
						rep.FirstError = err.Error()
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	return os.WriteFile("output/flood.json", b, 0o644)
}

// keyFile holds "TASK_ID HEX_KEY", written by the test after the spawn.
const keyFile = "flood-key"

// findKey waits up to 30 s for keyFile and reads the task's id and key.
func findKey() (string, []byte, error) {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(keyFile)
		if f := strings.Fields(string(b)); err == nil && len(f) == 2 {
			key, err := hex.DecodeString(f[1])
			return f[0], key, err
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("no task id and key in %s after 30 s: %v", keyFile, err)
		}
	}
}
