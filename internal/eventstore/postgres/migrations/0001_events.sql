-- The event log (SPEC §3). position is the global order, handed out from
-- event_head under its row lock, so in commit order without gaps (see the
-- package doc); (stream_id, stream_version) is the per-stream order that
-- optimistic concurrency checks, and its uniqueness refuses the second of
-- two appends that reach one version. data is json, not jsonb: it keeps
-- the appended text as it was, as SQLite does. recorded_at has
-- microseconds.
CREATE TABLE events (
	position       bigint      PRIMARY KEY CHECK (position > 0),
	event_id       text        NOT NULL CONSTRAINT events_event_id_key UNIQUE,
	stream_id      text        NOT NULL,
	stream_version bigint      NOT NULL CHECK (stream_version > 0),
	type           text        NOT NULL,
	schema_version integer     NOT NULL,
	data           json,
	actor          text        NOT NULL DEFAULT '',
	correlation_id text        NOT NULL DEFAULT '',
	causation_id   text        NOT NULL DEFAULT '',
	recorded_at    timestamptz NOT NULL,
	CONSTRAINT events_stream_version_key UNIQUE (stream_id, stream_version)
);

-- The last position handed out, in its only row. An append raises it in
-- its own transaction; the row lock that takes holds every other append
-- until this one commits or rolls back. Its committed value is the head:
-- the highest committed position.
CREATE TABLE event_head (
	only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
	position bigint  NOT NULL CHECK (position >= 0)
);
INSERT INTO event_head (position) VALUES (0);
