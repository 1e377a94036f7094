-- The event log. position is the global order (the rowid, assigned by the
-- single writer without gaps); (stream_id, stream_version) is the per-stream
-- order that optimistic concurrency checks. recorded_at is UTC text in a
-- fixed-width RFC 3339 form so it sorts as text.
CREATE TABLE events (
	position       INTEGER PRIMARY KEY,
	event_id       TEXT    NOT NULL UNIQUE,
	stream_id      TEXT    NOT NULL,
	stream_version INTEGER NOT NULL CHECK (stream_version > 0),
	type           TEXT    NOT NULL,
	schema_version INTEGER NOT NULL,
	data           TEXT,
	actor          TEXT    NOT NULL DEFAULT '',
	correlation_id TEXT    NOT NULL DEFAULT '',
	causation_id   TEXT    NOT NULL DEFAULT '',
	recorded_at    TEXT    NOT NULL,
	UNIQUE (stream_id, stream_version)
) STRICT;
