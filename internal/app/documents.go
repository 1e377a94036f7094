package app

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	"github.com/corral-dev/corral/internal/document"
	"github.com/corral-dev/corral/internal/workspace"
)

// documentIndex is the document index and what it holds open.
type documentIndex struct {
	ix    *document.Index
	write *sql.DB  // the index's write connection to corral.db
	files *os.Root // documents/
}

// openDocuments opens the document index in the event store's database and
// brings it up to date with the events (a full rebuild on first start or
// after a schema change).
func (a *App) openDocuments(ctx context.Context) error {
	var err error
	if a.docs.write, err = a.store.OpenReadModelWriter(ctx); err != nil {
		return err
	}
	if a.docs.files, err = a.data.Root().OpenRoot(workspace.DirDocuments); err != nil {
		return fmt.Errorf("open documents: %w", err)
	}
	log := a.log.With("subsystem", "documents")
	a.docs.ix, err = document.Open(ctx, document.Options{Read: a.store.DB(), Write: a.docs.write, Events: a.store, Files: a.docs.files}, log)
	if err != nil {
		return err
	}
	if err := a.docs.ix.Sync(ctx); err != nil {
		return err
	}
	log.Info("document index ready", "position", a.docs.ix.Position())
	return nil
}

// closeDocuments releases the index's handles; before the store closes.
func (a *App) closeDocuments() {
	if a.docs.write != nil {
		a.docs.write.Close()
	}
	if a.docs.files != nil {
		a.docs.files.Close()
	}
}
