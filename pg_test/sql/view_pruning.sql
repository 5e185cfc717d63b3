-- Queries through the view still prune partitions: a filter on the originator
-- (and sequence) touches only that originator's partitions, in both tables.
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
