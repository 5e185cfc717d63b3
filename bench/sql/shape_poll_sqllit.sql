-- shape_poll_sql.sql with the request's values written into the query instead of
-- bound: the planner prunes the partitions once, at PREPARE, which a client
-- binding parameters (as xmtpd does) never gets. Kept beside it for comparison.
-- Polling one originator at the end of its data (nothing new).
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic, b.originator_envelope
      FROM envelopes.gateway_envelopes_meta m
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = m.originator_node_id
       AND b.originator_sequence_id = m.originator_sequence_id
       AND b.originator_node_id = 1
     WHERE m.originator_node_id = 1
       AND m.originator_sequence_id > (SELECT c.seqs[1] FROM bench_cursor c)
     ORDER BY m.originator_sequence_id
     LIMIT 1000) r;
