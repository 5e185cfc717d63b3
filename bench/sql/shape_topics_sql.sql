-- Per-topic cursors: per (topic, originator) entry a LATERAL range of the
-- topic index, cut per entry and in all, then each row's blob by key.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT f.originator_node_id, f.originator_sequence_id, f.gateway_time, f.topic, b.originator_envelope
      FROM (SELECT s.*
              FROM bench_topic_cursor c, unnest(c.topics, c.nodes, c.seqs) AS e(topic, node, seq),
                   LATERAL (SELECT m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic
                              FROM envelopes.gateway_envelopes_meta m
                             WHERE m.topic = e.topic AND m.originator_node_id = e.node
                               AND m.originator_sequence_id > e.seq
                             ORDER BY m.originator_sequence_id LIMIT 100) s
             ORDER BY s.originator_node_id, s.originator_sequence_id
             LIMIT 1000) f
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = f.originator_node_id
       AND b.originator_sequence_id = f.originator_sequence_id
     ORDER BY f.originator_node_id, f.originator_sequence_id) r;
