-- The servers (replicas) sharing this database, each with its lease: a
-- replica renews renewed_at every second (cluster.Renew) and is dead once
-- cluster.TTL passed without a renewal, by this database's clock, so no
-- replica's clock decides. What a replica runs names it in its events;
-- this table only says who is alive. clock_skew_ms is the replica's clock
-- against this database's, as it last measured it (corral doctor shows
-- them); url is where the others reach its API. Rows of replicas dead for
-- an hour are removed by the others.
CREATE TABLE replicas (
	id            text        PRIMARY KEY,
	host          text        NOT NULL DEFAULT '',
	url           text        NOT NULL DEFAULT '',
	runtimes      text[]      NOT NULL DEFAULT '{}',
	clock_skew_ms bigint      NOT NULL DEFAULT 0,
	started_at    timestamptz NOT NULL,
	renewed_at    timestamptz NOT NULL
);
