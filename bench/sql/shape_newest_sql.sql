-- The newest envelope of each of four topics: DISTINCT ON over the topic's rows.
SELECT count(*), sum(pg_catalog.length(r.originator_envelope)), sum(pg_catalog.length(r.topic)), max(r.gateway_time) FROM (
    SELECT l.originator_node_id, l.originator_sequence_id, l.gateway_time, l.topic, b.originator_envelope
      FROM (SELECT DISTINCT ON (m.topic) m.originator_node_id, m.originator_sequence_id, m.gateway_time, m.topic
              FROM envelopes.gateway_envelopes_meta m
             WHERE m.topic = ANY (ARRAY[pg_catalog.int4send(0), pg_catalog.int4send(1),
                                        pg_catalog.int4send(2), pg_catalog.int4send(3)])
             ORDER BY m.topic, m.gateway_time DESC) l
      JOIN envelopes.gateway_envelopes_blob b
        ON b.originator_node_id = l.originator_node_id
       AND b.originator_sequence_id = l.originator_sequence_id) r;
