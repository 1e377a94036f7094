package sandboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
)

func TestFakeConformance(t *testing.T) {
	Run(t, Harness{
		Setup: func(t *testing.T) func() sandbox.Runtime {
			f := NewFake()
			return func() sandbox.Runtime {
				f = f.Restart()
				return f
			}
		},
		Unisolated: true,
	})
}

func TestFakeScriptedRun(t *testing.T) {
	release := make(chan struct{})
	f := NewFake()
	f.Run = func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus {
		if spec.ID != "task-1" {
			<-ctx.Done() // only Stop ends the others
			return sandbox.ExitStatus{Code: 143}
		}
		select {
		case <-release:
			return sandbox.ExitStatus{Code: 2}
		case <-ctx.Done():
			return sandbox.ExitStatus{Code: 143}
		}
	}
	ctx := context.Background()
	spec := sandbox.Spec{ID: "task-1", Labels: map[string]string{sandbox.LabelTaskID: "1"}}
	if _, err := f.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.Status(ctx, "task-1"); st.State != sandbox.StateRunning {
		t.Errorf("State = %s, want running", st.State)
	}
	close(release)
	if es, err := f.Wait(ctx, "task-1"); err != nil || es.Code != 2 {
		t.Errorf("Wait = %+v, %v; want code 2", es, err)
	}
	if _, err := f.Create(ctx, sandbox.Spec{ID: "task-2"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Stop(ctx, "task-2", time.Second); err != nil {
		t.Fatal(err)
	}
	if es, _ := f.Wait(ctx, "task-2"); es.Code != 143 {
		t.Errorf("stopped Run exit = %d, want 143", es.Code)
	}
	f.Destroy(ctx, "task-1")
	if diff := cmp.Diff([]string{"task-1", "task-2"}, []string{f.Created()[0].ID, f.Created()[1].ID}); diff != "" {
		t.Errorf("Created (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"task-2"}, f.Stopped()); diff != "" {
		t.Errorf("Stopped (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"task-1"}, f.Destroyed()); diff != "" {
		t.Errorf("Destroyed (-want +got):\n%s", diff)
	}
}

func TestFakeCreateErr(t *testing.T) {
	f := NewFake()
	f.Run = func(ctx context.Context, spec sandbox.Spec) sandbox.ExitStatus { return sandbox.ExitStatus{} }
	f.CreateErr = func(sandbox.Spec) error { return errdefs.ErrUnavailable }
	if _, err := f.Create(context.Background(), sandbox.Spec{ID: "x"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Create = %v, want ErrUnavailable", err)
	}
	if _, err := f.Status(context.Background(), "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("failed Create left a sandbox: %v", err)
	}
}
