-- Partition listing and retention.

-- Every band partition: its originator, bounds (band_end NULL = MAXVALUE), the meta
-- and blob tables, live rows (from the statistics system, so approximate and a
-- moment behind) and bytes on disk (both tables with their indexes and TOAST).
CREATE FUNCTION partitions()
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               meta_partition regclass, blob_partition regclass,
               row_estimate bigint, total_bytes bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH bands AS (
        SELECT r.kind,
               (pg_catalog.regexp_match(pg_catalog.pg_get_expr(o.relpartbound, o.oid),
                                        '^FOR VALUES IN \((\d+)\)$'))[1]::integer AS node,
               b.oid AS leaf,
               pg_catalog.regexp_match(pg_catalog.pg_get_expr(b.relpartbound, b.oid),
                                       '^FOR VALUES FROM \((.*)\) TO \((.*)\)$') AS bound
          FROM (VALUES ('meta', '@extschema@.gateway_envelopes_meta'::pg_catalog.regclass),
                       ('blob', '@extschema@.gateway_envelopes_blob'::pg_catalog.regclass)) AS r(kind, root)
          JOIN pg_catalog.pg_inherits oi ON oi.inhparent = r.root
          JOIN pg_catalog.pg_class o ON o.oid = oi.inhrelid
          JOIN pg_catalog.pg_inherits bi ON bi.inhparent = o.oid
          JOIN pg_catalog.pg_class b ON b.oid = bi.inhrelid
    ), parsed AS (
        SELECT kind, node, leaf,
               NULLIF(pg_catalog.btrim(bound[1], ''''), 'MINVALUE')::bigint AS lo,
               NULLIF(pg_catalog.btrim(bound[2], ''''), 'MAXVALUE')::bigint AS hi
          FROM bands WHERE bound IS NOT NULL AND node IS NOT NULL
    )
    SELECT COALESCE(m.node, b.node), COALESCE(m.lo, b.lo), COALESCE(m.hi, b.hi),
           m.leaf::pg_catalog.regclass, b.leaf::pg_catalog.regclass,
           pg_catalog.pg_stat_get_live_tuples(COALESCE(m.leaf, b.leaf)),
           COALESCE(pg_catalog.pg_total_relation_size(m.leaf), 0)
             + COALESCE(pg_catalog.pg_total_relation_size(b.leaf), 0)
      FROM (SELECT * FROM parsed WHERE kind = 'meta') m
      FULL JOIN (SELECT * FROM parsed WHERE kind = 'blob') b
        ON b.node = m.node AND b.lo IS NOT DISTINCT FROM m.lo AND b.hi IS NOT DISTINCT FROM m.hi
     ORDER BY 1, 2
$$;

COMMENT ON FUNCTION partitions() IS
    'Every band partition with its originator, bounds, live-row estimate and size.';

-- Deletes envelopes whose expiry (unix seconds) is before as_of (default: now),
-- from meta and blob together (and their late-feed entries), then drops band partitions that are empty in both
-- tables and are not their originator's newest band. Returns one row per band it
-- deleted rows from or dropped.
--
-- Safe while inserts go on: a band is dropped only after ACCESS EXCLUSIVE locks on
-- it and on its originator partition were granted within lock_timeout_ms and it was
-- found empty under those locks, so no insert can be writing into it, and only when
-- no session is between creating or finding that band and inserting into it
-- (envelopes._prune_guard); a busy band is skipped and reported with dropped = false. Dropping keeps those locks
-- until the caller's transaction ends, so run it in a transaction of its own. An
-- insert that later arrives for a dropped band creates it again.
CREATE FUNCTION prune_expired(as_of bigint DEFAULT NULL, lock_timeout_ms integer DEFAULT 200)
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               deleted_rows bigint, dropped boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff bigint := COALESCE(as_of, EXTRACT(epoch FROM pg_catalog.now())::bigint);
    deleted jsonb := '{}';
    band record;
    empty boolean;
    caller_lock_timeout text := current_setting('lock_timeout');
BEGIN
    IF lock_timeout_ms IS NULL OR lock_timeout_ms <= 0 THEN
        RAISE EXCEPTION 'lock_timeout_ms must be positive (got %)', lock_timeout_ms
              USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- 1. Expired rows, from both tables in one statement, counted per meta band.
    WITH gone AS (
        DELETE FROM @extschema@.gateway_envelopes_meta m
         WHERE m.expiry IS NOT NULL AND m.expiry < cutoff
        RETURNING m.tableoid, m.originator_node_id, m.originator_sequence_id
    ), gone_blob AS (
        DELETE FROM @extschema@.gateway_envelopes_blob b
         USING gone g
         WHERE b.originator_node_id = g.originator_node_id
           AND b.originator_sequence_id = g.originator_sequence_id
    ), gone_late AS (
        DELETE FROM @extschema@.late_envelopes l
         USING gone g
         WHERE l.originator_node_id = g.originator_node_id
           AND l.originator_sequence_id = g.originator_sequence_id
    )
    SELECT COALESCE(jsonb_object_agg(t.leaf::text, t.n), '{}')
      INTO deleted
      FROM (SELECT gone.tableoid::oid AS leaf, count(*) AS n FROM gone GROUP BY 1) t;

    -- 2. Empty bands other than each originator's newest.
    FOR band IN
        SELECT p.*, (p.band_start = max(p.band_start) OVER (PARTITION BY p.originator_node_id)) AS newest
          FROM @extschema@.partitions() p
         ORDER BY p.originator_node_id, p.band_start
    LOOP
        dropped := false;
        IF NOT band.newest AND band.meta_partition IS NOT NULL AND band.blob_partition IS NOT NULL THEN
            EXECUTE format('SELECT NOT EXISTS (SELECT FROM %s) AND NOT EXISTS (SELECT FROM %s)',
                           band.meta_partition, band.blob_partition) INTO empty;
            IF empty THEN
                BEGIN
                    -- A session that just created or found this band and has not
                    -- inserted into it yet keeps it: leave it for next time.
                    IF NOT @extschema@._prune_guard(band.originator_node_id, band.band_start) THEN
                        RAISE EXCEPTION USING ERRCODE = 'object_in_use';
                    END IF;
                    PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
                    -- Parents first, the order in which inserts lock them.
                    EXECUTE format('LOCK TABLE %s, %s, %s, %s IN ACCESS EXCLUSIVE MODE',
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.meta_partition),
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.blob_partition),
                                   band.meta_partition, band.blob_partition);
                    EXECUTE format('SELECT NOT EXISTS (SELECT FROM %s) AND NOT EXISTS (SELECT FROM %s)',
                                   band.meta_partition, band.blob_partition) INTO empty;
                    IF NOT empty THEN
                        -- Rows arrived meanwhile: undo the locks by failing this block.
                        RAISE EXCEPTION USING ERRCODE = 'object_in_use';
                    END IF;
                    EXECUTE format('ALTER TABLE %s DETACH PARTITION %s',
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.meta_partition),
                                   band.meta_partition);
                    EXECUTE format('ALTER TABLE %s DETACH PARTITION %s',
                                   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = band.blob_partition),
                                   band.blob_partition);
                    EXECUTE format('DROP TABLE %s, %s', band.meta_partition, band.blob_partition);
                    dropped := true;
                EXCEPTION WHEN lock_not_available OR object_in_use THEN
                    dropped := false;  -- busy: left for the next run
                END;
            END IF;
        END IF;
        deleted_rows := COALESCE((deleted ->> band.meta_partition::oid::text)::bigint, 0);
        IF dropped OR deleted_rows > 0 THEN
            originator_node_id := band.originator_node_id;
            band_start := band.band_start;
            band_end := band.band_end;
            RETURN NEXT;
        END IF;
    END LOOP;
    PERFORM set_config('lock_timeout', caller_lock_timeout, true);
END
$$;

COMMENT ON FUNCTION prune_expired(bigint, integer) IS
    'Deletes expired envelopes and drops empty band partitions that are not their originator''s newest.';
