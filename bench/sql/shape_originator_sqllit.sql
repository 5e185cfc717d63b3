-- shape_originator_sql.sql with the request's values written into the query instead of
-- bound: the planner prunes the partitions once, at PREPARE, which a client
-- binding parameters (as xmtpd does) never gets. Kept beside it for comparison.
-- One originator from the start, as xmtpd writes it: meta joined with blob on
-- the key, both restricted to the originator. Every shape, in both forms,
-- produces the envelope bytes (their total length), as a reader receiving the
-- rows would; counting alone would let plain SQL skip reading them.
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
