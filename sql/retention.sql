-- Partition listing and retention.

-- Every band of both tables, read from the catalog alone (no table is opened or
-- locked, so it never waits): originator, bounds (band_end NULL = MAXVALUE) and
-- the meta and blob leaves, NULL where one table lacks the band. prune_expired
-- lists its work with it; partitions() adds sizes.
CREATE FUNCTION _bands()
RETURNS TABLE (originator_node_id integer, band_start bigint, band_end bigint,
               meta_partition oid, blob_partition oid)
LANGUAGE sql STABLE
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
    SELECT COALESCE(m.node, b.node), COALESCE(m.lo, b.lo), COALESCE(m.hi, b.hi), m.leaf, b.leaf
      FROM (SELECT * FROM parsed WHERE kind = 'meta') m
      FULL JOIN (SELECT * FROM parsed WHERE kind = 'blob') b
        ON b.node = m.node AND b.lo IS NOT DISTINCT FROM m.lo AND b.hi IS NOT DISTINCT FROM m.hi
     ORDER BY 1, 2
$$;

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
    SELECT b.originator_node_id, b.band_start, b.band_end,
           b.meta_partition::pg_catalog.regclass, b.blob_partition::pg_catalog.regclass,
           pg_catalog.pg_stat_get_live_tuples(COALESCE(b.meta_partition, b.blob_partition)),
           COALESCE(pg_catalog.pg_total_relation_size(b.meta_partition), 0)
             + COALESCE(pg_catalog.pg_total_relation_size(b.blob_partition), 0)
      FROM @extschema@._bands() b
     ORDER BY 1, 2
$$;

COMMENT ON FUNCTION partitions() IS
    'Every band partition with its originator, bounds, live-row estimate and size.';

-- prune_expired() is written in Rust (src/store/retention.rs): it commits band by
-- band in a background worker and never waits for a lock while holding one.

-- The highest key prune_expired has deleted per originator, with its gateway
-- time: originator_latest() reports the highest sequence id ever stored, which
-- pruning must not lower (xmtpd's vector clock, gateway_envelopes_latest, is
-- kept that way). Written by the pruning statement itself.
CREATE TABLE pruned_maxima (
    originator_node_id     integer     PRIMARY KEY,
    originator_sequence_id bigint      NOT NULL,
    gateway_time           timestamptz NOT NULL
);
COMMENT ON TABLE pruned_maxima IS
    'Per originator, the highest key pruning deleted (so originator_latest() survives pruning).';

-- Per originator, the highest sequence id ever stored (rows present, or deleted
-- by prune_expired) and that row's gateway time, ascending by originator. Rows
-- deleted by hand are not remembered.
CREATE FUNCTION originator_latest()
RETURNS TABLE (originator_node_id integer, originator_sequence_id bigint,
               gateway_time timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT ON (x.node) x.node, x.seq, x.at
      FROM (SELECT s.originator_node_id, s.originator_sequence_id, s.gateway_time
              FROM @extschema@._stored_maxima() s
            UNION ALL
            SELECT p.originator_node_id, p.originator_sequence_id, p.gateway_time
              FROM @extschema@.pruned_maxima p) AS x(node, seq, at)
     ORDER BY x.node, x.seq DESC
$$;
COMMENT ON FUNCTION originator_latest() IS
    'Per originator, the highest sequence id ever stored (surviving pruning) and its gateway time.';

-- pg_dump carries this state (see "Backup, restore and moving hosts" in the docs):
-- a table created by an extension is otherwise left out of every dump.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.pruned_maxima', '');
