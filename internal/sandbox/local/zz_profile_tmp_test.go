//go:build linux

package local

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
)

func med(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

func TestZZProfile(t *testing.T) {
	r, _ := MustNew(t)
	ctx := context.Background()
	n := 40
	var etc, cg, launch, st1, ready, st2, create, wait, destroy, total []time.Duration
	lim := sandbox.Limits{MemoryBytes: 2 << 30, CPUMillis: 2000, Pids: 512}
	for i := 0; i < n; i++ {
		ws := t.TempDir()
		spec := sandbox.Spec{ID: sandboxtest.NewID(t), Command: []string{"/bin/echo", "hi"}, Limits: lim,
			Mounts: []sandbox.Mount{{Source: ws, Target: "/task"}}}
		// manual replay of start() with timers
		dir := r.dir(spec.ID + "-m")
		os.MkdirAll(dir, 0o700)
		t0 := time.Now()
		binds, _ := writeEtc(filepath.Join(dir, "etc"), 1000, 1000)
		t1 := time.Now()
		cgs, err := r.cg.create(spec.ID+"-m", lim)
		if err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		status, _ := os.OpenFile(filepath.Join(dir, "status.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
		out, _ := os.OpenFile(filepath.Join(dir, "output.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
		argv := append([]string{"bwrap"}, bwrapArgs(spec, r.opts, filepath.Join(dir, "etc"), binds)...)
		argv = launcher(procsFiles(cgs), argv)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = out, out
		cmd.ExtraFiles = []*os.File{status}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t3 := time.Now()
		s := state{ID: spec.ID, PID: cmd.Process.Pid}
		writeState(dir, s)
		t4 := time.Now()
		for {
			if info, ok := readStatus(dir); ok && info.ChildPID > 0 {
				s.ChildPID = info.ChildPID
				if hasChildren(s.ChildPID) {
					break
				}
			}
			time.Sleep(100 * time.Microsecond)
		}
		t5 := time.Now()
		writeState(dir, s)
		t6 := time.Now()
		cmd.Wait()
		t7 := time.Now()
		status.Close()
		out.Close()
		removeCgroups(cgs)
		os.RemoveAll(dir)
		etc = append(etc, t1.Sub(t0))
		cg = append(cg, t2.Sub(t1))
		launch = append(launch, t3.Sub(t2))
		st1 = append(st1, t4.Sub(t3))
		ready = append(ready, t5.Sub(t4))
		st2 = append(st2, t6.Sub(t5))
		wait = append(wait, t7.Sub(t6))

		// the real thing
		a := time.Now()
		if _, err := r.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		b := time.Now()
		r.Wait(ctx, spec.ID)
		c := time.Now()
		r.Destroy(ctx, spec.ID)
		d := time.Now()
		create = append(create, b.Sub(a))
		wait = append(wait, c.Sub(b))
		destroy = append(destroy, d.Sub(c))
		total = append(total, d.Sub(a))
	}
	t.Logf("manual: etc %v cgroup %v cmd.Start %v state1 %v ready-wait %v state2 %v", med(etc), med(cg), med(launch), med(st1), med(ready), med(st2))
	t.Logf("runtime: create %v wait %v destroy %v total %v", med(create), med(wait), med(destroy), med(total))
}
