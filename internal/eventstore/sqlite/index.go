package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
)

// OpenReadModelWriter opens a write connection to the store's file for read
// models that keep their own tables beside the events (the document index).
// The caller owns it and closes it before Close.
//
// It is a second writer next to the event writer, which SQLite serialises
// with its write lock: a read-model transaction holds that lock for its
// length, and an Append arriving meanwhile waits for it (up to the busy
// timeout, 5 s). Read models must therefore keep their transactions short
// (a batch of a few hundred rows, milliseconds) and must never write the
// events table. They run with synchronous=NORMAL: a commit may be lost on
// power failure, which a read model rebuilt from events can afford; the
// events keep synchronous=FULL.
func (s *Store) OpenReadModelWriter(ctx context.Context) (*sql.DB, error) {
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	q.Set("_foreign_keys", "1")
	q.Set("_synchronous", "NORMAL")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", s.path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open read-model writer: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open read-model writer: %w", err)
	}
	return db, nil
}
