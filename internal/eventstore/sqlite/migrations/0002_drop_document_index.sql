-- The document index kept its tables in this file until it moved to a
-- database of its own (documents.db), which is rebuilt from the events:
-- nothing here is needed any more.
DROP TABLE IF EXISTS docindex_fts;
DROP TABLE IF EXISTS docindex_docs;
DROP TABLE IF EXISTS docindex_meta;
