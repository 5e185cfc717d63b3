-- The best hand-written plan: meta joined with blob, the values written into the
-- query so that the planner prunes to the originator's bands once, at PREPARE.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta m
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = m.originator_node_id
       AND b.originator_sequence_id = m.originator_sequence_id
       AND b.originator_node_id = 3
     WHERE m.originator_node_id = 3 AND m.originator_sequence_id > 0
     ORDER BY m.originator_sequence_id
     LIMIT 1000) r;
