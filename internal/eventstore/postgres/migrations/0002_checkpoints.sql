-- Checkpoints (eventstore.Checkpoints): a reader's state at a position of
-- the log, one row per name, the newest only. Nothing here is the truth:
-- every row can be dropped and is made again from the events. Several
-- servers may save the same name; SaveCheckpoint's upsert never moves a
-- row to a lower position.
CREATE TABLE checkpoints (
	name     text        PRIMARY KEY,
	position bigint      NOT NULL CHECK (position >= 0),
	data     bytea       NOT NULL,
	saved_at timestamptz NOT NULL DEFAULT now()
);
-- Kept out of line but not compressed: a start reads a checkpoint to be
-- quick, and pglz would make it inflate the megabytes of a large one
-- first, where the disk it saves is small.
ALTER TABLE checkpoints ALTER COLUMN data SET STORAGE EXTERNAL;
