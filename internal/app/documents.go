package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/document"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/workspace"
)

// documentsDB is the document index's own database in the data root: a
// read model, rebuilt from the events whenever it is missing.
const documentsDB = "documents.db"

// documentIndex is the document index and what it holds open.
type documentIndex struct {
	ix    *document.Index
	db    *sqlite.ReadModel // documents.db
	files *os.Root          // documents/
}

// openDocuments opens the document index in its own database and brings
// it up to date with the events (a full rebuild on first start, after a
// schema change, or when documents.db was removed).
func (a *App) openDocuments(ctx context.Context) error {
	var err error
	if a.docs.db, err = sqlite.OpenReadModel(ctx, filepath.Join(a.data.Path(), documentsDB)); err != nil {
		return err
	}
	if a.docs.files, err = a.data.Root().OpenRoot(workspace.DirDocuments); err != nil {
		return fmt.Errorf("open documents: %w", err)
	}
	log := a.log.With("subsystem", "documents")
	a.docs.ix, err = document.Open(ctx, document.Options{Read: a.docs.db.Read, Write: a.docs.db.Write, Events: a.store, Files: a.docs.files}, log)
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
	if a.docs.db != nil {
		a.docs.db.Close()
	}
	if a.docs.files != nil {
		a.docs.files.Close()
	}
}
