// Package postgrestest makes PostgreSQL databases for tests: one of each
// test's own on the server testenv.PostgresDSN finds, dropped at its end.
package postgrestest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/testenv"
)

// Database is a test's database.
type Database struct {
	Name  string
	DSN   string // the test's database, as the admin
	Admin string // the admin's, on its own database
}

// New makes a database with a random name for tb, dropped when tb ends
// (after what tb opened on it later has closed: cleanups run last in,
// first out). It skips tb, or fails it under CI, when no PostgreSQL server
// answers (testenv.PostgresDSN).
func New(tb testing.TB) Database {
	tb.Helper()
	admin := testenv.PostgresDSN(tb)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		testenv.Missing(tb, fmt.Sprintf("cannot log in to PostgreSQL as an admin (%v; %s)", err, testenv.PostgresInstall))
	}
	defer conn.Close(ctx)
	name := "corral_test_" + strings.ToLower(rand.Text()[:16])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			tb.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	return Database{Name: name, DSN: WithSetting(admin, "dbname", name), Admin: admin}
}

// WithSetting is dsn with key set to value, in either of its forms.
func WithSetting(dsn, key, value string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		if key == "dbname" {
			u.Path = "/" + value
			q.Del(key)
		} else {
			q.Set(key, value)
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + key + "='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(value) + "'" // the last of a key's settings wins
}
