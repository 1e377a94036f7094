package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

// corral store copy, end to end: a data root's log into PostgreSQL and
// into a new data root from there, as the configuration names them; a
// second run finds the copy done; a data root a server holds is refused;
// the connection string is never shown.
func TestStoreCopy(t *testing.T) {
	for _, k := range []string{"CORRAL_CONFIG", "CORRAL_DATA", "CORRAL_STORE_DRIVER", "CORRAL_STORE_DSN"} {
		t.Setenv(k, "") // empty is unset: the test's configuration alone
	}
	ctx := context.Background()
	dir := t.TempDir()
	root := filepath.Join(dir, "data")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	const secret = "sekrit-in-the-dsn"
	dsn := postgrestest.New(t).DSN
	dsnFile := filepath.Join(dir, "pg.dsn")
	// The password goes unused (the test's server lets its user in by
	// peer authentication) but is part of the string, which must not show.
	if err := os.WriteFile(dsnFile, []byte(postgrestest.WithSetting(dsn, "password", secret)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "corral.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "data: %s\nstore: {driver: postgres, dsn_file: %s}\n", root, dsnFile), 0o600); err != nil {
		t.Fatal(err)
	}

	s, err := sqlite.Open(ctx, filepath.Join(root, "corral.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cctx := eventstore.WithCause(ctx, eventstore.Cause{CorrelationID: "corr_1", CausationID: "request/1"})
	for i := range 40 {
		if _, err := s.Append(cctx, fmt.Sprintf("task/%d", i%4), eventstore.AnyVersion,
			eventstore.Proposed{Type: "t.step", SchemaVersion: 1, Data: json.RawMessage(fmt.Sprintf(`{"i":%d,"s":"✓ \u0000"}`, i)), Actor: "alice"},
			eventstore.Proposed{Type: "t.none", SchemaVersion: 1}); err != nil {
			t.Fatal(err)
		}
	}
	want := storetest.MustReadAll(t, s, 0)
	// The copy notes the events whose recorded_at has a part below the
	// microsecond: not all of them, as a clock's reading can be a whole
	// microsecond (1 in 1,000; the test's 40 commits met one now and then).
	fine := 0
	for i := range want {
		if want[i].RecordedAt.Nanosecond()%1000 != 0 {
			fine++
		}
		want[i].RecordedAt = want[i].RecordedAt.Truncate(time.Microsecond)
	}

	corral := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(ctx, args, &stdout, &stderr)
		if strings.Contains(stdout.String()+stderr.String(), secret) {
			t.Errorf("corral %s showed the connection string: %s%s", strings.Join(args, " "), stdout.String(), stderr.String())
		}
		return code, stdout.String(), stderr.String()
	}

	// s is open: a server holds the data root.
	code, _, stderr := corral("store", "copy", "--to", "postgres", "--config", cfg)
	if code != 1 || !strings.Contains(stderr, "corral store copy: copy the event log from sqlite to postgres: a Corral server is running on the data root "+root+": stop it") {
		t.Errorf("copy from a data root in use: exit %d, %q", code, stderr)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := corral("store", "copy", "--to", "postgres", "--config", cfg, "--batch", "7")
	if code != 0 {
		t.Fatalf("copy to postgres: exit %d: %s", code, stderr)
	}
	for _, line := range []string{
		"from:      SQLite " + filepath.Join(root, "corral.db"),
		"to:        PostgreSQL database \"",
		"events:    80 in 4 streams",
		"copied:    80 events in ",
		"verified:  every field of every event",
		"sha256:    ",
		fmt.Sprintf("note:      %d events keep their recorded_at to the microsecond only", fine),
		"To run on the copy: corral serve with this configuration",
	} {
		if !strings.Contains(stdout, line) {
			t.Errorf("copy to postgres: no %q in\n%s", line, stdout)
		}
	}
	pg, err := postgres.Open(ctx, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := storetest.MustReadAll(t, pg, 0)
	pg.Close()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PostgreSQL's log (-want +got):\n%s", diff)
	}

	other := filepath.Join(dir, "other")
	code, stdout, stderr = corral("store", "copy", "--to", "sqlite", "--config", cfg, "--data", other)
	if code != 0 || !strings.Contains(stdout, "to:        SQLite "+filepath.Join(other, "corral.db")) || strings.Contains(stdout, "note:") {
		t.Fatalf("copy to sqlite: exit %d: %s%s", code, stdout, stderr)
	}
	code, stdout, _ = corral("store", "copy", "--to", "sqlite", "--config", cfg, "--data", other)
	if code != 0 || !strings.Contains(stdout, "resumed:   the target held the log up to position 80 already") || !strings.Contains(stdout, "copied:    0 events") {
		t.Errorf("second copy to sqlite: exit %d: %s", code, stdout)
	}
	back, err := sqlite.Open(ctx, filepath.Join(other, "corral.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if diff := cmp.Diff(want, storetest.MustReadAll(t, back, 0)); diff != "" {
		t.Errorf("the new data root's log (-want +got):\n%s", diff)
	}
}

// corral store's usage errors, and a configuration without PostgreSQL.
func TestStoreCopyUsage(t *testing.T) {
	for _, k := range []string{"CORRAL_CONFIG", "CORRAL_STORE_DRIVER", "CORRAL_STORE_DSN"} {
		t.Setenv(k, "")
	}
	cfg := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(cfg, []byte("data: "+filepath.Dir(cfg)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"store"}, 2, "give a command: copy"},
		{[]string{"store", "--help"}, 0, "copy        Copy the event log"},
		{[]string{"store", "move"}, 2, `unknown store command "move"`},
		{[]string{"store", "copy", "--help"}, 0, "--to"},
		{[]string{"store", "copy", "--config", cfg}, 2, "--to must be postgres or sqlite"},
		{[]string{"store", "copy", "--to", "mysql", "--config", cfg}, 2, "--to must be postgres or sqlite"},
		{[]string{"store", "copy", "--to", "sqlite", "--batch", "0", "--config", cfg}, 2, "--batch must be at least 1"},
		{[]string{"store", "copy", "--to", "postgres", "--config", cfg, "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"store", "copy", "--to", "postgres", "--config", cfg}, 2, "no PostgreSQL database to copy into: set store.driver: postgres with store.dsn_file"},
		{[]string{"store", "copy", "--to", "sqlite", "--config", cfg}, 2, "no PostgreSQL database to copy from"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("corral %s: exit %d, want %d; output %q, want %q in it", strings.Join(tc.args, " "), code, tc.code, stdout.String()+stderr.String(), tc.out)
		}
	}
}
