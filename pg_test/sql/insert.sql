-- Inserting envelopes: partitions appear on demand, inserts are idempotent, and
-- bad input fails with a specific SQLSTATE and writes nothing.
\set VERBOSITY terse

-- A listing helper: every band partition with its bounds and rows.
CREATE FUNCTION pg_temp.bands() RETURNS TABLE (partition name, bound text, rows bigint)
LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.oid, c.relname, pg_get_expr(c.relpartbound, c.oid) AS b
               FROM pg_class c
              WHERE c.relnamespace = 'envelopes'::regnamespace AND c.relkind = 'r'
                AND c.relname LIKE 'gateway\_envelopes\_%'
              ORDER BY c.relname
    LOOP
        partition := r.relname; bound := r.b;
        EXECUTE format('SELECT count(*) FROM envelopes.%I', r.relname) INTO rows;
        RETURN NEXT;
    END LOOP;
END $$;

SELECT envelopes.insert_gateway_envelope(1, 10, '\x746f706963', '\xcafe');
SELECT envelopes.insert_gateway_envelope(1, 10, '\x746f706963', '\xcafe');  -- again: 0
SELECT envelopes.insert_gateway_envelope(2, 1999999, '\x01', '\x02', payer_id => 7, expiry => 4102444800);
SELECT * FROM pg_temp.bands();
SELECT originator_node_id, originator_sequence_id, topic, payer_id, expiry, originator_envelope
  FROM envelopes.gateway_envelopes_view ORDER BY 1, 2;

-- A batch across originators and bands, with a duplicate and an existing row.
SET envelopes.band_width = 100;
SELECT envelopes.insert_gateway_envelopes(
    ARRAY[1, 3, 3, 3, 1],
    ARRAY[10, 99, 100, 100, 250]::bigint[],
    ARRAY['\xaa', '\xbb', '\xcc', '\xdd', '\xee']::bytea[],
    ARRAY['\x01', '\x02', '\x03', '\x04', '\x05']::bytea[]);
SELECT * FROM pg_temp.bands();
RESET envelopes.band_width;

-- Bad input: each error names its SQLSTATE, and nothing is written.
SELECT envelopes.insert_gateway_envelope(NULL, 1, '\x01', '\x02');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.insert_gateway_envelope(1, NULL, '\x01', '\x02');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.insert_gateway_envelope(-5, 1, '\x01', '\x02');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.insert_gateway_envelope(5, -1, '\x01', '\x02');
\echo :LAST_ERROR_SQLSTATE
-- Sequence ids start at 1 (a cursor with no entry for an originator is at 0).
SELECT envelopes.insert_gateway_envelope(5, 0, '\x01', '\x02');
\echo :LAST_ERROR_SQLSTATE
-- A gateway_time no reader could turn into a point in time.
SELECT envelopes.insert_gateway_envelope(5, 1, '\x01', '\x02', gateway_time => 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.insert_gateway_envelope(5, 1, NULL, '\x02');
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.insert_gateway_envelope(5, 1, '\x01', NULL);
\echo :LAST_ERROR_SQLSTATE
SET envelopes.max_topic_bytes = 2;
SELECT envelopes.insert_gateway_envelope(5, 1, '\x010203', '\x02');
\echo :LAST_ERROR_SQLSTATE
RESET envelopes.max_topic_bytes;
SET envelopes.max_envelope_bytes = 2;
SELECT envelopes.insert_gateway_envelope(5, 1, '\x01', '\x010203');
\echo :LAST_ERROR_SQLSTATE
RESET envelopes.max_envelope_bytes;
SELECT envelopes.insert_gateway_envelopes(ARRAY[5, 5], ARRAY[1]::bigint[], ARRAY['\x01', '\x01']::bytea[], ARRAY['\x01', '\x01']::bytea[]);
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.insert_gateway_envelopes(ARRAY[5, NULL], ARRAY[1, 2]::bigint[], ARRAY['\x01', '\x01']::bytea[], ARRAY['\x01', '\x01']::bytea[]);
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.insert_gateway_envelopes(ARRAY[5], ARRAY[1]::bigint[], ARRAY['\x01']::bytea[], ARRAY['\x01']::bytea[], expiries => ARRAY[1, 2]::bigint[]);
\echo :LAST_ERROR_SQLSTATE
SELECT envelopes.ensure_gateway_parts(5, 1, 0);
\echo :LAST_ERROR_SQLSTATE
SET envelopes.band_width = -1;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS partitions_of_node_5 FROM pg_temp.bands() WHERE partition::text LIKE '%\_o5\_%';

-- A rollback leaves neither meta nor blob rows (partitions created in the rolled
-- back transaction go too).
BEGIN;
SELECT envelopes.insert_gateway_envelope(6, 1, '\x01', '\x02');
ROLLBACK;
SELECT count(*) AS meta_rows FROM envelopes.gateway_envelopes_meta WHERE originator_node_id = 6;
SELECT count(*) AS blob_rows FROM envelopes.gateway_envelopes_blob WHERE originator_node_id = 6;

-- The caller's transaction survives partition creation: its earlier and later
-- statements commit with it.
CREATE TABLE app_log (note text);
BEGIN;
INSERT INTO app_log VALUES ('before');
SELECT envelopes.insert_gateway_envelope(8, 5000000, '\x01', '\x02');
INSERT INTO app_log VALUES ('after');
COMMIT;
SELECT note FROM app_log ORDER BY note;
SELECT count(*) AS node_8_rows FROM envelopes.gateway_envelopes_view WHERE originator_node_id = 8;

-- 200 hot inserts in one transaction consume exactly one transaction id: no
-- subtransaction per row. (Measured from outside: the next transaction's id.)
SELECT envelopes.insert_gateway_envelope(9, 1, '\x01', '\x02');
SELECT pg_current_xact_id() AS xid_before \gset
SELECT sum(envelopes.insert_gateway_envelope(9, s, '\x01', '\x02')) FROM generate_series(2, 201) s;
SELECT pg_current_xact_id()::text::bigint - :'xid_before'::text::bigint AS xids_used_by_the_200_inserts_and_this_query;

-- The last band of the sequence space ends at MAXVALUE, without overflow.
SELECT envelopes.insert_gateway_envelope(2147483647, 9223372036854775807, '\x01', '\x02');
SELECT * FROM pg_temp.bands() WHERE partition::text LIKE '%o2147483647%';

-- No orphans.
SELECT count(*) AS orphans FROM envelopes.orphaned_envelopes();
