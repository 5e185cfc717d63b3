-- The maintenance worker's record (src/store/maintenance/): one row per run in
-- this database, inserted when the run starts (finished stays NULL while it
-- runs, and for a run whose worker was stopped) and completed when it ends. The
-- worker keeps the newest 1,000 runs. A run that failed somewhere names the
-- first failure in error (and counts the others); it still did what it could,
-- and the next interval tries again.
CREATE TABLE maintenance_runs (
    run_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started       timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    finished      timestamptz,
    bands_dropped bigint      NOT NULL DEFAULT 0,
    bands_created bigint      NOT NULL DEFAULT 0,
    rows_deleted  bigint      NOT NULL DEFAULT 0,
    error         text
);
COMMENT ON TABLE maintenance_runs IS
    'Runs of the maintenance worker (pruning, bands created ahead) in this database, newest 1,000.';

-- The newest runs, newest first, with how long each took (NULL while it runs).
CREATE FUNCTION maintenance_status(max_runs integer DEFAULT 10)
RETURNS TABLE (run_id bigint, started timestamptz, finished timestamptz,
               duration interval, bands_dropped bigint, bands_created bigint,
               rows_deleted bigint, error text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.run_id, r.started, r.finished, r.finished - r.started,
           r.bands_dropped, r.bands_created, r.rows_deleted, r.error
      FROM @extschema@.maintenance_runs r
     ORDER BY r.run_id DESC
     LIMIT GREATEST(max_runs, 0)
$$;

COMMENT ON FUNCTION maintenance_status(integer) IS
    'The newest runs of the maintenance worker in this database, newest first.';

-- pg_dump carries this state (see "Backup, restore and moving hosts" in the docs):
-- a table created by an extension is otherwise left out of every dump.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.maintenance_runs', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.maintenance_runs_run_id_seq', '');
