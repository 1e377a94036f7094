// Command progressflood is built by internal/app's progress flood test and
// run inside a sandbox as a command agent. It finds its task's id and
// webhook key where any agent can (the worker's environment, in /proc),
// then posts signed progress reports of 32 large items, each with a fresh
// webhook id, from 8 goroutines as fast as the server answers, for the
// duration its argument names. It writes how the server answered to
// output/flood.json.
package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// findKey reads CORRAL_TASK_ID and CORRAL_WEBHOOK_KEY from the environment
// of a process of the sandbox: the worker's.
func findKey() (string, []byte, error) {
	envs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range envs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var taskID, hexKey string
		for _, kv := range bytes.Split(b, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("CORRAL_TASK_ID=")); ok {
				taskID = string(v)
			}
			if v, ok := bytes.CutPrefix(kv, []byte("CORRAL_WEBHOOK_KEY=")); ok {
				hexKey = string(v)
			}
		}
		if taskID != "" && hexKey != "" {
			key, err := hex.DecodeString(hexKey)
			return taskID, key, err
		}
	}
	return "", nil, errors.New("no process of the sandbox shows CORRAL_TASK_ID and CORRAL_WEBHOOK_KEY")
}
