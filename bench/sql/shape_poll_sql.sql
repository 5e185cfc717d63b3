-- Polling one originator at the end of its data (nothing new).
-- The originator and the limit are bind parameters, as in shape_originator_sql.sql.
\set node 1
\set lim 1000
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta m
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = m.originator_node_id
       AND b.originator_sequence_id = m.originator_sequence_id
       AND b.originator_node_id = :node
     WHERE m.originator_node_id = :node
       AND m.originator_sequence_id > (SELECT c.seqs[1] FROM bench_cursor c)
     ORDER BY m.originator_sequence_id
     LIMIT :lim) r;
