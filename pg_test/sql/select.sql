-- Cursor reads, partition listing and retention.
\set VERBOSITY terse
-- A store of its own: three originators, ids 1..25 in bands of 10, ids below 10
-- expiring at 100.
DROP EXTENSION pg_envelopes CASCADE;
CREATE EXTENSION pg_envelopes;
SET envelopes.band_width = 10;
SELECT envelopes.insert_gateway_envelopes(
           array_agg(n), array_agg(s), array_agg(CASE WHEN s % 2 = 0 THEN '\x0e'::bytea ELSE '\x0d'::bytea END),
           array_agg(pg_catalog.int8send(s)), expiries => array_agg(CASE WHEN s < 10 THEN 100 END::bigint))
  FROM generate_series(1, 3) n, generate_series(1::bigint, 25) s;

-- Cursor {1: 22, 3: 5}; originator 2 is absent and reads from 0. Ordered by
-- originator then sequence id, cut at the limit.
SELECT originator_node_id, originator_sequence_id, topic
  FROM envelopes.select_gateway_envelopes('{1, 3}', '{22, 5}', row_limit => 8);

-- Topics and originators together.
SELECT originator_node_id, originator_sequence_id, topic
  FROM envelopes.select_gateway_envelopes('{1, 3}', '{20, 18}', topics => ARRAY['\x0e'::bytea],
                                          originator_node_ids => '{3, 1}');

-- Empty filters match nothing; a limit of 0 returns nothing.
SELECT count(*) FROM envelopes.select_gateway_envelopes(topics => '{}');
SELECT count(*) FROM envelopes.select_gateway_envelopes(originator_node_ids => '{}');
SELECT count(*) FROM envelopes.select_gateway_envelopes(row_limit => 0);

-- Bad input.
SELECT * FROM envelopes.select_gateway_envelopes('{1, 2}', '{1}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM envelopes.select_gateway_envelopes('{1, NULL}', '{1, 2}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM envelopes.select_gateway_envelopes('{1, 1}', '{1, 2}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM envelopes.select_gateway_envelopes(row_limit => -5);
\echo :LAST_ERROR_SQLSTATE

-- Ceilings with no writer in flight: the highest committed sequence id.
SELECT * FROM envelopes.originator_ceilings() ORDER BY 1;

-- Every band partition.
SELECT originator_node_id, band_start, band_end, meta_partition, blob_partition
  FROM envelopes.partitions() ORDER BY 1, 2;

-- Retention: rows 1..9 of each originator expired at 100; band [0, 10) empties
-- and is dropped; the newest band is never dropped.
SELECT * FROM envelopes.prune_expired(as_of => 1000) ORDER BY 1, 2;
SELECT originator_node_id, band_start, band_end FROM envelopes.partitions() ORDER BY 1, 2;
SELECT count(*) AS remaining FROM envelopes.gateway_envelopes_view;
SELECT * FROM envelopes.prune_expired(as_of => 1000);
SELECT * FROM envelopes.prune_expired(lock_timeout_ms => 0);
\echo :LAST_ERROR_SQLSTATE
