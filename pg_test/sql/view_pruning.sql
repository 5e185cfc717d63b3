-- Queries through the view prune partitions: a filter on the originator (and
-- sequence) touches only that originator's partitions, in both tables.
SET envelopes.band_width = 1000;
SELECT envelopes.ensure_gateway_parts(n, s) FROM generate_series(1, 3) n, unnest(ARRAY[5, 1005, 2005]) s;
ANALYZE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob;

EXPLAIN (COSTS OFF)
SELECT * FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 2 AND originator_sequence_id = 1500;

EXPLAIN (COSTS OFF)
SELECT * FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 3 AND originator_sequence_id > 1500
 ORDER BY originator_sequence_id LIMIT 10;

-- The blob side follows the meta rows: run on data, only the bands that hold the
-- rows asked for are read in either table (the others are "never executed").
-- (Memoize off: its cache statistics would make the output depend on memory.)
SET envelopes.notify = off;
SET enable_memoize = off;
SELECT envelopes.insert_gateway_envelopes(array_agg(77), array_agg(s), array_agg('\x01'::bytea), array_agg('\x02'::bytea))
  FROM generate_series(1, 3999) s;
ANALYZE envelopes.gateway_envelopes_meta, envelopes.gateway_envelopes_blob;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT * FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 77 AND originator_sequence_id > 2500
 ORDER BY originator_sequence_id LIMIT 10;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT * FROM envelopes.gateway_envelopes_view
 WHERE originator_node_id = 77 AND originator_sequence_id = 3456;
