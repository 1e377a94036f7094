-- Checkpoints (eventstore.Checkpoints): a reader's state at a position of
-- the log, one row per name, the newest only. Nothing here is the truth:
-- every row can be dropped and is made again from the events.
CREATE TABLE checkpoints (
	name     TEXT    PRIMARY KEY,
	position INTEGER NOT NULL CHECK (position >= 0),
	data     BLOB    NOT NULL,
	saved_at TEXT    NOT NULL
) STRICT;
