package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// ClusterOptions configure RunCluster. Zero fields take the documented
// defaults.
type ClusterOptions struct {
	// AdminDSN is a PostgreSQL connection string of a role that may
	// create databases: each measure gets a new one, dropped after.
	AdminDSN string
	// Binary is the corral executable the replicas run; default this
	// process's.
	Binary string
	// Appends is how many events each store takes, from Writers
	// concurrent appenders on streams of their own; defaults 4000 and 16.
	Appends, Writers int
	// Tasks is how many tasks each throughput run spawns, from 8
	// clients; default 60. MaxConcurrent is the cluster's
	// max_concurrent_workers in every run; default 8.
	Tasks, MaxConcurrent int
	// ServerLog gets the replicas' log (warnings and errors); nil: none.
	ServerLog io.Writer
}

// ClusterResult is what RunCluster measured.
type ClusterResult struct {
	// AppendsPerSecond by store: "sqlite" and "postgres".
	AppendsPerSecond map[string]float64 `json:"appends_per_second"`
	// TasksPerSecond by the number of replicas: 1 and 3, each task
	// spawned through one of them in turn, `true` in a cold sandbox.
	TasksPerSecond map[int]float64 `json:"tasks_per_second"`
	// Failover is the time from the SIGKILL of the replica running the
	// most tasks to the first task_adopted a survivor's follower saw;
	// Adopted how many of its tasks were adopted in all.
	Failover time.Duration `json:"failover_ns"`
	Adopted  int           `json:"adopted"`
}

func (o *ClusterOptions) setDefaults() error {
	if o.AdminDSN == "" {
		return errors.New("a PostgreSQL connection string (a role that may create databases) is needed")
	}
	if o.Binary == "" {
		var err error
		if o.Binary, err = os.Executable(); err != nil {
			return err
		}
	}
	if o.Appends <= 0 {
		o.Appends = 4000
	}
	if o.Writers <= 0 {
		o.Writers = 16
	}
	if o.Tasks <= 0 {
		o.Tasks = 60
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 8
	}
	return nil
}

// RunCluster measures the event store on SQLite and PostgreSQL, task
// throughput with one and with three replicas on one database, and a
// replica's failover.
func RunCluster(ctx context.Context, opts ClusterOptions, log *slog.Logger) (*ClusterResult, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	res := &ClusterResult{AppendsPerSecond: map[string]float64{}, TasksPerSecond: map[int]float64{}}
	dir, err := os.MkdirTemp("", "corral-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// The sandboxes' identity must search it to reach their data roots.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}

	sq, err := sqlite.Open(ctx, filepath.Join(dir, "corral.db"), log)
	if err != nil {
		return nil, err
	}
	res.AppendsPerSecond["sqlite"], err = appendRate(ctx, sq, opts.Appends, opts.Writers)
	sq.Close()
	if err != nil {
		return nil, err
	}
	dsn, drop, err := newDatabase(ctx, opts.AdminDSN)
	if err != nil {
		return nil, err
	}
	pg, err := postgres.Open(ctx, dsn, log)
	if err == nil {
		res.AppendsPerSecond["postgres"], err = appendRate(ctx, pg, opts.Appends, opts.Writers)
		pg.Close()
	}
	drop()
	if err != nil {
		return nil, err
	}

	for _, n := range []int{1, 3} {
		c, err := startCluster(ctx, opts, dir, n, log)
		if err != nil {
			return nil, err
		}
		res.TasksPerSecond[n], err = c.throughput(ctx, opts.Tasks)
		c.stop()
		if err != nil {
			return nil, err
		}
	}

	c, err := startCluster(ctx, opts, dir, 3, log)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	res.Failover, res.Adopted, err = c.failover(ctx)
	return res, err
}

// appendRate appends n events from writers goroutines, each on streams
// of its own, and returns events per second.
func appendRate(ctx context.Context, s eventstore.Store, n, writers int) (float64, error) {
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				if _, err := s.Append(ctx, fmt.Sprintf("bench/%d", w), eventstore.AnyVersion,
					eventstore.Proposed{Type: "bench", Data: json.RawMessage(`{"i":1}`)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// newDatabase makes a database for one measure and returns its DSN and
// what drops it.
func newDatabase(ctx context.Context, admin string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("connect to PostgreSQL as its admin: %w", err)
	}
	name := "corral_bench_" + strings.ToLower(rand.Text()[:12])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, name)
	if cfg.Password != "" {
		dsn += " password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(cfg.Password) + "'"
	}
	return dsn, func() {
		conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
		conn.Close(context.Background())
	}, nil
}

// cluster is n replicas, `corral serve` processes on one new database and
// one new data root.
type cluster struct {
	procs   []*exec.Cmd
	clients []*httpapi.Client
	ids     []string
	data    string
	drop    func()
	stopped []bool
}

func startCluster(ctx context.Context, opts ClusterOptions, dir string, n int, log *slog.Logger) (*cluster, error) {
	dsn, drop, err := newDatabase(ctx, opts.AdminDSN)
	if err != nil {
		return nil, err
	}
	c := &cluster{drop: drop, stopped: make([]bool, n)}
	c.data, err = os.MkdirTemp(dir, "data-")
	if err != nil {
		drop()
		return nil, err
	}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.stop()
			return nil, err
		}
		addr := ln.Addr().String()
		ln.Close()
		cmd := exec.Command(opts.Binary, "serve", "--data", c.data, "--listen", addr)
		// No warm sandboxes: one a replica killed leaves would outlive the
		// bench (the next server on its data root destroys it).
		cmd.Env = append(os.Environ(), "CORRAL_STORE_DRIVER=postgres", "CORRAL_STORE_DSN="+dsn, "CORRAL_LOCAL_WARM_POOL=0",
			fmt.Sprintf("CORRAL_MAX_CONCURRENT=%d", opts.MaxConcurrent), "CORRAL_LOG_LEVEL=warn")
		cmd.Stderr = opts.ServerLog
		if err := cmd.Start(); err != nil {
			c.stop()
			return nil, err
		}
		c.procs = append(c.procs, cmd)
		client := httpapi.NewClient("http://"+addr, "")
		c.clients = append(c.clients, client)
		id, err := waitReplica(ctx, "http://"+addr)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.ids = append(c.ids, id)
	}
	return c, nil
}

// waitReplica waits until the server at url is ready and returns its
// replica id.
func waitReplica(ctx context.Context, url string) (string, error) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			continue
		}
		var h struct{ Replica string }
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && err == nil {
			return h.Replica, nil
		}
	}
	return "", fmt.Errorf("the replica at %s did not become ready", url)
}

// stop stops every replica still running (SIGTERM: sandboxes whose task
// ended go with them) and drops the database.
func (c *cluster) stop() {
	for i, p := range c.procs {
		if !c.stopped[i] {
			p.Process.Signal(syscall.SIGTERM)
			p.Wait()
			c.stopped[i] = true
		}
	}
	c.drop()
}

// throughput spawns n tasks of `true`, through each replica in turn from
// 8 clients, and returns tasks per second from the first spawn to the last
// end.
func (c *cluster) throughput(ctx context.Context, n int) (float64, error) {
	start := time.Now()
	var next atomic.Int64
	_, err := fanOut(ctx, n, 8, func(ctx context.Context) error {
		cl := c.clients[int(next.Add(1))%len(c.clients)]
		tk, _, err := cl.Spawn(ctx, service.SpawnRequest{TaskDescription: "bench", Agent: "command", Command: []string{"true"}})
		if err != nil {
			return err
		}
		res, err := cl.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: time.Minute})
		if err != nil {
			return err
		}
		if res.Status != task.Success {
			return fmt.Errorf("task %s ended %s: %s", tk.ID, res.Status, res.ErrorMessage)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// failover runs six long tasks, kills the replica running the most with
// SIGKILL, and times the first adoption a survivor sees.
func (c *cluster) failover(ctx context.Context) (time.Duration, int, error) {
	var ids []string
	for i := range 6 {
		tk, _, err := c.clients[i%len(c.clients)].Spawn(ctx, service.SpawnRequest{TaskDescription: "failover", Agent: "command", Command: []string{"sleep", "60"}})
		if err != nil {
			return 0, 0, err
		}
		ids = append(ids, tk.ID)
	}
	defer func() {
		for _, id := range ids {
			for i, cl := range c.clients {
				if !c.stopped[i] {
					cl.Cancel(context.Background(), id)
					break
				}
			}
		}
	}()
	var victim int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		page, err := c.clients[0].List(ctx, service.ListRequest{Status: string(task.Running), Limit: 100})
		if err != nil {
			return 0, 0, err
		}
		if len(page.Tasks) == len(ids) {
			count := map[string]int{}
			for _, t := range page.Tasks {
				count[t.Replica]++
			}
			for i, id := range c.ids {
				if count[id] > count[c.ids[victim]] {
					victim = i
				}
			}
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, errors.New("the failover's tasks did not all run")
		}
	}
	follower := c.clients[(victim+1)%len(c.clients)]
	adopted := make(chan time.Time, len(ids))
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go follower.Events(fctx, service.EventsRequest{After: service.AfterNow, Follow: true}, func(e eventstore.Event) error {
		if e.Type == task.EventAdopted {
			adopted <- time.Now()
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // the follower is connected
	killed := time.Now()
	c.procs[victim].Process.Kill()
	c.procs[victim].Wait()
	c.stopped[victim] = true
	var first time.Time
	n := 0
	for timeout := time.After(30 * time.Second); ; {
		select {
		case at := <-adopted:
			if n == 0 {
				first = at
			}
			n++
			continue
		case <-timeout:
		case <-time.After(3 * time.Second):
			if n == 0 {
				continue
			}
		}
		break
	}
	if n == 0 {
		return 0, 0, errors.New("no task was adopted within 30 s of the kill")
	}
	return first.Sub(killed), n, nil
}
